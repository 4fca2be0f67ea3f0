// Strata's own quantizers for the ggml block formats (QuantizeRow, declared in core/quant.h).
//
// The approach per format (no importance matrix; every search minimises a weighted squared error
// with weights w = rms + |x|, a mild emphasis on large weights, near plain least squares):
//   Q8_0           the scale from the block's absolute max (core/dtype.cc's FromF32 rule, kept
//                  bit for bit: QuantizeRow calls it after the finite check).
//   Q4_0, Q5_0     the scale from the signed max (that element lands exactly on the most negative
//                  code), its f16 magnitude rounded up so the max never clips.
//   Q4_1, Q5_1     min/max: the f16 min rounded down, the step rounded up, so every element lies
//                  inside the grid.
//   Q2_K, Q4_K,    per sub-block a search over candidate steps (the grid stretched over the
//   Q5_K           sub-block's range with nmax + t levels, t on a small lattice), each refitted by
//                  weighted least squares of (step, offset), then two Lloyd passes; candidates whose
//                  grid clips the sub-block by more than half a step are rejected (the error
//                  bounds below rely on it). The sub-block steps and offsets are then quantized to
//                  6 bits (4 for Q2_K) against f16 super-block scales (magnitude rounded up so no
//                  sub-block scale clamps), and the codes recomputed as the nearest level of the
//                  decoded grid.
//   Q3_K, Q6_K     as above for the symmetric grids (signed sub-block scales, no offset).
//   IQ4_NL,        a search over scales d = xm / -(127 - t), t in [-7, 7] (xm: the signed max),
//   IQ4_XS         each refitted by least squares against the non-linear table; IQ4_XS then
//                  quantizes the 8 sub-block scales to 6 signed bits.
//
// Error bounds (per element, x the input, x^ the decoded value; s the decoded step of the element's
// (sub-)block; D, Dmin the decoded f16 super-block scales; plus f32 rounding of the decode). Every
// encoder picks each code as the nearest decoded level, so an element inside its (sub-)block's grid
// is within s/2 of x (IQ: half the widest table gap, 12 |dl|), and one outside decodes to the nearer
// end of the grid. Beyond that:
//   Q8_0:  |x - x^| <= s/2 + 127 (2^-11 s + 2^-25)   (codes from the unrounded scale)
//   Q4_0, Q5_0:  <= s          (the signed max lands on the wide end; the other side clips <= s)
//   Q4_1, Q5_1:  <= s/2        (nothing clips)
//   Q2_K, Q4_K, Q5_K:  <= s/2 + (nmax + 1/2) D/2 + Dmin/2   (the search clips <= half a step; the
//                      6/4-bit rounding of step and offset moves the grid ends by the rest)
//   Q3_K, Q6_K:  <= 3/2 s + (nn + 1/2) |D|   (nn = 4 resp. 32, the grid's negative reach)
//   IQ4_NL:  <= 21 |d|   (|d| >= |xm| / 134 and the table's positive end is 113)
//   IQ4_XS:  <= 21 |dl| + 134 |D|   (dl = D (ls - 32), the sub-block scale)
// These hold whenever no f16 scale had to be clamped. Scales beyond the f16 range are clamped to
// 65504 (offsets of Q4_1/Q5_1 to -65504): the grid then covers less than the data and elements
// beyond it saturate to the grid's end on their side (still the nearest level), e.g. Q4_0 can hold
// |x| <= 8 * 65504, Q4_K <= 15 * 63 * 65504. Tiny data whose scales fall below the f16 range get
// the smallest subnormal scale (or zero codes) and decode to (near) zero, within the bounds above.
// Each super-block is worked on scaled by a power of two (exact) that brings its absolute max into
// [1, 2), so the searches' sums of squares neither overflow (1e30) nor underflow (1e-30, denormals).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/quant.h"

