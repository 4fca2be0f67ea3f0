// VestigePolicy: VestigeKV tier 1 (blockwise low-pass residual selection) over MLA latent rows,
// the archive of rows it stops reading (RAM or a checksummed file), the tier-2 recall hook, and
// the read/byte accounting every report uses. Reference: docs/reference/vestigekv.md §1-§4
// (the § numbers here).
//
// Row sets of one MLA layer with n rows, n_closed = a multiple of `block`:
//   kept     = sinks [0, 4) ∪ top-m of sigma over all closed rows   (closed rows that are read)
//   archived = closed rows not kept                                 (never modified or deleted)
//   tail     = [n_closed, n)                                        (always read)
// A read for a query that sees rows [0, limit) attends kept ∪ tail ∪ fetched (fetched ⊆ archived,
// from the recall tier) with ONE exact softmax through ReadRows. When no row below the tail is
// archived the read is ReadPrefix, the full policy's own call, so the policy with everything kept
// (ratio 1, or n < block) is bit-identical to `full`.
//
// Prompt queries before the layer's first compression point (prefill calls before OnCompress)
// read every row, as `full` does: prefill attention is dense and compression changes only what
// later queries read (the reference's serving form, docs/reference/vestigekv.md §4). Decode
// steps, and prompt queries after a compression point (a second turn, an eval's question), read
// as follows.
//
// Calls (kv/policy.h): blocks close at OnAppended, when the call's rows are in and before its
// queries read. The selection ranks all closed rows against each other (one global top-m), so a
// query may read with it only if it sees every closed row: a query of the call that closed
// blocks and sits before their end reads with the selection from before the close (kept rows of
// the earlier closed prefix, then every row from its end); later queries, and every decode step,
// read with the new one (a decode step that closes a block sees all of its rows). With the file
// archive, every page of closed blocks is written and released at the EndCall of a decode call,
// and a prefill's at its compression point (OnCompress; a prompt's pages stay in RAM between its
// chunks), after every query of the call has read: during a call, every row a query reads as its
// tail is still in the store. The kept rows of a released page are copied once, exactly, into a
// dense attended tier (the restored buffer); a rebalance drops rows that leave the kept set (they
// are in the file) and reads rows that enter it back once. What stays in RAM is the tail, the
// kept rows, the metadata and (recall on) the index.
//
// File placement: a released page is gone from the store, so no read (ReadRows, ReadPrefix, the
// recall tier's index, calibration and gate) may touch it there. Its rows are served from the
// policy's memory instead: kept rows from the restored buffer, fetched rows with one pread each,
// and a dense step's released pages staged with one pread each for that read; ReadRows /
// ReadPrefix take those pointers, and the tier reads through ReadRow. The kernel tasks are the
// same as the RAM placement's, so every read equals it bit for bit (tested). A row the file
// cannot serve fails the read with a DataLoss error naming the row and the file.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/buffer.h"
#include "core/status.h"
#include "kv/policy.h"
#include "kv/registry.h"
#include "kv/vestige/archive.h"
#include "kv/vestige/recall.h"
#include "kv/vestige/row_chunks.h"
#include "kv/vestige/selector.h"

namespace strata {

enum class VestigeArchivePlacement {
  kRam,   // archived rows stay in LayerStore pages; only reads change
  kFile,  // closed pages are written to DIR and released; kept rows move to a dense tier
};

struct VestigeConfig {
  VestigeSelectorConfig selector;  // block, kappa, sinks, full_row, ratio
  VestigeArchivePlacement archive = VestigeArchivePlacement::kRam;
  std::string archive_dir;  // kFile: the folder for the archive files
  // Tier 2 (recall): on/off here; its own settings (recall-rank (alias rank), recall-capacity,
  // recall-margin, recall-overflow, calibration, z-floor, calib-queries) are parsed by
  // RecallOptions::FromSpec from the same spec.
  bool recall = true;
  RecallOptions recall_options;
  bool rank_explicit = false;  // false: Bind lowers the default 64 (DefaultRecallRank)

  // Effective values for printing by the CLI (the library prints nothing).
  int64_t block() const { return selector.block; }
  int kappa() const { return selector.kappa; }
  // Cutoff period of the low-pass in rows: block / kappa (256 at the defaults).
  double cutoff_period() const { return static_cast<double>(selector.block) / selector.kappa; }
  double ratio() const { return selector.ratio.AsDouble(); }
  // One line: "vestige: ratio 32, block 4096, kappa 16 (cutoff period 256 rows), sinks 4, ...".
  std::string ToString() const;

