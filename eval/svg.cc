#include "eval/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

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

// The value of attribute `name` in the tag text, "" when absent.
std::string Attr(const std::string& tag, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const size_t b = tag.find(key);
  if (b == std::string::npos) return "";
  const size_t e = tag.find('"', b + key.size());
  return e == std::string::npos ? "" : tag.substr(b + key.size(), e - b - key.size());
}

// Undoes XmlEscape (the five entities), so widths count characters as shown.
std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    const size_t e = s.find(';', i);
    const std::string ent = e == std::string::npos ? "" : s.substr(i, e - i + 1);
    const char c = ent == "&amp;" ? '&' : ent == "&lt;" ? '<' : ent == "&gt;" ? '>'
                 : ent == "&quot;" ? '"' : ent == "&apos;" ? '\'' : 0;
    if (c == 0) {
      out += s[i];
      continue;
    }
    out += c;
    i = e;
  }
  return out;
}
}  // namespace

double TextWidth(const std::string& text, double size) {
  // UTF-8: count code points, not bytes.
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xc0) != 0x80;
  return 0.62 * size * static_cast<double>(n);
}

std::vector<TextBox> SvgTextBoxes(const std::string& svg) {
  std::vector<TextBox> boxes;
  for (size_t p = svg.find("<text "); p != std::string::npos; p = svg.find("<text ", p + 1)) {
    const size_t tag_end = svg.find('>', p);
    const size_t close = svg.find("</text>", tag_end);
    if (tag_end == std::string::npos || close == std::string::npos) break;
    const std::string tag = svg.substr(p, tag_end - p);
    TextBox b;
    b.text = Unescape(svg.substr(tag_end + 1, close - tag_end - 1));
    const double x = std::atof(Attr(tag, "x").c_str()), y = std::atof(Attr(tag, "y").c_str());
    const double size = std::atof(Attr(tag, "font-size").c_str());
    const double w = TextWidth(b.text, size);
    const std::string anchor = Attr(tag, "text-anchor");
    // Extent along the baseline [a, b] relative to the anchor point.
    const double a = anchor == "middle" ? -w / 2 : anchor == "end" ? -w : 0;
    const double up = 0.8 * size, down = 0.25 * size;
    const std::string tr = Attr(tag, "transform");
    if (tr.rfind("rotate(-90", 0) == 0) {  // reads bottom to top: the baseline runs up
      b.x0 = x - up, b.x1 = x + down, b.y0 = y - (a + w), b.y1 = y - a;
    } else {
      b.x0 = x + a, b.x1 = x + a + w, b.y0 = y - up, b.y1 = y + down;
    }
    boxes.push_back(b);
  }
  return boxes;
}

std::vector<std::string> SvgTextProblems(const std::string& svg) {
  std::vector<std::string> problems;
  const size_t root = svg.find("<svg ");
  const std::string root_tag =
      root == std::string::npos ? "" : svg.substr(root, svg.find('>', root) - root);
  const double width = std::atof(Attr(root_tag, "width").c_str());
  const double height = std::atof(Attr(root_tag, "height").c_str());
  const std::vector<TextBox> boxes = SvgTextBoxes(svg);
  for (size_t i = 0; i < boxes.size(); ++i) {
    const TextBox& a = boxes[i];
    if (a.x0 < -0.5 || a.y0 < -0.5 || a.x1 > width + 0.5 || a.y1 > height + 0.5) {
      problems.push_back("'" + a.text + "' lies outside the " + N(width) + " x " + N(height) +
                         " canvas");
    }
    for (size_t j = i + 1; j < boxes.size(); ++j) {
      const TextBox& b = boxes[j];
      const double ox = std::min(a.x1, b.x1) - std::max(a.x0, b.x0);
      const double oy = std::min(a.y1, b.y1) - std::max(a.y0, b.y0);
      if (ox > 0.5 && oy > 0.5) problems.push_back("'" + a.text + "' overlaps '" + b.text + "'");
    }
  }
  return problems;
}

// Whole pixels: a renderer then covers every pixel of the canvas (no half-transparent edge).
Svg::Svg(double width, double height) : width_(std::ceil(width)), height_(std::ceil(height)) {}

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