namespace strata {
namespace {

constexpr float kF16Max = 65504.f;
constexpr uint16_t kF16MaxBits = 0x7bff;

// Round to nearest integer (ties to even) for |v| < 2^22: adding 1.5 * 2^23 moves the integer part
// into the low mantissa bits (the build has no -ffast-math, so the add and subtract both happen).
inline float RoundF(float v) { return (v + 12582912.f) - 12582912.f; }
inline float ClampF(float v, float lo, float hi) { return std::min(std::max(v, lo), hi); }
// Nearest integer code in [lo, hi] for v (any finite float or +-inf).
inline int Code(float v, float lo, float hi) { return static_cast<int>(RoundF(ClampF(v, lo, hi))); }

// f16 bits of a non-negative magnitude rounded up, clamped to the f16 max (see the header comment).
// A positive magnitude too small even for float still gets the smallest f16 subnormal, so a scale
// is zero only for an all-zero (sub-)block.
uint16_t F16MagUp(double v) {
  if (v >= kF16Max) return kF16MaxBits;
  const uint16_t h = F16RoundUp(static_cast<float>(v));
  return h == 0 && v > 0 ? uint16_t{1} : h;
}
// Same with the sign of `sign` (negative when sign < 0).
uint16_t F16SignedMagUp(double mag, double sign) {
  const uint16_t h = F16MagUp(mag);
  return sign < 0 ? static_cast<uint16_t>(h | 0x8000u) : h;
}

// Copies n values scaled by 2^-e (e: exponent of their absolute max) into out; returns e, or
// returns INT32_MIN and leaves out zero when every value is zero. Exact: power-of-two scaling of
// a finite float whose result is normal loses nothing; two factors keep each inside float range.
int Normalize(const float* x, int n, float* out) {
  float amax = 0.f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (amax == 0.f) {
    std::fill(out, out + n, 0.f);
    return INT32_MIN;
  }
  const int e = std::ilogb(amax);
  const int e1 = -e / 2, e2 = -e - e1;
  const float f1 = std::ldexp(1.f, e1), f2 = std::ldexp(1.f, e2);
  for (int i = 0; i < n; ++i) out[i] = (x[i] * f1) * f2;
  return e;
}

// Weights of the squared-error searches: rms of the (sub-)block plus |x|.
void Weights(const float* x, int n, float* w) {
  float s2 = 0.f;
  for (int i = 0; i < n; ++i) s2 += x[i] * x[i];
  const float rms = std::sqrt(s2 / static_cast<float>(n));
  for (int i = 0; i < n; ++i) w[i] = rms + std::fabs(x[i]);
}

// ---- asymmetric grids: x ~ a q + b, q in [0, nmax], a >= 0, b <= 0 ----

// The sums of the searches run in 4 independent lanes (n is a multiple of 4): the compiler turns
// each lane group into one vector operation without reassociating anything itself.
constexpr int kLanes = 4;
inline float Hsum(const float* v) { return (v[0] + v[1]) + (v[2] + v[3]); }

// For codes l = round(clamp((x - off) * scale, 0, nmax)): sums of w l, w l^2, w l x.
void AsymSums(const float* x, const float* w, int n, float off, float scale, float nmax,
              float* sl, float* sl2, float* slx) {
  float a[kLanes] = {}, b[kLanes] = {}, c[kLanes] = {};
  for (int i = 0; i < n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const float l = RoundF(ClampF((x[i + k] - off) * scale, 0.f, nmax));
      const float wl = w[i + k] * l;
      a[k] += wl;
      b[k] += wl * l;
      c[k] += wl * x[i + k];
    }
  }
  *sl = Hsum(a);
  *sl2 = Hsum(b);
  *slx = Hsum(c);
}

struct AsymFit {
  float a = 0.f;
  float b = 0.f;
};

struct Sums {
  float w = 0, wx = 0, wx2 = 0;
};

// Weighted squared error of the grid (a, b) for codes with sums sl, sl2, slx.
inline float AsymErr(const Sums& s, float a, float b, float sl, float sl2, float slx) {
  return s.wx2 + a * a * sl2 + b * b * s.w - 2.f * a * slx - 2.f * b * s.wx + 2.f * a * b * sl;
}

// Least-squares (a, b) for the codes summarised by sl, sl2, slx (b forced <= 0); false when
// degenerate. err gets the weighted squared error.
bool SolveAsym(const Sums& s, float sl, float sl2, float slx, AsymFit* f, float* err) {
  const float det = s.w * sl2 - sl * sl;
  float a, b;
  if (det > 0.f) {
    a = (s.w * slx - sl * s.wx) / det;
    b = (sl2 * s.wx - sl * slx) / det;
  } else {
    a = 0.f;
    b = 1.f;
  }
  if (b > 0.f) {
    if (sl2 <= 0.f) return false;
    b = 0.f;
    a = slx / sl2;
  }
  if (!(a > 0.f)) return false;
  f->a = a;
  f->b = b;
  *err = AsymErr(s, a, b, sl, sl2, slx);
  return true;
}

// The best (a, b) for one sub-block (normalized values x, weights w). Candidate steps stretch the
// sub-block's [min(min, 0), max] over nmax + t levels for t = t0, t0 + dt, ..., t0 + steps dt.
AsymFit FitAsym(const float* x, const float* w, int n, int nmax, float t0, float dt, int steps) {
  float mn = x[0], mx = x[0];
  Sums s;
  for (int i = 0; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
    s.w += w[i];
    s.wx += w[i] * x[i];
    s.wx2 += w[i] * x[i] * x[i];
  }
  mn = std::min(mn, 0.f);
  AsymFit best;
  if (mx <= mn) {  // all zero or all equal to a negative value
    best.b = mn;
    return best;
  }
  const float fmax = static_cast<float>(nmax);
  // The grid must cover [mn, mx] to within half a step on both sides.
  auto covers = [&](const AsymFit& f) {
    return mn >= f.b - 0.5f * f.a && mx <= f.b + (fmax + 0.5f) * f.a;
  };
  float sl, sl2, slx;
  // Baseline: the plain min/max grid (always covers).
  best.a = (mx - mn) / fmax;
  best.b = mn;
  AsymSums(x, w, n, mn, 1.f / best.a, fmax, &sl, &sl2, &slx);
  float best_err = AsymErr(s, best.a, best.b, sl, sl2, slx);
  for (int k = 0; k <= steps; ++k) {
    const float iscale = (fmax + t0 + dt * static_cast<float>(k)) / (mx - mn);
    AsymSums(x, w, n, mn, iscale, fmax, &sl, &sl2, &slx);
    AsymFit f;
    float err;
    if (SolveAsym(s, sl, sl2, slx, &f, &err) && err < best_err && covers(f)) {
      best = f;
      best_err = err;
    }
  }
  for (int it = 0; it < 2; ++it) {  // Lloyd passes: recode against the best grid and refit
    AsymSums(x, w, n, best.b, 1.f / best.a, fmax, &sl, &sl2, &slx);
    AsymFit f;
    float err;
    if (!(SolveAsym(s, sl, sl2, slx, &f, &err) && err < best_err && covers(f))) break;
    best = f;
    best_err = err;
  }
  return best;
}

// ---- symmetric grids: x ~ a q, q in [-nn, np] (a signed) ----

// For codes l = round(clamp(x * scale, -nn, np)): sums of w l^2 and w l x.
void SymSums(const float* x, const float* w, int n, float scale, float nn, float np, float* sl2,
             float* slx) {
  float b[kLanes] = {}, c[kLanes] = {};
  for (int i = 0; i < n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const float l = RoundF(ClampF(x[i + k] * scale, -nn, np));
      const float wl = w[i + k] * l;
      b[k] += wl * l;
      c[k] += wl * x[i + k];
    }
  }
  *sl2 = Hsum(b);
  *slx = Hsum(c);
}

