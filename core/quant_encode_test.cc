// QuantizeRow (core/quant_encode.cc): per-element error bounds on random and adversarial blocks,
// RMS error ceilings and their order on N(0,1) data, NaN/Inf and block-size refusal, Q8_0 bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "core/rng.h"
#include "core/status_testing.h"

namespace strata {
namespace {

const DType kTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,  DType::kQ5_1,
                        DType::kQ8_0, DType::kQ2_K, DType::kQ3_K,  DType::kQ4_K,
                        DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS};

std::string Name(DType t) { return std::string(DTypeName(t)); }
bool IsIq(DType t) { return t == DType::kIQ4_NL || t == DType::kIQ4_XS; }

// Sets every code of one encoded block to the type's lowest code (which = 0), the next one up
// (which = 1) or the highest (which = 2), leaving the scales alone: decoding such copies gives each
// element's grid ends and step without re-implementing the scale layouts here.
void SetCodes(DType t, uint8_t* blk, int which) {
  const uint8_t nib[3] = {0x00, 0x11, 0xff};
  const uint8_t two[3] = {0x00, 0x55, 0xff};
  const uint8_t top[3] = {0x00, 0x00, 0xff};
  switch (t) {
    case DType::kQ4_0: {
      auto* b = reinterpret_cast<BlockQ4_0*>(blk);
      std::memset(b->qs, nib[which], sizeof(b->qs));
      return;
    }
    case DType::kIQ4_NL: {
      auto* b = reinterpret_cast<BlockIQ4_NL*>(blk);
      std::memset(b->qs, nib[which], sizeof(b->qs));
      return;
    }
    case DType::kQ4_1: {
      auto* b = reinterpret_cast<BlockQ4_1*>(blk);
      std::memset(b->qs, nib[which], sizeof(b->qs));
      return;
    }
    case DType::kQ5_0: {
      auto* b = reinterpret_cast<BlockQ5_0*>(blk);
      std::memset(b->qs, nib[which], sizeof(b->qs));
      std::memset(b->qh, top[which], sizeof(b->qh));
      return;
    }
    case DType::kQ5_1: {
      auto* b = reinterpret_cast<BlockQ5_1*>(blk);
      std::memset(b->qs, nib[which], sizeof(b->qs));
      std::memset(b->qh, top[which], sizeof(b->qh));
      return;
    }
    case DType::kQ8_0: {
      auto* b = reinterpret_cast<BlockQ8_0*>(blk);
      const int8_t c[3] = {-127, -126, 127};
      for (auto& q : b->qs) q = c[which];
      return;
    }
    case DType::kQ2_K: {
      auto* b = reinterpret_cast<BlockQ2_K*>(blk);
      std::memset(b->qs, two[which], sizeof(b->qs));
      return;
    }
    case DType::kQ3_K: {
      auto* b = reinterpret_cast<BlockQ3_K*>(blk);
      std::memset(b->qs, two[which], sizeof(b->qs));
      std::memset(b->hmask, top[which], sizeof(b->hmask));
      return;
    }
    case DType::kQ4_K: {
      auto* b = reinterpret_cast<BlockQ4_K*>(blk);
      std::memset(b->qs, nib[which], sizeof(b->qs));
      return;
    }
    case DType::kQ5_K: {
      auto* b = reinterpret_cast<BlockQ5_K*>(blk);
      std::memset(b->qs, nib[which], sizeof(b->qs));
      std::memset(b->qh, top[which], sizeof(b->qh));
      return;
    }
    case DType::kQ6_K: {
      auto* b = reinterpret_cast<BlockQ6_K*>(blk);
      std::memset(b->ql, nib[which], sizeof(b->ql));
      std::memset(b->qh, top[which], sizeof(b->qh));
      return;
    }
    case DType::kIQ4_XS: {
      auto* b = reinterpret_cast<BlockIQ4_XS*>(blk);
      std::memset(b->qs, nib[which], sizeof(b->qs));
      return;
    }
    default:
      FAIL() << "no block type " << Name(t);
  }
}

// The f16 scale fields of a block: the super-block (or block) scale D and, where there is one,
// Dmin (Q4_1/Q5_1: the offset m).
struct Scales {
  float d = 0.f, dmin = 0.f;
};
Scales ScalesOf(DType t, const uint8_t* blk) {
  Scales s;
  uint16_t d = 0, m = 0;
  switch (t) {
    case DType::kQ2_K: {
      auto* b = reinterpret_cast<const BlockQ2_K*>(blk);
      d = b->d;
      m = b->dmin;
      break;
    }
    case DType::kQ3_K: d = reinterpret_cast<const BlockQ3_K*>(blk)->d; break;
    case DType::kQ4_K: {
      auto* b = reinterpret_cast<const BlockQ4_K*>(blk);
      d = b->d;
      m = b->dmin;
      break;
    }
    case DType::kQ5_K: {
      auto* b = reinterpret_cast<const BlockQ5_K*>(blk);
      d = b->d;
      m = b->dmin;
      break;
    }
    case DType::kQ6_K: d = reinterpret_cast<const BlockQ6_K*>(blk)->d; break;
    case DType::kQ4_1: {
      auto* b = reinterpret_cast<const BlockQ4_1*>(blk);
      d = b->d;
      m = b->m;
      break;
    }
    case DType::kQ5_1: {
      auto* b = reinterpret_cast<const BlockQ5_1*>(blk);
      d = b->d;
      m = b->m;
      break;
    }
    default:
      std::memcpy(&d, blk, 2);  // Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS: d first
  }
  s.d = F16ToF32(d);
  s.dmin = F16ToF32(m);
  return s;
}

// True when an f16 scale field sits at +-65504, the clamp for scales beyond the f16 range (the
// stated bounds are for unclamped blocks; clamped ones are checked for saturation instead).
bool Clamped(const Scales& s) {
  return std::fabs(s.d) == 65504.f || std::fabs(s.dmin) == 65504.f;
}

// The bound stated in core/quant_encode.cc for element with step s (IQ: dl), scales sc.
double StatedBound(DType t, double s, const Scales& sc) {
  const double D = std::fabs(sc.d), Dm = std::fabs(sc.dmin);
  switch (t) {
    case DType::kQ8_0: return s / 2 + 127 * (std::ldexp(s, -11) + std::ldexp(1.0, -25));
    case DType::kQ4_0: case DType::kQ5_0: return s;
    case DType::kQ4_1: case DType::kQ5_1: return s / 2;
    case DType::kQ2_K: return s / 2 + 3.5 * D / 2 + Dm / 2;
    case DType::kQ4_K: return s / 2 + 15.5 * D / 2 + Dm / 2;
    case DType::kQ5_K: return s / 2 + 31.5 * D / 2 + Dm / 2;
    case DType::kQ3_K: return 1.5 * s + 4.5 * D;
    case DType::kQ6_K: return 1.5 * s + 32.5 * D;
    case DType::kIQ4_NL: return 21 * s;
    case DType::kIQ4_XS: return 21 * s + 134 * D;
    default: return 0;
  }
}

struct RowResult {
  std::vector<float> y;  // decoded
  double sum_sq = 0;     // squared error
};

// Quantizes x, decodes it, and checks every element: inside its grid within half a step (IQ: half
// the widest table gap, 12 |dl|; Q8_0: its stated bound), outside it the nearer grid end, and
// (blocks without a clamped scale) within the stated bound.
RowResult CheckRow(DType t, const std::vector<float>& x, const std::string& what) {
  SCOPED_TRACE(Name(t) + " " + what);
  const int64_t n = static_cast<int64_t>(x.size());
  const int64_t be = DTypeBlockElems(t), bb = DTypeBlockBytes(t);
  std::vector<uint8_t> q(DTypeRowBytes(t, n));
  RowResult r;
  r.y.resize(n);
  const Status st = QuantizeRow(t, x.data(), q.data(), n);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return r;
  DequantizeRow(t, q.data(), r.y.data(), n);
  std::vector<float> probe[3];
  for (int which = 0; which < 3; ++which) {
    std::vector<uint8_t> c = q;
    for (int64_t b = 0; b < n / be; ++b) SetCodes(t, c.data() + b * bb, which);
    probe[which].resize(n);
    DequantizeRow(t, c.data(), probe[which].data(), n);
  }
  int failures = 0;
  for (int64_t i = 0; i < n && failures < 5; ++i) {
    const Scales sc = ScalesOf(t, q.data() + (i / be) * bb);
    const double xi = x[i], yi = r.y[i];
    const double lo = std::min(probe[0][i], probe[2][i]), hi = std::max(probe[0][i], probe[2][i]);
    const double step = IsIq(t) ? (hi - lo) / 240.0 : std::fabs(probe[1][i] - probe[0][i]);
    const double eps = std::ldexp(std::fabs(xi) + std::fabs(lo) + std::fabs(hi), -20);
    const double err = std::fabs(xi - yi);
    bool ok = std::isfinite(yi);
    std::string why;
    if (t == DType::kQ8_0) {
      // Codes from the unrounded scale (the FromF32 rule): only the stated bound applies.
      why = "error above the stated bound";
    } else if (xi > hi) {
      ok = ok && std::fabs(yi - hi) <= eps;
      why = "above the grid, not at its top " + std::to_string(hi);
    } else if (xi < lo) {
      ok = ok && std::fabs(yi - lo) <= eps;
      why = "below the grid, not at its bottom " + std::to_string(lo);
    } else {
      const double in = IsIq(t) ? 12 * step : step / 2;
      ok = ok && err <= in + eps;
      why = "inside the grid, error above " + std::to_string(in);
    }
    if (ok && !Clamped(sc)) {
      const double b = StatedBound(t, step, sc);
      ok = err <= b + eps;
      why = "error above the stated bound " + std::to_string(b);
    }
    if (!ok) {
      ++failures;
      ADD_FAILURE() << "element " << i << " x=" << xi << " decoded " << yi << " step " << step
                    << " D " << sc.d << " Dmin " << sc.dmin << ": " << why;
    }
  }
  for (int64_t i = 0; i < n; ++i) r.sum_sq += (x[i] - static_cast<double>(r.y[i])) * (x[i] - r.y[i]);
  return r;
}

enum class Dist { kNormal, kUniform, kHeavy, kOutliers, kShifted, kScaled };
const char* DistName(Dist d) {
  switch (d) {
    case Dist::kNormal: return "normal";
    case Dist::kUniform: return "uniform";
    case Dist::kHeavy: return "heavy-tailed";
    case Dist::kOutliers: return "outliers";
    case Dist::kShifted: return "shifted";
    case Dist::kScaled: return "scaled";
  }
  return "?";
}

std::vector<float> Draw(Rng& rng, Dist d, int64_t n) {
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) {
    double v = rng.Normal();
    switch (d) {
      case Dist::kNormal: break;
      case Dist::kUniform: v = 2 * rng.Uniform() - 1; break;
      case Dist::kHeavy: v = v / std::sqrt(rng.Uniform() + 1e-4); break;  // Student-t like tails
      case Dist::kOutliers: if (rng.Below(64) == 0) v *= 40; break;
      case Dist::kShifted: v = 3 + 0.5 * v; break;
      case Dist::kScaled: break;
    }
    x[i] = static_cast<float>(v);
  }
  if (d == Dist::kScaled) {  // every 256 values at their own scale, 1e-4 .. 1e4
    for (int64_t b = 0; b < n; b += kQK_K) {
      const float s = static_cast<float>(std::pow(10.0, 8 * rng.Uniform() - 4));
      for (int64_t i = b; i < std::min(n, b + kQK_K); ++i) x[i] *= s;
    }
  }
  return x;
}

