#include "model/config.h"

#include <sstream>

#include "io/gguf.h"

namespace strata {

const char* ArchName(Arch a) {
  switch (a) {
    case Arch::kLlama: return "llama";
    case Arch::kQwen2: return "qwen2";
    case Arch::kDeepseek2: return "deepseek2";
  }
  return "?";
}

StatusOr<Arch> ParseArch(const std::string& name) {
  if (name == "llama") return Arch::kLlama;
  if (name == "qwen2") return Arch::kQwen2;
  if (name == "deepseek2") return Arch::kDeepseek2;
  return Unimplemented("unsupported architecture '" + name +
                       "' (supported: llama, qwen2, deepseek2)");
}

namespace {

Status Positive(const std::string& key, int64_t v) {
  if (v <= 0 || v > (int64_t{1} << 31)) {
    return OutOfRange("metadata " + key + " = " + std::to_string(v) + " is not a valid size");
  }
  return OkStatus();
}

}  // namespace

StatusOr<ModelConfig> ModelConfig::FromGguf(const GgufFile& f) {
  ModelConfig c;
  ASSIGN_OR_RETURN(std::string arch_name, f.GetString("general.architecture"));
  ASSIGN_OR_RETURN(c.arch, ParseArch(arch_name));
  const std::string a = arch_name + ".";
  c.name = f.GetStringOr("general.name", arch_name);

  auto req = [&](const std::string& key, int* out) -> Status {
    auto v = f.GetInt(a + key);
    if (!v.ok()) return v.status();
    RETURN_IF_ERROR(Positive(a + key, *v));
    *out = static_cast<int>(*v);
    return OkStatus();
  };
  RETURN_IF_ERROR(req("block_count", &c.n_layers));
  RETURN_IF_ERROR(req("embedding_length", &c.d_model));
  RETURN_IF_ERROR(req("attention.head_count", &c.n_heads));
  if (f.Has(a + "attention.head_count_kv") &&
      f.Find(a + "attention.head_count_kv")->type == GgufType::kArray) {
    return Unimplemented(a + "attention.head_count_kv is a per-layer array (hybrid models such as "
                         "kimi-linear are not supported yet)");
  }
  c.n_kv_heads = static_cast<int>(f.GetIntOr(a + "attention.head_count_kv", c.n_heads));
  RETURN_IF_ERROR(Positive(a + "attention.head_count_kv", c.n_kv_heads));
  c.d_ff = static_cast<int>(f.GetIntOr(a + "feed_forward_length", 0));
  c.n_ctx_train = f.GetIntOr(a + "context_length", 4096);
  c.rms_eps = static_cast<float>(f.GetFloatOr(a + "attention.layer_norm_rms_epsilon", 1e-5));
  if (!(c.rms_eps > 0.f && c.rms_eps < 1.f)) {
    return OutOfRange("metadata " + a + "attention.layer_norm_rms_epsilon = " +
                      std::to_string(c.rms_eps) + " is not in (0, 1)");
  }
  c.rope_base = static_cast<float>(f.GetFloatOr(a + "rope.freq_base", 10000.0));
  if (!(c.rope_base > 1.f)) {
    return OutOfRange("metadata " + a + "rope.freq_base = " + std::to_string(c.rope_base));
  }
  const std::string scaling = f.GetStringOr(a + "rope.scaling.type", "none");
  if (scaling == "linear") {
    const double factor = f.GetFloatOr(a + "rope.scaling.factor", 1.0);
    if (!(factor >= 1.0)) return OutOfRange(a + "rope.scaling.factor = " + std::to_string(factor));
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling != "none" && !scaling.empty()) {
    return Unimplemented("rope scaling type '" + scaling + "' (" + a +
                         "rope.scaling.type) is not supported; supported: none, linear, and "
                         "llama3 frequency factors (rope_freqs.weight)");
  }
  c.has_rope_freqs = f.FindTensor("rope_freqs.weight") != nullptr;

  if (c.arch == Arch::kDeepseek2) {
    c.kv_lora_rank = static_cast<int>(f.GetIntOr(a + "attention.kv_lora_rank", 0));
    RETURN_IF_ERROR(Positive(a + "attention.kv_lora_rank", c.kv_lora_rank));
    c.q_lora_rank = static_cast<int>(f.GetIntOr(a + "attention.q_lora_rank", 0));
    RETURN_IF_ERROR(req("rope.dimension_count", &c.qk_rope_dim));
    int qk_dim = 0;
    if (f.Has(a + "attention.key_length_mla")) {
      RETURN_IF_ERROR(req("attention.key_length_mla", &qk_dim));
      RETURN_IF_ERROR(req("attention.value_length_mla", &c.v_head_dim));
    } else {
      RETURN_IF_ERROR(req("attention.key_length", &qk_dim));
      RETURN_IF_ERROR(req("attention.value_length", &c.v_head_dim));
    }
    c.qk_nope_dim = qk_dim - c.qk_rope_dim;
    if (c.qk_nope_dim <= 0) {
      return OutOfRange("MLA query/key head dim " + std::to_string(qk_dim) +
                        " must exceed the rope dims " + std::to_string(c.qk_rope_dim));
    }
    if (c.n_kv_heads != 1) {
      return InvalidArgument(a + "attention.head_count_kv = " + std::to_string(c.n_kv_heads) +
                             "; MLA caches one latent row per token (expected 1)");
    }
    c.rope_dim = c.qk_rope_dim;
    c.mla_nope = f.GetBoolOr(a + "attention.mla_use_nope", false);
    c.n_leading_dense = static_cast<int>(f.GetIntOr(a + "leading_dense_block_count", 0));
    c.n_experts = static_cast<int>(f.GetIntOr(a + "expert_count", 0));
    if (c.n_experts > 0) {
      RETURN_IF_ERROR(req("expert_used_count", &c.n_experts_used));
      RETURN_IF_ERROR(req("expert_feed_forward_length", &c.d_ff_expert));
      if (c.n_experts_used > c.n_experts) {
        return OutOfRange(a + "expert_used_count = " + std::to_string(c.n_experts_used) +
                          " exceeds expert_count = " + std::to_string(c.n_experts));
      }
      c.n_shared_experts = static_cast<int>(f.GetIntOr(a + "expert_shared_count", 0));
      c.expert_weights_scale = static_cast<float>(f.GetFloatOr(a + "expert_weights_scale", 1.0));
      c.expert_weights_norm = f.GetBoolOr(a + "expert_weights_norm", false);
      c.expert_gating = static_cast<int>(f.GetIntOr(a + "expert_gating_func", 1));
      if (c.expert_gating != 1 && c.expert_gating != 2) {
        return Unimplemented(a + "expert_gating_func = " + std::to_string(c.expert_gating) +
                             " (supported: 1 softmax, 2 sigmoid)");
      }
    }
    if (c.n_leading_dense > 0 || c.n_experts == 0) RETURN_IF_ERROR(req("feed_forward_length", &c.d_ff));
    c.rope_style = RopeStyle::kNorm;
  } else {
    if (c.n_heads % c.n_kv_heads != 0) {
      return InvalidArgument(a + "attention.head_count = " + std::to_string(c.n_heads) +
                             " is not a multiple of head_count_kv = " +
                             std::to_string(c.n_kv_heads));
    }
    c.head_dim = static_cast<int>(f.GetIntOr(a + "attention.key_length", c.d_model / c.n_heads));
    RETURN_IF_ERROR(Positive(a + "attention.key_length", c.head_dim));
    const int64_t vlen = f.GetIntOr(a + "attention.value_length", c.head_dim);
    if (vlen != c.head_dim) {
      return Unimplemented(a + "attention.value_length = " + std::to_string(vlen) +
                           " differs from key_length " + std::to_string(c.head_dim));
    }
    c.rope_dim = static_cast<int>(f.GetIntOr(a + "rope.dimension_count", c.head_dim));
    if (c.rope_dim <= 0 || c.rope_dim > c.head_dim || c.rope_dim % 2) {
      return OutOfRange(a + "rope.dimension_count = " + std::to_string(c.rope_dim) +
                        " (head dim " + std::to_string(c.head_dim) + ")");
    }
    RETURN_IF_ERROR(req("feed_forward_length", &c.d_ff));
    c.rope_style = c.arch == Arch::kQwen2 ? RopeStyle::kNeox : RopeStyle::kNorm;
  }
  if (c.rope_dim % 2) return OutOfRange("rope dims " + std::to_string(c.rope_dim) + " is odd");
  return c;
}

std::string ModelConfig::Summary() const {
  std::ostringstream s;
  s << ArchName(arch) << " '" << name << "': " << n_layers << " layers, d_model " << d_model
    << ", " << n_heads << " heads";
  if (is_mla()) {
    s << ", MLA d_c " << kv_lora_rank << " d_r " << qk_rope_dim << " (" << (mla_nope ? "NoPE" : "RoPE")
      << "), nope " << qk_nope_dim << ", v " << v_head_dim;
    if (q_lora_rank) s << ", q_lora " << q_lora_rank;
    if (n_experts) {
      s << ", MoE " << n_experts << " experts top-" << n_experts_used << " + " << n_shared_experts
        << " shared (ff " << d_ff_expert << "), " << n_leading_dense << " dense layers";
    }
  } else {
    s << " / " << n_kv_heads << " kv heads, head dim " << head_dim;
  }
  s << ", ffn " << d_ff << ", vocab " << n_vocab;
  return s.str();
}

}  // namespace strata
