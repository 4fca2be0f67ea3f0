// KIVI baseline (kivi2, kivi4): asymmetric 2/4-bit quantization with an incremental group flush.
//
// Layout (per KV head; the reference group 32, residual 32, docs/reference/geodesia-kv.md §8):
//   keys    per channel over groups of 32 tokens: one f16 (lo, step) per (group, channel);
//   values  per token over groups of 32 channels: one f16 (lo, step) per (token, channel group);
//   codes   packed LSB-first, token-major (t * D + d), `bits` bits each.
// MLA layers hold one latent row per token that is both key and value: it is quantized once, per
// channel over 32-token groups (the key rule), and the value is the first v_dim columns of the
// same dequantized row.
//
// Flush schedule (real, incremental): once a call's rows are in (OnAppended, before its first
// read), a cache of t tokens holds exactly max(0, floor((t - 32) / 32)) quantized groups, so the
// newest t - 32 * that (in [32, 64)) tokens are exact. Every 32 new tokens the oldest exact group
// is quantized once, from the exact bf16 rows, and never again; a prefill chunk's new groups are
// quantized together, (group, KV head) pairs over the call's pool, each independent of the others
// (the same bytes on any number of threads).
// The policy then releases the store pages it no longer needs (all rows quantized and before the
// first query of the current call), so memory really shrinks; attention dequantizes.
//
// Causality: a read at position pos uses a quantized group only if all its rows are <= pos (a
// group's (lo, step) depend on all its rows); later groups are read exactly from the store.
//
// Quantization: lo = f16 rounded down from the group min, step = f16 rounded up from
// (max - lo) / (2^bits - 1), code = clamp(round((x - lo) / step), 0, 2^bits - 1), x^ = lo +
// code * step. So |x - x^| <= step / 2 (+ f32 rounding), and a constant group has step 0 and
// reconstructs exactly (the reference's 0/0 is avoided). Values outside the f16 range are clamped.
//
// KIVI's rate is set by --bits through the policy name; --ratio is accepted and ignored (so a
// grid over ratios can include it).
//
// Read path: GQA layers whose key and value widths are equal and a multiple of 32 keep their
// groups in Geodesia's packed slot format (kernels/geodesia_format.h: two 32-token groups are
// one 64-token slot at level `bits` with group size 32; the same codes, packing and f16 scales
// as above, only arranged as that format's arrays) and are read by the packed attention kernel
// (kernels/packed_attention.h), with the arithmetic of the `attn-math` setting (f32 | int8,
// geodesia::PackedMath). Other layers (MLA, other widths) keep the per-group arrays and the
// dequantize-then-attend loop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/packed_attention.h"
#include "kv/policy.h"
#include "kv/registry.h"

namespace strata::baselines {

struct KiviQuantParams {
  uint16_t lo = 0;    // f16
  uint16_t step = 0;  // f16, 0 for a constant group
};

// Quantizes n values x[i * stride] to `bits`; codes[i] one per byte.
KiviQuantParams KiviQuantize(const float* x, int64_t n, int64_t stride, int bits, uint8_t* codes);
inline float KiviDequant(uint8_t code, float lo, float step) { return lo + code * step; }
// LSB-first packing of n codes of `bits` (2, 4 or 8) bits, each < 2^bits (geodesia::PackCodes,
// any n): (1,2,3,0) at 2 bits -> 0x39.
void KiviPack(const uint8_t* codes, int64_t n, int bits, uint8_t* out);
void KiviUnpack(const uint8_t* packed, int64_t n, int bits, uint8_t* codes);

class KiviPolicy final : public Policy {
 public:
  StatusOr<std::unique_ptr<Policy>> Clone() const override {
    return std::unique_ptr<Policy>(new KiviPolicy(*this));
  }
  static constexpr int kGroup = 32;     // tokens per key group, channels per value group
  static constexpr int kResidual = 32;  // exact recent tokens, at least

