#include "kv/vestige/selector.h"

#include <kissfft/kiss_fftr.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/lowpass.h"

namespace strata {

StatusOr<VestigeRatio> VestigeRatio::Parse(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("--ratio = '" + text + "' " + why);
  };
  VestigeRatio r;
  // Plain decimal "D[.D]": exact rational.
  size_t i = 0;
  __int128 num = 0, den = 1;
  int digits = 0;
  bool seen_dot = false, any = false, decimal = !text.empty();
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.' && !seen_dot) {
      seen_dot = true;
      continue;
    }
    if (c < '0' || c > '9') {
      decimal = false;
      break;
    }
    any = true;
    if (num == 0 && c == '0') {
      if (seen_dot) den *= 10;
      continue;  // leading zeros are not significant
    }
    if (++digits > 18) {
      decimal = false;
      break;
    }
    num = num * 10 + (c - '0');
    if (seen_dot) den *= 10;
  }
  if (decimal && any && den <= static_cast<__int128>(1000000000000000000LL)) {
    if (num < den) return bad("must be >= 1 (the compression ratio R = 1/rho)");
    const int64_t n = static_cast<int64_t>(num), d = static_cast<int64_t>(den);
    const int64_t g = std::gcd(n, d);
    r.num = n / g;
    r.den = d / g;
    r.exact = true;
    r.value = static_cast<long double>(r.num) / r.den;
    return r;
  }
  // Anything else strtold accepts (exponents, many digits): long double, documented as inexact.
  char* end = nullptr;
  const long double v = std::strtold(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v)) return bad("is not a number");
  if (!(v >= 1.0L)) return bad("must be >= 1 (the compression ratio R = 1/rho)");
  r.exact = false;
  r.value = v;
  return r;
}

double VestigeRatio::AsDouble() const {
  return exact ? static_cast<double>(num) / static_cast<double>(den) : static_cast<double>(value);
}

int64_t VestigeBudget(int64_t n_closed, const VestigeRatio& ratio) {
  STRATA_CHECK(n_closed >= 0);
  if (n_closed == 0) return 0;
  int64_t m;
  if (ratio.exact) {
    // n_closed / R = n_closed * den / num, rounded half to even, in exact integer arithmetic.
    const __int128 a = static_cast<__int128>(n_closed) * ratio.den;
    const __int128 q = a / ratio.num, rem = a % ratio.num;
    __int128 r = q;
    if (2 * rem > ratio.num || (2 * rem == ratio.num && (q & 1))) r = q + 1;
    m = static_cast<int64_t>(r);
  } else {
    // nearbyintl rounds to nearest-even under the default rounding mode.
    const int old = std::fegetround();
    std::fesetround(FE_TONEAREST);
    m = static_cast<int64_t>(std::nearbyintl(static_cast<long double>(n_closed) / ratio.value));
    std::fesetround(old);
  }
  return std::min(n_closed, std::max<int64_t>(1, m));
}

BlockSigma::~BlockSigma() {
  if (fwd_) kiss_fftr_free(fwd_);
  if (inv_) kiss_fftr_free(inv_);
}

BlockSigma::BlockSigma(BlockSigma&& o) noexcept { *this = std::move(o); }

BlockSigma& BlockSigma::operator=(BlockSigma&& o) noexcept {
  if (this != &o) {
    if (fwd_) kiss_fftr_free(fwd_);
    if (inv_) kiss_fftr_free(inv_);
    n_ = o.n_;
    fwd_ = o.fwd_;
    inv_ = o.inv_;
    o.n_ = 0;
    o.fwd_ = o.inv_ = nullptr;
    rows_ = std::move(o.rows_);
    rows_c_ = o.rows_c_;
    cols_ = std::move(o.cols_);
    spec_ = std::move(o.spec_);
    low_ = std::move(o.low_);
    acc_ = std::move(o.acc_);
    tab_ = std::move(o.tab_);
    tab_kappa_ = o.tab_kappa_;
    tab_n_ = o.tab_n_;
    o.tab_kappa_ = 0;
    o.tab_n_ = 0;
    basis_ = std::move(o.basis_);
    basis_kappa_ = o.basis_kappa_;
    basis_n_ = o.basis_n_;
    o.basis_kappa_ = 0;
    o.basis_n_ = 0;
    scratch_ = std::move(o.scratch_);
    path_ = o.path_;
  }
  return *this;
}

