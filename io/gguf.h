// GGUF v3 (and v2) reader over mmap or an owned buffer, and a writer. Key names follow llama.cpp.
//
// Layout (little endian): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv metadata
// entries (string key, u32 value type, value), then n_tensors infos (string name, u32 n_dims,
// u64 ne[n_dims] fastest-first, u32 ggml type, u64 offset), then padding to `general.alignment`
// (default 32), then the tensor data; each tensor's offset is relative to the data start and aligned.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/huge_region.h"
#include "core/status.h"
#include "core/tensor.h"

namespace strata {

enum class GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};
const char* GgufTypeName(GgufType t);

// One metadata value. Scalars live in the union-like fields. An array's elements (all of
// array_type) are held by kind, so that what a file's array costs in memory is a small multiple of
// the bytes it occupies in the file (one GgufValue per u8 element would be ~130x): numbers and
// bools packed as in the file (`packed`, 1x), strings in `strings` (32 bytes + text per >= 8 + text
// in the file), nested arrays in `array`. Use size() and at() to walk any array.
struct GgufValue {
  GgufType type = GgufType::kU32;
  GgufType array_type = GgufType::kU32;  // element type when type == kArray
  uint64_t u = 0;   // unsigned integers and bool
  int64_t i = 0;    // signed integers
  double f = 0;     // F32/F64
  std::string s;    // kString
  std::vector<uint8_t> packed;       // kArray of a number or bool type, little endian
  std::vector<std::string> strings;  // kArray of kString
  std::vector<GgufValue> array;      // kArray of kArray

  // Elements of an array (0 for a scalar).
  size_t size() const;
  // Element j of an array as a value of array_type (CHECKs j < size()).
  GgufValue at(size_t j) const;

  static GgufValue U8(uint8_t v);
  static GgufValue I8(int8_t v);
  static GgufValue U16(uint16_t v);
  static GgufValue I16(int16_t v);
  static GgufValue U32(uint32_t v);
  static GgufValue I32(int32_t v);
  static GgufValue U64(uint64_t v);
  static GgufValue I64(int64_t v);
  static GgufValue F32(float v);
  static GgufValue F64(double v);
  static GgufValue Bool(bool v);
  static GgufValue String(std::string v);
  static GgufValue Array(GgufType elem, std::vector<GgufValue> elems);
  static GgufValue StringArray(const std::vector<std::string>& v);
  static GgufValue F32Array(const std::vector<float>& v);
  static GgufValue I32Array(const std::vector<int32_t>& v);

  bool IsInteger() const;
  // The value as a signed/unsigned integer or double when it is numeric (bool counts as 0/1).
  int64_t AsInt() const;
  double AsDouble() const;
  std::string DebugString() const;  // short, arrays abbreviated
};

struct GgufTensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // outermost first (torch order) = ggml ne reversed
  uint64_t offset = 0;         // relative to the data section
  uint64_t n_bytes = 0;
};

class GgufFile {
 public:
  // Limits on what a file may claim: deeper array nesting, more dims or more elements in one
  // tensor are OutOfRange errors.
  static constexpr int kMaxArrayDepth = 8;
  static constexpr int kMaxDims = 4;
  static constexpr int64_t kMaxTensorElems = int64_t{1} << 40;

  // How the file's bytes are held: mapped read-only (pages shared with the page cache, loaded on
  // first touch), or read into anonymous memory advised for huge pages (a copy: costs the file's
  // size in memory and a read at open, and streams faster; see core/huge_region.h).
  enum class Load { kMmap, kMemory };

  // Opens the file. Every structural problem is a DataLoss/OutOfRange/Unimplemented error naming
  // the file and what is wrong; the file is never trusted (counts, lengths, dims, offsets are
  // bounds-checked before use).
  static StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path,
                                                  Load load = Load::kMmap);
  // Parses an in-memory image (takes ownership).
  static StatusOr<std::unique_ptr<GgufFile>> FromBuffer(std::vector<uint8_t> bytes,
                                                        std::string name = "<memory>");
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  // Byte offset of the data section (a multiple of alignment()); tensor offsets are relative to it.
  uint64_t data_offset() const { return data_offset_; }
  // The whole file image (file_size() bytes).
  const uint8_t* data() const { return base_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* Find(const std::string& key) const;
  bool Has(const std::string& key) const { return Find(key) != nullptr; }
  // Typed getters: NotFound when absent, InvalidArgument when of the wrong kind (naming the key,
  // its type, the expected one and the file). Integer keys accept any integer type whose value
  // fits; float keys accept F32/F64 and integers.
  StatusOr<std::string> GetString(const std::string& key) const;
  StatusOr<int64_t> GetInt(const std::string& key) const;      // any integer type
  StatusOr<double> GetFloat(const std::string& key) const;     // F32/F64 or any integer
  StatusOr<bool> GetBool(const std::string& key) const;
  StatusOr<std::vector<std::string>> GetStringArray(const std::string& key) const;
  StatusOr<std::vector<int64_t>> GetIntArray(const std::string& key) const;
  StatusOr<std::vector<float>> GetFloatArray(const std::string& key) const;
  // An integer in [lo, hi], range-checked in 64 bits before any narrowing: OutOfRange naming the
  // key, the value and the range.
  StatusOr<int64_t> GetIntIn(const std::string& key, int64_t lo, int64_t hi) const;
  // The same when present; `def` when absent. A present key of the wrong type is an error, never
  // the default (a u8 `mla_use_nope` must not silently run a NoPE model with RoPE).
  StatusOr<int64_t> GetIntOr(const std::string& key, int64_t def) const;
  StatusOr<int64_t> GetIntInOr(const std::string& key, int64_t def, int64_t lo, int64_t hi) const;
  StatusOr<double> GetFloatOr(const std::string& key, double def) const;
  StatusOr<bool> GetBoolOr(const std::string& key, bool def) const;
  StatusOr<std::string> GetStringOr(const std::string& key, const std::string& def) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(const std::string& name) const;
  // A view of the tensor's bytes; NotFound naming the tensor when absent.
  StatusOr<TensorView> Tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* map_ = nullptr;             // mmap'ed region (or null when owned_ / memory_ is used)
  std::vector<uint8_t> owned_;
  HugeRegion memory_;               // Load::kMemory
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

class GgufWriter {
 public:
  GgufWriter() = default;
  void Set(const std::string& key, GgufValue value);  // replaces an existing key in place
  // shape outermost first; data holds DTypeRowBytes(dtype, numel) bytes (copied).
  Status AddTensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                   const void* data, size_t n_bytes);
  Status AddTensorF32(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                      const float* values);  // converts from f32 into dtype
  void set_alignment(uint64_t a);            // also written as general.alignment when != 32
                                             // (CHECKs a nonzero power of two)
  uint64_t alignment() const { return alignment_; }
  // Serialises to bytes / to a file (written to PATH.tmp then renamed, so a killed writer never
  // leaves a truncated file under the final name).
  std::vector<uint8_t> ToBytes() const;
  Status WriteFile(const std::string& path) const;

 private:
  // Header, metadata, tensor infos and the padding up to the data section.
  std::vector<uint8_t> HeaderBytes() const;
  // Offset of each tensor relative to the data section.
  std::vector<uint64_t> TensorOffsets() const;
  struct PendingTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;
  };
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<PendingTensor> tensors_;
  uint64_t alignment_ = 32;
};

}  // namespace strata
