// VestigeKV tier 2: the recall index and its scan (see recall.h).
//
// The scan kernels (tile dots, fire test, row scores; their version log) live in
// kernels/recall_scan.{h,cc} on plain views; this file builds those views from the tier and the
// LayerStore (KernelSource below, the RecallScanView in IndexScores and Scan).
#include "kv/vestige/recall.h"

#include "kv/vestige/capacity.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>

#include "core/buffer.h"
#include "core/check.h"
#include "core/dtype.h"
#include "kernels/ops.h"
#include "kernels/recall_scan.h"
#include "kv/vestige/calibration.h"

namespace strata {
namespace recall_internal {

// Where rows come from: the store, or the policy's reader when one is installed.
struct RowSrc {
  const LayerStore* store = nullptr;
  const RecallRowReader* reader = nullptr;  // null or empty: store.key_row(0, u)
  const uint16_t* sidecar = nullptr;        // [n_indexed, d_r] branch copy, or null
  int k_dim = 0;
};
inline const uint16_t* GetRow(const RowSrc& s, int64_t u, uint16_t* scratch) {
  if (s.reader != nullptr && *s.reader) return (*s.reader)(u, scratch);
  return s.store->key_row(0, u);
}

// The kernels' view of a row source: rows through GetRow. A store page holds kPageRows consecutive
// rows k_dim apart and a 16-row tile never straddles pages, so the store's tiles are strided (one
// row() per tile, prefetched ahead); a reader's rows come row by row. `s` must outlive the view.
inline RecallRowSource KernelSource(const RowSrc& s) {
  static_assert(LayerStore::kPageRows % kRecallTileRows == 0, "a tile lies in one page");
  RecallRowSource v;
  v.row = [](const void* ctx, int64_t u, uint16_t* scratch) {
    return GetRow(*static_cast<const RowSrc*>(ctx), u, scratch);
  };
  v.ctx = &s;
  v.k_dim = s.k_dim;
  v.tile_row_stride = (s.reader != nullptr && *s.reader) ? 0 : s.k_dim;
  v.branch_sidecar = s.sidecar;
  return v;
}

}  // namespace recall_internal

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kF16Limit = 6e4f;  // |csk|, |qsk| must stay below this (f16 max is 65504)

// out [G, n]: lam * q_h . row for rows (or [begin, begin + n)), multi-threaded over rows.
void ScoreRows(const recall_internal::RowSrc& src, const float* q, int G, const int64_t* rows,
               int64_t begin, int64_t n, float lam, float* out, ThreadPool* pool) {
  const RecallRowSource view = recall_internal::KernelSource(src);
  ParallelForOrInline(pool, n, 64, [&](int64_t b, int64_t e, int) {
    RecallScoreRows(q, G, view, rows ? rows + b : nullptr, begin + b, e - b, lam, out + b, n);
  });
}

recall_internal::RowSrc StoreSrc(const LayerStore& store) {
  recall_internal::RowSrc s;
  s.store = &store;
  s.k_dim = store.geometry().k_dim;
  return s;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// Options

std::string_view RecallCalibrationName(RecallCalibration c) {
  return c == RecallCalibration::kPrefix ? "prefix" : "decode";
}
std::string_view RecallZFloorName(RecallZFloor f) { return f == RecallZFloor::kNone ? "none" : "0"; }

std::vector<SettingDecl> RecallSettingDecls() {
  const RecallOptions o;
  return {
      SettingDecl::Int("rank", o.rank,
                       "recall: basis rank r; when not given, 64 lowered until the index (2r + 4 + "
                       "2 d_r bytes per archived row) is at most 1/4 of the row, min 8")
          .Min(8)
          .Constraint("a multiple of 8, <= d_c")
          .Alias("recall-rank")
          .Shared(),
      SettingDecl::Int("recall-capacity", o.capacity,
                       "recall: fetch buffer rows; an overflow reads densely (or truncates)")
          .Min(1)
          .Shared(),
      SettingDecl::Real("recall-margin", o.margin, "recall: a row fires iff score > max1 - margin")
          .Min(0),
      SettingDecl::Enum("recall-overflow", o.truncate ? "truncate" : "fallback",
                        {"fallback", "truncate"},
                        "recall: more fired rows than the buffer: dense fallback or truncate"),
      SettingDecl::Enum("calibration", std::string(RecallCalibrationName(o.calibration)),
                        {"prefix", "decode"},
                        "recall: the threshold is calibrated on prompt or on decode queries")
          .Shared(),
      SettingDecl::Enum("z-floor", std::string(RecallZFloorName(o.z_floor)), {"none", "0"},
                        "recall: floor of the calibrated threshold z (0: never below 0)"),
      SettingDecl::Int("calib-queries", o.prefix_max_queries,
                       "recall: prompt queries labelled for calibration (0: all)")
          .Min(0),
      SettingDecl::Bool("recall-sidecar", o.branch_sidecar,
                        "recall: the scan keeps its own bf16 copy of the branch (always on with "
                        "archive=file:DIR)"),
  };
}

StatusOr<RecallOptions> RecallOptions::FromSpec(const PolicySpec& spec) {
  PolicySettings decl;
  decl.policy = spec.name.empty() ? "recall" : spec.name;
  decl.settings = RecallSettingDecls();
  ASSIGN_OR_RETURN(const ResolvedSettings s, ResolveSettings(decl, spec.settings));
  return FromSettings(s);
}

StatusOr<RecallOptions> RecallOptions::FromSettings(const ResolvedSettings& s) {
  RecallOptions o;
  const int64_t rank = s.Int("rank");
  o.capacity = s.Int("recall-capacity");
  o.margin = static_cast<float>(s.Real("recall-margin"));
  o.prefix_max_queries = static_cast<int>(s.Int("calib-queries"));
  o.branch_sidecar = s.Bool("recall-sidecar");
  o.rank = static_cast<int>(rank);
  o.truncate = s.text("recall-overflow") == "truncate";
  o.calibration =
      s.text("calibration") == "decode" ? RecallCalibration::kDecode : RecallCalibration::kPrefix;
  o.z_floor = s.text("z-floor") == "none" ? RecallZFloor::kNone : RecallZFloor::kZero;
  if (rank < 8 || rank % 8 != 0 || rank > (1 << 20)) {
    return InvalidArgument("--recall-rank must be a positive multiple of 8, got " +
                           std::to_string(rank));
  }
  return o;
}

Status RecallOptions::Validate(int d_c) const {
  if (rank < 8 || rank % 8 != 0 || rank > d_c) {
    return InvalidArgument("--recall-rank must be a multiple of 8 in [8, " + std::to_string(d_c) +
                           "], got " + std::to_string(rank));
  }
  if (capacity < 1) {
    return InvalidArgument("--recall-capacity must be >= 1, got " + std::to_string(capacity));
  }
  if (!(margin >= 0.f) || !std::isfinite(margin)) {
    return InvalidArgument("--recall-margin must be finite and >= 0, got " + std::to_string(margin));
  }
  if (prefix_max_queries < 0) {
    return InvalidArgument("--calib-queries must be >= 0, got " +
                           std::to_string(prefix_max_queries));
  }
  if (decode_start < 1 || decode_max < decode_start) {
    return InvalidArgument("decode calibration window must satisfy 1 <= start <= max, got " +
                           std::to_string(decode_start) + ", " + std::to_string(decode_max));
  }
  return OkStatus();
}

// ------------------------------------------------------------------------------------------------
// Configuration and index

Status RecallTier::Configure(const LayerGeometry& g, const RecallOptions& opt) {
  if (g.kind != AttnKind::kMla) {
    return InvalidArgument("recall tier needs an MLA layer, got " + g.ToString());
  }
  const int d_c = g.k_dim - g.rope_dim;
  if (g.rope_dim < 1 || d_c < 8) {
    return InvalidArgument("recall tier needs d_c >= 8 and d_r >= 1, got " + g.ToString());
  }
  RETURN_IF_ERROR(opt.Validate(d_c));
  *this = RecallTier();
  opt_ = opt;
  n_heads_ = g.n_q_heads;
  d_c_ = d_c;
  d_r_ = g.rope_dim;
  lam_ = g.scale;
  z_ = kRecallZMax;
  thr_g_ = kNegInf;
  basis_.assign(static_cast<size_t>(opt.rank) * d_c, 0.f);
  for (int k = 0; k < opt.rank; ++k) basis_[static_cast<size_t>(k) * d_c + k] = 1.f;
  collecting_ = opt.calibration == RecallCalibration::kDecode;
  decode_window_ = opt.decode_start;
  return OkStatus();
}

recall_internal::RowSrc RecallTier::Src(const LayerStore& store) const {
  recall_internal::RowSrc s;
  s.store = &store;
  s.reader = &reader_;
  s.sidecar = opt_.branch_sidecar ? branch_.data() : nullptr;
  s.k_dim = d_c_ + d_r_;
  return s;
}

void RecallTier::SetRowReader(RecallRowReader reader) { reader_ = std::move(reader); }

std::vector<uint16_t> RecallTier::csk(int64_t u) const {
  STRATA_CHECK(u >= 0 && u < n_indexed_);
  std::vector<uint16_t> out(opt_.rank);
  for (int k = 0; k < opt_.rank; ++k) out[k] = csk_[RecallCskAt(u, k, opt_.rank)];
  return out;
}

float RecallTier::eta(int64_t u) const {
  STRATA_CHECK(u >= 0 && u < n_indexed_);
  return eta_[u];
}

RecallTier RecallTier::Clone() const {
  RecallTier c(*this);
  c.reader_ = RecallRowReader();
  ReserveAsIn(&c.basis_, basis_);
  ReserveAsIn(&c.csk_, csk_);
  ReserveAsIn(&c.eta_, eta_);
  ReserveAsIn(&c.branch_, branch_);
  ReserveAsIn(&c.arch_mask_, arch_mask_);
  ReserveAsIn(&c.fetch_, fetch_);
  ReserveAsIn(&c.tile_fire_, tile_fire_);
  ReserveAsIn(&c.qpos_, qpos_);
  ReserveAsIn(&c.qidx_, qidx_);
  ReserveAsIn(&c.qbuf_, qbuf_);
  return c;
}

int64_t RecallTier::ResidentBytes() const {
  // Allocated, not used, sizes: what the tier really holds.
  return static_cast<int64_t>(basis_.capacity() * 4 + csk_.capacity() * 2 + eta_.capacity() * 4 +
                              branch_.capacity() * 2 +
                              arch_mask_.capacity() * 2 + fetch_.capacity() * 8 +
                              tile_fire_.capacity() * 2 +
                              qbuf_.size() * 4 + qpos_.size() * 8);
}

Status RecallTier::ProjectRows(const LayerStore& store, const float* basis, int64_t begin,
                               int64_t end, uint16_t* csk, float* eta, int64_t* bad_row,
                               ThreadPool* pool) const {
  const int r = opt_.rank, dc = d_c_;
  const int64_t n = end - begin;
  if (n <= 0) return OkStatus();
  const int T = pool ? pool->size() : 1;
  const recall_internal::RowSrc src = Src(store);
  // First failing row per chunk: (row, channel, value).
  struct Bad {
    int64_t row = -1;
    int ch = 0;
    float value = 0.f;
  };
  std::vector<Bad> bad(T);
  ParallelForOrInline(pool, n, 16, [&](int64_t b, int64_t e, int k) {
    std::vector<float> c(dc), res(dc), p(r);
    std::vector<uint16_t> scratch(src.k_dim);
    for (int64_t i = b; i < e; ++i) {
      const int64_t u = begin + i;
      const uint16_t* row = GetRow(src, u, scratch.data());
      for (int j = 0; j < dc; ++j) c[j] = Bf16ToF32(row[j]);
      // DotAcc2 (two accumulators): the summation order csk, eta and qsk were always computed
      // in; the fire sets the tests pin depend on it bit for bit.
      for (int kk = 0; kk < r; ++kk) {
        p[kk] = DotAcc2(basis + static_cast<size_t>(kk) * dc, c.data(), dc);
      }
      res = c;
      for (int kk = 0; kk < r; ++kk) {
        const float pk = p[kk];
        const float* v = basis + static_cast<size_t>(kk) * dc;
        for (int j = 0; j < dc; ++j) res[j] -= v[j] * pk;
      }
      eta[u] = std::sqrt(DotAcc2(res.data(), res.data(), dc));
      for (int kk = 0; kk < r; ++kk) {
        if (!(std::fabs(p[kk]) < kF16Limit) && bad[k].row < 0) bad[k] = {u, kk, p[kk]};
        csk[RecallCskAt(u, kk, r)] = F32ToF16(p[kk]);
      }
    }
  });
  for (const Bad& x : bad) {
    if (x.row >= 0 && (*bad_row < 0 || x.row < *bad_row)) *bad_row = x.row;
  }
  if (*bad_row >= 0) {
    for (const Bad& x : bad) {
      if (x.row == *bad_row) {
        return OutOfRange("recall index: csk of row " + std::to_string(x.row) + " channel " +
                          std::to_string(x.ch) + " is " + std::to_string(x.value) +
                          ", outside the f16 range |csk| < 6e4");
      }
    }
  }
  return OkStatus();
}

namespace {

// Grows an index vector to n elements with at most 1/16 of slack: the index is most of what a
// long VestigeKV cache keeps resident, and std::vector's doubling would hold up to twice it (the
// re-copies this costs add up to ~16x the final size, once, over a fill).
template <typename V>
void GrowTo(V& v, size_t n, typename V::value_type fill) {
  if (n > v.capacity()) v.reserve(std::max(n, v.capacity() + v.capacity() / 16));
  v.resize(n, fill);
}

}  // namespace

Status RecallTier::IndexClosedRows(const LayerStore& store, int64_t n_closed, ThreadPool* pool) {
  STRATA_CHECK(configured());
  STRATA_CHECK(n_closed <= store.n_rows());
  if (n_closed <= n_indexed_) return OkStatus();
  constexpr int64_t kT = kRecallTileRows;
  const int r = opt_.rank;
  // Tiles of 16 rows; the lanes past n_indexed() stay zero.
  GrowTo(csk_, static_cast<size_t>((n_closed + kT - 1) / kT) * kT * r, 0);
  GrowTo(eta_, static_cast<size_t>((n_closed + kT - 1) / kT) * kT, 0.f);
  int64_t bad = -1;
  Status s = ProjectRows(store, basis_.data(), n_indexed_, n_closed, csk_.data(), eta_.data(),
                         &bad, pool);
  const int64_t first = n_indexed_;
  n_indexed_ = bad >= 0 ? bad : n_closed;
  const int64_t n_tiles = (n_indexed_ + kT - 1) / kT;
  csk_.resize(static_cast<size_t>(n_tiles) * kT * r);
  eta_.resize(static_cast<size_t>(n_tiles) * kT);
  for (int64_t u = n_indexed_; u < n_tiles * kT; ++u) {
    eta_[u] = 0.f;
    for (int k = 0; k < r; ++k) csk_[RecallCskAt(u, k, r)] = 0;
  }
  GrowTo(arch_mask_, n_tiles, 0);
  if (opt_.branch_sidecar) {
    GrowTo(branch_, static_cast<size_t>(n_indexed_) * d_r_, 0);
    std::vector<uint16_t> scratch(d_c_ + d_r_);
    const recall_internal::RowSrc src = Src(store);
    for (int64_t u = first; u < n_indexed_; ++u) {
      const uint16_t* row = recall_internal::GetRow(src, u, scratch.data());
      std::copy(row + d_c_, row + d_c_ + d_r_, branch_.begin() + u * d_r_);
    }
  }
  return s;
}

std::vector<int64_t> RecallTier::archive() const {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n_arch_));
  for (size_t t = 0; t < arch_mask_.size(); ++t) {
    for (int i = 0; i < kRecallTileRows; ++i) {
      if (arch_mask_[t] >> i & 1) out.push_back(static_cast<int64_t>(t) * kRecallTileRows + i);
    }
  }
  return out;
}