void BlockSigma::Plan(int64_t n) {
  if (n == n_) return;
  if (fwd_) kiss_fftr_free(fwd_);
  if (inv_) kiss_fftr_free(inv_);
  fwd_ = kiss_fftr_alloc(static_cast<int>(n), 0, nullptr, nullptr);
  inv_ = kiss_fftr_alloc(static_cast<int>(n), 1, nullptr, nullptr);
  STRATA_CHECK(fwd_ != nullptr && inv_ != nullptr);
  n_ = n;
  spec_.assign(2 * (n / 2 + 1), 0.f);
  low_.assign(n, 0.f);
  acc_.assign(n, 0.f);
}

int64_t BlockSigma::RowStride(int C) {
  return (static_cast<int64_t>(C) + kLowpassPad - 1) / kLowpassPad * kLowpassPad;
}

float* BlockSigma::RowBuffer(int C, int64_t n) {
  const size_t size = static_cast<size_t>(n) * RowStride(C);
  if (rows_c_ != C || rows_.size() != size) {
    rows_.assign(size, 0.f);  // zero padding columns; rows are overwritten by the caller
    rows_c_ = C;
  }
  return rows_.data();
}

void BlockSigma::Compute(const uint16_t* rows, int64_t stride, int64_t n, int row_width,
                         int first_channel, int kappa, float* sigma) {
  STRATA_CHECK(n >= 2 && n % 2 == 0);
  STRATA_CHECK(kappa >= 1 && kappa < n / 2);
  STRATA_CHECK(first_channel >= 0 && first_channel < row_width);
  const int C = row_width - first_channel;
  const int64_t ld = RowStride(C);
  float* x = RowBuffer(C, n);
  for (int64_t u = 0; u < n; ++u) {  // bf16 -> f32 is exact
    const uint16_t* r = rows + u * stride + first_channel;
    for (int c = 0; c < C; ++c) x[u * ld + c] = Bf16ToF32(r[c]);
  }
  ComputeRows(C, n, kappa, sigma);
}

void BlockSigma::ComputeRows(int C, int64_t n, int kappa, float* sigma) {
  STRATA_CHECK(n >= 2 && n % 2 == 0);
  STRATA_CHECK(kappa >= 1 && kappa < n / 2);
  STRATA_CHECK(rows_c_ == C && rows_.size() == static_cast<size_t>(n) * RowStride(C));
  const int64_t ld = RowStride(C);
  const bool direct =
      path_ == Path::kDirect || (path_ == Path::kAuto && kappa <= kDirectMaxKappa);
  if (direct) {
    if (basis_kappa_ != kappa || basis_n_ != n) {
      basis_ = LowpassBasis(n, kappa);
      basis_kappa_ = kappa;
      basis_n_ = n;
    }
    LowpassResidualNorms(rows_.data(), ld, n, C, basis_.data(), kappa, &scratch_, sigma);
    return;
  }
  // Many bins: an FFT per channel on the transposed block.
  // Transposed in tiles of 16 rows so every channel receives whole 64-byte lines (a row-at-a-time
  // scatter with a 4n-byte stride thrashes the cache and costs 3x the FFTs).
  cols_.resize(static_cast<size_t>(C) * n);
  constexpr int64_t kTile = 16;
  for (int64_t u0 = 0; u0 < n; u0 += kTile) {
    const int64_t u1 = std::min(n, u0 + kTile);
    for (int c = 0; c < C; ++c) {
      float* dst = cols_.data() + static_cast<size_t>(c) * n;
      for (int64_t u = u0; u < u1; ++u) dst[u] = rows_[u * ld + c];
    }
  }
  ComputeColumnsFft(cols_.data(), C, n, kappa, sigma);
}

