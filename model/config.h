// ModelConfig: the architecture hyper-parameters, read from GGUF metadata with llama.cpp key names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/ops.h"

namespace strata {

class GgufFile;

enum class Arch { kLlama, kQwen2, kDeepseek2, kKimiLinear, kGemma3 };
const char* ArchName(Arch a);
StatusOr<Arch> ParseArch(const std::string& name);

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string name;
  int64_t n_vocab = 0;
  int n_layers = 0;
  int d_model = 0;
  int d_ff = 0;           // dense FFN width
  int n_heads = 0;
  int n_kv_heads = 0;     // GQA; MLA: 1
  int head_dim = 0;       // GQA key/value head dim
  int64_t n_ctx_train = 0;
  float rms_eps = 1e-5f;

  // RoPE
  int rope_dim = 0;       // rotated dims per head (GQA: usually head_dim; MLA: d_r)
  float rope_base = 10000.f;
  float rope_freq_scale = 1.f;     // linear scaling 1/factor
  RopeStyle rope_style = RopeStyle::kNorm;
  bool has_rope_freqs = false;     // llama3 frequency factors tensor present

  // MLA (deepseek2)
  int q_lora_rank = 0;    // 0: single attn_q
  int kv_lora_rank = 0;   // d_c
  int qk_nope_dim = 0;
  int qk_rope_dim = 0;    // d_r
  int v_head_dim = 0;
  bool mla_nope = false;  // branch cached and used unrotated (GGUF: {arch}.attention.mla_use_nope)

  // MoE (deepseek2)
  int n_leading_dense = 0;
  int n_experts = 0;
  int n_experts_used = 0;
  int n_shared_experts = 0;
  int d_ff_expert = 0;
  float expert_weights_scale = 1.f;
  bool expert_weights_norm = false;
  int expert_gating = 1;  // 1 softmax, 2 sigmoid

  // kimi-linear (KDA + NoPE MLA hybrid). layer_kda[l] = 1 where the file's per-layer
  // attention.head_count_kv is 0 (llama.cpp's marker of a recurrent layer), 0 at MLA layers.
  std::vector<uint8_t> layer_kda;  // [n_layers]; empty for the other architectures
  int kda_head_dim = 0;            // {arch}.kda.head_dim (d_k = d_v per KDA head)
  int kda_heads = 0;               // = attention.head_count (llama.cpp's KDA head count)
  int ssm_conv_kernel = 0;         // {arch}.ssm.conv_kernel (short causal conv taps)

  // gemma3: interleaved sliding-window (local) and global layers. layer_local[l] = 1 where layer l
  // attends to its last `sliding_window` positions only (llama.cpp's swa pattern: every layer
  // except each swa_period-th is local); empty when the model has no sliding window.
  std::vector<uint8_t> layer_local;  // [n_layers] or empty
  int sliding_window = 0;            // {arch}.attention.sliding_window (positions, the query's own included)
  float rope_base_local = 10000.f;   // {arch}.rope.freq_base_swa (local layers' RoPE base)
  float final_logit_softcap = 0.f;   // {arch}.final_logit_softcapping (0: none)
  float attn_scale = 0.f;            // softmax scale (0: 1/sqrt(head_dim))

  bool is_mla() const { return arch == Arch::kDeepseek2 || arch == Arch::kKimiLinear; }
  bool is_kda_layer(int l) const { return !layer_kda.empty() && layer_kda[l] != 0; }
  int n_kda_layers() const;
  bool is_local_layer(int l) const { return !layer_local.empty() && layer_local[l] != 0; }
  int n_local_layers() const;
  bool is_moe_layer(int l) const { return n_experts > 0 && l >= n_leading_dense; }
  // Reads and validates every field; errors name the key and the bad value.
  static StatusOr<ModelConfig> FromGguf(const GgufFile& f);
  std::string Summary() const;
};

}  // namespace strata
