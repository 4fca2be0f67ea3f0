// Cold pages in FP4 (`coldfp4`): TensorRT-LLM's scheme of demoting cold KV pages to NVFP4 while
// the hot ones stay in the cache's own precision.
//
// Pages are the store's 64-row pages. Page 0 (the attention sinks) is never demoted. Any other
// page is demoted, in one step, the moment it fills (once the cache holds row 64 (p + 1) - 1);
// the partially filled newest page stays exact. So a query at limit L reads rows [0, 64) and
// [64 floor(L / 64), L) exactly (bf16, from the store) and every page in between in FP4; a
// query whose own page is full (L a multiple of 64) reads that page in FP4 too.
//
// The FP4 format (NVFP4): each row of each KV head, K and V alike, in blocks of 16 consecutive
// values (a last partial block zero-padded), every value an E2M1 code (sign + {0, 0.5, 1, 1.5,
// 2, 3, 4, 6}), one FP8 E4M3 scale per block, and one f32 second-level scale per (page, KV head,
// K or V) as NVFP4's per-tensor scale: g = amax(page) / (448 * 6) (1 when the page is all
// zeros). Block scale s = E4M3(amax(block) / 6 / g) (round to nearest even, saturating at 448);
// code = round to nearest (ties to the even code) on the E2M1 grid of x / (s g), saturating at
// 6; x^ = grid(code) s g. A page of one KV head takes 64 (ceil(D / 2) + ceil(D / 16)) bytes per
// K or V plus 4 bytes of g (PageBytes): 4 + 8 / 16 = 4.5 bits per value when D is a multiple of
// 16, + 32 bits per 64 rows. MLA layers code the latent row once; the value is its first v_dim
// columns.
//
// Reads: exact rows through ReadRows; the FP4 pages dequantized to f32 and attended with online
// softmax. Prefill chunks read staged (page 0's exact rows and the FP4 pages as f32, then the
// newest page's rows from the store; the policy keeps the store it was last shown in OnAppended
// to stage page 0 from).
// Resident = the store's pages still held + every demoted page's FP4 bytes; demoted pages
// wholly before the running call's first row are released from the store. Bytes read per read =
// exact rows x the store's bytes per row + FP4 pages read x their bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/policy.h"
#include "kv/registry.h"

namespace strata::baselines {

// FP8 E4M3 (OCP "E4M3FN": bias 7, no infinities, max 448, subnormals down to 2^-9) of a
// non-negative value: round to nearest even, saturating at 448.
uint8_t E4M3FromFloat(float x);
float E4M3ToFloat(uint8_t b);
// E2M1 (FP4): bit 3 the sign, bits 0-2 the index into {0, 0.5, 1, 1.5, 2, 3, 4, 6}; round to
// nearest, ties to the even index, saturating at 6.
uint8_t E2M1FromFloat(float x);
float E2M1ToFloat(uint8_t code);

// One row of n values in FP4 blocks of 16 with the page's second-level scale g: codes packed two
// per byte (value 2i in the low nibble), then one E4M3 scale per block.
constexpr int kFp4Block = 16;
inline int64_t Fp4RowBytes(int n) { return (n + 1) / 2 + (n + kFp4Block - 1) / kFp4Block; }
void Fp4EncodeRow(const float* x, int n, float g, uint8_t* out);
void Fp4DecodeRow(const uint8_t* in, int n, float g, float* x);

class ColdFp4Policy final : public Policy {
 public:
  // A copy with no running call's store (the next call's OnAppended sets it).
  StatusOr<std::unique_ptr<Policy>> Clone() const override {
    auto c = std::make_unique<ColdFp4Policy>(*this);
    for (Layer& L : c->layers_) L.store = nullptr;
    return std::unique_ptr<Policy>(std::move(c));
  }
  static constexpr int64_t kPage = 64;  // LayerStore::kPageRows
  std::string name() const override { return "coldfp4"; }
  std::string describe() const override;
  Status Bind(const std::vector<LayerGeometry>& layers) override;
  Status OnAppended(int layer, const LayerStore& store, const CacheCall& call, CachePlan* plan,
                    ThreadPool* pool) override;
  Status Read(int layer, const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override;
  bool ClaimStagedReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                        ReadStats* stats, StagedPrefixPlan* plan) override;
  void StagePrefixRows(int layer, int h, int64_t s0, int64_t sn, float* keys,
                       float* values) const override;
  int64_t ResidentBytes(int layer, const LayerStore& store) const override;
  int64_t PeakResidentBytes(int layer, const LayerGeometry& g, int64_t n_rows) const override;
  PolicySummary Summary(int layer, const LayerStore& store) const override;

  // FP4 bytes of one demoted page, all KV heads (keys + values + the f32 scales).
  static int64_t PageBytes(const LayerGeometry& g);
  // Pages demoted once the cache holds n rows: pages [1, floor(n / 64)).
  static int64_t DemotedAfter(int64_t n) { return std::max<int64_t>(0, n / kPage - 1); }
  int64_t demoted_pages(int layer) const { return layers_[layer].n_demoted; }
  // Bytes a read at `limit` touches: exact rows x the store's bytes per row + FP4 pages x
  // PageBytes.
  static int64_t ReadBytes(const LayerGeometry& g, int64_t limit);
  // Row u of KV head h as a read at `limit` attends it (f32): exact (the store's bf16) in page 0
  // and in rows >= 64 floor(limit / 64), else its FP4 dequantization. value may be null.
  void RowAsRead(int layer, const LayerStore& store, int h, int64_t u, int64_t limit, float* key,
                 float* value) const;
  // The second-level scale of page p of head h (keys; values when `value`).
  float page_scale(int layer, int h, int64_t p, bool value) const;

 private:
  struct Layer {
    LayerGeometry g;
    bool mla = false;
    int64_t n_demoted = 0;  // pages [1, 1 + n_demoted) are held in FP4
    // Per KV head, page p (>= 1) at (p - 1) * page_head_bytes: keys' rows, values' rows, then
    // the f32 scales (keys, values).
    std::vector<std::vector<uint8_t>> heads;
    const LayerStore* store = nullptr;  // the store of the running call (page 0's rows)
  };
  int64_t HeadPageBytes(const Layer& L) const;
  void Demote(const Layer& L, const LayerStore& store, int h, int64_t p, uint8_t* out) const;
  // Dequantized rows [u0, u0 + n) (within demoted pages) of head h.
  void DecodeRows(const Layer& L, int h, int64_t u0, int64_t n, float* kt, float* vt) const;

  std::vector<Layer> layers_;
};

PolicySettings ColdFp4Settings();
StatusOr<std::unique_ptr<Policy>> MakeColdFp4Policy(const PolicySpec& spec);

}  // namespace strata::baselines