TEST(QuantEncodeTest, RandomBlocksWithinBounds) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (DType t : kTypes) {
    for (Dist d : {Dist::kNormal, Dist::kUniform, Dist::kHeavy, Dist::kOutliers, Dist::kShifted,
                   Dist::kScaled}) {
      CheckRow(t, Draw(rng, d, 64 * kQK_K), DistName(d));
    }
  }
}

// One super-block of 256 (eight blocks of 32 for the small formats).
TEST(QuantEncodeTest, AdversarialBlocks) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int n = kQK_K;
  std::vector<std::pair<std::string, std::vector<float>>> rows;
  rows.push_back({"all zero", std::vector<float>(n, 0.f)});
  for (float c : {0.7f, -3.1f, 1000.f, 1e-3f, -65504.f}) {
    rows.push_back({"constant " + std::to_string(c), std::vector<float>(n, c)});
  }
  {
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = (i % 2 ? -1e-30f : 1e-30f);
    x[3] = 1e30f;
    x[200] = -1e30f;
    rows.push_back({"1e30 and 1e-30", x});
    std::vector<float> y(n, 1e-30f);
    y[77] = 1e30f;
    rows.push_back({"1e30 and positive 1e-30", y});
  }
  for (float v : {5.f, -5.f, 1e-20f, 3e38f}) {
    std::vector<float> x(n, 0.f);
    x[7] = v;
    rows.push_back({"single nonzero " + std::to_string(v), x});
  }
  for (float s : {30000.f, 65504.f, 70000.f, 1e6f, 1e8f, 1e12f, 3e38f}) {
    std::vector<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = static_cast<float>(std::clamp(rng.Normal() / 2, -1.0, 1.0) * s);
    x[11] = s;
    x[12] = -s;
    rows.push_back({"scale " + std::to_string(s), x});
  }
  {
    std::vector<float> x(n), y(n), z(n);
    for (int i = 0; i < n; ++i) {
      x[i] = static_cast<float>(rng.Normal() * 1e-40);  // f32 denormals
      y[i] = i % 3 ? 0.f : std::numeric_limits<float>::denorm_min() * static_cast<float>(i);
      z[i] = static_cast<float>(rng.Normal() * 1e-6);  // scales in the f16 subnormal range
    }
    rows.push_back({"denormal", x});
    rows.push_back({"sparse denormal", y});
    rows.push_back({"1e-6 normal", z});
    std::vector<float> m(n);
    for (int i = 0; i < n; ++i) m[i] = static_cast<float>(1000 + 0.01 * rng.Normal());
    rows.push_back({"offset 1000 spread 0.01", m});
    std::vector<float> neg(n);
    for (int i = 0; i < n; ++i) neg[i] = static_cast<float>(-5 - std::fabs(rng.Normal()));
    rows.push_back({"all negative", neg});
  }
  for (DType t : kTypes) {
    for (const auto& [what, x] : rows) {
      const RowResult r = CheckRow(t, x, what);
      if (r.y.empty()) continue;
      if (what == "all zero") {
        for (int i = 0; i < n; ++i) ASSERT_EQ(r.y[i], 0.f) << Name(t) << " element " << i;
      }
      if (what.rfind("single nonzero", 0) == 0 && std::fabs(x[7]) < 1e37f) {
        // Alone in its (sub-)block, the value sits on a grid end: relative error from the f16
        // rounding of the scales only; the zeros stay within the bounds checked above. (3e38 is
        // beyond every format's range and saturates; 1e-20 below it and decodes to zero.)
        if (std::fabs(x[7]) > 1e-4f) {
          EXPECT_NEAR(r.y[7], x[7], 2e-3 * std::fabs(x[7])) << Name(t) << " " << what;
        }
      }
      if (what.rfind("1e30", 0) == 0 || what == "single nonzero 3e+38") {
        // Saturated to the grid end on the value's side; tiny elements decode to near zero.
        const int big = what == "1e30 and 1e-30" ? 3 : what == "single nonzero 3e+38" ? 7 : 77;
        EXPECT_GT(r.y[big], 1e5f) << Name(t) << " " << what;
        if (what == "1e30 and 1e-30") {
          // (Q4_1/Q5_1 reach down to their clamped offset -65504 only.)
          EXPECT_LE(r.y[200], -65504.f) << Name(t);
        }
      }
    }
  }
}

