// A small SVG writer for report charts: well-formed XML (every attribute quoted, text escaped), a
// viewBox so browsers scale the chart, and the few shapes the charts use.
#pragma once

#include <string>
#include <vector>

namespace strata::eval {

// Escapes & < > " ' for XML text and attribute values.
std::string XmlEscape(const std::string& s);
// printf("%.*f"), with "-0.00" printed as "0.00".
std::string FormatNum(double v, int digits);
// Red (0) -> yellow (0.5) -> green (1), as "#rrggbb".
std::string RateColor(double rate);

// Approximate width in px of `text` at font size `size` in the charts' sans-serif face: 0.62 em
// per character (DejaVu Sans digits are 0.64 em, lower case ~0.55-0.6): what the charts size their
// panels and margins with, and what the overlap check assumes.
double TextWidth(const std::string& text, double size);

// One text element of a chart and its approximate bounding box (TextWidth wide, from 0.8 em above
// the baseline to 0.25 em below; a -90 degree rotation turns it about its anchor point).
struct TextBox {
  std::string text;
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};
// The text boxes of an SVG document written by Svg (its <text> elements).
std::vector<TextBox> SvgTextBoxes(const std::string& svg);
// Problems with the texts of an SVG document written by Svg: each pair of text boxes that
// overlap (by more than 0.5 px either way) and each box outside the canvas, one line each;
// empty when the chart's texts are all legible.
std::vector<std::string> SvgTextProblems(const std::string& svg);

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