// Candidate scales put the signed max xm at code -(nn + t); accepted grids reach |x| <= (nn + 1/2)
// |a| for every element (so the side of xm clips at most half a step).
float FitSym(const float* x, const float* w, int n, int nn_i, int np_i, float t0, float dt,
             int steps) {
  const float nn = static_cast<float>(nn_i), np = static_cast<float>(np_i);
  float xm = 0.f, amax = 0.f, wx2 = 0.f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      xm = x[i];
    }
    wx2 += w[i] * x[i] * x[i];
  }
  if (amax == 0.f) return 0.f;
  float sl2, slx;
  float best = xm / -nn;
  SymSums(x, w, n, 1.f / best, nn, np, &sl2, &slx);
  float best_err = wx2 - 2.f * best * slx + best * best * sl2;
  auto covers = [&](float a) { return amax <= (nn + 0.5f) * std::fabs(a); };
  auto try_codes = [&](float scale) {
    SymSums(x, w, n, scale, nn, np, &sl2, &slx);
    if (!(sl2 > 0.f)) return false;
    const float a = slx / sl2, err = wx2 - a * slx;
    if (a == 0.f || !(err < best_err) || !covers(a)) return false;
    best = a;
    best_err = err;
    return true;
  };
  for (int k = 0; k <= steps; ++k) try_codes(-(nn + t0 + dt * static_cast<float>(k)) / xm);
  for (int it = 0; it < 2; ++it) {
    if (!try_codes(1.f / best)) break;
  }
  return best;
}

// ---- the IQ4 non-linear table ----