// RMS error on N(0,1) data: the figures measured at commit time (printed here), each ceiling a
// 3% margin above its figure (runs with fresh seeds move by ~0.5%); and the order the formats' bit
// budgets promise. For comparison, ggml's reference quantizers (llama.cpp b10056, no importance
// matrix, ggml_quantize_chunk) measured by an ad-hoc program on the same 2^18 N(0,1) values:
// Q4_0 0.0860 Q4_1 0.0784 Q5_0 0.0428 Q5_1 0.0379 Q8_0 0.00536 Q2_K 0.2967 Q3_K 0.1510
// Q4_K 0.0715 Q5_K 0.0362 Q6_K 0.0177 IQ4_NL 0.0762 IQ4_XS 0.0768 (ours: within +0.4% on Q4_K,
// equal on the 32-element formats, 1-7% lower on the rest).
TEST(QuantEncodeTest, RmsErrorOnNormalData) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const std::map<DType, double> kMeasured = {
      {DType::kQ4_0, 0.0859}, {DType::kQ4_1, 0.0783}, {DType::kQ5_0, 0.0427},
      {DType::kQ5_1, 0.0379}, {DType::kQ8_0, 0.00536}, {DType::kQ2_K, 0.2751},
      {DType::kQ3_K, 0.1455}, {DType::kQ4_K, 0.0717}, {DType::kQ5_K, 0.0358},
      {DType::kQ6_K, 0.0174}, {DType::kIQ4_NL, 0.0757}, {DType::kIQ4_XS, 0.0763}};
  const std::vector<float> x = Draw(rng, Dist::kNormal, 1 << 18);
  std::map<DType, double> rms;
  for (DType t : kTypes) {
    const RowResult r = CheckRow(t, x, "rms");
    rms[t] = std::sqrt(r.sum_sq / static_cast<double>(x.size()));
    std::printf("QuantizeRow %-6s RMS error on N(0,1): %.5f (ceiling %.5f)\n", Name(t).c_str(),
                rms[t], kMeasured.at(t) * 1.03);
    EXPECT_LE(rms[t], kMeasured.at(t) * 1.03) << Name(t);
  }
  EXPECT_GT(rms[DType::kQ2_K], rms[DType::kQ3_K]);
  EXPECT_GT(rms[DType::kQ3_K], rms[DType::kQ4_K]);
  EXPECT_GT(rms[DType::kQ4_K], rms[DType::kQ5_K]);
  EXPECT_GT(rms[DType::kQ5_K], rms[DType::kQ6_K]);
  EXPECT_GT(rms[DType::kQ6_K], rms[DType::kQ8_0]);
  EXPECT_GE(rms[DType::kQ4_0], rms[DType::kQ4_1] * 0.98);
  EXPECT_GE(rms[DType::kQ5_0], rms[DType::kQ5_1] * 0.98);
  EXPECT_GT(rms[DType::kQ4_0], rms[DType::kQ5_0]);
  EXPECT_LE(rms[DType::kIQ4_NL], rms[DType::kQ4_0]);
  EXPECT_LE(rms[DType::kQ4_K], rms[DType::kQ4_0]);
}