void RecallTier::SetArchive(const int64_t* rows, int64_t n) {
  STRATA_CHECK(configured());
  for (int64_t i = 0; i < n; ++i) {
    STRATA_CHECK_MSG(rows[i] >= 0 && rows[i] < n_indexed_, "archived row %lld not indexed (%lld)",
                     static_cast<long long>(rows[i]), static_cast<long long>(n_indexed_));
    STRATA_CHECK_MSG(i == 0 || rows[i] > rows[i - 1], "archive must be ascending and distinct");
  }
  // The mask is the archive (a bit per indexed row): a list of positions beside it would cost
  // 8 bytes per archived row, more than the eta of the index.
  n_arch_ = n;
  arch_first_ = n > 0 ? rows[0] : -1;
  arch_last_ = n > 0 ? rows[n - 1] : -1;
  constexpr int64_t kT = kRecallTileRows;
  arch_mask_.assign((n_indexed_ + kT - 1) / kT, 0);
  for (int64_t i = 0; i < n; ++i) {
    arch_mask_[rows[i] / kT] |= static_cast<uint16_t>(1u << (rows[i] % kT));
  }
}

Status RecallTier::SetBasis(const LayerStore& store, const float* v, ThreadPool* pool) {
  STRATA_CHECK(configured());
  const size_t sz = static_cast<size_t>(opt_.rank) * d_c_;
  // Indexed rows are re-projected; nothing changes unless every row stays in range.
  std::vector<float> basis(v, v + sz);
  std::vector<uint16_t> csk(csk_.size());
  std::vector<float> eta(eta_.size());
  int64_t bad = -1;
  RETURN_IF_ERROR(ProjectRows(store, basis.data(), 0, n_indexed_, csk.data(), eta.data(), &bad,
                              pool));
  basis_ = std::move(basis);
  csk_ = std::move(csk);
  eta_ = std::move(eta);
  return OkStatus();
}