// Index of the table value nearest v (v any float). Every midpoint between neighbouring table
// values is a multiple of 1/2, so on a lattice of half-unit buckets over [-128, 128) the nearest
// index is constant within a bucket (a value exactly on a midpoint is equally near both).
struct Iq4Lookup {
  uint8_t idx[512];  // bucket b covers [b / 2 - 128, b / 2 - 127.5)
  float val[512];    // kIq4nlValues[idx[b]]
  Iq4Lookup() {
    for (int b = 0; b < 512; ++b) {
      const float start = 0.5f * static_cast<float>(b) - 128.f;
      int c = 0;
      while (c < 15 && 0.5f * (kIq4nlValues[c] + kIq4nlValues[c + 1]) <= start) ++c;
      idx[b] = static_cast<uint8_t>(c);
      val[b] = kIq4nlValues[c];
    }
  }
  static int Bucket(float v) {  // (clamped v + 128) * 2 >= 0: truncation is floor
    return static_cast<int>((ClampF(v, -128.f, 127.75f) + 128.f) * 2.f);
  }
  int Nearest(float v) const { return idx[Bucket(v)]; }
  float NearestValue(float v) const { return val[Bucket(v)]; }
};
const Iq4Lookup& Iq4() {
  static const Iq4Lookup t;
  return t;
}

// Least-squares scale against the table for one block (normalized x, weights w). Returns the signed
// scale d (0 for an all-zero block); accepted scales satisfy |d| >= |xm| / 134.
float FitIq4(const float* x, const float* w, int n) {
  const Iq4Lookup& t = Iq4();
  float xm = 0.f, amax = 0.f, wx2 = 0.f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      xm = x[i];
    }
    wx2 += w[i] * x[i] * x[i];
  }
  if (amax == 0.f) return 0.f;
  auto fit = [&](float d, float* out_d) {
    const float id = 1.f / d;
    float sv2 = 0, svx = 0;
    for (int i = 0; i < n; ++i) {
      const float v = t.NearestValue(x[i] * id);
      sv2 += w[i] * v * v;
      svx += w[i] * v * x[i];
    }
    *out_d = svx / sv2;  // sv2 > 0: no table value is zero
    return wx2 - *out_d * svx;
  };
  float best = xm / -127.f;
  {  // baseline: the signed max exactly on -127 (error from the baseline codes, not refitted)
    const float id = 1.f / best;
    float e2 = 0.f;
    for (int i = 0; i < n; ++i) {
      const float e = best * t.NearestValue(x[i] * id) - x[i];
      e2 += w[i] * e * e;
    }
    float best_err = e2;
    for (int k = -7; k <= 7; ++k) {
      float d;
      const float err = fit(xm / static_cast<float>(k - 127), &d);
      if (err < best_err && std::fabs(d) * 134.f >= amax) {
        best = d;
        best_err = err;
      }
    }
    float d;
    const float err = fit(best, &d);  // one Lloyd pass
    if (err < best_err && std::fabs(d) * 134.f >= amax) best = d;
  }
  return best;
}

// ---- per-format encoders (src: whole blocks; finite input already checked) ----

// Q4_0 / Q5_0: signed-max scale, magnitude rounded up, codes nearest in [-half, half - 1].
template <int kBits>
void EncodeSymLegacy(const float* x, uint16_t* d_out, uint8_t* codes) {
  constexpr int half = 1 << (kBits - 1);
  float xm = 0.f, amax = 0.f;
  for (int i = 0; i < kQK; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      xm = x[i];
    }
  }
  const uint16_t dh = amax == 0.f ? 0 : F16SignedMagUp(static_cast<double>(amax) / half, -xm);
  *d_out = dh;
  const float d = F16ToF32(dh);
  const float id = d != 0.f ? 1.f / d : 0.f;
  for (int i = 0; i < kQK; ++i) {
    codes[i] = static_cast<uint8_t>(Code(x[i] * id, -half, half - 1) + half);
  }
}

