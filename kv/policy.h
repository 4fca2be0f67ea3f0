// The cache policy interface: the events a policy sees, the plan it returns, the read it performs.
//
// A sequence's cache advances in forward calls (one Model::ForwardChunk: a prefill chunk or one
// decode token). The cache tells the policy where each call begins and ends; inside a call every
// layer first appends all of the call's rows, then reads the call's queries in position order.
// Events, per layer (nothing else reaches a policy):
//   BeginCall     the call's token range and kind, before its first row is appended;
//   OnAppend      after each appended row (a policy mirrors the row into its own structures);
//   OnAppended    after the call's last row is appended and before its first read: the causal
//                 point where a policy closes blocks and chooses what to keep (rows of the call's
//                 own queries stay readable: see Read);
//   OnPrefillStats observed prompt queries (exact weights when asked for), at most
//                 observation_queries() of them, delivered as they are read;
//   OnPrefillColumnSums  instead, where the policy takes them and the model computes them in
//                 bulk: the weights of a run of observed queries summed per row and KV head;
//   Read          one query that may see rows [0, limit): the policy picks what to read (recall
//                 scan, page selection, EMA update) and returns online-softmax states;
//   EndCall       after the call's last read;
//   OnCompress    the compression point (end of a prefill, or an explicit Compress()), outside
//                 any call.
// Every event returns a Status: an error names the layer, the rows and the cause and reaches the
// caller through KvCache; a policy never aborts on bad input and never leaves a row out of a
// softmax silently. Where a policy has an exact fallback (e.g. the recall tier's dense step) it
// takes it and counts it in ReadStats::fallbacks.
//
// Policies see the LayerStore read-only. The one mutation of the store, releasing pages whose
// rows the policy now keeps elsewhere, is a CachePlan the policy returns from BeginCall,
// OnAppended, EndCall or OnCompress and the cache applies at once; the cache checks that no
// released page holds a row of the running call (so no query of the call can lose a row).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kv/geometry.h"
#include "kv/store.h"