void RecallTier::SetCalibration(float z, float gate_thr) {
  STRATA_CHECK(configured());
  z_ = z;
  thr_g_ = gate_thr;
  collecting_ = false;
}

// ------------------------------------------------------------------------------------------------
// Scan

bool RecallTier::needs_entropy() const { return std::isfinite(thr_g_); }

void RecallTier::PrepareQuery(const float* q, QueryPrep* p) const {
  const int G = n_heads_, r = opt_.rank, dc = d_c_, dr = d_r_, k = dc + dr;
  p->dp = dr + r;
  const int g_pad = (G + kRecallHeadPad - 1) / kRecallHeadPad *
                    kRecallHeadPad;
  p->qcat.assign(static_cast<size_t>(g_pad) * p->dp, 0.f);
  p->cq.assign(G, 0.f);
  p->in_range = true;
  std::vector<float> qsk(r), res(dc);
  const float inv_sqrt = dc > r ? 1.f / std::sqrt(static_cast<float>(dc - r)) : 0.f;
  for (int h = 0; h < G; ++h) {
    const float* qc = q + static_cast<int64_t>(h) * k;
    const float* qr = qc + dc;
    float* out = p->qcat.data() + h * p->dp;
    for (int j = 0; j < dr; ++j) out[j] = Bf16ToF32(F32ToBf16(qr[j]));
    for (int kk = 0; kk < r; ++kk) {
      qsk[kk] = DotAcc2(basis_.data() + static_cast<size_t>(kk) * dc, qc, dc);
      if (!(std::fabs(qsk[kk]) < kF16Limit)) p->in_range = false;
      out[dr + kk] = F16ToF32(F32ToF16(qsk[kk]));
    }
    std::copy(qc, qc + dc, res.begin());
    for (int kk = 0; kk < r; ++kk) {
      const float pk = qsk[kk];
      const float* v = basis_.data() + static_cast<size_t>(kk) * dc;
      for (int j = 0; j < dc; ++j) res[j] -= v[j] * pk;
    }
    const float qres = std::sqrt(DotAcc2(res.data(), res.data(), dc));
    p->cq[h] = lam_ * qres * inv_sqrt;
  }
}