// Q4_1 / Q5_1: offset = min rounded down, step = range rounded up; codes nearest in [0, 2^bits).
template <int kBits>
void EncodeAsymLegacy(const float* x, uint16_t* d_out, uint16_t* m_out, uint8_t* codes) {
  constexpr int nmax = (1 << kBits) - 1;
  float mn = x[0], mx = x[0];
  for (int i = 1; i < kQK; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  const uint16_t mh = mn <= -kF16Max ? static_cast<uint16_t>(kF16MaxBits | 0x8000u)
                                     : (mn >= kF16Max ? kF16MaxBits : F16RoundDown(mn));
  const float m = F16ToF32(mh);
  // In double: mx - m may exceed the float range (3e38 - -65504 is fine, but 3e38 - -3e38 is not).
  const double range = static_cast<double>(mx) - m;
  const uint16_t dh = range > 0 ? F16MagUp(range / nmax) : 0;
  *d_out = dh;
  *m_out = mh;
  const float d = F16ToF32(dh);
  const float id = d != 0.f ? 1.f / d : 0.f;
  for (int i = 0; i < kQK; ++i) {
    // (x - m) in double: x - m can exceed the float range when the offset is clamped.
    const double v = std::min(std::max((static_cast<double>(x[i]) - m) * id, 0.0), 1.0 * nmax);
    codes[i] = static_cast<uint8_t>(Code(static_cast<float>(v), 0.f, nmax));
  }
}

void PackNibbles32(const uint8_t* c, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>((c[j] & 0xf) | ((c[j + 16] & 0xf) << 4));
}
void PackHigh32(const uint8_t* c, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < 32; ++j) h |= static_cast<uint32_t>((c[j] >> 4) & 1) << j;
  std::memcpy(qh, &h, 4);
}

void EncodeQ4_0(const float* x, BlockQ4_0* b, int64_t nb) {
  uint8_t c[kQK];
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    uint16_t d;
    EncodeSymLegacy<4>(x, &d, c);
    b[i].d = d;
    PackNibbles32(c, b[i].qs);
  }
}
void EncodeQ5_0(const float* x, BlockQ5_0* b, int64_t nb) {
  uint8_t c[kQK];
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    uint16_t d;
    EncodeSymLegacy<5>(x, &d, c);
    b[i].d = d;
    PackNibbles32(c, b[i].qs);
    PackHigh32(c, b[i].qh);
  }
}
void EncodeQ4_1(const float* x, BlockQ4_1* b, int64_t nb) {
  uint8_t c[kQK];
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    uint16_t d, m;
    EncodeAsymLegacy<4>(x, &d, &m, c);
    b[i].d = d;
    b[i].m = m;
    PackNibbles32(c, b[i].qs);
  }
}
void EncodeQ5_1(const float* x, BlockQ5_1* b, int64_t nb) {
  uint8_t c[kQK];
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    uint16_t d, m;
    EncodeAsymLegacy<5>(x, &d, &m, c);
    b[i].d = d;
    b[i].m = m;
    PackNibbles32(c, b[i].qs);
    PackHigh32(c, b[i].qh);
  }
}

void EncodeIQ4_NL(const float* x, BlockIQ4_NL* b, int64_t nb) {
  const Iq4Lookup& t = Iq4();
  float xn[kQK], w[kQK];
  uint8_t c[kQK];
  for (int64_t i = 0; i < nb; ++i, x += kQK) {
    const int e = Normalize(x, kQK, xn);
    uint16_t dh = 0;
    if (e != INT32_MIN) {
      Weights(xn, kQK, w);
      const float dn = FitIq4(xn, w, kQK);
      dh = F16SignedMagUp(std::ldexp(std::fabs(static_cast<double>(dn)), e), dn);
    }
    b[i].d = dh;
    const float d = F16ToF32(dh);
    const float id = d != 0.f ? 1.f / d : 0.f;
    for (int j = 0; j < kQK; ++j) c[j] = static_cast<uint8_t>(d != 0.f ? t.Nearest(x[j] * id) : 8);
    PackNibbles32(c, b[i].qs);
  }
}

// Asymmetric K-quants: fills the per-sub-block 6-bit (or 4-bit) scales sc / mins m, the f16 d and
// dmin, and the codes q (element order). nsub sub-blocks of n = 256 / nsub; smax = 63 or 15.
struct AsymSuper {
  uint16_t d, dmin;
  uint8_t sc[16], m[16];
  uint8_t q[kQK_K];
};