namespace strata {

// Rows and bytes one read touched (summed over layers by the cache).
struct ReadStats {
  int64_t rows_attended = 0;  // distinct rows whose full K/V were read (per KV head summed)
  int64_t rows_fetched = 0;   // rows recalled from an archive this step
  int64_t bytes_read = 0;     // every byte the read touched: rows, indexes, scales, summaries
  int64_t fallbacks = 0;      // reads that took an exact fallback (e.g. a dense recall step)
};

// The split of a claimed staged read (Policy::ClaimStagedReads): a query at limit L reads its
// first Split(L) rows from the policy's staged copy, the rest from the store.
struct StagedPrefixPlan {
  int64_t unit = 1;  // Split(L) = min(cap, floor(L / unit) * unit)
  int64_t cap = 0;
  int64_t Split(int64_t limit) const { return std::min(cap, limit / unit * unit); }
};

// One observed prompt query and, when the policy asks for them, its exact attention weights.
struct PrefillObservation {
  int64_t query_pos = 0;     // position of the query; it saw rows [0, query_pos]
  int n_q_heads = 0;
  int k_dim = 0;
  const float* q = nullptr;  // [n_q_heads, k_dim] the query as the cache saw it (MLA: absorbed)
  int64_t n_keys = 0;        // = query_pos + 1
  const float* weights = nullptr;  // [n_q_heads, n_keys] softmax probabilities, or null
};

// A run of observed prompt queries of one call, delivered through their weights' column sums:
// the queries at positions [first_query, end_query) (each sees rows [0, pos]); for KV head h and
// row u < n_keys = end_query, sums[h * n_keys + u] is the sum over those queries and the G query
// heads of h of their exact softmax weight on row u (0 where u > pos).
struct PrefillColumnSums {
  int64_t first_query = 0;
  int64_t end_query = 0;
  int64_t n_keys = 0;
  const double* sums = nullptr;  // [n_kv_heads, n_keys]
};

// Where a forward call sits in the sequence.
enum class CallKind {
  kPrefill,  // a chunk of the prompt (Model::Prefill)
  kDecode,   // one generated token (Model::Decode), or any call outside a prefill
};

// One forward call: rows [first, end) are appended to every layer, then its queries read.
struct CacheCall {
  int64_t first = 0;
  int64_t end = 0;
  CallKind kind = CallKind::kDecode;
  int64_t n_rows() const { return end - first; }
};

// A planned change of the store, returned by a policy and applied by the cache.
struct CachePlan {
  struct Page {
    int head = 0;      // KV head (MLA: 0)
    int64_t page = 0;  // page index (rows [64 page, 64 page + 64))
  };
  std::vector<Page> release;  // pages the policy no longer reads from the store
  bool empty() const { return release.empty(); }
};

// What a policy did to the cache on this run, read from the state its reads use (never restated
// from its settings): the reports' "rows kept / visible" and the reason behind a "compressed
// nothing" warning (kv/achieved.h). One layer's summary, or a sum over layers, trials or windows
// (Add). Rows count once per KV head (an MLA layer has one).
struct PolicySummary {
  int64_t rows_visible = 0;    // rows a query at the end of the cache would see
  int64_t rows_kept = -1;      // of them, rows the policy reads without a recall (sinks, kept
                               // rows, the unclosed tail); -1: the policy does not select rows
  int64_t blocks_closed = -1;  // compression blocks closed so far; -1: the policy has no blocks
  // False: the policy changed nothing it holds or reads on this run (no block closed, every row
  // kept, no compression point yet...); `note` says why. True is also the default of a policy
  // that does not say: the measured bytes then decide alone.
  bool compressed = true;
  bool reference = false;  // the uncompressed cache itself (`full`): nothing to warn about
  std::string note;        // one line; several distinct notes are joined with "; "
  // The setting that would make the policy hold (or read) less on this model, when its settings
  // make it hold more than it must (e.g. "archive=file keeps the archived rows on disk");
  // CheckAchieved appends it to a holds-more warning. Distinct ones are joined with "; ".
  std::string remedy;
  // A bits-per-value budget (Geodesia's `bits`; 0: the policy has none), and the values it
  // covers on this run with the bits they take (summed over layers; 0 before the compression
  // point), for CheckAchieved's budget check (kv/achieved.h).
  double budget_bits = 0;
  int64_t budget_values = 0;
  double budget_bits_used = 0;
  // Sums rows and blocks (when only one side selects rows, the other side's rows count as all
  // kept; blocks likewise as none), ORs `compressed`, ANDs `reference`, joins distinct notes.
  void Add(const PolicySummary& other);
  // The start of a sum (nothing counted, not compressed, reference): Identity().Add(s) == s.
  static PolicySummary Identity();
};

// Where a policy's resident bytes are: named parts that add up to its ResidentBytes, and what
// it keeps on disk (not resident). Reports print them ("resident = tail and pages a + attended
// tier b + ...; archive file c on disk").
struct ResidentParts {
  std::vector<std::pair<std::string, int64_t>> parts;  // in the policy's order
  int64_t file_bytes = 0;
  int64_t total() const;
  // Adds other's parts by name (a part new to this sum goes last) and its file bytes.
  void Add(const ResidentParts& other);
  // "12.3 KiB = cache pages 10.0 KiB + index 2.3 KiB" (one part: just the bytes).
  std::string ToString() const;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  // The policy with the settings it actually uses (e.g. "vestige ratio 32, block 512, kappa 2"),
  // for the CLI to print; valid after Bind.
  virtual std::string describe() const { return name(); }
  // A deep copy of the policy and all its state (KvCache::Fork): the copy answers every later
  // event exactly as this policy would, bit for bit, and shares no mutable state with it. The
  // default refuses: "policy 'X' cannot be forked".
  virtual StatusOr<std::unique_ptr<Policy>> Clone() const {
    return Unimplemented("policy '" + name() + "' cannot be forked");
  }
  // Checks the policy fits the model (e.g. a row policy on a model with no MLA layer is an error
  // naming both) and sizes per-layer state.
  virtual Status Bind(const std::vector<LayerGeometry>& layers) = 0;
  // Whether the policy reads stores of this kv type (LayerGeometry::kv_type). Compressed
  // policies' formats, scores and archives are defined over bf16 rows, so only bf16 by default;
  // KvCache::Create refuses any other with an error naming the policy.
  virtual bool SupportsKvType(DType t) const { return t == DType::kBF16; }

  // Call boundaries (see the header comment). `plan` is empty on entry.
  virtual Status BeginCall(int layer, const LayerStore& store, const CacheCall& call,
                           CachePlan* plan) {
    return OkStatus();
  }
  virtual Status OnAppend(int layer, const LayerStore& store) { return OkStatus(); }
  // `pool`: the workers of the call (KvCache::BeginCall's; may be null), for a policy's block
  // closes and group quantization; results must not depend on it.
  virtual Status OnAppended(int layer, const LayerStore& store, const CacheCall& call,
                            CachePlan* plan, ThreadPool* pool) {
    return OkStatus();
  }
  virtual Status EndCall(int layer, const LayerStore& store, const CacheCall& call,
                         CachePlan* plan) {
    return OkStatus();
  }

