#include "kv/geometry.h"

namespace strata {

std::string LayerGeometry::ToString() const {
  if (kind == AttnKind::kMla) {
    return "MLA row " + std::to_string(k_dim) + " = [c " + std::to_string(k_dim - rope_dim) +
           " ; r " + std::to_string(rope_dim) + (rope ? " (RoPE)" : " (NoPE)") + "], " +
           std::to_string(n_q_heads) + " heads";
  }
  return "GQA " + std::to_string(n_q_heads) + "q/" + std::to_string(n_kv_heads) + "kv heads, k " +
         std::to_string(k_dim) + ", v " + std::to_string(v_dim);
}

}  // namespace strata