void BlockSigma::ComputeColumnsFft(const float* cols, int C, int64_t n, int kappa, float* sigma) {
  STRATA_CHECK(n >= 2 && n % 2 == 0);
  STRATA_CHECK(kappa >= 1 && kappa < n / 2);
  Plan(n);
  std::fill(acc_.begin(), acc_.end(), 0.f);
  auto* spec = reinterpret_cast<kiss_fft_cpx*>(spec_.data());
  const float inv_n = 1.0f / static_cast<float>(n);  // KissFFT's inverse is unnormalised
  // Synthesis tables for the kept bins 1..kappa-1: cos/sin(2 pi k u / n), from f64.
  if (tab_kappa_ != kappa || tab_n_ != n) {
    tab_.assign(static_cast<size_t>(2) * (kappa - 1) * n, 0.f);
    for (int k = 1; k < kappa; ++k) {
      float* ct = tab_.data() + static_cast<size_t>(2 * (k - 1)) * n;
      float* st = ct + n;
      for (int64_t u = 0; u < n; ++u) {
        const double t = 2 * M_PI * static_cast<double>((k * u) % n) / static_cast<double>(n);
        ct[u] = static_cast<float>(std::cos(t));
        st[u] = static_cast<float>(std::sin(t));
      }
    }
    tab_kappa_ = kappa;
    tab_n_ = n;
  }
  // Channels go in groups of kGroup so that one table row (cos and sin, 2 x 4n bytes) is reused
  // from L1 by every channel of the group instead of streaming the whole table per channel.
  constexpr int kGroup = 8;
  low_.resize(static_cast<size_t>(kGroup) * n);
  float* acc = acc_.data();
  for (int c0 = 0; c0 < C; c0 += kGroup) {
    const int G = std::min(kGroup, C - c0);
    float re[kGroup], im[kGroup];
    kiss_fft_cpx bins[kGroup][64];  // the kept bins of each channel (kappa <= 64 here)
    std::vector<kiss_fft_cpx> big;  // kappa > 64: rare, kept general
    kiss_fft_cpx* kept = &bins[0][0];
    int stride = 64;
    if (kappa > 64) {
      big.resize(static_cast<size_t>(kGroup) * kappa);
      kept = big.data();
      stride = kappa;
    }
    for (int g = 0; g < G; ++g) {
      kiss_fftr(static_cast<kiss_fftr_cfg>(fwd_), cols + static_cast<size_t>(c0 + g) * n, spec);
      std::memcpy(kept + static_cast<size_t>(g) * stride, spec, sizeof(kiss_fft_cpx) * kappa);
      // The inverse of the low-passed spectrum (bins >= kappa zeroed), evaluated directly from
      // the kept bins: low_u = (X_0 + 2 sum_{0<k<kappa} Re(X_k e^{2 pi i k u / n})) / n — what an
      // inverse FFT of the zeroed spectrum computes (KissFFT's inverse is unnormalised: 1/n).
      float* low = low_.data() + static_cast<size_t>(g) * n;
      const float x0 = kept[static_cast<size_t>(g) * stride].r * inv_n;
      for (int64_t u = 0; u < n; ++u) low[u] = x0;
    }
    for (int k = 1; k < kappa; ++k) {
      const float* ct = tab_.data() + static_cast<size_t>(2 * (k - 1)) * n;
      const float* st = ct + n;
      for (int g = 0; g < G; ++g) {
        re[g] = 2 * kept[static_cast<size_t>(g) * stride + k].r * inv_n;
        im[g] = 2 * kept[static_cast<size_t>(g) * stride + k].i * inv_n;
        float* low = low_.data() + static_cast<size_t>(g) * n;
        const float a = re[g], b = im[g];
        for (int64_t u = 0; u < n; ++u) low[u] += a * ct[u] - b * st[u];
      }
    }
    for (int g = 0; g < G; ++g) {
      const float* x = cols + static_cast<size_t>(c0 + g) * n;
      const float* low = low_.data() + static_cast<size_t>(g) * n;
      for (int64_t u = 0; u < n; ++u) {
        const float e = x[u] - low[u];
        acc[u] += e * e;
      }
    }
  }
  for (int64_t u = 0; u < n; ++u) sigma[u] = std::sqrt(acc_[u]);
}