void EncodeAsymSuper(const float* x, int nsub, int nmax, int smax, float t0, float dt, int steps,
                     AsymSuper* out) {
  const int n = kQK_K / nsub;
  float xn[kQK_K], w[kQK_K];
  const int e = Normalize(x, kQK_K, xn);
  std::memset(out, 0, sizeof(*out));
  if (e == INT32_MIN) return;  // all zero: zero scales and codes decode to 0
  AsymFit fit[16];
  float max_a = 0.f, max_m = 0.f;
  for (int j = 0; j < nsub; ++j) {
    Weights(xn + j * n, n, w + j * n);
    fit[j] = FitAsym(xn + j * n, w + j * n, n, nmax, t0, dt, steps);
    max_a = std::max(max_a, fit[j].a);
    max_m = std::max(max_m, -fit[j].b);
  }
  // Super-block scales in real units, magnitude rounded up (so a / d <= smax: no sub-scale clamps).
  out->d = max_a > 0.f ? F16MagUp(std::ldexp(static_cast<double>(max_a), e) / smax) : 0;
  out->dmin = max_m > 0.f ? F16MagUp(std::ldexp(static_cast<double>(max_m), e) / smax) : 0;
  // The same scales in the normalized units of xn (exact power-of-two scaling, in double).
  const double dn = std::ldexp(static_cast<double>(F16ToF32(out->d)), -e);
  const double mn = std::ldexp(static_cast<double>(F16ToF32(out->dmin)), -e);
  const float fs = static_cast<float>(smax);
  for (int j = 0; j < nsub; ++j) {
    const int sc = dn > 0 ? Code(static_cast<float>(fit[j].a / dn), 0.f, fs) : 0;
    const int m = mn > 0 ? Code(static_cast<float>(-fit[j].b / mn), 0.f, fs) : 0;
    out->sc[j] = static_cast<uint8_t>(sc);
    out->m[j] = static_cast<uint8_t>(m);
    const float step = static_cast<float>(dn * sc);
    const float off = static_cast<float>(mn * m);
    const float* xs = xn + j * n;
    uint8_t* q = out->q + j * n;
    if (step > 0.f) {
      const float is = 1.f / step;
      for (int i = 0; i < n; ++i) q[i] = static_cast<uint8_t>(Code((xs[i] + off) * is, 0.f, nmax));
    } else {
      for (int i = 0; i < n; ++i) q[i] = 0;
    }
  }
}

// Symmetric K-quants: signed sub-block scales sc in [-32, 31] (Q3_K) or [-128, 127] (Q6_K) times a
// signed f16 d chosen so the largest sub-scale lands on the negative end (-smin).
struct SymSuper {
  uint16_t d;
  int sc[16];
  int q[kQK_K];  // in [-nn, np]
};

void EncodeSymSuper(const float* x, int nn, int np, int smin, int smax, float t0, float dt,
                    int steps, SymSuper* out) {
  constexpr int nsub = 16, n = 16;
  float xn[kQK_K], w[kQK_K];
  const int e = Normalize(x, kQK_K, xn);
  std::memset(out, 0, sizeof(*out));
  if (e == INT32_MIN) return;
  float a[nsub], am = 0.f, amag = 0.f;
  for (int j = 0; j < nsub; ++j) {
    Weights(xn + j * n, n, w + j * n);
    a[j] = FitSym(xn + j * n, w + j * n, n, nn, np, t0, dt, steps);
    if (std::fabs(a[j]) > amag) {
      amag = std::fabs(a[j]);
      am = a[j];
    }
  }
  if (amag == 0.f) return;
  out->d = F16SignedMagUp(std::ldexp(static_cast<double>(amag), e) / smin, -am);
  const double dn = std::ldexp(static_cast<double>(F16ToF32(out->d)), -e);
  for (int j = 0; j < nsub; ++j) {
    const int sc = Code(static_cast<float>(a[j] / dn), static_cast<float>(-smin),
                        static_cast<float>(smax));
    out->sc[j] = sc;
    const float step = static_cast<float>(dn * sc);
    const float* xs = xn + j * n;
    int* q = out->q + j * n;
    if (step != 0.f) {
      const float is = 1.f / step;
      for (int i = 0; i < n; ++i) q[i] = Code(xs[i] * is, static_cast<float>(-nn), np);
    } else {
      for (int i = 0; i < n; ++i) q[i] = 0;
    }
  }
}

// The candidate lattices of the sub-block searches (t: extra levels the range is stretched over).
constexpr float kAsymT0 = -1.f, kAsymDt = 0.1f;
constexpr int kAsymSteps = 20;

void EncodeQ2_K(const float* x, BlockQ2_K* b, int64_t nb) {
  AsymSuper s;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    EncodeAsymSuper(x, 16, 3, 15, -0.5f, 0.1f, 15, &s);
    b[i].d = s.d;
    b[i].dmin = s.dmin;
    for (int j = 0; j < 16; ++j) b[i].scales[j] = static_cast<uint8_t>(s.sc[j] | (s.m[j] << 4));
    // Element 128 h + 32 k + l -> bits [2 k, 2 k + 2) of qs[32 h + l].
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    for (int el = 0; el < kQK_K; ++el) {
      const int h = el / 128, k = (el % 128) / 32, l = el % 32;
      b[i].qs[32 * h + l] |= static_cast<uint8_t>(s.q[el] << (2 * k));
    }
  }
}

