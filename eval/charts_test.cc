// The report charts as figures (issue 19 defect 8): no two texts overlap and none leaves the
// canvas (by the writer's own text boxes), twins in the PPL chart stay visible, intervals are
// drawn, and every chart renders with rsvg-convert (Debian librsvg2-bin) to a PNG of the
// declared size that is not blank.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "eval/eval_testing.h"
#include "eval/needle.h"
#include "eval/svg.h"
#include "eval/windows.h"

namespace strata::eval {
namespace {

namespace fs = std::filesystem;

struct Image {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgba;  // [height][width][4]
};

uint32_t Be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what rsvg-convert writes); "" or an error.
std::string DecodePng(const std::string& bytes, Image* img) {
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  if (bytes.size() < 8 || std::memcmp(b, "\x89PNG\r\n\x1a\n", 8) != 0) return "not a PNG";
  size_t p = 8;
  std::string idat;
  int color = -1;
  while (p + 12 <= bytes.size()) {
    const uint32_t len = Be32(b + p);
    const std::string type(bytes, p + 4, 4);
    if (p + 12 + len > bytes.size()) return "truncated chunk " + type;
    const uint8_t* d = b + p + 8;
    if (type == "IHDR") {
      img->width = Be32(d);
      img->height = Be32(d + 4);
      if (d[8] != 8 || (d[9] != 6 && d[9] != 2) || d[12] != 0) return "unsupported PNG format";
      color = d[9];
    } else if (type == "IDAT") {
      idat.append(reinterpret_cast<const char*>(d), len);
    } else if (type == "IEND") {
      break;
    }
    p += 12 + len;
  }
  if (color < 0) return "no IHDR";
  const size_t bpp = color == 6 ? 4 : 3, stride = img->width * bpp;
  std::vector<uint8_t> raw((stride + 1) * img->height);
  uLongf n = raw.size();
  if (uncompress(raw.data(), &n, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) !=
          Z_OK ||
      n != raw.size()) {
    return "bad image data";
  }
  std::vector<uint8_t> px(stride * img->height), prev(stride, 0);
  for (uint32_t y = 0; y < img->height; ++y) {
    const uint8_t f = raw[y * (stride + 1)];
    const uint8_t* in = &raw[y * (stride + 1) + 1];
    uint8_t* out = &px[y * stride];
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= bpp ? out[x - bpp] : 0, up = prev[x], c = x >= bpp ? prev[x - bpp] : 0;
      int v = in[x];
      if (f == 1) v += a;
      if (f == 2) v += up;
      if (f == 3) v += (a + up) / 2;
      if (f == 4) {
        const int pa = std::abs(up - c), pb = std::abs(a - c), pc = std::abs(a + up - 2 * c);
        v += pa <= pb && pa <= pc ? a : pb <= pc ? up : c;
      }
      out[x] = static_cast<uint8_t>(v);
    }
    std::copy(out, out + stride, prev.begin());
  }
  img->rgba.resize(size_t{img->width} * img->height * 4);
  for (size_t i = 0; i < size_t{img->width} * img->height; ++i) {
    for (size_t k = 0; k < 4; ++k) img->rgba[i * 4 + k] = k < bpp ? px[i * bpp + k] : 255;
  }
  return "";
}

// Renders the chart with rsvg-convert and checks the PNG: the SVG's size, fully opaque, and far
// from blank (a real chart inks a few per cent of its pixels in several colours).
void ExpectRendersNonBlank(const std::string& svg, const std::string& name) {
  SCOPED_TRACE(name);
  ASSERT_EQ(std::system("command -v rsvg-convert >/dev/null 2>&1"), 0)
      << "rsvg-convert not found: run scripts/setup.sh (Debian librsvg2-bin)";
  const fs::path dir = fs::temp_directory_path() / ("strata_charts_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string in = (dir / (name + ".svg")).string(), out = (dir / (name + ".png")).string();
  std::ofstream(in) << svg;
  ASSERT_EQ(std::system(("rsvg-convert -o '" + out + "' '" + in + "'").c_str()), 0);
  std::ifstream f(out, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), {});
  Image img;
  ASSERT_EQ(DecodePng(bytes, &img), "");
  const auto boxes = SvgTextBoxes(svg);
  const size_t w_at = svg.find(" width=\""), h_at = svg.find(" height=\"");
  EXPECT_EQ(img.width, static_cast<uint32_t>(std::lround(std::atof(svg.c_str() + w_at + 8))));
  EXPECT_EQ(img.height, static_cast<uint32_t>(std::lround(std::atof(svg.c_str() + h_at + 9))));
  size_t inked = 0;
  std::set<uint32_t> colours;
  for (size_t i = 0; i < img.rgba.size(); i += 4) {
    const uint8_t* q = &img.rgba[i];
    EXPECT_EQ(q[3], 255) << "transparent pixel " << i / 4;
    if (q[0] < 240 || q[1] < 240 || q[2] < 240) ++inked;
    colours.insert((uint32_t{q[0]} << 16) | (uint32_t{q[1]} << 8) | q[2]);
  }
  const double share = static_cast<double>(inked) / (img.rgba.size() / 4);
  EXPECT_GT(share, 0.01) << "blank: " << inked << " inked pixels";
  EXPECT_GT(colours.size(), 8u);
  EXPECT_FALSE(boxes.empty());
  fs::remove_all(dir);
}

