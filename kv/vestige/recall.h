// VestigeKV tier 2: a low-rank recall index over an MLA layer's closed rows and its per-step scan.
//
// One RecallTier per (sequence, MLA layer). It never reads or copies a row's content except to
// index it once at close time; archived rows stay in the LayerStore, bit-identical (§1.2).
//
// Index (§1.3, §3.1). For every closed row u (kept and archived alike, so a rebalance is an
// index selection, never a re-projection):
//   csk_u = V_r c_hat_u   f16 [r]   (projection in f32; |csk| < 6e4 is checked, see IndexClosedRows)
//   eta_u = ||c_hat_u - V_r^T csk_u||   f32 (from the f32 projection)
// V_r [r, d_c] f32 has orthonormal rows: identity rows (the first r axes) until calibrated, then
// the top-r eigenvectors (descending eigenvalue) of the mean-centred Gram of calibration content
// queries q_c', all heads pooled (LAPACK dsyevr).
//
// Scan, per step and head h with absorbed query q_h = [q_c' (d_c) ; q_r (d_r)] (§3.2):
//   qsk = V_r q_c' (f32),  qres = ||q_c' - V_r^T qsk||
//   idx_u  = lam * (bf16(q_r) . r_u + f16(qsk) . csk_u)    f32 products and accumulation
//   cert_u = lam * qres * eta_u / sqrt(d_c - r)
//   fire   iff gate_h and idx_u + z * cert_u > max1_h - margin      (strict)
// with max1_h = max over the attended set of lam * q_h . row (-inf when the set is empty: the
// whole archive fires) and gate_h = entropy_h > thr_g (nats; always open when thr_g = -inf or the
// gate is off). The fetched set is the union over heads, ascending row ids.
//
// Layout (v2; the kernels are kernels/recall_scan.{h,cc}): csk is kept in tiles of 16
// consecutive rows, channel-major within a tile, so the scan reads channel k of 16 rows with one
// vector load and computes 16 rows x all active heads per tile (a GEMM [heads, d_r + r] x
// [d_r + r, 16] on operands widened on the fly). The same bytes as a row-major csk (the last
// partial tile is zero padded); an archive bit mask per tile (2 B per 16 rows) selects the
// archived rows. The branch is still read from the row's tail.
//
// Soundness. With z = sqrt(d_c - r) the certified score bounds the true score by Cauchy-Schwarz;
// with the f16/bf16 roundings it holds up to a rounding slack (tested in recall_test.cc):
//   idx_u + sqrt(d_c - r) * cert_u >= lam * q . row_u
//       - lam * (2^-8 sum_i |q_r,i r_u,i| + 2^-10 sum_i |qsk_i csk_u,i| + 2^-16 ||q_c'|| ||c_hat_u||)
// Calibrated z (~2) is what makes the scan selective; it trades soundness for a recall target.
//
// Overflow (§3.5): if the union exceeds `capacity` rows, the step either falls back to a dense
// read of all rows (default; exact) or keeps the first `capacity` fired rows in position order
// (truncate). A query whose qsk leaves the f16 range also falls back (exact, never silent).
//
// Typical use by the policy (same-step query, the reference form):
//   tier.Configure(geometry, opts);                       // once
//   tier.IndexClosedRows(store, n_closed);                // at every block close
//   tier.SetArchive(archived_rows, n_archived);           // after every (re)selection
//   prefix mode: tier.ObserveQuery(pos, q) from OnPrefillStats, then tier.CalibratePrefix(store,
//                pool) in OnCompress after IndexClosedRows + SetArchive.
//   per decode step: read the attended set (kept ∪ tail) into states st; max1[h] = st.m[h];
//     if (tier.needs_entropy()) tier.AttendedStats(store, q, attended, n, pool, max1, entropy);
//     RecallScan s = tier.Scan(store, q, limit, max1, entropy, pool);
//     s.fallback ? dense read of [0, limit) : ReadRows(store, q, s.rows, s.n, ...) merged into st.
//   Decode-mode calibration happens inside Scan (it records the step's query).
//
// § numbers cite docs/reference/vestigekv.md (the reference behaviour).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/geometry.h"
#include "kv/registry.h"
#include "kv/store.h"

