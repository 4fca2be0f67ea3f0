// Per-layer cache geometry: what a layer stores per token and how its queries read it.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "kernels/attn_math.h"

namespace strata {

enum class AttnKind {
  kGqa,  // per KV head: a key row [k_dim] and a value row [v_dim] per token (MHA when kv == q heads)
  kMla,  // one latent row [k_dim = d_c + d_r] per token, shared by all heads; value = first v_dim cols
};

// The KV storage types (--kv-type): "bf16", "f16", "f32"; other types print as DTypeName.
std::string KvTypeName(DType t);
// "bf16" | "f16" | "f32" (case-insensitive); anything else is InvalidArgument naming the text.
StatusOr<DType> ParseKvType(const std::string& text);

struct LayerGeometry {
  AttnKind kind = AttnKind::kGqa;
  int n_q_heads = 0;
  int n_kv_heads = 0;  // MLA: 1
  int k_dim = 0;       // GQA: key head dim; MLA: latent row width, e.g. 576
  int v_dim = 0;       // GQA: value head dim; MLA: d_c, e.g. 512 (the row's first v_dim columns)
  int rope_dim = 0;    // MLA: d_r, the branch = the row's last rope_dim columns; GQA: rotated dims
  bool rope = true;    // false: the MLA branch is cached and used unrotated (NoPE)
  float scale = 1.f;   // softmax scale applied to q.k
  // 0: a global layer (a query reads every earlier row). > 0: a sliding-window (local) layer (GQA
  // only): a query at position p reads rows [p - window + 1, p]. The cache holds such a layer's
  // window itself (older pages are released) and no policy ever sees it (kv/cache.h).
  int window = 0;
  // How the store holds rows (--kv-type): bf16 (the default, which every policy reads), or f32 /
  // f16 for research and parity (read by the full policy only; see Policy::SupportsKvType).
  DType kv_type = DType::kBF16;
  // The dot-product arithmetic of this layer's reads (--attn-math; each kernel resolves it, auto
  // included): every view the store hands out and every read of kv/policy.cc carries it.
  AttnMath attn_math = AttnMath::kF32;
  // The model's number of this layer: the cache holds some of a model's layers only (kimi-linear
  // caches its MLA layers, and a policy sees a model's global layers only), so a layer's place
  // in a list of geometries is not its number. -1: not set (KvCache::Create sets it to the
  // layer's index in the model's list where the model left it unset).
  int model_layer = -1;

  int group_size() const { return n_q_heads / n_kv_heads; }
  // Bytes of one stored value: 2 (bf16, f16) or 4 (f32).
  int64_t value_bytes() const { return kv_type == DType::kF32 ? 4 : 2; }
  // Bytes one token occupies in this layer with kv_type storage (the full cache).
  int64_t bytes_per_token() const {
    return kind == AttnKind::kMla ? value_bytes() * k_dim
                                  : value_bytes() * n_kv_heads * (k_dim + v_dim);
  }
  std::string ToString() const;
};

// "layer N" for the geometry at `index` of its list: its model_layer when set, else the index.
std::string LayerName(const LayerGeometry& g, size_t index);

}  // namespace strata
