// Random-weight test models (`strata synth`): an HF-layout checkpoint (safetensors + config.json)
// or, through the same converter users run, a GGUF with a SentencePiece-style tokenizer.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"

namespace strata {

struct SynthOptions {
  Arch arch = Arch::kLlama;
  bool nope = false;  // deepseek2: NoPE branch (mla_use_nope)
  int d_model = 64;
  int n_layers = 2;
  int n_heads = 4;
  int n_kv_heads = 2;   // llama/qwen2
  int head_dim = 16;    // llama/qwen2
  int d_ff = 128;
  int vocab = 512;
  // deepseek2
  int q_lora_rank = 0;
  int kv_lora_rank = 32;
  int qk_nope_dim = 16;
  int qk_rope_dim = 8;
  int v_head_dim = 16;
  int n_experts = 4;
  int n_experts_used = 2;
  int n_shared_experts = 1;
  int d_ff_expert = 32;
  int n_leading_dense = 1;
  int gating = 1;          // 1 softmax, 2 sigmoid
  // kimi-linear: KDA heads = heads, head dim kda_head_dim, short conv kernel conv_kernel; layer l
  // is MLA when (l + 1) % mla_every == 0 or it is the last layer (the released model's pattern
  // with mla_every = 4), else KDA. MLA uses kv_lora / nope_dim / rope_dim / v_dim (NoPE).
  int kda_head_dim = 16;
  int conv_kernel = 4;
  int mla_every = 2;
  float routed_scale = 1.f;  // kimi-linear: routed_scaling_factor
  // gemma3: sliding window (positions) and period (every swa_period-th layer global).
  int sliding_window = 8;
  int swa_period = 2;
  bool tied_embeddings = false;
  float rope_base = 10000.f;
  float init_std = 0.02f;
  uint64_t seed = 1;
  DType dtype = DType::kF16;  // storage of matrices
  // Non-empty: a llama.cpp file type ("Q4_K_M", "Q8_0", ...); the model is built in f32 and then
  // quantized with that type's per-tensor mix (model/quantize.h). GGUF only.
  std::string file_type;

  // "key=value,key=value" over the field names above (d_model, layers, heads, kv_heads,
  // head_dim, ff, vocab, q_lora, kv_lora, nope_dim, rope_dim, v_dim, experts, experts_used,
  // shared_experts, ff_expert, dense_layers, gating, kda_dim, conv, mla_every, window,
  // swa_period, tied, seed).
  // Unknown keys are errors.
  Status ApplyDims(const std::string& spec);
  // Named shapes: "tiny" (tests), "125m" (llama-shaped ~125M), "150m" (deepseek2-shaped ~150M),
  // "48b-shape" (kimi-linear with Kimi Linear 48B-A3B's layer geometry, few layers and experts).
  Status ApplyPreset(const std::string& name);
  // Sets the architecture; kimi-linear with the tiny preset also takes its tiny hybrid shape
  // (4 layers KDA, MLA, KDA, MLA; sigmoid routing with a selection bias), gemma3 its (3 layers:
  // local, global, local; one KV head of 32, tied output).
  void SetArch(Arch a, const std::string& preset);
  bool is_mla_layer(int l) const {
    return arch != Arch::kKimiLinear || (l + 1) % mla_every == 0 || l == n_layers - 1;
  }
  Status Validate() const;
};

// Writes DIR/config.json and DIR/model.safetensors.
Status SynthHf(const SynthOptions& o, const std::string& dir);
// Writes a GGUF file (converted from an HF checkpoint written to a temporary folder).
Status SynthGguf(const SynthOptions& o, const std::string& path);

}  // namespace strata