void RecallTier::IndexScores(const LayerStore& store, const float* q, const int64_t* rows,
                             int64_t n, float* idx, float* cert) const {
  STRATA_CHECK(configured());
  for (int64_t i = 0; i < n; ++i) STRATA_CHECK(rows[i] >= 0 && rows[i] < n_indexed_);
  QueryPrep p;
  PrepareQuery(q, &p);
  if (n == 0) return;
  const recall_internal::RowSrc src = Src(store);
  RecallScanView a;
  const int g_pad = static_cast<int>(p.qcat.size() / p.dp);
  std::vector<float> qt(p.qcat.size());
  for (int h = 0; h < g_pad; ++h) {
    RecallPutQuery(p.qcat.data() + h * p.dp, p.dp, h, qt.data());
  }
  a.q = qt.data();
  a.n_heads = n_heads_;
  a.n_heads_pad = g_pad;
  a.lam = lam_;
  a.src = recall_internal::KernelSource(src);
  a.d_c = d_c_;
  a.d_r = d_r_;
  a.r = opt_.rank;
  a.csk = csk_.data();
  a.eta = eta_.data();
  RecallIndexDots(a, rows, n, idx, n);
  for (int h = 0; h < n_heads_; ++h)
    for (int64_t i = 0; i < n; ++i) cert[h * n + i] = p.cq[h] * eta_[rows[i]];
}