  // Prefill statistics. How many trailing prompt queries to observe for a prefill of
  // `prompt_len` tokens (0: none), and whether their attention weights are needed (or only the
  // queries).
  virtual int64_t observation_queries(int64_t prompt_len) const { return 0; }
  // Of a window of n_observed queries, the policy uses only those at offsets 0, s, 2s, ... (s =
  // this, >= 1) from the window's first: the others are not delivered (nor, where a model can
  // skip it, formed). Only for policies that need no weights (column sums cover every query).
  virtual int64_t observation_stride(int64_t n_observed) const { return 1; }
  virtual bool observation_needs_weights() const { return true; }
  virtual Status OnPrefillStats(int layer, const LayerStore& store,
                                const PrefillObservation& obs) {
    return OkStatus();
  }
  // Whether the policy reads observed queries' weights only through their column sums per KV
  // head, in any grouping of the queries (then a model may deliver a run of them at once through
  // OnPrefillColumnSums instead of one OnPrefillStats per query; the sums are those of the same
  // weights up to f32 rounding of the scores, not bit for bit). Only asked when
  // observation_needs_weights().
  virtual bool observation_takes_column_sums() const { return false; }
  virtual Status OnPrefillColumnSums(int layer, const LayerStore& store,
                                     const PrefillColumnSums& sums) {
    return Internal(name() + " does not take observation column sums");
  }
  // The compression point. `pool` (may be null) runs the policy's own work there (block closes,
  // index builds, calibration); what it computes must not depend on it.
  virtual Status OnCompress(int layer, const LayerStore& store, CachePlan* plan, ThreadPool* pool) {
    return OkStatus();
  }
  // A query that may see rows [0, limit): q [n_q_heads, k_dim] f32. Writes states for all
  // n_q_heads heads (st->Reset() already done by the caller).
  virtual Status Read(int layer, const LayerStore& store, const float* q, int64_t limit,
                      ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) = 0;
  // Dense reads claimed in bulk (MLA prefill, model/mla.cc): whether the running call's m
  // queries of `layer` at limits first_limit, first_limit + 1, ..., first_limit + m - 1 would
  // each read exactly rows [0, limit) of the store through Read, as ReadPrefix reads them, with
  // no effect but the counting. True: the policy counts the m reads as Read would have (its own
  // counters and ReadStats into `stats`), and the caller computes their attention from the
  // store's rows by another method, exact up to f32 rounding. False (the default): nothing
  // happens and the caller reads each query through Read.
  virtual bool ClaimDenseReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                               ReadStats* stats) {
    return false;
  }
  // Staged reads in bulk (GQA prefill, model/gqa_prefill.h), for a policy whose reads are a
  // prefix of its own approximate rows followed by exact rows of the store (KIVI: the quantized
  // groups, then the newest rows): whether the running call's m queries of `layer` at limits
  // first_limit .. first_limit + m - 1 would each read, through Read, rows [0, b) as the f32 rows
  // StagePrefixRows gives and rows [b, limit) of the store exactly, with b = plan->Split(limit),
  // and no effect but the counting. True: the policy fills *plan, counts the m reads as Read
  // would have (into `stats`), and the caller computes their attention by another method, exact
  // up to f32 rounding. False (the default): nothing happens.
  virtual bool ClaimStagedReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                                ReadStats* stats, StagedPrefixPlan* plan) {
    return false;
  }
  // After ClaimStagedReads: rows [s0, s0 + sn) (s0 + sn <= the plan's cap) of KV head h as f32,
  // keys [sn, k_dim] and values [sn, v_dim] row-major, as Read would attend them; values may be
  // null (the caller needs the keys only: MLA, whose values are the latent rows' first v_dim).
  virtual void StagePrefixRows(int layer, int h, int64_t s0, int64_t sn, float* keys,
                               float* values) const {}
  // Bytes this policy keeps resident for the layer (rows it still holds + its own structures).
  virtual int64_t ResidentBytes(int layer, const LayerStore& store) const {
    return store.resident_bytes();
  }
  // An upper bound of ResidentBytes(layer) at any point of a sequence while the layer holds at
  // most `n_rows` rows (prefill calls of any size, block closes, compression points, decode
  // steps), for the bound layer `layer` of geometry `g`. The server reserves a prompt of n tokens
  // at the sum over layers (KvCache::PeakResidentBytes) before admitting it; the conformance
  // suite (kv/conformance_test.cc, PeakResidentWithinDeclared) checks the bound for every
  // registered policy at a tiny and a realistic size. A policy whose structures beside the store
  // have a fixed size (a basis, buffers) declares them here, so the bound holds at every size.
  // The default: the store's pages as `full` holds them (FullPageBytes), right for a policy that
  // holds nothing else.
  virtual int64_t PeakResidentBytes(int layer, const LayerGeometry& g, int64_t n_rows) const {
    return FullPageBytes(g, n_rows);
  }
  // The pages `full` holds for n_rows rows of a layer: whole LayerStore::kPageRows-row pages.
  static int64_t FullPageBytes(const LayerGeometry& g, int64_t n_rows) {
    const int64_t page = LayerStore::kPageRows;
    return (n_rows + page - 1) / page * page * g.bytes_per_token();
  }
  // ResidentBytes by part. The default: "cache pages" (the store's pages) and, when the policy
  // holds more, "policy state" (the rest).
  virtual ResidentParts ResidentBreakdown(int layer, const LayerStore& store) const;
  // The first error the policy recovered from exactly (OK when none): e.g. a failed archive
  // write (the rows stay in RAM) or a failed recall index (dense steps from then on). Results
  // are still exact; reports print it so that a run that did not do what was asked says so.
  virtual Status recovered_error() const { return OkStatus(); }
  // What the policy did to the layer so far (see PolicySummary). The default: rows_visible =
  // store rows x KV heads, no row selection, no blocks, compressed = true (no claim).
  virtual PolicySummary Summary(int layer, const LayerStore& store) const;
  // Graded block levels (Geodesia-KV) of one layer: `levels` = the ladder's bits per value,
  // highest first (16, 8, 4, 2, 1), and per KV head the level of every block (the open block
  // included). False, writing nothing, for a policy without graded blocks (the default).
  virtual bool BlockLevels(int layer, std::vector<int>* levels,
                           std::vector<std::vector<int>>* per_head) const {
    return false;
  }
};