  // math_from_cache: the packed read's arithmetic comes from the bound layers' --attn-math at
  // Bind (the setting's default, `cache`); else `math`.
  explicit KiviPolicy(int bits, geodesia::PackedMath math = geodesia::PackedMath::kF32,
                      bool math_from_cache = false)
      : bits_(bits), math_(math), math_from_cache_(math_from_cache) {}
  std::string name() const override { return bits_ == 2 ? "kivi2" : "kivi4"; }
  Status Bind(const std::vector<LayerGeometry>& layers) override;
  Status OnAppended(int layer, const LayerStore& store, const CacheCall& call,
                    CachePlan* plan, ThreadPool* pool) override;
  Status Read(int layer, const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override;
  // A prefill chunk's reads are the quantized groups below each query (as f32, StagePrefixRows)
  // and the exact rows after them (model/gqa_prefill.h, and MLA's expanded form in model/mla.h,
  // stage both).
  bool ClaimStagedReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                        ReadStats* stats, StagedPrefixPlan* plan) override;
  void StagePrefixRows(int layer, int h, int64_t s0, int64_t sn, float* keys,
                       float* values) const override;
  int64_t ResidentBytes(int layer, const LayerStore& store) const override;
  // The store's pages for n_rows (a call's own pages stay until the next call, so a prompt
  // prefilled in one call is held exact whole) plus every group quantized by then
  // (GroupsAfter(n_rows) x GroupBytes): 1.19x full at 2 bits, 1.31x at 4 (head dim 64).
  int64_t PeakResidentBytes(int layer, const LayerGeometry& g, int64_t n_rows) const override {
    return FullPageBytes(g, n_rows) + GroupsAfter(n_rows) * GroupBytes(layer);
  }
  // No row selection; blocks = quantized groups (per layer), compressed = at least one.
  PolicySummary Summary(int layer, const LayerStore& store) const override;

  int bits() const { return bits_; }
  geodesia::PackedMath math() const { return math_; }
  // True when the layer's groups are held as packed slots and read by the packed kernel.
  bool packed(int layer) const { return layers_[layer].packed; }
  // Groups quantized so far (rows [0, 32 * groups) are held quantized).
  int64_t quantized_groups(int layer) const { return layers_[layer].n_groups; }
  // Bytes of codes and scales of one group (all KV heads) and of all groups.
  int64_t GroupBytes(int layer) const;
  int64_t QuantizedBytes(int layer) const { return quantized_groups(layer) * GroupBytes(layer); }
  // Dequantized key row u (< 32 * groups) of KV head h: [k_dim] (MLA: the latent row).
  void DequantKey(int layer, int h, int64_t u, float* out) const;
  // Dequantized value row: [v_dim].
  void DequantValue(int layer, int h, int64_t u, float* out) const;
  // Static schedule: groups quantized after t tokens.
  static int64_t GroupsAfter(int64_t t) { return t < kResidual ? 0 : (t - kResidual) / kGroup; }

 private:
  struct Head {
    std::vector<uint8_t> kcodes;   // per group: packed [32, k_dim]
    std::vector<uint16_t> kscale;  // per group: lo[k_dim], step[k_dim] (f16)
    std::vector<uint8_t> vcodes;   // GQA, per group: packed [32, v_dim]
    std::vector<uint16_t> vscale;  // GQA, per group: [32 tokens][n_vg] (lo, step) pairs
    std::vector<uint8_t> slots;    // packed layers: per pair of groups one slot (SlotBytes)
  };
  struct Layer {
    LayerGeometry g;
    bool mla = false;
    bool packed = false;  // groups held as packed slots (see the header comment)
    int64_t slot_bytes = 0;
    int n_vg = 0;  // value channel groups
    int64_t n_groups = 0;
    std::vector<Head> heads;
  };
  // Quantizes the groups complete after store.n_rows() rows (GroupsAfter) that are not yet.
  void Flush(Layer& L, const LayerStore& store, ThreadPool* pool);
  // Quantizes group j of KV head h into its place in *head's arrays (sized by Flush).
  void QuantizeGroup(const Layer& L, const LayerStore& store, int h, int64_t j, Head* head) const;
  // Dequantizes group j of head h: keys [32, k_dim], values [32, v_dim] (f32).
  void DequantGroup(const Layer& L, int h, int64_t j, float* kt, float* vt) const;
  int64_t KeyCodeBytes(const Layer& L) const { return int64_t{kGroup} * L.g.k_dim * bits_ / 8; }
  int64_t ValCodeBytes(const Layer& L) const { return int64_t{kGroup} * L.g.v_dim * bits_ / 8; }

  // Packed layers: the groups [0, qg) of every KV head through PackedAttend.
  void ReadPacked(const Layer& L, int64_t qg, const float* q, ThreadPool* pool,
                  SoftmaxStates* st) const;

  int bits_;
  geodesia::PackedMath math_;
  bool math_from_cache_ = false;
  std::vector<Layer> layers_;
};

// kivi2 / kivi4: the rate is fixed by the bits; one setting, attn-math (f32 | int8), the
// arithmetic of the packed read (geodesia::PackedMath).
PolicySettings KiviSettings(int bits);
StatusOr<std::unique_ptr<Policy>> MakeKiviPolicy(const PolicySpec& spec, int bits);

}  // namespace strata::baselines