RecallScan RecallTier::Scan(const LayerStore& store, const float* q, int64_t limit,
                            const float* max1, const float* entropy, ThreadPool* pool) {
  STRATA_CHECK(configured());
  STRATA_CHECK(limit >= 0 && limit <= store.n_rows());
  if (opt_.calibration == RecallCalibration::kDecode) MaybeCalibrateDecode(store, q, limit, pool);
  RecallScan out;
  fetch_.clear();
  const int64_t na = n_arch_;
  if (na == 0) return out;
  STRATA_CHECK_MSG(arch_last_ < limit, "archived row %lld not visible (limit %lld)",
                   static_cast<long long>(arch_last_), static_cast<long long>(limit));
  ++counters_.scans;
  counters_.scanned_rows += na;
  counters_.index_bytes_read += na * scan_bytes_per_row();

  QueryPrep p;
  PrepareQuery(q, &p);
  if (!p.in_range) {  // the sketch cannot be formed in f16: read everything, exactly
    out.overflow = out.fallback = true;
    ++counters_.fallbacks;
    return out;
  }
  // Active heads (gate open), their operands and thresholds.
  // The caller decided whether to pass the entropy before this call; when a decode-mode
  // calibration installed a gate threshold just now, the gate stays open for this step (it can
  // only add fires, never lose one).
  const bool gated = needs_entropy() && entropy != nullptr;
  std::vector<int> heads;
  for (int h = 0; h < n_heads_; ++h) {
    if (gated && !(entropy[h] > thr_g_)) {
      ++counters_.gated_heads;
      continue;
    }
    heads.push_back(h);
  }
  if (heads.empty()) return out;
  const int A = static_cast<int>(heads.size());
  constexpr int kHp = kRecallHeadPad;
  constexpr int64_t kT = kRecallTileRows;
  const int a_pad = (A + kHp - 1) / kHp * kHp;
  std::vector<float> qcat(static_cast<size_t>(a_pad) * p.dp, 0.f), cq(A), thr(A);
  for (int a = 0; a < A; ++a) {
    const int h = heads[a];
    RecallPutQuery(p.qcat.data() + h * p.dp, p.dp, a, qcat.data());
    cq[a] = p.cq[h];
    thr[a] = max1[h] - opt_.margin;
  }
  const recall_internal::RowSrc src = Src(store);
  RecallScanView args;
  args.q = qcat.data();
  args.n_heads = A;
  args.n_heads_pad = a_pad;
  args.cq = cq.data();
  args.thr = thr.data();
  args.lam = lam_;
  args.z = z_;
  args.src = recall_internal::KernelSource(src);
  args.d_c = d_c_;
  args.d_r = d_r_;
  args.r = opt_.rank;
  args.csk = csk_.data();
  args.eta = eta_.data();
  args.arch_mask = arch_mask_.data();
  // Tiles [t_lo, t_hi) hold the archive; a tile's kept rows are computed and masked out.
  const int64_t t_lo = arch_first_ / kT, t_hi = arch_last_ / kT + 1;
  tile_fire_.assign(t_hi - t_lo, 0);
  const int T = pool ? pool->size() : 1;
  std::vector<int64_t> fired(T, 0);
  ParallelForOrInline(pool, t_hi - t_lo, 4, [&](int64_t b, int64_t e, int k) {
    RecallScanTiles(args, t_lo + b, t_lo + e, tile_fire_.data() + b, &fired[k]);
  });
  for (int64_t c : fired) counters_.fired += c;
  // Position-order compaction (tiles ascend, and bits within a tile).
  int64_t n_fired = 0;
  for (uint16_t m : tile_fire_) n_fired += std::popcount(m);
  out.n_fired = n_fired;
  if (n_fired > opt_.capacity) {
    out.overflow = true;
    if (!opt_.truncate) {
      out.fallback = true;
      ++counters_.fallbacks;
      return out;
    }
    ++counters_.truncations;
  }
  const int64_t keep = std::min<int64_t>(n_fired, opt_.capacity);
  fetch_.reserve(keep);
  for (int64_t t = t_lo; t < t_hi && static_cast<int64_t>(fetch_.size()) < keep; ++t) {
    uint32_t m = tile_fire_[t - t_lo];
    while (m != 0 && static_cast<int64_t>(fetch_.size()) < keep) {
      fetch_.push_back(t * kT + std::countr_zero(m));
      m &= m - 1;
    }
  }
  out.rows = fetch_.data();
  out.n = static_cast<int64_t>(fetch_.size());
  counters_.fetched += out.n;
  return out;
}

