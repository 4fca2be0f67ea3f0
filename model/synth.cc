#include "model/synth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/rng.h"
#include "io/gguf.h"
#include "io/hf.h"
#include "model/quantize.h"

namespace strata {

Status SynthOptions::ApplyDims(const std::string& spec) {
  std::map<std::string, int*> ints = {
      {"d_model", &d_model},        {"layers", &n_layers},         {"heads", &n_heads},
      {"kv_heads", &n_kv_heads},    {"head_dim", &head_dim},       {"ff", &d_ff},
      {"vocab", &vocab},            {"q_lora", &q_lora_rank},      {"kv_lora", &kv_lora_rank},
      {"nope_dim", &qk_nope_dim},   {"rope_dim", &qk_rope_dim},    {"v_dim", &v_head_dim},
      {"experts", &n_experts},      {"experts_used", &n_experts_used},
      {"shared_experts", &n_shared_experts}, {"ff_expert", &d_ff_expert},
      {"dense_layers", &n_leading_dense},    {"gating", &gating},
      {"kda_dim", &kda_head_dim},   {"conv", &conv_kernel},        {"mla_every", &mla_every},
      {"window", &sliding_window},  {"swa_period", &swa_period}};
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return InvalidArgument("--dims item '" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), val = item.substr(eq + 1);
    char* end = nullptr;
    const long long v = std::strtoll(val.c_str(), &end, 10);
    if (val.empty() || *end != '\0') {
      return InvalidArgument("--dims " + key + " = '" + val + "' is not an integer");
    }
    if (key == "tied") {
      tied_embeddings = v != 0;
    } else if (key == "seed") {
      seed = static_cast<uint64_t>(v);
    } else if (auto it = ints.find(key); it != ints.end()) {
      if (v < 0 || v > (1 << 24)) return InvalidArgument("--dims " + key + " = " + val + " is out of range");
      *it->second = static_cast<int>(v);
    } else {
      return InvalidArgument("--dims: unknown key '" + key + "'");
    }
  }
  return OkStatus();
}

Status SynthOptions::ApplyPreset(const std::string& name) {
  if (name == "tiny") return OkStatus();
  if (name == "125m") {  // llama-shaped, ~125M parameters
    arch = Arch::kLlama;
    d_model = 768; n_layers = 12; n_heads = 12; n_kv_heads = 4; head_dim = 64; d_ff = 2048;
    vocab = 32000;
    return OkStatus();
  }
  if (name == "150m") {  // deepseek2-shaped MLA + MoE, ~150M parameters (d_c 512, d_r 64)
    arch = Arch::kDeepseek2;
    d_model = 1024; n_layers = 6; n_heads = 16; d_ff = 2816; vocab = 16000;
    kv_lora_rank = 512; qk_rope_dim = 64; qk_nope_dim = 128; v_head_dim = 128;
    n_experts = 8; n_experts_used = 2; n_shared_experts = 1; d_ff_expert = 384;
    n_leading_dense = 1;
    return OkStatus();
  }
  if (name == "48b-shape") {  // Kimi Linear 48B-A3B per-layer geometry; 4 layers, 16 experts
    arch = Arch::kKimiLinear;
    d_model = 2304; n_layers = 4; n_heads = 32; d_ff = 9216;
    // The real vocabulary is 163840; 32000 keeps the file and the synth time small (the output
    // matrix is then ~5x smaller than the real one in the decode bandwidth floor).
    vocab = 32000;
    kda_head_dim = 128; conv_kernel = 4; mla_every = 4;
    kv_lora_rank = 512; qk_rope_dim = 64; qk_nope_dim = 128; v_head_dim = 128;
    n_experts = 16; n_experts_used = 8; n_shared_experts = 1; d_ff_expert = 1024;
    n_leading_dense = 1; gating = 2; routed_scale = 2.446f;
    return OkStatus();
  }
  return InvalidArgument("unknown preset '" + name + "' (tiny, 125m, 150m, 48b-shape)");
}

