// Hugging Face checkpoints: safetensors reader (mmap) and config.json, and their conversion to the
// GGUF layout the engine loads (llama.cpp tensor and key names), for LlamaForCausalLM,
// Qwen2ForCausalLM and DeepseekV2ForCausalLM.
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

// One or more *.safetensors files (a model.safetensors.index.json is honoured when present).
class SafetensorsFile {
 public:
  // path: a .safetensors file. Header length, JSON, dtypes, shapes and data_offsets are all
  // validated against the file size; errors name the file and tensor.
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  const std::map<std::string, std::string>& metadata() const { return meta_; }
  std::vector<std::string> TensorNames() const;  // sorted
  StatusOr<TensorView> Tensor(const std::string& name) const;  // F32, F16, BF16 (others: error)

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* map_ = nullptr;
  std::map<std::string, std::string> meta_;
  std::map<std::string, TensorView> tensors_;
};

// Writes tensors (name -> (dtype, shape, f32 values)) as a safetensors file; used by `strata synth
// --format safetensors` and the tests.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;  // F32, F16 or BF16
  std::vector<int64_t> shape;
  std::vector<float> values;
};
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors);

// Converts an HF model directory (config.json + *.safetensors [+ tokenizer metadata supplied by
// the caller as GGUF keys]) into a GGUF image with llama.cpp names. `out_dtype` is the storage type
// for 2-D weights (F32, F16, BF16 or Q8_0); norms and biases stay F32.
struct HfConvertOptions {
  DType out_dtype = DType::kF16;
};
StatusOr<GgufWriter> ConvertHfDirectory(const std::string& dir, const HfConvertOptions& opts);

}  // namespace strata
