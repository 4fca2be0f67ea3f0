// The absorbed MLA attention layer of deepseek2 and kimi-linear: cache rows [c_hat ; r] of width
// d_c + d_r (the branch last), the branch rotated (RoPE) or not (ModelConfig::mla_nope), q by a
// single attn_q or by a LoRA (attn_q_a, its norm, attn_q_b; ModelConfig::q_lora_rank > 0).
//
// Absorbed form, per head h:  q_abs_h = [W_UK,h^T q_nope_h ; q_pe_h]  (d_c + d_r),
//   s_h(u) = q_abs_h . row_u / sqrt(nope + rope),  o_hat_h = sum softmax * c_hat_u  (d_c),
//   o_h = W_UV,h o_hat_h  (v),  out = W_o concat_h o_h.
#pragma once

#include <string>
#include <vector>

#include "model/moe.h"

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
};

}  // namespace strata
