// The absorbed MLA attention layer of deepseek2 and kimi-linear: cache rows [c_hat ; r] of width
// d_c + d_r (the branch last), the branch rotated (RoPE) or not (ModelConfig::mla_nope), q by a
// single attn_q or by a LoRA (attn_q_a, its norm, attn_q_b; ModelConfig::q_lora_rank > 0).
//
// Absorbed form, per head h:  q_abs_h = [W_UK,h^T q_nope_h ; q_pe_h]  (d_c + d_r),
//   s_h(u) = q_abs_h . row_u / sqrt(nope + rope),  o_hat_h = sum softmax * c_hat_u  (d_c),
//   o_h = W_UV,h o_hat_h  (v),  out = W_o concat_h o_h.
// Every decode step reads that way: d_c + d_r + d_c multiply-adds per (row, head).
//
// Expanded form (long prefill chunks whose reads are dense): the rows decompressed per head,
//   k_h(u) = [W_UK,h c_hat_u ; r_u]  (nope + d_r),  v_h(u) = W_UV,h c_hat_u  (v),
//   s_h(u) = [q_nope_h ; q_pe_h] . k_h(u) / sqrt(nope + rope),  o_h = sum softmax * v_h(u),
// the same attention up to f32 rounding: nope + d_r + v multiply-adds per (query, row, head)
// (320 against 1088 at DeepSeek-V2's shapes) plus d_c (nope + v) per (row, head) to decompress,
// paid once per chunk, so it pays for chunks of a few hundred rows (ExpandedPays).
//
// A policy that stages its own rows (KIVI: Policy::ClaimStagedReads) is read in the expanded
// form too, its dequantized latent rows decompressed like the store's (ExpandedPrefixAttention).
//
// Observed queries of an expanded chunk (H2O, SnapKV: Policy::observation_takes_column_sums)
// are delivered as column sums of their weights instead of one absorbed weight pass per query:
// up to 32k rows the attention pass keeps each observed head's weights per tile and rescales
// them once the head is final (AttendStagedObserved; heads outermost, each head's rows
// decompressed whole); beyond, a second pass over the re-decompressed keys with each head's
// final softmax state (StagedColumnSums): d_c nope per (row, head) to decompress the keys again
// plus nope + d_r per (observed query, row, head), in parallel (ColumnSumsPay).
#pragma once

#include <string>
#include <vector>

#include "model/moe.h"
#include "model/staged_prefix.h"

namespace strata {

// One MLA layer's tensors.
struct MlaWeights {
  std::vector<float> kv_a_norm, q_a_norm;
  TensorView wq, wq_a, wq_b, wkv_a, wo;
  TensorView k_b;                           // [H, d_c, nope]: per head W_UK,h^T
  TensorView v_b;                           // [H, v, d_c]: per head W_UV,h
  std::vector<float> k_b_owned, v_b_owned;  // filled when split from a legacy attn_kv_b
};

// A Model with MLA attention layers (and the MoE feed-forward of MoeModel).
class MlaModel : public MoeModel {
 protected:
  using MoeModel::MoeModel;

  // The cache geometry of every MLA layer.
  LayerGeometry MlaGeometry() const;
  // The MLA tensors of the layer with prefix p ("blk.L."). k_b / v_b, or a legacy unsplit
  // attn_kv_b split at load.
  Status LoadMla(const std::string& p, MlaWeights* M) const;
  // y = the attention output of the RMS-normed layer input xn for the rows of a pass; the rows'
  // cache layer is cache_layer. Rows in groups of up to kAbsorbRows: the group's absorbed
  // queries, then each row's observation and read (in row order), then the group's value
  // expansion. The per-head products W_UK,h^T q and W_UV,h att are MatVecBatch over the group's
  // rows (== MatVec per row bit for bit), so each head's weights are read once per group
  // instead of once per row.
  Status MlaForward(const Rows& rows, const MlaWeights& M, int cache_layer, const float* xn,
                    ThreadPool* pool, float* y) const;

 private:
  static constexpr int kAbsorbRows = 64;
  // Whether a chunk of n prefill rows at positions p0.. reads cheaper in the expanded form.
  bool ExpandedPays(int64_t n) const;
  // Whether k observed queries of an expanded chunk over n_rows rows are cheaper as column sums
  // (kept by the attention pass, or beyond kMlaObservedRows a second pass over the
  // re-decompressed keys) than as k absorbed weight passes.
  bool ColumnSumsPay(int64_t k, int64_t n_rows) const;
  // The expanded (non-absorbed) attention of a prefill chunk whose dense reads the cache granted
  // (KvCache::ClaimDenseReads): per head, keys [W_UK,h c_u ; r_u] and values W_UV,h c_u
  // decompressed from the cache's rows segment by segment, then AttendStaged on the chunk's
  // queries q [n, H, nope + dr] (q_pe not yet rotated; rope_cs: RopeFactors of each query's
  // position, [n, dr], null under NoPE). o: [n, H, v].
  // With obs_b > obs_a: then col[u] (zeroed by the caller, [p0 + obs_b]) gets the sum over the
  // chunk's queries [obs_a, obs_b) and their heads of the final softmax weight on row u.
  Status ExpandedAttention(const Rows& rows, const MlaWeights& M, int cache_layer, const float* q,
                           const float* rope_cs, ThreadPool* pool, float* o, int64_t obs_a = 0,
                           int64_t obs_b = 0, double* col = nullptr) const;
  // The expanded attention of a prefill chunk whose reads the cache granted through a staged
  // prefix (KvCache::ClaimStagedReads: KIVI's quantized groups): per head, the prefix's latent
  // rows (as the policy stages them) decompressed segment by segment and read by each query up
  // to its split, then the exact rows after the smallest split decompressed once and read by
  // each run of queries with the same split up to its limit; one online softmax over both.
  Status ExpandedPrefixAttention(const Rows& rows, const MlaWeights& M, int cache_layer,
                                 const float* q, const float* rope_cs, const StagedPrefix& prefix,
                                 ThreadPool* pool, float* o) const;
};

namespace mla_internal {
// Tests: the smallest prefill chunk read in the expanded form; 0 (the default) lets the cost
// model decide (MlaModel::ExpandedPays), a negative value turns the expanded form off. Returns
// the previous value.
int64_t SetExpandedMinRowsForTest(int64_t rows);
// Tests: the most rows whose observed column sums the attention pass keeps (32768 by default;
// beyond, a second pass over the keys). Returns the previous value.
int64_t SetObservedRowsForTest(int64_t rows);
}  // namespace mla_internal

}  // namespace strata
