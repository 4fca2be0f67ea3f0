#include "kv/geometry.h"

#include <algorithm>
#include <cctype>

namespace strata {

std::string KvTypeName(DType t) {
  switch (t) {
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF32: return "f32";
    default: return std::string(DTypeName(t));
  }
}

StatusOr<DType> ParseKvType(const std::string& text) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "bf16") return DType::kBF16;
  if (t == "f16") return DType::kF16;
  if (t == "f32") return DType::kF32;
  return InvalidArgument("--kv-type '" + text + "' must be f32, f16 or bf16");
}

std::string LayerName(const LayerGeometry& g, size_t index) {
  return "layer " + std::to_string(g.model_layer >= 0 ? static_cast<size_t>(g.model_layer) : index);
}

std::string LayerGeometry::ToString() const {
  // The default bf16 storage is not named (the text predates --kv-type); others are.
  const std::string kv =
      kv_type == DType::kBF16 ? "" : ", kv " + KvTypeName(kv_type);
  if (kind == AttnKind::kMla) {
    return "MLA row " + std::to_string(k_dim) + " = [c " + std::to_string(k_dim - rope_dim) +
           " ; r " + std::to_string(rope_dim) + (rope ? " (RoPE)" : " (NoPE)") + "], " +
           std::to_string(n_q_heads) + " heads" + kv;
  }
  return "GQA " + std::to_string(n_q_heads) + "q/" + std::to_string(n_kv_heads) + "kv heads, k " +
         std::to_string(k_dim) + ", v " + std::to_string(v_dim) + kv +
         (window > 0 ? ", sliding window " + std::to_string(window) : "");
}

}  // namespace strata