  // Parses and validates the settings (ratio, kappa, block, sinks, archive, recall and the recall
  // tier's keys); errors name the flag and the value.
  static StatusOr<VestigeConfig> FromSpec(const PolicySpec& spec, bool full_row);
};

// Per-step, per-layer accounting of the last read.
struct VestigeReadInfo {
  int64_t rows_attended = 0;  // kept + tail + fetched rows read in full
  int64_t rows_kept = 0;      // closed kept rows read
  int64_t rows_tail = 0;
  int64_t rows_archived = 0;  // archived rows below the read's tail (scanned when recall is on)
  int64_t rows_fetched = 0;
  // Of the attended rows, those served from outside the store (file placement): the attended
  // tier, a staged page or a pread.
  int64_t rows_from_file = 0;
  int64_t file_reads = 0;      // preads of the archive file: one per fetched row, per staged page
  int64_t bytes_read = 0;      // rows x row bytes + archived x index bytes (recall on)
  bool fallback = false;       // the recall tier asked for dense attention this step
};

// Bytes resident for one layer, by tier.
struct VestigeResidency {
  int64_t store_bytes = 0;     // LayerStore pages still allocated (kept, tail, archived in RAM)
  int64_t restored_bytes = 0;  // the attended tier: kept rows of released pages (file placement)
  int64_t staged_bytes = 0;    // released pages staged for a dense read (freed when it ends)
  int64_t metadata_bytes = 0;  // sigma, kept mask, kept/archived lists (13 B/closed row), pages
  int64_t index_bytes = 0;     // recall index (reported by the recall tier)
  int64_t file_bytes = 0;      // on disk (not RAM)
  int64_t released_bytes = 0;  // RAM given back by releasing archived pages
};

// The tier-2 hook: the policy drives the recall tier only through this interface. The default
// implementation wraps RecallTier (kv/vestige/recall.h), one per MLA layer; tests install their
// own to check the merge. Rows are positions in the layer.
class VestigeRecallHook {
 public:
  virtual ~VestigeRecallHook() = default;
  // Prefill observation (forwarded from the policy's event 1; weights are never requested).
  virtual int64_t observation_queries(int64_t prompt_len) const { return 0; }
  virtual int64_t observation_stride(int64_t n_observed) const { return 1; }
  virtual void Observe(int layer, const LayerStore& store, const PrefillObservation& obs) {}
  // After every close + rebalance: the closed prefix is [0, n_closed); archived ascending.
  // `pool` (may be null; the compression point's) runs the indexing, which must not depend on it.
  virtual void OnSelection(int layer, const LayerStore& store, int64_t n_closed,
                           const std::vector<int64_t>& archived, ThreadPool* pool) {}
  // At the compression point, after the selection (prefix calibration), on `pool` (may be null).
  virtual void OnCompress(int layer, const LayerStore& store, ThreadPool* pool) {}
  // The decode-step scan, called after the attended set (kept ∪ tail, `attended` ascending) has
  // been read into `attended_states` (m = the lam-scaled max per head). `archived`: the archived
  // rows (ascending, all < limit). Appends fetched rows (a subset of `archived`, any order;
  // duplicates removed by the caller) or sets *fallback for a dense step.
  virtual void Fetch(int layer, const LayerStore& store, const float* q, int64_t limit,
                     const std::vector<int64_t>& attended, const SoftmaxStates& attended_states,
                     const std::vector<int64_t>& archived, ThreadPool* pool,
                     std::vector<int64_t>* fetched, bool* fallback) = 0;
  // Scan bytes per archived row per step (§1.3: 2r + 4 + 2 d_r = 260 at r = d_r = 64).
  virtual int64_t ScanBytesPerArchivedRow(int layer) const = 0;
  virtual int64_t ResidentBytes(int layer) const { return 0; }
  // The first error the tier hit (it then answers with dense fallbacks, which are exact).
  virtual Status status() const { return OkStatus(); }
  // A deep copy of the hook's state for a forked cache (VestigePolicy::Clone). The default
  // refuses.
  virtual StatusOr<std::unique_ptr<VestigeRecallHook>> Clone() const {
    return Unimplemented("this recall hook cannot be forked");
  }
};

class VestigePolicy final : public Policy {
 public:
  // full_row: the "fullrow" ablation (sigma over all k_dim columns).
  explicit VestigePolicy(VestigeConfig cfg);
  ~VestigePolicy() override;