void SynthOptions::SetArch(Arch a, const std::string& preset) {
  const bool changed = arch != a;
  arch = a;
  if (a == Arch::kKimiLinear && preset == "tiny" && changed) {
    n_layers = 4; mla_every = 2; gating = 2; routed_scale = 1.5f;
  }
  // gemma3 tiny: local, global, local (period 2) with an 8-row window, one KV head as the 270M.
  if (a == Arch::kGemma3 && preset == "tiny" && changed) {
    n_layers = 3; n_kv_heads = 1; head_dim = 32; tied_embeddings = true;
  }
}

Status SynthOptions::Validate() const {
  auto pos = [](const char* what, int v) -> Status {
    if (v <= 0) return InvalidArgument(std::string("synth: ") + what + " must be > 0, got " + std::to_string(v));
    return OkStatus();
  };
  RETURN_IF_ERROR(pos("d_model", d_model));
  RETURN_IF_ERROR(pos("layers", n_layers));
  RETURN_IF_ERROR(pos("heads", n_heads));
  RETURN_IF_ERROR(pos("ff", d_ff));
  if (vocab < 260) return InvalidArgument("synth: vocab must be >= 260 (3 specials + 256 bytes + 1), got " + std::to_string(vocab));
  if (d_model % 32 && dtype == DType::kQ8_0) {
    return InvalidArgument("synth: Q8_0 needs d_model divisible by 32, got " + std::to_string(d_model));
  }
  if (arch == Arch::kKimiLinear) {
    RETURN_IF_ERROR(pos("kda_dim", kda_head_dim));
    RETURN_IF_ERROR(pos("conv", conv_kernel));
    RETURN_IF_ERROR(pos("mla_every", mla_every));
  }
  if (arch == Arch::kDeepseek2 || arch == Arch::kKimiLinear) {
    RETURN_IF_ERROR(pos("kv_lora", kv_lora_rank));
    RETURN_IF_ERROR(pos("nope_dim", qk_nope_dim));
    RETURN_IF_ERROR(pos("v_dim", v_head_dim));
    if (qk_rope_dim <= 0 || qk_rope_dim % 2) {
      return InvalidArgument("synth: rope_dim must be even and > 0, got " + std::to_string(qk_rope_dim));
    }
    if (n_experts > 0) {
      RETURN_IF_ERROR(pos("experts_used", n_experts_used));
      RETURN_IF_ERROR(pos("ff_expert", d_ff_expert));
      if (n_experts_used > n_experts) return InvalidArgument("synth: experts_used > experts");
    }
    if (arch == Arch::kKimiLinear && q_lora_rank != 0) {
      return InvalidArgument("synth: kimi-linear has no q LoRA (q_lora must be 0)");
    }
  } else {
    if (arch == Arch::kGemma3) {
      RETURN_IF_ERROR(pos("swa_period", swa_period));
      if (sliding_window < 0) return InvalidArgument("synth: window must be >= 0");
    }
    RETURN_IF_ERROR(pos("kv_heads", n_kv_heads));
    RETURN_IF_ERROR(pos("head_dim", head_dim));
    if (n_heads % n_kv_heads) return InvalidArgument("synth: heads must be a multiple of kv_heads");
    if (head_dim % 2) return InvalidArgument("synth: head_dim must be even");
  }
  return OkStatus();
}