TEST(QuantEncodeTest, NonFiniteInputRefusedNamingTheElement) {
  const float kBad[] = {std::numeric_limits<float>::quiet_NaN(),
                        std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity()};
  const char* kText[] = {"nan", "inf", "-inf"};
  for (DType t : kTypes) {
    for (int k = 0; k < 3; ++k) {
      std::vector<float> x(512, 0.5f);
      x[37 + 100 * k] = kBad[k];
      x[400] = kBad[(k + 1) % 3];  // only the first bad element is named
      std::vector<uint8_t> q(DTypeRowBytes(t, 512));
      const Status s = QuantizeRow(t, x.data(), q.data(), 512);
      ASSERT_FALSE(s.ok()) << Name(t);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      const std::string want =
          "element " + std::to_string(37 + 100 * k) + " is " + kText[k] + " ";
      EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
      EXPECT_NE(s.message().find(Name(t)), std::string::npos) << s.message();
    }
  }
}

TEST(QuantEncodeTest, PartialBlockRefused) {
  std::vector<float> x(600, 1.f);
  std::vector<uint8_t> q(4096);
  for (DType t : kTypes) {
    const int64_t be = DTypeBlockElems(t);
    for (int64_t n : {be + 1, be - 1, int64_t{-be}}) {
      const Status s = QuantizeRow(t, x.data(), q.data(), n);
      ASSERT_FALSE(s.ok()) << Name(t) << " n " << n;
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("n = " + std::to_string(n) + " "), std::string::npos)
          << s.message();
      EXPECT_NE(s.message().find("of " + std::to_string(be)), std::string::npos) << s.message();
    }
    EXPECT_OK(QuantizeRow(t, x.data(), q.data(), 0));
  }
  const Status s = QuantizeRow(DType::kI32, x.data(), q.data(), 32);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("I32"), std::string::npos) << s.message();
}

