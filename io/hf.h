// Hugging Face checkpoints: safetensors reader (mmap) and config.json, and their conversion to the
// GGUF layout the engine loads (llama.cpp tensor and key names), for LlamaForCausalLM,
// Qwen2ForCausalLM, DeepseekV2ForCausalLM, KimiLinearForCausalLM and Gemma3ForCausalLM (text).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/gguf.h"

namespace strata {

// One .safetensors file, mapped read-only. (Sharded checkpoints: ConvertHfDirectory opens every
// shard named by model.safetensors.index.json, or every *.safetensors file in the directory.)
//
// Layout: u64 LE header length N, N bytes of JSON ({"__metadata__": {str: str}, NAME: {"dtype",
// "shape", "data_offsets": [begin, end)}}), then the data; offsets are relative to byte 8 + N.
class SafetensorsFile {
 public:
  // Largest header accepted (the safetensors reference implementation's limit).
  static constexpr uint64_t kMaxHeaderBytes = 100'000'000;

  // path: a .safetensors file. Header length, JSON, dtypes, shapes and data_offsets are all
  // validated against the file size (DataLoss/OutOfRange naming the file and tensor). Tensors of
  // a known dtype this engine does not read (I64, F8_E4M3, ...) are size-checked here and refused
  // by Tensor(); an unknown dtype string is only range-checked.
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return meta_; }
  std::vector<std::string> TensorNames() const;  // sorted, all dtypes
  bool Has(const std::string& name) const {
    return tensors_.count(name) != 0 || unsupported_.count(name) != 0;
  }
  // F32, F16, BF16. Others: Unimplemented naming the dtype and the tensor; absent: NotFound.
  // The data pointer may be unaligned (the format does not require alignment): copy before
  // reading through a typed pointer.
  StatusOr<TensorView> Tensor(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* map_ = nullptr;
  std::map<std::string, std::string> meta_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> unsupported_;  // tensor name -> safetensors dtype string
};

// Writes tensors (name -> (dtype, shape, f32 values)) as a safetensors file; used by `strata synth
// --format safetensors` and the tests. Data follows in the given order; the JSON header is padded
// with spaces so the data starts 8-byte aligned. `metadata` goes into "__metadata__" when not
// empty. InvalidArgument (naming the tensor) for a dtype other than F32/F16/BF16, a value count
// that differs from the shape, a duplicate or reserved name.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;  // F32, F16 or BF16
  std::vector<int64_t> shape;
  std::vector<float> values;
};
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// Converts an HF model directory (config.json + *.safetensors) into a GGUF image with llama.cpp
// key and tensor names (convert_hf_to_gguf.py conventions), for LlamaForCausalLM ("llama"),
// Qwen2ForCausalLM ("qwen2") and DeepseekV2ForCausalLM ("deepseek2"; MLA with kv_b_proj split
// into attn_k_b (per head W_UK transposed, [n_head, kv_lora, nope]) and attn_v_b ([n_head, v,
// kv_lora]); routed experts stacked into ffn_*_exps).
//
// `out_dtype` is the storage type for 2-D weights and stacked expert tensors (F32, F16, BF16 or
// Q8_0; Q8_0 falls back to F16 for a tensor whose last dim is not a multiple of 32); norms,
// biases and rope_freqs stay F32. llama q/k rows are permuted like llama.cpp's LlamaModel.permute
// so the engine's adjacent-pair RoPE matches HF's rotate_half; qwen2 and deepseek2 are copied.
//
// Tokenizer: NOT converted here. The caller adds the tokenizer.ggml.* keys itself (e.g. from a
// DIR/tokenizer.gguf-meta.json it prepared, or from another GGUF) with GgufWriter::Set before
// writing; this function never reads tokenizer files.
//
// Errors: NotFound naming config.json or a required HF tensor; InvalidArgument naming a bad config
// key or a tensor whose shape disagrees with config.json (both shapes given); Unimplemented for
// another architecture, rope_scaling type, or an HF tensor this mapping does not know (conversion
// never drops a weight silently; rotary_emb.inv_freq and layers >= num_hidden_layers, e.g.
// DeepSeek's MTP layers, are skipped on purpose).
struct HfConvertOptions {
  DType out_dtype = DType::kF16;
};
StatusOr<GgufWriter> ConvertHfDirectory(const std::string& dir, const HfConvertOptions& opts);

}  // namespace strata