namespace {

// SentencePiece-style vocabulary: 3 specials, 256 byte tokens, then pieces with descending scores.
void AddTokenizer(const SynthOptions& o, GgufWriter* w) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0.f, 0.f, 0.f};
  std::vector<int32_t> types = {2, 3, 3};  // UNKNOWN, CONTROL, CONTROL
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.push_back(buf);
    scores.push_back(0.f);
    types.push_back(6);  // BYTE
  }
  const std::string sp = "\xE2\x96\x81";  // U+2581
  std::vector<std::string> pieces;
  pieces.push_back(sp);
  for (char c = 32; c < 127; ++c) {
    if (c != ' ') pieces.push_back(std::string(1, c));
  }
  const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";
  for (char a : letters) pieces.push_back(sp + a);
  for (char a : letters) for (char b : letters) pieces.push_back(std::string{a, b});
  for (char a : letters) for (char b : letters) pieces.push_back(sp + a + b);
  for (char a : letters) for (char b : letters) for (char c : letters) pieces.push_back(std::string{a, b, c});
  for (const auto& p : pieces) {
    if (static_cast<int>(tokens.size()) >= o.vocab) break;
    scores.push_back(-static_cast<float>(tokens.size()));
    tokens.push_back(p);
    types.push_back(1);  // NORMAL
  }
  for (int i = static_cast<int>(tokens.size()); i < o.vocab; ++i) {
    tokens.push_back("<unused" + std::to_string(i) + ">");
    scores.push_back(-1e9f);
    types.push_back(5);  // UNUSED
  }
  w->Set("tokenizer.ggml.model", GgufValue::String("llama"));
  w->Set("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
  w->Set("tokenizer.ggml.scores", GgufValue::F32Array(scores));
  w->Set("tokenizer.ggml.token_type", GgufValue::I32Array(types));
  w->Set("tokenizer.ggml.unknown_token_id", GgufValue::U32(0));
  w->Set("tokenizer.ggml.bos_token_id", GgufValue::U32(1));
  w->Set("tokenizer.ggml.eos_token_id", GgufValue::U32(2));
  w->Set("tokenizer.ggml.add_bos_token", GgufValue::Bool(true));
}

}  // namespace

