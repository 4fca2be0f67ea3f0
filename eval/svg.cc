#include "eval/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace strata::eval {

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters are not allowed in XML 1.0; print them as spaces.
        out += (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') ? ' ' : c;
    }
  }
  return out;
}

std::string FormatNum(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  std::string s = buf;
  if (s[0] == '-' && s.find_first_not_of("-0.") == std::string::npos) s.erase(0, 1);
  return s;
}

std::string RateColor(double rate) {
  rate = std::clamp(rate, 0.0, 1.0);
  // Two linear segments: (215, 48, 39) -> (254, 224, 139) -> (26, 152, 80).
  auto mix = [](double a, double b, double t) {
    return static_cast<int>(std::lround(a + (b - a) * t));
  };
  int r, g, b;
  if (rate < 0.5) {
    const double t = rate / 0.5;
    r = mix(215, 254, t), g = mix(48, 224, t), b = mix(39, 139, t);
  } else {
    const double t = (rate - 0.5) / 0.5;
    r = mix(254, 26, t), g = mix(224, 152, t), b = mix(139, 80, t);
  }
  char buf[16];
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", r, g, b);
  return buf;
}

namespace {
std::string N(double v) { return FormatNum(v, 1); }
}  // namespace

Svg::Svg(double width, double height) : width_(width), height_(height) {}

void Svg::Rect(double x, double y, double w, double h, const std::string& fill,
               const std::string& stroke) {
  body_ += "  <rect x=\"" + N(x) + "\" y=\"" + N(y) + "\" width=\"" + N(w) + "\" height=\"" + N(h) +
           "\" fill=\"" + XmlEscape(fill) + "\" stroke=\"" + XmlEscape(stroke) + "\"/>\n";
}

void Svg::Line(double x1, double y1, double x2, double y2, const std::string& stroke,
               double stroke_width, const std::string& dash) {
  body_ += "  <line x1=\"" + N(x1) + "\" y1=\"" + N(y1) + "\" x2=\"" + N(x2) + "\" y2=\"" + N(y2) +
           "\" stroke=\"" + XmlEscape(stroke) + "\" stroke-width=\"" + FormatNum(stroke_width, 2) +
           "\"" + (dash.empty() ? "" : " stroke-dasharray=\"" + XmlEscape(dash) + "\"") + "/>\n";
}

void Svg::Circle(double cx, double cy, double r, const std::string& fill) {
  body_ += "  <circle cx=\"" + N(cx) + "\" cy=\"" + N(cy) + "\" r=\"" + N(r) + "\" fill=\"" +
           XmlEscape(fill) + "\"/>\n";
}

void Svg::Polyline(const std::string& points, const std::string& stroke, double stroke_width) {
  body_ += "  <polyline points=\"" + XmlEscape(points) + "\" fill=\"none\" stroke=\"" +
           XmlEscape(stroke) + "\" stroke-width=\"" + FormatNum(stroke_width, 2) + "\"/>\n";
}

void Svg::Text(double x, double y, const std::string& text, const std::string& anchor, double size,
               const std::string& weight, double rotate) {
  body_ += "  <text x=\"" + N(x) + "\" y=\"" + N(y) + "\" text-anchor=\"" + XmlEscape(anchor) +
           "\" font-size=\"" + N(size) + "\"";
  if (!weight.empty()) body_ += " font-weight=\"" + XmlEscape(weight) + "\"";
  if (rotate != 0) {
    body_ += " transform=\"rotate(" + N(rotate) + " " + N(x) + " " + N(y) + ")\"";
  }
  body_ += '>';  // appended piecewise: "x" + string trips GCC 12's -Wrestrict false positive
  body_ += XmlEscape(text);
  body_ += "</text>\n";
}

std::string Svg::Finish() {
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + N(width_) + "\" height=\"" +
       N(height_) + "\" viewBox=\"0 0 " + N(width_) + " " + N(height_) +
       "\" font-family=\"sans-serif\">\n";
  s += "  <rect x=\"0\" y=\"0\" width=\"" + N(width_) + "\" height=\"" + N(height_) +
       "\" fill=\"#ffffff\"/>\n";
  s += body_;
  s += "</svg>\n";
  return s;
}

}  // namespace strata::eval
