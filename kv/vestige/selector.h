// VestigeKV tier 1: the blockwise low-pass residual score sigma and the global top-m selection.
//
// Per closed block of `block` rows of one MLA layer, sigma_u = || x_u - lowpass(x)_u ||_2 over the
// selected channels (the last d_r branch columns, or every column for the "fullrow" ablation),
// where lowpass keeps the real-FFT bins [0, kappa) along the sequence axis (§2.1).
// Sigma is computed once when a block closes and never changes. The kept set of the closed
// prefix is the 4 sinks (positions [0, sinks), not counted against m) plus the global top-m of
// sigma over all closed rows, ties broken by (sigma descending, position ascending); m is
// recomputed at every close, so rows move both ways between kept and archived (§2.2).
//
// § numbers cite docs/reference/vestigekv.md (the reference behaviour).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv/vestige/capacity.h"

#include "core/status.h"
#include "kv/store.h"

namespace strata {

// The compression ratio R = 1/rho as an exact rational num/den (parsed from decimal text such as
// "32" or "1.5"), so that m = round_half_even(n_closed * den / num) is computed in integers.
struct VestigeRatio {
  int64_t num = 1;
  int64_t den = 1;
  // Non-decimal text (e.g. "1e3") falls back to a long double computation of n / R rounded to
  // nearest-even; exact for every R whose decimal form has at most 18 significant digits.
  bool exact = true;
  long double value = 1.0L;  // R (used only when !exact)

  // Parses "R" (R >= 1). InvalidArgument naming --ratio and the text when it is not a number or
  // is < 1.
  static StatusOr<VestigeRatio> Parse(const std::string& text);
  double AsDouble() const;
};

// m = max(1, round_half_even(n_closed / R)), capped at n_closed (0 when n_closed == 0).
int64_t VestigeBudget(int64_t n_closed, const VestigeRatio& ratio);

// sigma of one block: rows [0, n) of `rows` (n bf16 rows of width `row_width`, row u at
// rows + u * stride), channels [first_channel, row_width). Writes sigma[n] (f32).
// Requires kappa >= 1 and kappa < n / 2 (n even). For kappa <= kDirectMaxKappa (the shipped
// kappa = 16) the kept bins are a direct partial DFT on a real Fourier basis, analysis and
// synthesis as two register-tiled products over the rows in their natural layout
// (kernels/lowpass.h: 2 n (2 kappa - 1) C multiply-adds, ~8x cheaper than the FFT path at
// n = 4096, kappa = 16, C = 64). Above it, KissFFT's real FFT (float) per channel and the inverse of
// the zeroed spectrum evaluated directly from the kept bins (O(n kappa)). Scratch and tables are
// reused across calls by keeping a BlockSigma object.
class BlockSigma {
 public:
  static constexpr int kDirectMaxKappa = 64;
  // Which back-end computes sigma: by kappa (kAuto, the selector's), or forced (tests compare the
  // two on the same block; `bench attention --kind mla` times both in one run).
  enum class Path { kAuto, kDirect, kFft };
  void set_path(Path p) { path_ = p; }
  // A new object on the same path, with no scratch or tables (they are rebuilt on use, and the
  // results do not depend on them).
  BlockSigma Fresh() const {
    BlockSigma b;
    b.path_ = path_;
    return b;
  }

  BlockSigma() = default;
  ~BlockSigma();
  BlockSigma(const BlockSigma&) = delete;
  BlockSigma& operator=(const BlockSigma&) = delete;
  BlockSigma(BlockSigma&& o) noexcept;
  BlockSigma& operator=(BlockSigma&& o) noexcept;

  void Compute(const uint16_t* rows, int64_t stride, int64_t n, int row_width, int first_channel,
               int kappa, float* sigma);
  // For callers that gather the channels themselves: a [n, RowStride(C)] f32 buffer, row u's
  // channel c at u * RowStride(C) + c; the padding columns [C, RowStride(C)) are zero and must
  // stay zero. Fill rows [0, n), then ComputeRows.
  static int64_t RowStride(int C);
  float* RowBuffer(int C, int64_t n);
  // sigma[n] of the rows in RowBuffer(C, n) (read, not modified).
  void ComputeRows(int C, int64_t n, int kappa, float* sigma);