// ------------------------------------------------------------------------------------------------
// Calibration

struct RecallTier::Label {
  int64_t tgt = -1;        // global argmax row
  bool hard = false;       // tgt archived
  int64_t best_arch = -1;  // best archived row (-1: none visible)
  double true_arch = 0;    // its true score
  float max1 = kNegInf;    // max over the attended (non-archived) visible rows
  double entropy = 0;      // entropy (nats) of the softmax over the attended rows
};

void RecallTier::ComputeLabels(const LayerStore& store, ThreadPool* pool,
                               std::vector<Label>* labels) const {
  const int G = n_heads_, k = d_c_ + d_r_;
  const int64_t n_q = static_cast<int64_t>(qpos_.size());
  labels->assign(static_cast<size_t>(n_q) * G, Label());
  std::vector<uint8_t> archived(store.n_rows(), 0);
  for (int64_t u : archive()) archived[u] = 1;
  std::vector<float> s;
  for (int64_t i = 0; i < n_q; ++i) {
    const int64_t lim = std::min(qpos_[i] + 1, store.n_rows());
    s.resize(static_cast<size_t>(G) * lim);
    ScoreRows(Src(store), qbuf_.data() + i * G * k, G, nullptr, 0, lim, lam_, s.data(), pool);
    // Each head's label on its own (the same arithmetic on any pool).
    ParallelForOrInline(pool, G, 1, [&](int64_t h0, int64_t h1, int) {
      for (int64_t h = h0; h < h1; ++h) {
        Label& L = (*labels)[i * G + h];
        const float* sh = s.data() + h * lim;
        float best = kNegInf, best_a = kNegInf;
        for (int64_t u = 0; u < lim; ++u) {
          if (L.tgt < 0 || sh[u] > best) {
            best = sh[u];
            L.tgt = u;
          }
          if (archived[u]) {
            if (L.best_arch < 0 || sh[u] > best_a) {
              best_a = sh[u];
              L.best_arch = u;
            }
          } else {
            L.max1 = std::max(L.max1, sh[u]);
          }
        }
        if (L.tgt >= 0) L.hard = archived[L.tgt] != 0;
        if (L.best_arch >= 0) L.true_arch = best_a;
        if (L.max1 > kNegInf) {
          double d = 0;
          for (int64_t u = 0; u < lim; ++u)
            if (!archived[u]) d += std::exp(static_cast<double>(sh[u]) - L.max1);
          double ent = 0;
          for (int64_t u = 0; u < lim; ++u) {
            if (archived[u]) continue;
            const double pu = std::exp(static_cast<double>(sh[u]) - L.max1) / d;
            ent -= pu * std::log(std::max(pu, 1e-12));
          }
          L.entropy = ent;
        }
      }
    });
  }
}

Status RecallTier::RefitBasis(const LayerStore& store, ThreadPool* pool) {
  const int G = n_heads_, k = d_c_ + d_r_, r = opt_.rank;
  const int64_t n_q = static_cast<int64_t>(qpos_.size());
  std::vector<float> x(static_cast<size_t>(n_q) * G * d_c_);
  for (int64_t i = 0; i < n_q * G; ++i)
    std::copy(qbuf_.begin() + i * k, qbuf_.begin() + i * k + d_c_, x.begin() + i * d_c_);
  std::vector<float> basis(static_cast<size_t>(r) * d_c_);
  RETURN_IF_ERROR(FitRecallBasis(x.data(), n_q * G, d_c_, r, basis.data(), nullptr, pool));
  return SetBasis(store, basis.data(), pool);
}

int64_t RecallTier::PrefixObservationStride(int64_t n, int64_t cap) {
  int64_t s = 1;
  if (cap <= 0) return s;
  while ((n + s - 1) / s > 2 * cap) s *= 2;
  return s;
}