// The Q8_0 rule other code depends on, written out: d = amax / 127, codes lround(x / d) with the
// unrounded scale, d stored as nearest f16.
void ReferenceQ8_0(const float* x, BlockQ8_0* b, int64_t nb) {
  for (int64_t j = 0; j < nb; ++j) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[j * 32 + i]));
    const float d = amax / 127.f;
    const float id = d > 0.f ? 1.f / d : 0.f;
    b[j].d = F32ToF16(d);
    for (int i = 0; i < 32; ++i) b[j].qs[i] = static_cast<int8_t>(std::lround(x[j * 32 + i] * id));
  }
}

TEST(QuantEncodeTest, Q8_0BytesMatchTheFromF32Rule) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (Dist d : {Dist::kNormal, Dist::kHeavy, Dist::kOutliers, Dist::kScaled}) {
    std::vector<float> x = Draw(rng, d, 64 * 32);
    x[5] = 0.f;
    std::fill(x.begin() + 64, x.begin() + 96, 0.f);  // one all-zero block
    for (int i = 96; i < 128; ++i) x[i] = 8e6f * (i % 2 ? 1.f : -0.5f);  // d near the f16 max
    const int64_t nb = static_cast<int64_t>(x.size()) / 32;
    std::vector<BlockQ8_0> want(nb), got(nb), from(nb);
    ReferenceQ8_0(x.data(), want.data(), nb);
    ASSERT_OK(QuantizeRow(DType::kQ8_0, x.data(), got.data(), nb * 32));
    FromF32(DType::kQ8_0, x.data(), from.data(), nb * 32);
    EXPECT_EQ(std::memcmp(want.data(), got.data(), nb * sizeof(BlockQ8_0)), 0) << DistName(d);
    EXPECT_EQ(std::memcmp(want.data(), from.data(), nb * sizeof(BlockQ8_0)), 0) << DistName(d);
  }
  // Beyond 127 * 65520 the old rule stored an Inf scale; now it clamps and saturates.
  std::vector<float> x(32, 1e9f);
  x[1] = -1e9f;
  BlockQ8_0 b;
  ASSERT_OK(QuantizeRow(DType::kQ8_0, x.data(), &b, 32));
  EXPECT_EQ(b.d, 0x7bff);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], -127);
}