  std::string name() const override { return cfg_.selector.full_row ? "fullrow" : "vestige"; }
  std::string describe() const override { return cfg_.ToString(); }
  // RAM placement: every layer's selection and read state and the recall hook (Clone) copied.
  // File placement (archive=file:DIR) is refused: its archive files are append-only per cache.
  StatusOr<std::unique_ptr<Policy>> Clone() const override;
  Status Bind(const std::vector<LayerGeometry>& layers) override;
  int64_t observation_queries(int64_t prompt_len) const override;
  // The recall tier's prefix calibration keeps every s-th observed query (RecallTier::
  // PrefixObservationStride): the others are not delivered.
  int64_t observation_stride(int64_t n_observed) const override;
  bool observation_needs_weights() const override { return false; }
  Status OnPrefillStats(int layer, const LayerStore& store, const PrefillObservation& obs) override;
  Status OnAppended(int layer, const LayerStore& store, const CacheCall& call,
                    CachePlan* plan, ThreadPool* pool) override;
  Status EndCall(int layer, const LayerStore& store, const CacheCall& call,
                 CachePlan* plan) override;
  Status OnCompress(int layer, const LayerStore& store, CachePlan* plan,
                    ThreadPool* pool) override;
  Status Read(int layer, const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override;
  // Prompt queries before the layer's compression point (and every query of a GQA layer), as
  // Read's dense branch reads them.
  bool ClaimDenseReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                       ReadStats* stats) override;
  int64_t ResidentBytes(int layer, const LayerStore& store) const override;
  // The store's pages as `full` holds them (with the file archive, the released pages staged back
  // for a dense read stand in for pages the store no longer holds), the selection metadata and,
  // on MLA layers, the attended tier (kept rows of released pages), the recall index (per closed
  // row 2 rank + 4 bytes, the branch sidecar, masks, the fetch list) and its fixed-size parts:
  // the basis (rank x d_c f32) and, until calibration, the recorded queries (at most
  // 2 calib-queries + 1 of n_q_heads x k_dim f32 each), which dominate a short prompt's cache
  // (measured up to 5.8x full at 300-1,100 rows, at k_dim 72 and at the 150m preset's shape;
  // about +25% at 16,384 rows there: kv/peak_resident_test.cc, docs/serve.md).
  // Vectors are bounded by their capacity growth (1/16 for the index, 2x for position lists).
  int64_t PeakResidentBytes(int layer, const LayerGeometry& g, int64_t n_rows) const override;
  // tail and pages (the store), attended tier, recall index, selection metadata, buffers; the
  // archive file's bytes.
  ResidentParts ResidentBreakdown(int layer, const LayerStore& store) const override;
  // A failed archive write (the rows stay in RAM) or the recall tier's first error (dense steps
  // from then on): both exact.
  Status recovered_error() const override;
  // MLA layers: rows kept = kept closed rows + the unclosed tail, blocks = closed blocks,
  // compressed = some closed row is archived. Other layers are read in full (not compressed).
  PolicySummary Summary(int layer, const LayerStore& store) const override;

  const VestigeConfig& config() const { return cfg_; }
  // Installs the tier-2 implementation (null: none). Call before the first append.
  void SetRecallHook(std::unique_ptr<VestigeRecallHook> hook) { recall_ = std::move(hook); }
  VestigeRecallHook* recall_hook() const { return recall_.get(); }

  int n_layers() const { return static_cast<int>(layers_.size()); }
  bool is_mla(int layer) const { return layers_[layer].mla; }
  // Selection state of an MLA layer (CHECK: layer is MLA).
  const VestigeSelector& selector(int layer) const;
  int64_t n_closed(int layer) const;
  const VestigeReadInfo& last_read(int layer) const { return layers_[layer].last; }
  VestigeResidency Residency(int layer, const LayerStore& store) const;
  // Totals over the policy's life.
  int64_t closes() const { return closes_; }
  // Wall time of the selector's block closes (sigma of each closing block), for benchmarks.
  double close_seconds() const { return close_seconds_; }
  int64_t reads() const { return reads_; }
  int64_t fallbacks() const { return fallbacks_; }
  double fallback_rate() const { return reads_ ? static_cast<double>(fallbacks_) / reads_ : 0.0; }
  // The first archive write error (OK when none): the pages then stay resident (exact). A read
  // error is never recovered from: the read returns it.
  const Status& archive_status() const { return recovered_; }
  // Path of layer's archive file ("" in RAM placement or before the first release).
  std::string archive_path(int layer) const;

  // Any row of the layer as bf16 [k_dim], from RAM, the restored buffer or the archive file.
  Status ReadRow(int layer, const LayerStore& store, int64_t row, uint16_t* out) const;
  // The RecallTier of an MLA layer when the default recall hook is installed, else null.
  const RecallTier* recall_tier(int layer) const;