Status SynthHf(const SynthOptions& o, const std::string& dir) {
  RETURN_IF_ERROR(o.Validate());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("cannot create directory '" + dir + "': " + ec.message());
  Rng rng(o.seed);
  const DType st_dtype = (o.dtype == DType::kF32 || o.dtype == DType::kBF16) ? o.dtype : DType::kF16;
  std::vector<SafetensorsTensor> ts;
  auto mat = [&](const std::string& name, std::vector<int64_t> shape, float std_dev) {
    SafetensorsTensor t;
    t.name = name;
    t.dtype = st_dtype;
    t.shape = shape;
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    t.values.resize(n);
    for (auto& v : t.values) v = static_cast<float>(rng.Normal() * std_dev);
    ts.push_back(std::move(t));
  };
  auto norm = [&](const std::string& name, int64_t n) {
    SafetensorsTensor t;
    t.name = name;
    t.dtype = DType::kF32;
    t.shape = {n};
    t.values.resize(n);
    for (auto& v : t.values) v = static_cast<float>(1.0 + 0.1 * rng.Normal());
    ts.push_back(std::move(t));
  };
  // Gemma stores a norm's weight w and applies 1 + w: small values around 0.
  auto gemma_norm = [&](const std::string& name, int64_t n) {
    norm(name, n);
    for (auto& v : ts.back().values) v -= 1.f;
  };
  const int64_t d = o.d_model;
  const float s = o.init_std;
  // Embeddings at unit-ish scale so RMSNorm inputs are well conditioned.
  mat("model.embed_tokens.weight", {o.vocab, d}, 1.0f);
  nlohmann::json cfg;
  cfg["hidden_size"] = o.d_model;
  cfg["num_hidden_layers"] = o.n_layers;
  cfg["num_attention_heads"] = o.n_heads;
  cfg["intermediate_size"] = o.d_ff;
  cfg["vocab_size"] = o.vocab;
  cfg["rms_norm_eps"] = 1e-5;
  cfg["rope_theta"] = o.rope_base;
  cfg["max_position_embeddings"] = 131072;
  cfg["tie_word_embeddings"] = o.tied_embeddings;
  cfg["torch_dtype"] = "float16";
  // Attention weights get a larger scale than the rest so attention is far from uniform and
  // tests comparing policies see real differences.
  const float sa = 4.f / std::sqrt(static_cast<float>(d));
  for (int l = 0; l < o.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (o.arch == Arch::kGemma3) {
      const int64_t qd = int64_t{o.n_heads} * o.head_dim, kvd = int64_t{o.n_kv_heads} * o.head_dim;
      gemma_norm(p + "input_layernorm.weight", d);
      mat(p + "self_attn.q_proj.weight", {qd, d}, sa);
      mat(p + "self_attn.k_proj.weight", {kvd, d}, sa);
      mat(p + "self_attn.v_proj.weight", {kvd, d}, s * 10);
      gemma_norm(p + "self_attn.q_norm.weight", o.head_dim);
      gemma_norm(p + "self_attn.k_norm.weight", o.head_dim);
      mat(p + "self_attn.o_proj.weight", {d, qd}, s);
      gemma_norm(p + "post_attention_layernorm.weight", d);
      gemma_norm(p + "pre_feedforward_layernorm.weight", d);
      gemma_norm(p + "post_feedforward_layernorm.weight", d);
      mat(p + "mlp.gate_proj.weight", {o.d_ff, d}, s);
      mat(p + "mlp.up_proj.weight", {o.d_ff, d}, s);
      mat(p + "mlp.down_proj.weight", {d, o.d_ff}, s);
      continue;
    }
    norm(p + "input_layernorm.weight", d);
    norm(p + "post_attention_layernorm.weight", d);
    if (o.arch == Arch::kKimiLinear) {
      const std::string at = p + "self_attn.";
      if (!o.is_mla_layer(l)) {
        const int64_t H = o.n_heads, D = o.kda_head_dim, C = H * D, W = o.conv_kernel;
        mat(at + "q_proj.weight", {C, d}, sa);
        mat(at + "k_proj.weight", {C, d}, sa);
        mat(at + "v_proj.weight", {C, d}, sa);
        // Depthwise conv taps around 0.5 so the conv mixes the last W tokens visibly.
        for (const char* x : {"q", "k", "v"}) {
          mat(at + x + "_conv1d.weight", {C, 1, W}, 0.5f);
          ts.back().dtype = DType::kF32;
        }
        mat(at + "f_a_proj.weight", {D, d}, sa);
        mat(at + "f_b_proj.weight", {C, D}, 1.f / std::sqrt(static_cast<float>(D)));
        {  // A_log: log of decay rates in [1, 16] (the released model's init range), fp32
          SafetensorsTensor t;
          t.name = at + "A_log";
          t.dtype = DType::kF32;
          t.shape = {1, 1, H, 1};
          for (int64_t h = 0; h < H; ++h) t.values.push_back(std::log(1.f + 15.f * rng.Uniform()));
          ts.push_back(std::move(t));
        }
        mat(at + "dt_bias", {C}, 1.f);
        ts.back().dtype = DType::kF32;
        mat(at + "b_proj.weight", {H, d}, sa);
        mat(at + "g_a_proj.weight", {D, d}, sa);
        mat(at + "g_b_proj.weight", {C, D}, 1.f / std::sqrt(static_cast<float>(D)));
        norm(at + "o_norm.weight", D);
        mat(at + "o_proj.weight", {d, C}, s);
      } else {
        const int64_t qk = o.qk_nope_dim + o.qk_rope_dim;
        mat(at + "q_proj.weight", {o.n_heads * qk, d}, sa);
        mat(at + "kv_a_proj_with_mqa.weight", {o.kv_lora_rank + o.qk_rope_dim, d}, sa);
        norm(at + "kv_a_layernorm.weight", o.kv_lora_rank);
        mat(at + "kv_b_proj.weight",
            {o.n_heads * (o.qk_nope_dim + o.v_head_dim), o.kv_lora_rank},
            1.f / std::sqrt(static_cast<float>(o.kv_lora_rank)));
        mat(at + "o_proj.weight", {d, o.n_heads * o.v_head_dim}, s);
      }
      if (o.n_experts > 0 && l >= o.n_leading_dense) {
        const std::string mb = p + "block_sparse_moe.";
        mat(mb + "gate.weight", {o.n_experts, d}, sa);
        mat(mb + "gate.e_score_correction_bias", {o.n_experts}, 0.5f);
        ts.back().dtype = DType::kF32;
        for (int e = 0; e < o.n_experts; ++e) {
          const std::string ep = mb + "experts." + std::to_string(e) + ".";
          mat(ep + "w1.weight", {o.d_ff_expert, d}, s);
          mat(ep + "w3.weight", {o.d_ff_expert, d}, s);
          mat(ep + "w2.weight", {d, o.d_ff_expert}, s);
        }
        if (o.n_shared_experts > 0) {
          const int64_t ffs = int64_t{o.d_ff_expert} * o.n_shared_experts;
          mat(mb + "shared_experts.gate_proj.weight", {ffs, d}, s);
          mat(mb + "shared_experts.up_proj.weight", {ffs, d}, s);
          mat(mb + "shared_experts.down_proj.weight", {d, ffs}, s);
        }
      } else {
        mat(p + "mlp.gate_proj.weight", {o.d_ff, d}, s);
        mat(p + "mlp.up_proj.weight", {o.d_ff, d}, s);
        mat(p + "mlp.down_proj.weight", {d, o.d_ff}, s);
      }
    } else if (o.arch == Arch::kDeepseek2) {
      const int64_t qk = o.qk_nope_dim + o.qk_rope_dim;
      if (o.q_lora_rank > 0) {
        mat(p + "self_attn.q_a_proj.weight", {o.q_lora_rank, d}, sa);
        norm(p + "self_attn.q_a_layernorm.weight", o.q_lora_rank);
        mat(p + "self_attn.q_b_proj.weight", {o.n_heads * qk, o.q_lora_rank}, sa);
      } else {
        mat(p + "self_attn.q_proj.weight", {o.n_heads * qk, d}, sa);
      }
      mat(p + "self_attn.kv_a_proj_with_mqa.weight", {o.kv_lora_rank + o.qk_rope_dim, d}, sa);
      norm(p + "self_attn.kv_a_layernorm.weight", o.kv_lora_rank);
      mat(p + "self_attn.kv_b_proj.weight",
          {o.n_heads * (o.qk_nope_dim + o.v_head_dim), o.kv_lora_rank},
          1.f / std::sqrt(static_cast<float>(o.kv_lora_rank)));
      mat(p + "self_attn.o_proj.weight", {d, o.n_heads * o.v_head_dim}, s);
      if (o.n_experts > 0 && l >= o.n_leading_dense) {
        mat(p + "mlp.gate.weight", {o.n_experts, d}, sa);
        for (int e = 0; e < o.n_experts; ++e) {
          const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
          mat(ep + "gate_proj.weight", {o.d_ff_expert, d}, s);
          mat(ep + "up_proj.weight", {o.d_ff_expert, d}, s);
          mat(ep + "down_proj.weight", {d, o.d_ff_expert}, s);
        }
        if (o.n_shared_experts > 0) {
          const int64_t ffs = int64_t{o.d_ff_expert} * o.n_shared_experts;
          mat(p + "mlp.shared_experts.gate_proj.weight", {ffs, d}, s);
          mat(p + "mlp.shared_experts.up_proj.weight", {ffs, d}, s);
          mat(p + "mlp.shared_experts.down_proj.weight", {d, ffs}, s);
        }
      } else {
        mat(p + "mlp.gate_proj.weight", {o.d_ff, d}, s);
        mat(p + "mlp.up_proj.weight", {o.d_ff, d}, s);
        mat(p + "mlp.down_proj.weight", {d, o.d_ff}, s);
      }
    } else {
      const int64_t qd = int64_t{o.n_heads} * o.head_dim, kvd = int64_t{o.n_kv_heads} * o.head_dim;
      mat(p + "self_attn.q_proj.weight", {qd, d}, sa);
      mat(p + "self_attn.k_proj.weight", {kvd, d}, sa);
      mat(p + "self_attn.v_proj.weight", {kvd, d}, s * 10);
      mat(p + "self_attn.o_proj.weight", {d, qd}, s);
      if (o.arch == Arch::kQwen2) {
        mat(p + "self_attn.q_proj.bias", {qd}, 0.1f);
        mat(p + "self_attn.k_proj.bias", {kvd}, 0.1f);
        mat(p + "self_attn.v_proj.bias", {kvd}, 0.1f);
        ts[ts.size() - 3].dtype = ts[ts.size() - 2].dtype = ts[ts.size() - 1].dtype = DType::kF32;
      }
      mat(p + "mlp.gate_proj.weight", {o.d_ff, d}, s);
      mat(p + "mlp.up_proj.weight", {o.d_ff, d}, s);
      mat(p + "mlp.down_proj.weight", {d, o.d_ff}, s);
    }
  }
  if (o.arch == Arch::kGemma3) {
    gemma_norm("model.norm.weight", d);
  } else {
    norm("model.norm.weight", d);
  }
  if (!o.tied_embeddings) mat("lm_head.weight", {o.vocab, d}, s);
  if (o.arch == Arch::kKimiLinear) {
    // The released config.json's keys (docs/reference/kimi-linear.md §1).
    cfg["architectures"] = {"KimiLinearForCausalLM"};
    cfg["model_type"] = "kimi_linear";
    cfg.erase("max_position_embeddings");
    cfg["model_max_length"] = 1048576;
    cfg["num_key_value_heads"] = o.n_heads;
    cfg["head_dim"] = o.d_model / o.n_heads;
    cfg["kv_lora_rank"] = o.kv_lora_rank;
    cfg["q_lora_rank"] = nullptr;
    cfg["qk_nope_head_dim"] = o.qk_nope_dim;
    cfg["qk_rope_head_dim"] = o.qk_rope_dim;
    cfg["v_head_dim"] = o.v_head_dim;
    cfg["mla_use_nope"] = true;
    nlohmann::json kda = nlohmann::json::array(), full = nlohmann::json::array();
    for (int l = 0; l < o.n_layers; ++l) (o.is_mla_layer(l) ? full : kda).push_back(l + 1);
    cfg["linear_attn_config"] = {{"kda_layers", kda},
                                 {"full_attn_layers", full},
                                 {"num_heads", o.n_heads},
                                 {"head_dim", o.kda_head_dim},
                                 {"short_conv_kernel_size", o.conv_kernel}};
    cfg["num_experts"] = o.n_experts;
    cfg["num_experts_per_token"] = o.n_experts_used;
    cfg["num_shared_experts"] = o.n_shared_experts;
    cfg["moe_intermediate_size"] = o.d_ff_expert;
    cfg["first_k_dense_replace"] = o.n_leading_dense;
    cfg["moe_layer_freq"] = 1;
    cfg["moe_router_activation_func"] = o.gating == 2 ? "sigmoid" : "softmax";
    cfg["moe_renormalize"] = true;
    cfg["routed_scaling_factor"] = o.routed_scale;
    cfg["use_grouped_topk"] = true;
    cfg["num_expert_group"] = 1;
    cfg["topk_group"] = 1;
    cfg["hidden_act"] = "silu";
  } else if (o.arch == Arch::kGemma3) {
    // Gemma3TextConfig's keys (transformers): layer_types spell the period out.
    cfg["architectures"] = {"Gemma3ForCausalLM"};
    cfg["model_type"] = "gemma3_text";
    cfg["num_key_value_heads"] = o.n_kv_heads;
    cfg["head_dim"] = o.head_dim;
    cfg["query_pre_attn_scalar"] = o.head_dim;
    cfg["hidden_activation"] = "gelu_pytorch_tanh";
    cfg["rms_norm_eps"] = 1e-6;
    cfg["rope_local_base_freq"] = 10000.0;
    cfg["final_logit_softcapping"] = nullptr;
    cfg["attn_logit_softcapping"] = nullptr;
    cfg["rope_scaling"] = nullptr;
    cfg["sliding_window"] = o.sliding_window;
    nlohmann::json types = nlohmann::json::array();
    for (int l = 0; l < o.n_layers; ++l) {
      types.push_back(l % o.swa_period == o.swa_period - 1 ? "full_attention" : "sliding_attention");
    }
    cfg["layer_types"] = types;
  } else if (o.arch == Arch::kDeepseek2) {
    cfg["architectures"] = {"DeepseekV2ForCausalLM"};
    cfg["num_key_value_heads"] = o.n_heads;
    cfg["kv_lora_rank"] = o.kv_lora_rank;
    cfg["q_lora_rank"] = o.q_lora_rank > 0 ? nlohmann::json(o.q_lora_rank) : nlohmann::json(nullptr);
    cfg["qk_nope_head_dim"] = o.qk_nope_dim;
    cfg["qk_rope_head_dim"] = o.qk_rope_dim;
    cfg["v_head_dim"] = o.v_head_dim;
    cfg["n_routed_experts"] = o.n_experts > 0 ? nlohmann::json(o.n_experts) : nlohmann::json(nullptr);
    cfg["num_experts_per_tok"] = o.n_experts_used;
    cfg["n_shared_experts"] = o.n_shared_experts;
    cfg["moe_intermediate_size"] = o.d_ff_expert;
    cfg["first_k_dense_replace"] = o.n_leading_dense;
    cfg["routed_scaling_factor"] = 1.0;
    cfg["norm_topk_prob"] = false;
    cfg["scoring_func"] = o.gating == 2 ? "sigmoid" : "softmax";
    cfg["topk_method"] = "greedy";
    cfg["mla_use_nope"] = o.nope;
  } else {
    cfg["architectures"] = {o.arch == Arch::kQwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
    cfg["num_key_value_heads"] = o.n_kv_heads;
    cfg["head_dim"] = o.head_dim;
  }
  RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", ts));
  std::ofstream f(dir + "/config.json");
  f << cfg.dump(2) << "\n";
  if (!f.good()) return IoError("cannot write " + dir + "/config.json");
  return OkStatus();
}

Status SynthGguf(const SynthOptions& o, const std::string& path) {
  RETURN_IF_ERROR(o.Validate());
  char tmpl[] = "/tmp/strata-synth-XXXXXX";
  if (!mkdtemp(tmpl)) return IoError("cannot create a temporary directory under /tmp");
  const std::string tmp = tmpl;
  Status st = SynthHf(o, tmp);
  if (st.ok()) {
    HfConvertOptions co;
    co.out_dtype = o.file_type.empty() ? o.dtype : DType::kF32;
    auto w = ConvertHfDirectory(tmp, co);
    if (!w.ok()) {
      st = w.status();
    } else {
      w->Set("general.name", GgufValue::String(std::string("strata-synth-") + ArchName(o.arch)));
      AddTokenizer(o, &*w);
      if (o.file_type.empty()) {
        st = w->WriteFile(path);
      } else {
        StatusOr<FileTypeInfo> ft = ParseFileType(o.file_type);
        if (!ft.ok()) {
          st = ft.status();
        } else {
          QuantizeFileOptions qo;
          qo.type = *ft;
          qo.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
          st = WriteQuantized(*w, path, qo).status();
        }
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  return st;
}

}  // namespace strata