 private:
  void Plan(int64_t n);
  // The FFT path on channel-major columns cols [C, n].
  void ComputeColumnsFft(const float* cols, int C, int64_t n, int kappa, float* sigma);
  int64_t n_ = 0;
  void* fwd_ = nullptr;      // kiss_fftr_cfg
  void* inv_ = nullptr;      // kiss_fftr_cfg
  std::vector<float> rows_;  // [n, RowStride(C)] the block's channels, f32
  int rows_c_ = 0;
  std::vector<float> cols_;  // [channels, n] the block transposed (FFT path)
  std::vector<float> spec_;  // [n/2 + 1] complex as (re, im) pairs
  std::vector<float> low_;   // [n]
  std::vector<float> acc_;   // [n] running sum of squared residuals
  std::vector<float> tab_;   // [kappa - 1][cos n, sin n] synthesis tables (FFT path)
  int tab_kappa_ = 0;
  int64_t tab_n_ = 0;
  std::vector<float> basis_;  // kernels/lowpass.h basis (direct path)
  int basis_kappa_ = 0;
  int64_t basis_n_ = 0;
  std::vector<float> scratch_;
  Path path_ = Path::kAuto;
};

struct VestigeSelectorConfig {
  int64_t block = 4096;   // rows per closed block; a multiple of LayerStore::kPageRows
  int kappa = 16;         // low-pass bins kept, [0, kappa)
  int sinks = 4;          // positions [0, sinks) always kept, not counted against m
  bool full_row = false;  // false: the last d_r columns (branch); true: every column (ablation)
  VestigeRatio ratio;
};

// The selection state of one MLA layer: sigma of every closed row and the kept/archived split.
class VestigeSelector {
 public:
  VestigeSelector() = default;
  VestigeSelector(const VestigeSelectorConfig& cfg, int row_width, int branch_dim);
  // A deep copy of the selection (the sigma back-end's scratch fresh).
  VestigeSelector Clone() const {
    VestigeSelector c;
    c.cfg_ = cfg_;
    c.row_width_ = row_width_;
    c.first_channel_ = first_channel_;
    c.fft_ = fft_.Fresh();
    c.sigma_ = sigma_;
    c.kept_mask_ = kept_mask_;
    c.kept_ = kept_;
    c.archived_ = archived_;
    c.order_ = order_;
    ReserveAsIn(&c.sigma_, sigma_);
    ReserveAsIn(&c.kept_mask_, kept_mask_);
    ReserveAsIn(&c.kept_, kept_);
    ReserveAsIn(&c.archived_, archived_);
    ReserveAsIn(&c.order_, order_);
    return c;
  }

  int64_t n_closed() const { return static_cast<int64_t>(sigma_.size()); }
  // m for the current closed prefix.
  int64_t budget() const { return VestigeBudget(n_closed(), cfg_.ratio); }
  // Closes the next block: rows [n_closed, n_closed + block) of `store` (all must exist).
  // Computes its sigma; does not rebalance.
  void CloseBlock(const LayerStore& store);
  // Recomputes m and the kept set over all closed rows.
  void Rebalance();

  // [n_closed] f32, immutable once written.
  const std::vector<float>& sigma() const { return sigma_; }
  // Closed rows kept (sinks and top-m), ascending.
  const std::vector<int64_t>& kept() const { return kept_; }
  // Closed rows not kept, ascending.
  const std::vector<int64_t>& archived() const { return archived_; }
  // [n_closed] 1 when kept.
  const std::vector<uint8_t>& kept_mask() const { return kept_mask_; }
  // Bytes the selection holds: sigma, the mask and the kept/archived lists, allocated sizes
  // (13 bytes per closed row, plus slack).
  int64_t MetadataBytes() const;

 private:
  VestigeSelectorConfig cfg_;
  int row_width_ = 0;
  int first_channel_ = 0;
  BlockSigma fft_;
  std::vector<float> sigma_;
  std::vector<uint8_t> kept_mask_;
  std::vector<int64_t> kept_, archived_;
  // Scratch for the top-m selection (row indices; rows < 2^32), freed after each rebalance: held,
  // it would cost 8 more bytes per closed row (56 MB at 1M tokens x 7 layers).
  std::vector<uint32_t> order_;
};

}  // namespace strata