namespace strata {

// Where zp and thr_g come from (flag `calibration`).
enum class RecallCalibration {
  kPrefix,  // paper/harness form: prompt queries [T/2, T), z ladder, 0.03 gate quantile (§3.4)
  kDecode,  // serving form: first 8..64 decode queries, conformal order statistic (§3.3)
};
// Lower clamp of the fitted z (flag `z-floor`; §8.2 leaves it open).
//   kZero (default): z >= 0. The certificate term can then only add fires, so the recall target
//     the fit guarantees on calibration rows still holds, and rows indexed after the fit (blocks
//     closed later, never refitted) are not scored below their sketch idx_u.
//   kNone: the repo's behaviour: a negative order statistic is used as is (fewer fires).
enum class RecallZFloor { kNone, kZero };

std::string_view RecallCalibrationName(RecallCalibration c);  // "prefix" | "decode"
std::string_view RecallZFloorName(RecallZFloor f);            // "none" | "0"

struct RecallOptions {
  int rank = 64;                    // r: multiple of 8 in [8, d_c]           (recall-rank)
  int64_t capacity = 4096;          // W: fetch buffer rows, >= 1             (recall-capacity)
  bool truncate = false;            // overflow: false = dense fallback        (recall-overflow
                                    //   fallback|truncate)
  float margin = 0.f;               // fire iff score > max1 - margin, >= 0   (recall-margin)
  // Default prefix: our cache sees absorbed prompt queries (the serving repo could not), so the
  // tier is calibrated from the first decode step instead of over-fetching on a provisional index.
  RecallCalibration calibration = RecallCalibration::kPrefix;  //              (calibration)
  RecallZFloor z_floor = RecallZFloor::kZero;                  //              (z-floor none|0)
  // Prefix mode: at most this many of the observed prompt queries are used, evenly strided over
  // what was observed (labels cost H * T * 576 MACs per query); 0 = all.   (calib-queries)
  int prefix_max_queries = 64;
  // Decode mode: the window starts at decode_start queries and grows to at most decode_max.
  int decode_start = 8;
  int decode_max = 64;
  // Keep a bf16 copy of each closed row's branch [d_r] (2 d_r B per row) so the scan never reads
  // the store (needed when archived pages are released to a file; the reference default reads the
  // branch from the row's own tail).                                         (recall-sidecar)
  bool branch_sidecar = false;

  // Reads the keys above from validated settings (RecallSettingDecls: their defaults are the
  // members' initial values above); errors name flag and value.
  static StatusOr<RecallOptions> FromSettings(const ResolvedSettings& s);
  // The same from a spec holding recall keys only (validated against RecallSettingDecls).
  static StatusOr<RecallOptions> FromSpec(const PolicySpec& spec);
  Status Validate(int d_c) const;
};

// The recall tier's declared settings (kv/settings.h), part of vestige's and fullrow's
// declaration; each default is the text of RecallOptions' initial value.
std::vector<SettingDecl> RecallSettingDecls();

struct RecallCounters {
  int64_t scans = 0;             // Scan calls with a non-empty archive
  int64_t scanned_rows = 0;      // archived rows scanned, summed over scans
  int64_t fired = 0;             // (head, row) pairs that fired, summed over scans
  int64_t fetched = 0;           // rows handed back for reading (head union, after truncation)
  int64_t fallbacks = 0;         // scans answered with a dense fallback
  int64_t truncations = 0;       // scans whose union was truncated to capacity
  int64_t gated_heads = 0;       // (scan, head) pairs skipped because the gate was closed
  int64_t index_bytes_read = 0;  // csk + eta + branch bytes the scans read
  int64_t calibrations = 0;      // calibrated tiers installed
};

// One step's answer. `rows` stays valid until the next Scan or any mutation of the tier.
struct RecallScan {
  const int64_t* rows = nullptr;  // fetched archived rows, ascending; empty when fallback
  int64_t n = 0;
  int64_t n_fired = 0;    // size of the head union before truncation
  bool overflow = false;  // n_fired > capacity (or a query outside f16 range)
  bool fallback = false;  // the policy must read every row in [0, limit) densely this step
};

// Reads row u's bf16 [k_dim] content: returns a pointer to it (e.g. into `scratch`, which has
// k_dim entries). Called from several threads at once. Used for indexing, refits and calibration
// labels (and the scan's branch without a sidecar). Default: store.key_row(0, u).
using RecallRowReader = std::function<const uint16_t*(int64_t row, uint16_t* scratch)>;

namespace recall_internal {
struct RowSrc;
}

class RecallTier {
 public:
  RecallTier() = default;
  RecallTier(RecallTier&&) = default;
  RecallTier& operator=(RecallTier&&) = default;
  // A deep copy with the same capacities (ResidentBytes counts them) and no row reader (one
  // that reads through its owner must be installed again: SetRowReader).
  RecallTier Clone() const;

  // g must be MLA: d_c = g.k_dim - g.rope_dim, d_r = g.rope_dim, lam = g.scale. Resets the tier
  // (identity basis, z = Z_MAX = 8, gate open, empty index and archive).
  Status Configure(const LayerGeometry& g, const RecallOptions& opt);