void ExpectLegible(const std::string& svg, const std::string& name) {
  EXPECT_EQ(testing::XmlWellFormedError(svg), "") << name;
  const std::vector<std::string> problems = SvgTextProblems(svg);
  std::string all;
  for (const auto& p : problems) all += "  " + p + "\n";
  EXPECT_TRUE(problems.empty()) << name << ":\n" << all;
}

// The plot markers' centres (circles of radius 4 outside the legend column at x >= legend_x).
std::vector<std::pair<std::string, std::string>> Markers(const std::string& svg, double legend_x) {
  std::vector<std::pair<std::string, std::string>> m;
  for (size_t p = svg.find("<circle "); p != std::string::npos; p = svg.find("<circle ", p + 1)) {
    const size_t cx = svg.find("cx=\"", p) + 4, cy = svg.find("cy=\"", p) + 4;
    const std::string x = svg.substr(cx, svg.find('"', cx) - cx);
    if (std::atof(x.c_str()) >= legend_x) continue;
    m.push_back({x, svg.substr(cy, svg.find('"', cy) - cy)});
  }
  return m;
}

TEST(ChartTextTest, BoxesFollowAnchorAndRotation) {
  Svg svg(200, 100);
  svg.Text(100, 50, "abcd", "middle", 10);
  svg.Text(20, 90, "vertical", "middle", 10, "", -90);
  const auto boxes = SvgTextBoxes(svg.Finish());
  ASSERT_EQ(boxes.size(), 2u);
  EXPECT_NEAR(boxes[0].x0, 100 - TextWidth("abcd", 10) / 2, 1e-9);
  EXPECT_NEAR(boxes[0].y0, 42, 1e-9);
  EXPECT_NEAR(boxes[1].x0, 12, 1e-9);  // rotated: 0.8 em left of the anchor
  EXPECT_NEAR(boxes[1].y1 - boxes[1].y0, TextWidth("vertical", 10), 1e-9);
  // Overlaps and texts off the canvas are reported.
  Svg bad(100, 40);
  bad.Text(10, 20, "first label", "start", 12);
  bad.Text(30, 22, "second", "start", 12);
  bad.Text(90, 20, "off the edge", "start", 12);
  const auto problems = SvgTextProblems(bad.Finish());
  ASSERT_GE(problems.size(), 2u);
  EXPECT_NE(problems[0].find("'first label' overlaps 'second'"), std::string::npos);
}

class ChartsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto r = testing::RetrievalModel();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    retrieval_ = r->release();
  }
  static void TearDownTestSuite() { delete retrieval_; }
  static Model* retrieval_;
};
Model* ChartsTest::retrieval_ = nullptr;