void RecallTier::ObserveQuery(int64_t query_pos, const float* q) {
  STRATA_CHECK(configured());
  if (opt_.calibration != RecallCalibration::kPrefix) return;
  const int64_t k = static_cast<int64_t>(n_heads_) * (d_c_ + d_r_);
  const int64_t i = n_observed_++;
  if (i % obs_stride_ != 0) return;
  qpos_.push_back(query_pos);
  qidx_.push_back(i);
  qbuf_.insert(qbuf_.end(), q, q + k);
  const int64_t cap = opt_.prefix_max_queries;
  if (cap > 0 && static_cast<int64_t>(qpos_.size()) > 2 * cap) {
    // Double the stride: keep the observations whose index is a multiple of it (evenly spread).
    obs_stride_ *= 2;
    size_t w = 0;
    for (size_t j = 0; j < qpos_.size(); ++j) {
      if (qidx_[j] % obs_stride_ != 0) continue;
      qpos_[w] = qpos_[j];
      qidx_[w] = qidx_[j];
      std::copy(qbuf_.begin() + j * k, qbuf_.begin() + (j + 1) * k, qbuf_.begin() + w * k);
      ++w;
    }
    qpos_.resize(w);
    qidx_.resize(w);
    qbuf_.resize(w * k);
  }
}

Status RecallTier::CalibratePrefix(const LayerStore& store, ThreadPool* pool) {
  STRATA_CHECK(configured());
  if (opt_.calibration != RecallCalibration::kPrefix) {
    return InvalidArgument("CalibratePrefix with --calibration decode");
  }
  if (qpos_.empty()) return OkStatus();
  const int64_t k = static_cast<int64_t>(n_heads_) * (d_c_ + d_r_);
  // Evenly strided subset of at most prefix_max_queries.
  const int64_t have = static_cast<int64_t>(qpos_.size());
  const int64_t cap = opt_.prefix_max_queries;
  if (cap > 0 && have > cap) {
    std::vector<int64_t> pos(cap);
    std::vector<float> buf(static_cast<size_t>(cap) * k);
    for (int64_t j = 0; j < cap; ++j) {
      const int64_t src = j * have / cap;
      pos[j] = qpos_[src];
      std::copy(qbuf_.begin() + src * k, qbuf_.begin() + (src + 1) * k, buf.begin() + j * k);
    }
    qpos_ = std::move(pos);
    qbuf_ = std::move(buf);
  }
  Status st = RefitBasis(store, pool);
  if (st.ok()) {
    std::vector<Label> labels;
    ComputeLabels(store, pool, &labels);
    const int G = n_heads_;
    std::vector<double> hard_ent, all_ent;
    for (const Label& L : labels) {
      if (L.max1 == kNegInf) continue;
      all_ent.push_back(L.entropy);
      if (L.hard) hard_ent.push_back(L.entropy);
    }
    const GateFit gate =
        FitGate(hard_ent, all_ent, kRecallGateAlphaPrefix, kRecallMinHardPrefix);
    std::vector<LadderRow> ladder;
    std::vector<int64_t> uniq;
    std::vector<float> idx, cert;
    for (size_t i = 0; i < qpos_.size(); ++i) {
      // The hard heads' targets scored together: one query preparation per query, not per head
      // (each (head, row) score is the same either way).
      uniq.clear();
      for (int h = 0; h < G; ++h) {
        if (labels[i * G + h].hard) uniq.push_back(labels[i * G + h].tgt);
      }
      if (uniq.empty()) continue;
      std::sort(uniq.begin(), uniq.end());
      uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
      const int64_t nu = static_cast<int64_t>(uniq.size());
      idx.resize(static_cast<size_t>(G) * nu);
      cert.resize(static_cast<size_t>(G) * nu);
      IndexScores(store, qbuf_.data() + i * k, uniq.data(), nu, idx.data(), cert.data());
      for (int h = 0; h < G; ++h) {
        const Label& L = labels[i * G + h];
        if (!L.hard) continue;
        const int64_t j = std::lower_bound(uniq.begin(), uniq.end(), L.tgt) - uniq.begin();
        LadderRow row;
        row.idx = idx[h * nu + j];
        row.cert = cert[h * nu + j];
        row.max1 = L.max1;
        row.gate_open = !std::isfinite(gate.thr) || L.entropy > gate.thr;
        ladder.push_back(row);
      }
    }
    float z = FitLadderZ(ladder, opt_.margin);
    if (opt_.z_floor == RecallZFloor::kZero) z = std::max(z, 0.f);
    z_ = z;
    thr_g_ = gate.thr;
    calibrated_ = true;
    ++counters_.calibrations;
  }
  qpos_.clear();
  qidx_.clear();
  qbuf_.clear();
  qbuf_.shrink_to_fit();
  return st;
}