  // Installs a row reader (empty: the store). Keep it valid for the tier's life.
  void SetRowReader(RecallRowReader reader);

  // Indexes closed rows [n_indexed(), n_closed) (closed rows are always a prefix; a no-op when
  // already indexed). OutOfRange naming the row, channel and value if some |csk| >= 6e4; the rows
  // before it stay indexed.
  // `pool` (may be null) splits the rows; the index does not depend on it.
  Status IndexClosedRows(const LayerStore& store, int64_t n_closed, ThreadPool* pool = nullptr);
  // The archived rows: ascending, distinct, each < n_indexed() (CHECKed). Copied.
  void SetArchive(const int64_t* rows, int64_t n);

  // Prefix calibration input: one observed prompt query at query_pos (it sees rows [0, query_pos]),
  // q: [n_q_heads, d_c + d_r] f32 absorbed. Ignored in decode mode.
  void ObserveQuery(int64_t query_pos, const float* q);
  // The stride ObserveQuery ends with after n calls (cap = prefix_max_queries; 0: all): the
  // smallest power of two s with ceil(n / s) <= 2 cap. The queries it keeps are those at offsets
  // 0, s, 2s, ...; offered only those (at most 2 cap), it keeps every one, so a caller that
  // skips the rest installs the same calibration.
  static int64_t PrefixObservationStride(int64_t n, int64_t cap);
  // Prefix mode: fits V_r from the observed queries, re-indexes the closed rows, computes labels
  // over the full cache (causal) against the current archive, and fits thr_g and z (ladder).
  // Clears the observed queries. InvalidArgument in decode mode; with no observed query it keeps
  // the provisional tier and returns OK.
  Status CalibratePrefix(const LayerStore& store, ThreadPool* pool);

  // Whether Scan needs the entropy of the attended set (the gate is on with a finite threshold).
  bool needs_entropy() const;
  // One decode step. q: [n_q_heads, d_c + d_r] f32; the query sees rows [0, limit).
  // max1: [n_q_heads] lam-scaled max over the attended set; entropy: [n_q_heads] nats, or null
  // when !needs_entropy(). In decode mode the query is first recorded for calibration (position
  // limit - 1) and a calibrated tier may be installed before scanning.
  RecallScan Scan(const LayerStore& store, const float* q, int64_t limit, const float* max1,
                  const float* entropy, ThreadPool* pool);

  // Overrides (benchmarks, tests): a fixed z and gate threshold (-inf: gate open), and a given
  // orthonormal basis [rank, d_c] (re-projects the indexed rows; on a range error nothing changes).
  void SetCalibration(float z, float gate_thr);
  Status SetBasis(const LayerStore& store, const float* v, ThreadPool* pool = nullptr);

  // --- read-only state ---
  bool configured() const { return d_c_ > 0; }
  bool calibrated() const { return calibrated_; }
  int rank() const { return opt_.rank; }
  int d_c() const { return d_c_; }
  int d_r() const { return d_r_; }
  float z() const { return z_; }
  float gate_threshold() const { return thr_g_; }  // -inf: always open
  int64_t n_indexed() const { return n_indexed_; }
  std::vector<int64_t> archive() const;  // ascending (built from the archive mask)
  const float* basis() const { return basis_.data(); }         // [rank, d_c] f32
  std::vector<uint16_t> csk(int64_t u) const;  // [rank] f16 of closed row u (a copy: csk is tiled)
  float eta(int64_t u) const;
  const RecallCounters& counters() const { return counters_; }
  const RecallOptions& options() const { return opt_; }
  // Bytes the index keeps resident (basis, csk and eta incl. the zero padding of the last 16-row
  // tile, archive list and tile mask, fetch buffer and per-tile fire masks, calibration queries).
  int64_t ResidentBytes() const;
  // Bytes one scanned archived row costs a scan: 2 r (csk) + 4 (eta) + 2 d_r (branch).
  int64_t scan_bytes_per_row() const { return 2 * opt_.rank + 4 + 2 * d_r_; }

  // AttendedScoreStats (below) with the rows read through this tier's row source: its reader when
  // one is installed (the policy's, which serves rows of pages released to an archive file from
  // its restored buffer or the file), else the store. Same arithmetic, so the same bytes give the
  // same max1 and entropy bit for bit.
  void AttendedStats(const LayerStore& store, const float* q, const int64_t* rows, int64_t n,
                     ThreadPool* pool, float* max1, float* entropy) const;

  // Scores of the index for one query [n_heads, d_c + d_r] (idx and cert per head for each listed
  // row, bit-identical to what Scan compares). idx, cert: [n_heads, n]. For calibration and tests.
  void IndexScores(const LayerStore& store, const float* q, const int64_t* rows, int64_t n,
                   float* idx, float* cert) const;

