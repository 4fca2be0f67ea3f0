// Per-layer cache geometry: what a layer stores per token and how its queries read it.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

enum class AttnKind {
  kGqa,  // per KV head: a key row [k_dim] and a value row [v_dim] per token (MHA when kv == q heads)
  kMla,  // one latent row [k_dim = d_c + d_r] per token, shared by all heads; value = first v_dim cols
};

struct LayerGeometry {
  AttnKind kind = AttnKind::kGqa;
  int n_q_heads = 0;
  int n_kv_heads = 0;  // MLA: 1
  int k_dim = 0;       // GQA: key head dim; MLA: latent row width, e.g. 576
  int v_dim = 0;       // GQA: value head dim; MLA: d_c, e.g. 512 (the row's first v_dim columns)
  int rope_dim = 0;    // MLA: d_r, the branch = the row's last rope_dim columns; GQA: rotated dims
  bool rope = true;    // false: the MLA branch is cached and used unrotated (NoPE)
  float scale = 1.f;   // softmax scale applied to q.k

  int group_size() const { return n_q_heads / n_kv_heads; }
  // Bytes one token occupies in this layer with bf16 storage (the full cache).
  int64_t bytes_per_token() const {
    return kind == AttnKind::kMla ? int64_t{2} * k_dim
                                  : int64_t{2} * n_kv_heads * (k_dim + v_dim);
  }
  std::string ToString() const;
};

}  // namespace strata