TEST(QuantEncodeTest, FromF32RoutesBlockTypesToQuantizeRow) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const std::vector<float> x = Draw(rng, Dist::kNormal, 2 * kQK_K);
  for (DType t : kTypes) {
    std::vector<uint8_t> a(DTypeRowBytes(t, x.size())), b(a.size());
    ASSERT_OK(QuantizeRow(t, x.data(), a.data(), static_cast<int64_t>(x.size())));
    FromF32(t, x.data(), b.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(a, b) << Name(t);
  }
}

// Throughput on one thread (printed, not asserted: machines differ). CPU time of the process (the
// test is single-threaded), the best of 3 runs, so a loaded machine disturbs it less than wall time.
TEST(QuantEncodeTest, ThroughputReport) {
  Rng rng(7);
  const std::vector<float> x = Draw(rng, Dist::kNormal, 1 << 20);
  for (DType t : kTypes) {
    std::vector<uint8_t> q(DTypeRowBytes(t, x.size()));
    double s = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      const std::clock_t c0 = std::clock();
      ASSERT_OK(QuantizeRow(t, x.data(), q.data(), static_cast<int64_t>(x.size())));
      s = std::min(s, static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC);
    }
    s = std::max(s, 1e-6);
    std::printf("QuantizeRow %-6s %7.1f M values/s (%7.1f MB/s of f32) on 1 thread\n",
                Name(t).c_str(), x.size() / s / 1e6, x.size() * 4 / s / 1e6);
  }
}

}  // namespace
}  // namespace strata
