#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "io/gguf.h"

namespace strata {

const char* ArchName(Arch a) {
  switch (a) {
    case Arch::kLlama: return "llama";
    case Arch::kQwen2: return "qwen2";
    case Arch::kDeepseek2: return "deepseek2";
    case Arch::kKimiLinear: return "kimi-linear";
    case Arch::kGemma3: return "gemma3";
  }
  return "?";
}

StatusOr<Arch> ParseArch(const std::string& name) {
  if (name == "llama") return Arch::kLlama;
  if (name == "qwen2") return Arch::kQwen2;
  if (name == "deepseek2") return Arch::kDeepseek2;
  if (name == "kimi-linear") return Arch::kKimiLinear;
  if (name == "gemma3") return Arch::kGemma3;
  return Unimplemented("unsupported architecture '" + name +
                       "' (supported: llama, qwen2, deepseek2, kimi-linear, gemma3)");
}

namespace {

// Sizes and counts are held in int: every one is range-checked in 64 bits first.
constexpr int64_t kMaxInt = INT32_MAX;

// gemma3's sliding-window layers, local RoPE base, attention scale and logit soft-capping, as
// llama.cpp's loader reads them (src/models/gemma3.cpp): without attention.sliding_window every
// layer is global; with it, layer l is local unless l % period == period - 1 (period:
// attention.sliding_window_pattern, default 6); the local RoPE base defaults to 10000.
Status ReadGemma3(const GgufFile& f, const std::string& a, ModelConfig* c) {
  ASSIGN_OR_RETURN(const int64_t window, f.GetIntInOr(a + "attention.sliding_window", 0, 0, kMaxInt));
  c->sliding_window = static_cast<int>(window);
  if (window > 0) {
    if (f.Has(a + "attention.sliding_window_pattern") &&
        f.Find(a + "attention.sliding_window_pattern")->type == GgufType::kArray) {
      return Unimplemented(a + "attention.sliding_window_pattern is a per-layer array; gemma3 "
                           "files carry a period (a number)");
    }
    ASSIGN_OR_RETURN(const int64_t period,
                     f.GetIntInOr(a + "attention.sliding_window_pattern", 6, 1, kMaxInt));
    c->layer_local.assign(c->n_layers, 0);
    for (int l = 0; l < c->n_layers; ++l) c->layer_local[l] = l % period < period - 1;
    ASSIGN_OR_RETURN(const double local_base, f.GetFloatOr(a + "rope.freq_base_swa", 10000.0));
    c->rope_base_local = static_cast<float>(local_base);
    if (!(c->rope_base_local > 1.f) || !std::isfinite(c->rope_base_local)) {
      return OutOfRange("metadata " + a + "rope.freq_base_swa = " + std::to_string(local_base) +
                        " is not a finite number > 1");
    }
  }
  ASSIGN_OR_RETURN(const double cap, f.GetFloatOr(a + "final_logit_softcapping", 0.0));
  if (!(cap >= 0.0) || !std::isfinite(cap)) {
    return OutOfRange("metadata " + a + "final_logit_softcapping = " + std::to_string(cap) +
                      " is not a finite number >= 0");
  }
  c->final_logit_softcap = static_cast<float>(cap);
  // Gemma's query_pre_attn_scalar: head_dim for every size but 27B (llama.cpp types 27B by its
  // 62 layers and scales by d_model / n_heads there).
  const int scalar_dim = c->n_layers == 62 ? c->d_model / c->n_heads : c->head_dim;
  c->attn_scale = 1.f / std::sqrt(static_cast<float>(scalar_dim));
  return OkStatus();
}

}  // namespace

StatusOr<ModelConfig> ModelConfig::FromGguf(const GgufFile& f) {
  ModelConfig c;
  ASSIGN_OR_RETURN(std::string arch_name, f.GetString("general.architecture"));
  ASSIGN_OR_RETURN(c.arch, ParseArch(arch_name));
  const std::string a = arch_name + ".";
  ASSIGN_OR_RETURN(c.name, f.GetStringOr("general.name", arch_name));

  // A required size in [1, hi].
  auto req = [&](const std::string& key, int* out, int64_t hi = kMaxInt) -> Status {
    ASSIGN_OR_RETURN(int64_t v, f.GetIntIn(a + key, 1, hi));
    *out = static_cast<int>(v);
    return OkStatus();
  };
  // An optional one in [lo, hi]; `def` when absent.
  auto opt = [&](const std::string& key, int64_t def, int64_t lo, int64_t hi, int* out) -> Status {
    ASSIGN_OR_RETURN(int64_t v, f.GetIntInOr(a + key, def, lo, hi));
    *out = static_cast<int>(v);
    return OkStatus();
  };
  // Every layer has at least its two norms and its attention and FFN weights, so a block count
  // beyond the tensors the file holds is refused before anything is sized by it.
  const int64_t max_layers = std::max<int64_t>(1, static_cast<int64_t>(f.tensors().size()) / 4);
  {
    ASSIGN_OR_RETURN(int64_t n, f.GetIntIn(a + "block_count", 1, kMaxInt));
    if (n > max_layers) {
      return OutOfRange("metadata " + a + "block_count = " + std::to_string(n) +
                        ", but the file holds only " + std::to_string(f.tensors().size()) +
                        " tensors (each layer needs at least 4) (file " + f.path() + ")");
    }
    c.n_layers = static_cast<int>(n);
  }
  RETURN_IF_ERROR(req("embedding_length", &c.d_model));
  RETURN_IF_ERROR(req("attention.head_count", &c.n_heads));
  const bool kv_array = f.Has(a + "attention.head_count_kv") &&
                        f.Find(a + "attention.head_count_kv")->type == GgufType::kArray;
  if (c.arch == Arch::kKimiLinear) {
    // Per layer: 0 = KDA (recurrent), 1 = MLA (one latent row per token). A scalar applies to
    // every layer (then all MLA, or all KDA, which is refused below).
    std::vector<int64_t> per_layer;
    if (kv_array) {
      ASSIGN_OR_RETURN(per_layer, f.GetIntArray(a + "attention.head_count_kv"));
      if (static_cast<int64_t>(per_layer.size()) != c.n_layers) {
        return InvalidArgument("metadata " + a + "attention.head_count_kv has " +
                               std::to_string(per_layer.size()) + " entries but " + a +
                               "block_count = " + std::to_string(c.n_layers) +
                               " (one per layer: 0 = KDA, 1 = MLA)");
      }
    } else {
      ASSIGN_OR_RETURN(const int64_t v, f.GetIntIn(a + "attention.head_count_kv", 0, 1));
      per_layer.assign(c.n_layers, v);
    }
    c.layer_kda.resize(c.n_layers);
    int n_mla = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      if (per_layer[l] != 0 && per_layer[l] != 1) {
        return InvalidArgument("metadata " + a + "attention.head_count_kv[" + std::to_string(l) +
                               "] = " + std::to_string(per_layer[l]) +
                               " (kimi-linear: 0 = KDA layer, 1 = MLA layer)");
      }
      c.layer_kda[l] = per_layer[l] == 0;
      n_mla += per_layer[l] == 1;
    }
    if (n_mla == 0) {
      return Unimplemented("metadata " + a + "attention.head_count_kv marks no MLA layer; a "
                           "kimi-linear model without an MLA layer is not supported (the cache "
                           "counts positions by MLA rows)");
    }
    c.n_kv_heads = 1;
    c.kda_heads = c.n_heads;
    if (n_mla < c.n_layers) {
      RETURN_IF_ERROR(req("kda.head_dim", &c.kda_head_dim));
      RETURN_IF_ERROR(req("ssm.conv_kernel", &c.ssm_conv_kernel, 64));
    }
  } else {
    if (kv_array) {
      return Unimplemented(a + "attention.head_count_kv is a per-layer array, which only the "
                           "kimi-linear architecture reads");
    }
    RETURN_IF_ERROR(opt("attention.head_count_kv", c.n_heads, 1, kMaxInt, &c.n_kv_heads));
  }
  RETURN_IF_ERROR(opt("feed_forward_length", 0, 0, kMaxInt, &c.d_ff));
  ASSIGN_OR_RETURN(c.n_ctx_train, f.GetIntInOr(a + "context_length", 4096, 1, INT64_MAX));
  ASSIGN_OR_RETURN(const double eps, f.GetFloatOr(a + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rms_eps = static_cast<float>(eps);
  if (!(c.rms_eps > 0.f && c.rms_eps < 1.f)) {
    return OutOfRange("metadata " + a + "attention.layer_norm_rms_epsilon = " +
                      std::to_string(eps) + " is not in (0, 1)");
  }
  ASSIGN_OR_RETURN(const double base, f.GetFloatOr(a + "rope.freq_base", 10000.0));
  c.rope_base = static_cast<float>(base);
  if (!(c.rope_base > 1.f) || !std::isfinite(c.rope_base)) {
    return OutOfRange("metadata " + a + "rope.freq_base = " + std::to_string(base) +
                      " is not a finite number > 1");
  }
  ASSIGN_OR_RETURN(const std::string scaling, f.GetStringOr(a + "rope.scaling.type", "none"));
  if (scaling == "linear") {
    ASSIGN_OR_RETURN(const double factor, f.GetFloatOr(a + "rope.scaling.factor", 1.0));
    if (!(factor >= 1.0) || !std::isfinite(factor)) {
      return OutOfRange("metadata " + a + "rope.scaling.factor = " + std::to_string(factor) +
                        " is not a finite number >= 1");
    }
    c.rope_freq_scale = static_cast<float>(1.0 / factor);
  } else if (scaling != "none" && !scaling.empty()) {
    return Unimplemented("rope scaling type '" + scaling + "' (" + a +
                         "rope.scaling.type) is not supported; supported: none, linear, and "
                         "llama3 frequency factors (rope_freqs.weight)");
  }
  c.has_rope_freqs = f.FindTensor("rope_freqs.weight") != nullptr;

  if (c.arch == Arch::kDeepseek2 || c.arch == Arch::kKimiLinear) {
    const bool kimi = c.arch == Arch::kKimiLinear;
    RETURN_IF_ERROR(req("attention.kv_lora_rank", &c.kv_lora_rank));
    RETURN_IF_ERROR(opt("attention.q_lora_rank", 0, 0, kMaxInt, &c.q_lora_rank));
    RETURN_IF_ERROR(req("rope.dimension_count", &c.qk_rope_dim));
    int qk_dim = 0;
    if (kimi || f.Has(a + "attention.key_length_mla")) {  // kimi-linear: required (llama.cpp)
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
    if (int64_t{c.kv_lora_rank} + c.qk_rope_dim > kMaxInt) {
      return OutOfRange(a + "attention.kv_lora_rank + rope.dimension_count = " +
                        std::to_string(int64_t{c.kv_lora_rank} + c.qk_rope_dim) +
                        " does not fit a cache row");
    }
    c.rope_dim = c.qk_rope_dim;
    // kimi-linear MLA is always NoPE (llama.cpp builds no positions for it; no key is written).
    ASSIGN_OR_RETURN(c.mla_nope, f.GetBoolOr(a + "attention.mla_use_nope", kimi));
    if (kimi && !c.mla_nope) {
      return InvalidArgument("metadata " + a + "attention.mla_use_nope = false: kimi-linear MLA "
                             "layers are NoPE");
    }
    RETURN_IF_ERROR(opt("leading_dense_block_count", 0, 0, c.n_layers, &c.n_leading_dense));
    RETURN_IF_ERROR(opt("expert_count", 0, 0, kMaxInt, &c.n_experts));
    if (c.n_experts > 0) {
      RETURN_IF_ERROR(req("expert_used_count", &c.n_experts_used, c.n_experts));
      RETURN_IF_ERROR(req("expert_feed_forward_length", &c.d_ff_expert));
      RETURN_IF_ERROR(opt("expert_shared_count", 0, 0, kMaxInt, &c.n_shared_experts));
      ASSIGN_OR_RETURN(const double scale, f.GetFloatOr(a + "expert_weights_scale", 1.0));
      if (!std::isfinite(scale)) {
        return OutOfRange("metadata " + a + "expert_weights_scale = " + std::to_string(scale) +
                          " is not finite");
      }
      c.expert_weights_scale = static_cast<float>(scale);
      // kimi-linear: llama.cpp's graph always renormalises (the key is not written) and requires
      // the gating function key.
      ASSIGN_OR_RETURN(c.expert_weights_norm, f.GetBoolOr(a + "expert_weights_norm", kimi));
      if (kimi && !f.Has(a + "expert_gating_func")) {
        return NotFound("missing metadata " + a + "expert_gating_func (1 softmax, 2 sigmoid)");
      }
      ASSIGN_OR_RETURN(const int64_t gating, f.GetIntOr(a + "expert_gating_func", 1));
      if (gating != 1 && gating != 2) {
        return Unimplemented(a + "expert_gating_func = " + std::to_string(gating) +
                             " (supported: 1 softmax, 2 sigmoid)");
      }
      c.expert_gating = static_cast<int>(gating);
    }
    if (c.n_leading_dense > 0 || c.n_experts == 0) RETURN_IF_ERROR(req("feed_forward_length", &c.d_ff));
    c.rope_style = RopeStyle::kNorm;
  } else {
    if (c.n_heads % c.n_kv_heads != 0) {
      return InvalidArgument(a + "attention.head_count = " + std::to_string(c.n_heads) +
                             " is not a multiple of head_count_kv = " +
                             std::to_string(c.n_kv_heads));
    }
    if (f.Has(a + "attention.key_length")) {
      RETURN_IF_ERROR(req("attention.key_length", &c.head_dim));
    } else if (c.d_model % c.n_heads != 0) {
      return InvalidArgument(a + "embedding_length = " + std::to_string(c.d_model) +
                             " is not a multiple of attention.head_count = " +
                             std::to_string(c.n_heads) + " and attention.key_length is absent");
    } else {
      c.head_dim = c.d_model / c.n_heads;
    }
    ASSIGN_OR_RETURN(const int64_t vlen, f.GetIntOr(a + "attention.value_length", c.head_dim));
    if (vlen != c.head_dim) {
      return Unimplemented(a + "attention.value_length = " + std::to_string(vlen) +
                           " differs from key_length " + std::to_string(c.head_dim));
    }
    ASSIGN_OR_RETURN(const int64_t rope, f.GetIntOr(a + "rope.dimension_count", c.head_dim));
    if (rope <= 0 || rope > c.head_dim || rope % 2) {
      return OutOfRange(a + "rope.dimension_count = " + std::to_string(rope) + " (head dim " +
                        std::to_string(c.head_dim) + ")");
    }
    c.rope_dim = static_cast<int>(rope);
    RETURN_IF_ERROR(req("feed_forward_length", &c.d_ff));
    c.rope_style = c.arch == Arch::kQwen2 || c.arch == Arch::kGemma3 ? RopeStyle::kNeox
                                                                      : RopeStyle::kNorm;
  }
  if (c.arch == Arch::kGemma3) RETURN_IF_ERROR(ReadGemma3(f, a, &c));
  if (c.rope_dim % 2) return OutOfRange("rope dims " + std::to_string(c.rope_dim) + " is odd");
  return c;
}

int ModelConfig::n_local_layers() const {
  int n = 0;
  for (uint8_t k : layer_local) n += k != 0;
  return n;
}

int ModelConfig::n_kda_layers() const {
  int n = 0;
  for (uint8_t k : layer_kda) n += k != 0;
  return n;
}

std::string ModelConfig::Summary() const {
  std::ostringstream s;
  s << ArchName(arch) << " '" << name << "': " << n_layers << " layers, d_model " << d_model
    << ", " << n_heads << " heads";
  if (is_mla()) {
    s << ", MLA d_c " << kv_lora_rank << " d_r " << qk_rope_dim << " (" << (mla_nope ? "NoPE" : "RoPE")
      << "), nope " << qk_nope_dim << ", v " << v_head_dim;
    if (q_lora_rank) s << ", q_lora " << q_lora_rank;
    if (arch == Arch::kKimiLinear) {
      s << ", " << n_kda_layers() << " KDA + " << (n_layers - n_kda_layers())
        << " MLA layers (KDA " << kda_heads << " heads x " << kda_head_dim << ", conv "
        << ssm_conv_kernel << ")";
    }
    if (n_experts) {
      s << ", MoE " << n_experts << " experts top-" << n_experts_used << " + " << n_shared_experts
        << " shared (ff " << d_ff_expert << "), " << n_leading_dense << " dense layers";
    }
  } else {
    s << " / " << n_kv_heads << " kv heads, head dim " << head_dim;
    if (!layer_local.empty()) {
      s << ", " << n_local_layers() << " sliding-window (" << sliding_window << ") + "
        << (n_layers - n_local_layers()) << " global layers";
    }
  }
  s << ", ffn " << d_ff << ", vocab " << n_vocab;
  return s.str();
}

}  // namespace strata