void PackScalesK4(const uint8_t* sc, const uint8_t* m, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>((m[j] & 63) | ((m[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4));
  }
}

void EncodeQ4_K(const float* x, BlockQ4_K* b, int64_t nb) {
  AsymSuper s;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    EncodeAsymSuper(x, 8, 15, 63, kAsymT0, kAsymDt, kAsymSteps, &s);
    b[i].d = s.d;
    b[i].dmin = s.dmin;
    PackScalesK4(s.sc, s.m, b[i].scales);
    // Element 64 p + l -> low nibble of qs[32 p + l]; 64 p + 32 + l -> its high nibble.
    for (int p = 0; p < 4; ++p) {
      for (int l = 0; l < 32; ++l) {
        b[i].qs[32 * p + l] =
            static_cast<uint8_t>(s.q[64 * p + l] | (s.q[64 * p + 32 + l] << 4));
      }
    }
  }
}

void EncodeQ5_K(const float* x, BlockQ5_K* b, int64_t nb) {
  AsymSuper s;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    EncodeAsymSuper(x, 8, 31, 63, kAsymT0, kAsymDt, kAsymSteps, &s);
    b[i].d = s.d;
    b[i].dmin = s.dmin;
    PackScalesK4(s.sc, s.m, b[i].scales);
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    // As Q4_K for the low nibbles; bit 4 of element 64 p + l is bit 2 p of qh[l], of 64 p + 32 + l
    // bit 2 p + 1.
    for (int p = 0; p < 4; ++p) {
      for (int l = 0; l < 32; ++l) {
        const int lo = s.q[64 * p + l], hi = s.q[64 * p + 32 + l];
        b[i].qs[32 * p + l] = static_cast<uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
        b[i].qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1)));
      }
    }
  }
}

void EncodeQ3_K(const float* x, BlockQ3_K* b, int64_t nb) {
  SymSuper s;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    EncodeSymSuper(x, 4, 3, 32, 31, -1.f, 0.125f, 16, &s);
    b[i].d = s.d;
    // Scale j (stored + 32): low 4 bits in nibble j of bytes [0, 8), high 2 bits at bits
    // [2 (j / 4), +2) of byte 8 + j % 4.
    std::memset(b[i].scales, 0, sizeof(b[i].scales));
    for (int j = 0; j < 16; ++j) {
      const int v = s.sc[j] + 32;
      b[i].scales[j % 8] |= static_cast<uint8_t>((v & 0xf) << (j < 8 ? 0 : 4));
      b[i].scales[8 + j % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (j / 4)));
    }
    // Code c + 4 in [0, 8): low 2 bits of element 128 h + 32 k + l at bits [2 k, +2) of
    // qs[32 h + l], the high bit at bit 4 h + k of hmask[l].
    std::memset(b[i].qs, 0, sizeof(b[i].qs));
    std::memset(b[i].hmask, 0, sizeof(b[i].hmask));
    for (int el = 0; el < kQK_K; ++el) {
      const int h = el / 128, k = (el % 128) / 32, l = el % 32;
      const int c = s.q[el] + 4;
      b[i].qs[32 * h + l] |= static_cast<uint8_t>((c & 3) << (2 * k));
      b[i].hmask[l] |= static_cast<uint8_t>((c >> 2) << (4 * h + k));
    }
  }
}

void EncodeQ6_K(const float* x, BlockQ6_K* b, int64_t nb) {
  SymSuper s;
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    EncodeSymSuper(x, 32, 31, 128, 127, -0.9f, 0.1f, 18, &s);
    b[i].d = s.d;
    for (int j = 0; j < 16; ++j) b[i].scales[j] = static_cast<int8_t>(s.sc[j]);
    // Code c + 32 of element 128 h + 32 k + l: low nibble in ql[64 h + l + 32 (k % 2)] (low half
    // for k < 2, high for k >= 2), high 2 bits at bits [2 k, +2) of qh[32 h + l].
    std::memset(b[i].ql, 0, sizeof(b[i].ql));
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int el = 0; el < kQK_K; ++el) {
      const int h = el / 128, k = (el % 128) / 32, l = el % 32;
      const int c = s.q[el] + 32;
      b[i].ql[64 * h + l + 32 * (k % 2)] |= static_cast<uint8_t>((c & 0xf) << (k < 2 ? 0 : 4));
      b[i].qh[32 * h + l] |= static_cast<uint8_t>((c >> 4) << (2 * k));
    }
  }
}

