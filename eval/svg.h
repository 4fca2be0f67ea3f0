// A small SVG writer for report charts: well-formed XML (every attribute quoted, text escaped), a
// viewBox so browsers scale the chart, and the few shapes the charts use.
#pragma once

#include <string>

namespace strata::eval {

// Escapes & < > " ' for XML text and attribute values.
std::string XmlEscape(const std::string& s);
// printf("%.*f"), with "-0.00" printed as "0.00".
std::string FormatNum(double v, int digits);
// Red (0) -> yellow (0.5) -> green (1), as "#rrggbb".
std::string RateColor(double rate);

class Svg {
 public:
  Svg(double width, double height);
  void Rect(double x, double y, double w, double h, const std::string& fill,
            const std::string& stroke = "none");
  void Line(double x1, double y1, double x2, double y2, const std::string& stroke,
            double stroke_width = 1, const std::string& dash = "");
  void Circle(double cx, double cy, double r, const std::string& fill);
  // points: "x,y x,y ..."
  void Polyline(const std::string& points, const std::string& stroke, double stroke_width = 1.5);
  // anchor: start | middle | end; rotate in degrees about (x, y).
  void Text(double x, double y, const std::string& text, const std::string& anchor = "start",
            double size = 12, const std::string& weight = "", double rotate = 0);
  // Closes the document and returns it.
  std::string Finish();

 private:
  std::string body_;
  double width_, height_;
};

}  // namespace strata::eval