 private:
  // One query's scan operands for the heads in `heads`.
  struct QueryPrep {
    int64_t dp = 0;            // d_r + r: width of [branch (d_r) ; sketch (r)]
    std::vector<float> qcat;   // [n_heads padded to 16, dp] [bf16(q_r) ; f16(qsk)] as f32; the
                               // padding heads are zero
    std::vector<float> cq;     // [n_heads] lam * qres / sqrt(d_c - r) (cert_u = cq * eta_u)
    bool in_range = true;      // every |qsk| < 6e4
  };
  void PrepareQuery(const float* q, QueryPrep* p) const;
  recall_internal::RowSrc Src(const LayerStore& store) const;
  // Projects rows [begin, end) with `basis` into csk/eta (indexed by row). On a range failure
  // returns the error and sets *bad_row to the first failing row.
  Status ProjectRows(const LayerStore& store, const float* basis, int64_t begin, int64_t end,
                     uint16_t* csk, float* eta, int64_t* bad_row, ThreadPool* pool) const;
  // Fits V_r from the recorded queries and re-projects [0, n_indexed); keeps the old tier and
  // returns the error when a csk leaves the f16 range.
  Status RefitBasis(const LayerStore& store, ThreadPool* pool);
  struct Label;  // per (query, head) calibration label
  void ComputeLabels(const LayerStore& store, ThreadPool* pool, std::vector<Label>* labels) const;
  void MaybeCalibrateDecode(const LayerStore& store, const float* q, int64_t limit,
                            ThreadPool* pool);

  RecallTier(const RecallTier&) = default;  // Clone()
  RecallOptions opt_;
  int n_heads_ = 0;
  int d_c_ = 0, d_r_ = 0;
  float lam_ = 1.f;
  float z_ = 8.f;
  float thr_g_ = 0.f;  // set to -inf by Configure
  bool calibrated_ = false;
  bool collecting_ = false;        // decode mode: still recording queries
  int64_t decode_window_ = 0;      // decode mode: fit when this many queries are recorded
  int64_t n_observed_ = 0;         // prefix mode: ObserveQuery calls so far
  int64_t obs_stride_ = 1;         // prefix mode: keep observation i when i % stride == 0
  Status last_error_;              // the last failed refit (the tier then stayed as it was)
  std::vector<float> basis_;       // [rank, d_c] f32, orthonormal rows
  // csk in tiles of 16 rows, channel-major within a tile: [n_tiles, rank, 16] f16, row u channel
  // k at (u / 16) * rank * 16 + k * 16 + u % 16; the lanes past n_indexed are zero. The scan reads
  // a tile's channel k for 16 rows with one vector load (same bytes as row-major, no padding
  // beyond the last partial tile).
  std::vector<uint16_t> csk_;
  std::vector<float> eta_;         // [n_tiles * 16] f32, zero past n_indexed
  std::vector<uint16_t> branch_;   // [n_indexed, d_r] bf16 sidecar (branch_sidecar only)
  RecallRowReader reader_;
  int64_t n_indexed_ = 0;
  int64_t n_arch_ = 0;             // archived rows (the set is arch_mask_)
  int64_t arch_first_ = -1, arch_last_ = -1;
  std::vector<int64_t> qpos_;      // calibration query positions [n_obs]
  std::vector<int64_t> qidx_;      // prefix mode: observation index of each kept query
  std::vector<float> qbuf_;        // calibration queries [n_obs, n_heads, d_c + d_r]
  std::vector<int64_t> fetch_;     // this step's fetched rows
  std::vector<uint16_t> arch_mask_;  // [n_tiles] bit i of tile t: row 16 t + i is archived
  std::vector<uint16_t> tile_fire_;  // scratch: per tile of the archive's span, fired rows
  RecallCounters counters_;

 public:
  // The error of the last refit that failed inside Scan (OK if none); the tier kept its state.
  const Status& last_error() const { return last_error_; }
};

// Per-head max and softmax entropy (nats; p clamped at 1e-12 inside the log) of lam * q_h . row
// over the listed rows (ascending). q: [n_q_heads, k_dim]; max1, entropy: [n_q_heads]. An empty
// list gives max1 = -inf and entropy = 0. Reads the rows' keys once (multi-threaded over rows),
// from the store: a policy that releases pages uses RecallTier::AttendedStats instead.
void AttendedScoreStats(const LayerStore& store, const float* q, const int64_t* rows, int64_t n,
                        ThreadPool* pool, float* max1, float* entropy);

}  // namespace strata