void EncodeIQ4_XS(const float* x, BlockIQ4_XS* b, int64_t nb) {
  const Iq4Lookup& t = Iq4();
  float xn[kQK_K], w[kQK_K];
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    std::memset(&b[i], 0, sizeof(b[i]));
    const int e = Normalize(x, kQK_K, xn);
    float dj[8] = {}, dm = 0.f, dmag = 0.f;
    if (e != INT32_MIN) {
      for (int j = 0; j < 8; ++j) {
        Weights(xn + 32 * j, 32, w + 32 * j);
        dj[j] = FitIq4(xn + 32 * j, w + 32 * j, 32);
        if (std::fabs(dj[j]) > dmag) {
          dmag = std::fabs(dj[j]);
          dm = dj[j];
        }
      }
    }
    uint16_t dh = 0;
    if (dmag > 0.f) dh = F16SignedMagUp(std::ldexp(static_cast<double>(dmag), e) / 32.0, -dm);
    b[i].d = dh;
    const double dn = dh ? std::ldexp(static_cast<double>(F16ToF32(dh)), -e) : 0.0;
    for (int j = 0; j < 8; ++j) {
      const int ls = dn != 0 ? Code(static_cast<float>(dj[j] / dn), -32.f, 31.f) : 0;
      b[i].scales_l[j / 2] |= static_cast<uint8_t>(((ls + 32) & 0xf) << (4 * (j % 2)));
      b[i].scales_h |= static_cast<uint16_t>(((ls + 32) >> 4) << (2 * j));
      const float dl = static_cast<float>(dn * ls);
      const float id = dl != 0.f ? 1.f / dl : 0.f;
      uint8_t c[32];
      for (int k = 0; k < 32; ++k) c[k] = static_cast<uint8_t>(dl != 0.f ? t.Nearest(xn[32 * j + k] * id) : 8);
      PackNibbles32(c, b[i].qs + 16 * j);
    }
  }
}

}  // namespace

Status QuantizeRow(DType t, const float* src, void* dst, int64_t n) {
  const bool is_float = t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
  if (!IsQuantized(t) && !is_float) {
    return InvalidArgument("QuantizeRow: cannot encode f32 into " + std::string(DTypeName(t)));
  }
  const int64_t be = DTypeBlockElems(t);
  if (n < 0 || n % be != 0) {
    return InvalidArgument("QuantizeRow " + std::string(DTypeName(t)) + ": n = " +
                           std::to_string(n) + " is not a whole number of blocks of " +
                           std::to_string(be));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(src[i])) {
      char v[32];
      std::snprintf(v, sizeof(v), "%g", static_cast<double>(src[i]));
      return InvalidArgument("QuantizeRow " + std::string(DTypeName(t)) + ": element " +
                             std::to_string(i) + " is " + v + " (not finite)");
    }
  }
  const int64_t nb = n / be;
  switch (t) {
    case DType::kQ4_0: EncodeQ4_0(src, static_cast<BlockQ4_0*>(dst), nb); break;
    case DType::kQ4_1: EncodeQ4_1(src, static_cast<BlockQ4_1*>(dst), nb); break;
    case DType::kQ5_0: EncodeQ5_0(src, static_cast<BlockQ5_0*>(dst), nb); break;
    case DType::kQ5_1: EncodeQ5_1(src, static_cast<BlockQ5_1*>(dst), nb); break;
    case DType::kQ2_K: EncodeQ2_K(src, static_cast<BlockQ2_K*>(dst), nb); break;
    case DType::kQ3_K: EncodeQ3_K(src, static_cast<BlockQ3_K*>(dst), nb); break;
    case DType::kQ4_K: EncodeQ4_K(src, static_cast<BlockQ4_K*>(dst), nb); break;
    case DType::kQ5_K: EncodeQ5_K(src, static_cast<BlockQ5_K*>(dst), nb); break;
    case DType::kQ6_K: EncodeQ6_K(src, static_cast<BlockQ6_K*>(dst), nb); break;
    case DType::kIQ4_NL: EncodeIQ4_NL(src, static_cast<BlockIQ4_NL*>(dst), nb); break;
    case DType::kIQ4_XS: EncodeIQ4_XS(src, static_cast<BlockIQ4_XS*>(dst), nb); break;
    default:  // Q8_0 and the float types: FromF32's rule (Q8_0 bit for bit with it)
      FromF32(t, src, dst, n);
  }
  return OkStatus();
}

}  // namespace strata