 private:
  struct Layer {
    bool mla = false;
    int k_dim = 0;
    VestigeSelector sel;
    // The selection before the running call's closes (valid from its first close to EndCall).
    struct Before {
      bool valid = false;
      int64_t n_closed = 0;
      std::vector<int64_t> kept;  // ascending, all < n_closed
    } before;
    VestigeReadInfo last;
    bool prompt_call = false;  // the running call is a prefill chunk (its queries are prompt's)
    bool compressed = false;   // the layer has passed a compression point (OnCompress)
    // File placement.
    std::unique_ptr<VestigeArchiveFile> file;
    std::vector<uint8_t> released;      // [n_pages] 1 when the page went to the file
    std::vector<int64_t> restored_pos;  // kept rows of released pages, ascending
    RowChunks restored;                 // [restored_pos.size(), k_dim] bf16 (the attended tier)
    int64_t released_bytes = 0;
    // Released pages staged back for one dense read (a fallback step, or a query whose rows
    // [0, limit) hold no archived row below its tail): [kPageRows, k_dim] bf16 each, read from
    // the file with one pread, freed when the read ends.
    struct Staged {
      AlignedBuffer<uint16_t> rows;  // [kPageRows, k_dim] bf16 (heap block: stable pointers)
    };
    std::unordered_map<int64_t, Staged> staged;
    int64_t staged_bytes = 0;
    // Read scratch.
    std::vector<int64_t> rows, archived, fetched;
    std::vector<const uint16_t*> ptrs;  // [rows] where a row's bytes live (null: the store)
    std::vector<size_t> file_rows;      // indices into the read's rows read row by row
    std::vector<uint16_t> file_buf;     // [file_rows, k_dim] bf16 read from the file
    bool file_ok = true;                // false after a write error: no more releases
    int64_t file_reads = 0;             // preads of the archive file so far (reads)
  };
  // Closes every complete block and rebalances (the selection: kept and archived sets).
  // `pool` (the compression point's; null on decode calls) runs the recall indexing.
  Status CloseReady(int layer, const LayerStore& store, ThreadPool* pool = nullptr);
  // After a selection: kept rows of released pages into the restored buffer, the recall index.
  Status AfterSelection(int layer, const LayerStore& store, ThreadPool* pool);
  // File placement: writes the fully archived closed pages still resident and plans their
  // release. A write error keeps them resident (exact; recovered_error()).
  Status ArchivePages(int layer, const LayerStore& store, CachePlan* plan);
  // Every byte a read attends comes from where the row lives: its store page while resident,
  // else (file placement) the restored buffer (kept rows), a staged page (dense reads), or one
  // pread. The kernels see the same tasks either way (ReadPrefix / ReadRows with the policy's
  // pointers), so the file placement reads bit-identically to the RAM placement.
  //
  // ReadSet: `rows` (ascending) into st with ReadRows. ReadDense: rows [0, limit) with
  // ReadPrefix, the full policy's own call. Both return the rows served outside the store, or the
  // error of a row the file cannot serve.
  StatusOr<int64_t> ReadSet(Layer& L, const LayerStore& store, const float* q,
                            const std::vector<int64_t>& rows, ThreadPool* pool, SoftmaxStates* st,
                            ReadStats* local);
  StatusOr<int64_t> ReadDense(Layer& L, const LayerStore& store, const float* q, int64_t limit,
                              ThreadPool* pool, SoftmaxStates* st, ReadStats* local);
  // The staged copy of released page p (staged now if needed).
  StatusOr<const Layer::Staged*> StagePage(Layer& L, int64_t p);
  void ClearStaged(Layer& L);
  // Where a query at `limit` reads: with the selection from before its call's closes (`before`),
  // its tail from tail_begin, and the n_kept kept rows below it.
  struct ReadShape {
    bool before = false;
    int64_t tail_begin = 0, n_kept = 0;
  };
  ReadShape Shape(const Layer& L, int64_t limit) const;
  bool AnyReleasedBelow(const Layer& L, int64_t limit) const;
  void NoteRecovered(const Status& s);

  VestigeConfig cfg_;
  std::vector<Layer> layers_;
  std::unique_ptr<VestigeRecallHook> recall_;
  Status recovered_;  // the first archive write error
  int64_t closes_ = 0, reads_ = 0, fallbacks_ = 0;
  double close_seconds_ = 0;
  int64_t instance_ = 0;
};

// Registry entry makers ("vestige" and "fullrow").
// The declared settings of vestige (full_row: fullrow): the selector's, the archive's and the
// recall tier's (RecallSettingDecls); defaults are VestigeConfig's initial values.
PolicySettings VestigeSettings(bool full_row);
// The recall rank an MLA layer gets when `rank` is not given: the largest multiple of 8, at most
// 64 and d_c, whose index row (2 rank + 4 + 2 d_r bytes scanned per archived row) is at most a
// quarter of the 2 (d_c + d_r)-byte cache row, and 8 where even rank 8 is more (rows narrower
// than 4 d_r + 40 values, whose branch copy alone takes most of the quarter). Kimi Linear's row
// (d_c 512, d_r 64: 1,152 B) gets 64 (260 B, 23 %); the 80-wide testbed row 8 (52 B of 160).
int DefaultRecallRank(const LayerGeometry& g);

StatusOr<std::unique_ptr<Policy>> MakeVestigePolicy(const PolicySpec& spec, bool full_row);

}  // namespace strata