void RecallTier::MaybeCalibrateDecode(const LayerStore& store, const float* q, int64_t limit,
                                      ThreadPool* pool) {
  if (!collecting_ || n_arch_ == 0) return;
  const int64_t k = static_cast<int64_t>(n_heads_) * (d_c_ + d_r_);
  qpos_.push_back(limit - 1);
  qbuf_.insert(qbuf_.end(), q, q + k);
  const int64_t w = static_cast<int64_t>(qpos_.size());
  if (w < decode_window_) return;

  Status st = RefitBasis(store, pool);
  if (!st.ok()) {  // keep the provisional tier (sound at z = 8 up to the basis), stop refitting
    last_error_ = st;
    collecting_ = false;
    return;
  }
  std::vector<Label> labels;
  ComputeLabels(store, pool, &labels);
  const int G = n_heads_;
  std::vector<double> zq, hard_ent, all_ent;
  for (int64_t i = 0; i < w; ++i) {
    std::vector<int64_t> uniq;
    for (int h = 0; h < G; ++h) {
      if (labels[i * G + h].best_arch >= 0) uniq.push_back(labels[i * G + h].best_arch);
    }
    std::sort(uniq.begin(), uniq.end());
    uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
    const int64_t nu = static_cast<int64_t>(uniq.size());
    std::vector<float> idx(static_cast<size_t>(G) * nu), cert(static_cast<size_t>(G) * nu);
    IndexScores(store, qbuf_.data() + i * k, uniq.data(), nu, idx.data(), cert.data());
    for (int h = 0; h < G; ++h) {
      const Label& L = labels[i * G + h];
      if (L.max1 > kNegInf) {
        all_ent.push_back(L.entropy);
        if (L.hard) hard_ent.push_back(L.entropy);
      }
      if (L.best_arch < 0) continue;
      const int64_t j = std::lower_bound(uniq.begin(), uniq.end(), L.best_arch) - uniq.begin();
      zq.push_back(ZRequirement(L.true_arch, idx[h * nu + j], cert[h * nu + j]));
    }
  }
  const ConformalFit fit = FitConformalZ(zq, opt_.z_floor);
  const GateFit gate = FitGate(hard_ent, all_ent, kRecallGateAlphaDecode, kRecallMinRowsDecode);
  z_ = fit.z;
  thr_g_ = gate.thr;
  calibrated_ = true;
  ++counters_.calibrations;
  // Window growth: stop once both fits have their minimum sample, or at decode_max; otherwise
  // grow by doubling or to the predicted size (rounded up to a power of two), unless the
  // prediction exceeds decode_max (then stop with what we have).
  const int64_t n_hard = gate.n_hard;
  bool done = (fit.n >= kRecallMinRowsDecode && n_hard >= kRecallMinRowsDecode) ||
              w >= opt_.decode_max;
  if (!done) {
    const int64_t lim_n = std::min(fit.n, n_hard);
    const double pred = lim_n > 0 ? std::ceil(static_cast<double>(kRecallMinRowsDecode) * w /
                                              static_cast<double>(lim_n))
                                  : std::numeric_limits<double>::infinity();
    if (pred > opt_.decode_max) {
      done = true;
    } else {
      int64_t next = 1;
      while (next < static_cast<int64_t>(pred)) next *= 2;
      decode_window_ = std::min<int64_t>(opt_.decode_max, std::max(2 * w, next));
    }
  }
  if (done) {
    collecting_ = false;
    qpos_.clear();
    qbuf_.clear();
    qbuf_.shrink_to_fit();
  }
}

// ------------------------------------------------------------------------------------------------

namespace {

// AttendedScoreStats over rows served by `src` (G query heads, scale lam).
void AttendedStatsFrom(const recall_internal::RowSrc& src, const float* q, int G, float lam,
                       const int64_t* rows, int64_t n, ThreadPool* pool, float* max1,
                       float* entropy) {
  if (n == 0) {
    for (int h = 0; h < G; ++h) {
      max1[h] = kNegInf;
      entropy[h] = 0.f;
    }
    return;
  }
  std::vector<float> s(static_cast<size_t>(G) * n);
  ScoreRows(src, q, G, rows, 0, n, lam, s.data(), pool);
  for (int h = 0; h < G; ++h) {
    const float* sh = s.data() + h * n;
    float m = kNegInf;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, sh[i]);
    double d = 0;
    for (int64_t i = 0; i < n; ++i) d += std::exp(static_cast<double>(sh[i]) - m);
    double ent = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double p = std::exp(static_cast<double>(sh[i]) - m) / d;
      ent -= p * std::log(std::max(p, 1e-12));
    }
    max1[h] = m;
    entropy[h] = static_cast<float>(ent);
  }
}

}  // namespace

void AttendedScoreStats(const LayerStore& store, const float* q, const int64_t* rows, int64_t n,
                        ThreadPool* pool, float* max1, float* entropy) {
  const LayerGeometry& g = store.geometry();
  AttendedStatsFrom(StoreSrc(store), q, g.n_q_heads, g.scale, rows, n, pool, max1, entropy);
}

void RecallTier::AttendedStats(const LayerStore& store, const float* q, const int64_t* rows,
                               int64_t n, ThreadPool* pool, float* max1, float* entropy) const {
  STRATA_CHECK(configured());
  // The row source without the branch sidecar: the scores need whole rows.
  recall_internal::RowSrc src = Src(store);
  src.sidecar = nullptr;
  AttendedStatsFrom(src, q, n_heads_, lam_, rows, n, pool, max1, entropy);
}

}  // namespace strata