// The classic cache: every visible row, exactly. The reference every other policy is tested
// against ("policy off").
class FullPolicy final : public Policy {
 public:
  std::string name() const override { return "full"; }
  StatusOr<std::unique_ptr<Policy>> Clone() const override {
    return std::unique_ptr<Policy>(new FullPolicy(*this));
  }
  Status Bind(const std::vector<LayerGeometry>& layers) override { return OkStatus(); }
  // Exact attention over rows of any stored type: bf16, f16 or f32 (--kv-type).
  bool SupportsKvType(DType t) const override { return true; }
  Status Read(int layer, const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override;
  bool ClaimDenseReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                       ReadStats* stats) override;
  PolicySummary Summary(int layer, const LayerStore& store) const override;
};

// The ReadStats of m dense reads at limits first_limit .. first_limit + m - 1 (what ReadPrefix
// counts for each), for ClaimDenseReads.
void CountDenseReads(const LayerGeometry& g, int64_t first_limit, int m, ReadStats* stats);

// Exact reads shared by all row-selecting policies.
//
// ReadPrefix: rows [0, limit) of every KV head. ReadRows: the listed rows (ascending, < limit) of
// every KV head. Both split pages across the pool's threads with per-thread states merged in
// thread order, and count rows and bytes into stats.
//
// Rows a policy serves from its own memory (MLA only, e.g. pages it released to an archive file
// and staged back for this read): `page_keys` (ReadPrefix, [ceil(limit / kPageRows)] entries) gives
// page p's rows as a [kPageRows, k_dim] bf16 block where non-null; `key_rows` (ReadRows, [n_rows]
// entries) gives row rows[i] as [k_dim] bf16 where non-null. Null entries (or a null array) read
// the store. The tasks and the arithmetic do not depend on where the bytes live, so the result is
// bit-identical to reading the same bytes from the store.
void ReadPrefix(const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
                SoftmaxStates* st, ReadStats* stats, const uint16_t* const* page_keys = nullptr);
void ReadRows(const LayerStore& store, const float* q, const int64_t* rows, int64_t n_rows,
              ThreadPool* pool, SoftmaxStates* st, ReadStats* stats,
              const uint16_t* const* key_rows = nullptr);

}  // namespace strata