VestigeSelector::VestigeSelector(const VestigeSelectorConfig& cfg, int row_width, int branch_dim)
    : cfg_(cfg), row_width_(row_width) {
  STRATA_CHECK(cfg.block >= LayerStore::kPageRows && cfg.block % LayerStore::kPageRows == 0);
  STRATA_CHECK(cfg.kappa >= 1 && cfg.kappa < cfg.block / 2 && cfg.sinks >= 0);
  STRATA_CHECK(branch_dim >= 1 && branch_dim <= row_width);
  first_channel_ = cfg.full_row ? 0 : row_width - branch_dim;
}

void VestigeSelector::CloseBlock(const LayerStore& store) {
  const int64_t b = n_closed(), n = cfg_.block;
  STRATA_CHECK(store.n_rows() >= b + n);
  STRATA_CHECK(store.geometry().k_dim == row_width_);
  // Grown with at most 1/16 of slack (doubling would hold up to twice the sigma of a long cache).
  if (b + n > static_cast<int64_t>(sigma_.capacity())) {
    sigma_.reserve(std::max<size_t>(b + n, sigma_.capacity() + sigma_.capacity() / 16));
  }
  sigma_.resize(b + n);
  // Gather the block's selected channels straight from the store into [n, RowStride(C)] f32 rows
  // (rows live in 64-row pages, so they are read one row at a time; bf16 -> f32 is exact).
  const int C = row_width_ - first_channel_;
  const int64_t ld = BlockSigma::RowStride(C);
  float* x = fft_.RowBuffer(C, n);
  for (int64_t u = 0; u < n; ++u) {
    const uint16_t* r = store.key_row(0, b + u) + first_channel_;
    float* dst = x + u * ld;
    for (int c = 0; c < C; ++c) dst[c] = Bf16ToF32(r[c]);
  }
  fft_.ComputeRows(C, n, cfg_.kappa, sigma_.data() + b);
}

void VestigeSelector::Rebalance() {
  const int64_t n = n_closed();
  const int64_t m = budget();
  kept_mask_.assign(n, 0);
  if (m >= n) {
    std::fill(kept_mask_.begin(), kept_mask_.end(), 1);
  } else if (m > 0) {
    STRATA_CHECK(n <= int64_t{UINT32_MAX});
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), uint32_t{0});
    // NaN sorts as +inf (a non-finite row is kept rather than silently archived).
    auto key = [&](uint32_t u) {
      const float s = sigma_[u];
      return std::isnan(s) ? INFINITY : s;
    };
    auto before = [&](uint32_t a, uint32_t b) {
      const float ka = key(a), kb = key(b);
      return ka > kb || (ka == kb && a < b);  // sigma descending, position ascending
    };
    std::nth_element(order_.begin(), order_.begin() + (m - 1), order_.end(), before);
    for (int64_t i = 0; i < m; ++i) kept_mask_[order_[i]] = 1;
    std::vector<uint32_t>().swap(order_);
  }
  for (int64_t u = 0; u < std::min<int64_t>(cfg_.sinks, n); ++u) kept_mask_[u] = 1;
  // Sized exactly (push_back's doubling would hold up to 16 more bytes per closed row).
  const int64_t n_kept = std::count(kept_mask_.begin(), kept_mask_.end(), uint8_t{1});
  kept_.clear();
  archived_.clear();
  kept_.reserve(n_kept);
  archived_.reserve(n - n_kept);
  for (int64_t u = 0; u < n; ++u) (kept_mask_[u] ? kept_ : archived_).push_back(u);
}

int64_t VestigeSelector::MetadataBytes() const {
  return static_cast<int64_t>(sigma_.capacity() * sizeof(float) + kept_mask_.capacity() +
                              (kept_.capacity() + archived_.capacity()) * sizeof(int64_t) +
                              order_.capacity() * sizeof(uint32_t));
}

}  // namespace strata