// Needle: the per-policy heat maps (panel titles used to run into each other when a policy has
// one column) and the run's comparison chart with intact and answered rates and intervals.
TEST_F(ChartsTest, NeedleChartsAreLegibleAndRender) {
  NeedleOptions o;
  o.format = NeedleFormat::kKvTokens;
  o.lengths = {64, 96, 128};
  o.trials = 4;
  o.policies = {"destroy", "full"};
  o.ratios = {"4", "16"};
  o.factory = testing::FactoryWithDestroy();
  auto r = RunNeedle(*retrieval_, o, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const std::string policy : {"destroy", "full"}) {
    const std::string s = NeedleHeatmapSvg(*r, policy);
    ExpectLegible(s, "heat map " + policy);
    ExpectRendersNonBlank(s, "needle_" + policy);
  }
  const std::string c = NeedleComparisonSvg(*r);
  ExpectLegible(c, "comparison");
  EXPECT_NE(c.find("answered: greedy answer exactly right"), std::string::npos);
  EXPECT_NE(c.find("95% Wilson intervals"), std::string::npos);
  // Every row is labelled; the uncompressed reference, which has no ratio, is marked as such.
  for (const auto& cfg : r->configs) {
    const std::string label = cfg.policy == "full" ? "full (uncompressed)" : cfg.Label();
    EXPECT_NE(c.find(">" + label + "<"), std::string::npos) << label;
  }
  EXPECT_EQ(c.find(">full<"), std::string::npos);
  EXPECT_NE(NeedleHeatmapSvg(*r, "full").find(">uncompressed<"), std::string::npos);
  EXPECT_EQ(NeedleHeatmapSvg(*r, "destroy").find(">uncompressed<"), std::string::npos);
  EXPECT_NE(c.find("T = 128"), std::string::npos);
  ExpectRendersNonBlank(c, "needle_comparison");
}

PplConfigResult PplConfig(const std::string& policy, const std::string& ratio, double bits,
                          std::vector<std::vector<double>> nll) {
  PplConfigResult c;
  c.config.policy = policy;
  if (!ratio.empty()) c.config.ratio = ratio;
  double sum = 0;
  int64_t n = 0;
  for (auto& w : nll) {
    WindowResult wr;
    wr.nll = w;
    for (double v : w) sum += v, ++n;
    c.windows.push_back(wr);
  }
  c.mean_nll = sum / n;
  c.ppl = std::exp(c.mean_nll);
  c.n_targets = n;
  c.resident_bits_per_value = bits;
  return c;
}

// PPL: two configs at the same point (the same bytes and PPL) are both visible, each point has
// its interval, and the long legend fits the canvas.
TEST(ChartsPplTest, TwinsStayVisibleAndIntervalsAreDrawn) {
  PplReport r;
  r.configs.push_back(PplConfig("full", "", 16, {{2.0, 2.2, 1.9}, {2.1, 2.4, 2.0}}));
  r.configs.push_back(PplConfig("streaming", "1", 16, {{2.0, 2.2, 1.9}, {2.1, 2.4, 2.0}}));
  r.configs.push_back(PplConfig("geodesia-with-a-long-name", "2.5", 3.1,
                                {{2.3, 2.6, 2.2}, {2.5, 2.9, 2.4}}));
  const std::string s = PplParetoSvg(r);
  ExpectLegible(s, "ppl_pareto");
  // Legend circles sit right of the plot (x >= 80 + 440); the rest are the plotted points.
  const auto m = Markers(s, 520);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_NE(m[0], m[1]) << "the twin hides under the first point";
  EXPECT_NE(s.find("whiskers: 95% interval of the PPL over windows"), std::string::npos);
  EXPECT_NE(s.find("full: " + FormatNum(r.configs[0].ppl, 3) + " ["), std::string::npos) << s;
  ExpectRendersNonBlank(s, "ppl_pareto");
}

// KL: a chart (eval kl --svg-dir used to write nothing), one bar per config with its interval.
TEST(ChartsKlTest, KlChartIsLegibleAndRenders) {
  KlReport r;
  r.offsets = {0, 100};
  for (const auto& [name, scale] :
       std::vector<std::pair<std::string, double>>{{"full", 0.0}, {"kivi2", 0.02}, {"h2o", 0.1}}) {
    KlConfigResult c;
    c.config.policy = name;
    double sum = 0, mx = 0;
    for (int w = 0; w < 2; ++w) {
      KlWindow kw;
      for (int i = 0; i < 8; ++i) kw.kl.push_back(scale * (1 + 0.3 * ((i + w) % 3)));
      for (double v : kw.kl) sum += v, mx = std::max(mx, v);
      c.windows.push_back(kw);
    }
    c.mean_kl = sum / 16;
    c.max_kl = mx;
    c.n_positions = 16;
    r.configs.push_back(c);
  }
  const std::string s = KlSvg(r);
  ExpectLegible(s, "kl");
  EXPECT_NE(s.find("KL divergence (nats)"), std::string::npos);
  EXPECT_NE(s.find(">kivi2<"), std::string::npos);
  ExpectRendersNonBlank(s, "kl");
}

}  // namespace
}  // namespace strata::eval
