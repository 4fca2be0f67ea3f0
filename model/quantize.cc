// GGUF quantization with llama.cpp's file types and per-tensor mix (see model/quantize.h).
//
// The mix reproduces the rules of llama.cpp's quantizer (llama-quant.cpp, llama_tensor_get_type)
// for the types Strata implements, without an importance matrix, so a Strata Q4_K_M file holds
// the same type in every tensor as llama-quantize's (tested against llama-quantize's own choices,
// model/quantize_test.cc). Facts carried over: which tensors get more bits and when.
#include "model/quantize.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/quant.h"
#include "core/thread_pool.h"

namespace strata {

const std::vector<FileTypeInfo>& FileTypes() {
  static const std::vector<FileTypeInfo> kTypes = {
      {"Q4_0", 2, DType::kQ4_0, "4.50 bpw, 32-blocks of 4-bit codes with one f16 scale"},
      {"Q4_1", 3, DType::kQ4_1, "5.00 bpw, 32-blocks, 4-bit codes, f16 scale and min"},
      {"Q5_0", 8, DType::kQ5_0, "5.50 bpw, 32-blocks of 5-bit codes with one f16 scale"},
      {"Q5_1", 9, DType::kQ5_1, "6.00 bpw, 32-blocks, 5-bit codes, f16 scale and min"},
      {"IQ4_NL", 25, DType::kIQ4_NL, "4.50 bpw, 32-blocks on a non-linear 4-bit code book"},
      {"IQ4_XS", 30, DType::kIQ4_XS, "4.25 bpw, 256-blocks, non-linear 4-bit, 6-bit sub-scales"},
      {"Q2_K", 10, DType::kQ2_K, "2-bit K-quant, attn_v/ffn_down/attn_output at Q3_K/Q4_K"},
      {"Q3_K_S", 11, DType::kQ3_K, "3-bit K-quant, every matrix Q3_K (output Q6_K)"},
      {"Q3_K_M", 12, DType::kQ3_K, "3-bit K-quant, attn_v/ffn_down/attn_output at Q4_K/Q5_K"},
      {"Q3_K_L", 13, DType::kQ3_K, "3-bit K-quant, attn_v/ffn_down/attn_output at Q5_K"},
      {"Q4_K_S", 14, DType::kQ4_K, "4-bit K-quant, first layers' attn_v/ffn_down at Q5_K"},
      {"Q4_K_M", 15, DType::kQ4_K, "4-bit K-quant, half of attn_v/ffn_down at Q6_K"},
      {"Q5_K_S", 16, DType::kQ5_K, "5-bit K-quant, every matrix Q5_K (output Q6_K)"},
      {"Q5_K_M", 17, DType::kQ5_K, "5-bit K-quant, half of attn_v/ffn_down at Q6_K"},
      {"Q6_K", 18, DType::kQ6_K, "6.56 bpw, 6-bit K-quant"},
      {"Q8_0", 7, DType::kQ8_0, "8.50 bpw, 32-blocks of int8 with one f16 scale"},
      {"F16", 1, DType::kF16, "16-bit IEEE half, no quantization"},
      {"BF16", 32, DType::kBF16, "16-bit bfloat, no quantization"},
      {"F32", 0, DType::kF32, "32-bit float, no quantization"},
  };
  return kTypes;
}

namespace {
std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }
bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

StatusOr<FileTypeInfo> ParseFileType(const std::string& name) {
  const std::string u = Upper(name);
  std::string all;
  for (const FileTypeInfo& t : FileTypes()) {
    if (u == t.name) return t;
    all += (all.empty() ? "" : ", ") + std::string(t.name);
  }
  return InvalidArgument("'" + name + "' is not a file type Strata writes; one of: " + all);
}

std::string FileTypeIdName(int64_t id) {
  if (id == 0) return "ALL_F32";
  for (const FileTypeInfo& t : FileTypes()) {
    if (t.id == id) return "MOSTLY_" + std::string(t.name);
  }
  return "type " + std::to_string(id);
}

StatusOr<MixModelInfo> ReadMixModelInfo(const GgufFile& f) {
  MixModelInfo m;
  ASSIGN_OR_RETURN(std::string arch, f.GetString("general.architecture"));
  ASSIGN_OR_RETURN(int64_t n_layer, f.GetIntIn(arch + ".block_count", 1, 1 << 20));
  m.n_layer = static_cast<int>(n_layer);
  ASSIGN_OR_RETURN(int64_t n_head, f.GetIntInOr(arch + ".attention.head_count", 1, 1, 1 << 20));
  ASSIGN_OR_RETURN(int64_t n_kv,
                   f.GetIntInOr(arch + ".attention.head_count_kv", n_head, 1, 1 << 20));
  m.n_gqa = static_cast<int>(n_head / n_kv);
  ASSIGN_OR_RETURN(int64_t n_expert, f.GetIntInOr(arch + ".expert_count", 0, 0, 1 << 20));
  m.n_expert = static_cast<int>(n_expert);
  m.has_output = f.FindTensor("output.weight") != nullptr;
  for (const GgufTensorInfo& t : f.tensors()) {
    if (Contains(t.name, "attn_v.weight") || Contains(t.name, "attn_qkv.weight") ||
        Contains(t.name, "attn_kv_b.weight")) {
      ++m.n_attention_wv;
    }
  }
  return m;
}

bool IsQuantizableTensor(const std::string& name, const std::vector<int64_t>& shape) {
  return EndsWith(name, "weight") && shape.size() >= 2 && !Contains(name, "_norm.weight") &&
         !Contains(name, "ffn_gate_inp.weight") && name != "position_embd.weight" &&
         name != "token_types.weight";
}

TensorTypePlanner::TensorTypePlanner(const FileTypeInfo& ft, const MixModelInfo& info)
    : ft_(ft), info_(info) {}

namespace {
// llama.cpp's "more bits" layers: the first and last eighth and every third in between.
bool UseMoreBits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The layer of a tensor named "blk.N....", or -1.
int LayerOf(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  int v = 0;
  size_t i = 4;
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
  for (; i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])); ++i) {
    v = v * 10 + (name[i] - '0');
    if (v > (1 << 20)) return -1;
  }
  return v;
}
}  // namespace

DType TensorTypePlanner::MixType(const std::string& name, int64_t row_len) {
  const std::string ft = ft_.name;
  DType t = ft_.base;
  if (name == "output.weight" || (!info_.has_output && name == "token_embd.weight")) {
    // The output matrix: Q6_K unless the file type is Q8_0 (or the row does not fit 256-blocks,
    // then Q8_0).
    if (row_len % DTypeBlockElems(t) != 0) return DType::kQ8_0;
    return t == DType::kQ8_0 ? t : DType::kQ6_K;
  }
  if (name == "token_embd.weight") return t;
  if (Contains(name, "attn_v.weight")) {
    const int i = i_attention_wv_++;
    const int n = info_.n_attention_wv;
    if (ft == "Q2_K") {
      t = info_.n_gqa >= 4 ? DType::kQ4_K : DType::kQ3_K;
    } else if (ft == "Q3_K_M") {
      t = i < 2 ? DType::kQ5_K : DType::kQ4_K;
    } else if (ft == "Q3_K_L") {
      t = DType::kQ5_K;
    } else if ((ft == "IQ4_NL" || ft == "IQ4_XS") && info_.n_gqa >= 4) {
      t = DType::kQ5_K;
    } else if ((ft == "Q4_K_M" || ft == "Q5_K_M") && UseMoreBits(i, n)) {
      t = DType::kQ6_K;
    } else if (ft == "Q4_K_S" && i < 4) {
      t = DType::kQ5_K;
    }
    if (info_.n_expert == 8) t = DType::kQ8_0;
    return t;
  }
  if (Contains(name, "attn_k.weight")) {
    if (info_.n_expert == 8) t = DType::kQ8_0;
    return t;
  }
  if (Contains(name, "ffn_down")) {
    // Dense files count ffn_down tensors in file order; MoE files read the layer from the name.
    int i = i_ffn_down_++;
    if (info_.n_expert > 1) i = std::max(0, LayerOf(name));
    const int n = info_.n_layer;
    if (ft == "Q2_K") {
      t = DType::kQ3_K;
    } else if (ft == "Q3_K_M") {
      t = i < n / 16 ? DType::kQ5_K : DType::kQ4_K;
    } else if (ft == "Q3_K_L") {
      t = DType::kQ5_K;
    } else if (ft == "Q4_K_M") {
      if (UseMoreBits(i, n)) t = DType::kQ6_K;
    } else if (i < n / 8 && (ft == "IQ4_NL" || ft == "IQ4_XS")) {
      t = DType::kQ5_K;
    } else if (ft == "Q5_K_M" && UseMoreBits(i, n)) {
      t = DType::kQ6_K;
    } else if (ft == "Q4_K_S" && i < n / 8) {
      t = DType::kQ5_K;
    }
    return t;
  }
  if (Contains(name, "attn_output.weight")) {
    if (info_.n_expert == 8) {
      if (ft == "Q2_K" || ft == "Q3_K_S" || ft == "Q3_K_M" || ft == "IQ4_NL" || ft == "Q4_K_S" ||
          ft == "Q4_K_M" || ft == "IQ4_XS") {
        t = DType::kQ5_K;
      }
    } else {
      if (ft == "Q2_K") t = DType::kQ3_K;
      else if (ft == "Q3_K_M") t = DType::kQ4_K;
      else if (ft == "Q3_K_L") t = DType::kQ5_K;
    }
    return t;
  }
  if (Contains(name, "attn_qkv.weight")) {
    if (ft == "Q3_K_M" || ft == "Q3_K_L") t = DType::kQ4_K;
    else if (ft == "Q4_K_M") t = DType::kQ5_K;
    else if (ft == "Q5_K_M") t = DType::kQ6_K;
    return t;
  }
  return t;
}

StatusOr<DType> TensorTypePlanner::Choose(const std::string& name,
                                          const std::vector<int64_t>& shape, bool* quantized) {
  *quantized = false;
  if (!IsQuantizableTensor(name, shape)) return DType::kF32;
  if (!IsQuantized(ft_.base)) {
    // F32 / F16 / BF16 files: every matrix in that type, nothing else changes.
    *quantized = true;
    return ft_.base;
  }
  const int64_t row_len = shape.back();
  DType t = MixType(name, row_len);
  if (row_len % DTypeBlockElems(t) != 0) {
    // llama.cpp's fallbacks for rows that are not a whole number of 256-blocks.
    switch (t) {
      case DType::kIQ4_XS: t = DType::kIQ4_NL; break;
      case DType::kQ2_K: case DType::kQ3_K: t = DType::kQ4_0; break;
      case DType::kQ4_K: t = DType::kQ5_0; break;
      case DType::kQ5_K: t = DType::kQ5_1; break;
      case DType::kQ6_K: t = DType::kQ8_0; break;
      default: break;
    }
    if (row_len % DTypeBlockElems(t) != 0) t = DType::kF16;
    ++n_fallback_;
  }
  *quantized = true;
  return t;
}

namespace {
// Splits rows of one tensor across the pool; each worker converts its rows through f32.
Status ConvertTensor(const GgufTensorInfo& ti, const TensorView& src, DType to, ThreadPool* pool,
                     std::vector<uint8_t>* out) {
  const int64_t cols = ti.shape.back();
  const int64_t numel = src.numel();
  const int64_t rows = numel / cols;
  const int64_t in_rb = DTypeRowBytes(ti.dtype, cols);
  const int64_t out_rb = DTypeRowBytes(to, cols);
  out->resize(static_cast<size_t>(rows * out_rb));
  std::vector<Status> errs(static_cast<size_t>(pool->size()));
  pool->ParallelFor(rows, [&](int64_t b, int64_t e, int k) {
    std::vector<float> f(static_cast<size_t>(cols));
    const uint8_t* in = static_cast<const uint8_t*>(src.data);
    for (int64_t r = b; r < e; ++r) {
      ToF32(ti.dtype, in + r * in_rb, f.data(), cols);
      uint8_t* dst = out->data() + r * out_rb;
      if (IsQuantized(to)) {
        Status st = QuantizeRow(to, f.data(), dst, cols);
        if (!st.ok()) {
          errs[static_cast<size_t>(k)] =
              InvalidArgument("tensor " + ti.name + " row " + std::to_string(r) + ": " +
                              st.message());
          return;
        }
      } else {
        FromF32(to, f.data(), dst, cols);
      }
    }
  });
  for (const Status& st : errs) RETURN_IF_ERROR(st);
  return OkStatus();
}
}  // namespace

StatusOr<QuantizeFileReport> QuantizeGguf(const GgufFile& in, const std::string& out_path,
                                          const QuantizeFileOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(MixModelInfo info, ReadMixModelInfo(in));
  TensorTypePlanner planner(o.type, info);
  GgufWriter w;
  if (const GgufValue* a = in.Find("general.alignment"); a != nullptr && a->IsInteger()) {
    const int64_t al = a->AsInt();
    if (al <= 0 || (al & (al - 1)) != 0 || al > (1 << 20)) {
      return InvalidArgument("general.alignment " + std::to_string(al) +
                             " is not a power of two in [1, 2^20]");
    }
    w.set_alignment(static_cast<uint64_t>(al));
  }
  for (const auto& [key, v] : in.metadata()) {
    if (key == "general.alignment") continue;
    w.Set(key, v);
  }
  w.Set("general.file_type", GgufValue::U32(o.type.id));
  if (IsQuantized(o.type.base)) w.Set("general.quantization_version", GgufValue::U32(2));

  ThreadPool pool(std::max(1, o.threads));
  QuantizeFileReport rep;
  const int count = static_cast<int>(in.tensors().size());
  int index = 0;
  for (const GgufTensorInfo& ti : in.tensors()) {
    ++index;
    ASSIGN_OR_RETURN(TensorView src, in.Tensor(ti.name));
    bool quantize = false;
    ASSIGN_OR_RETURN(DType to, planner.Choose(ti.name, ti.shape, &quantize));
    const bool copy = !quantize || to == ti.dtype;
    if (copy) {
      to = ti.dtype;
      RETURN_IF_ERROR(w.AddTensor(ti.name, ti.dtype, ti.shape, src.data, ti.n_bytes));
    } else {
      if (IsQuantized(ti.dtype) && !o.allow_requantize) {
        return InvalidArgument("tensor " + ti.name + " is already " +
                               std::string(DTypeName(ti.dtype)) +
                               "; quantizing it again to " + std::string(DTypeName(to)) +
                               " loses precision twice (pass --allow-requantize to do it anyway, "
                               "or quantize from the F32/F16/BF16 file)");
      }
      if (ti.dtype != DType::kF32 && ti.dtype != DType::kF16 && ti.dtype != DType::kBF16 &&
          !IsQuantized(ti.dtype)) {
        return InvalidArgument("tensor " + ti.name + " has type " +
                               std::string(DTypeName(ti.dtype)) + ", which cannot be quantized");
      }
      std::vector<uint8_t> bytes;
      RETURN_IF_ERROR(ConvertTensor(ti, src, to, &pool, &bytes));
      RETURN_IF_ERROR(w.AddTensor(ti.name, to, ti.shape, bytes.data(), bytes.size()));
      ++rep.n_quantized;
    }
    const int64_t out_bytes = DTypeRowBytes(to, src.numel());
    rep.bytes_in += static_cast<int64_t>(ti.n_bytes);
    rep.bytes_out += out_bytes;
    rep.n_weights += src.numel();
    ++rep.n_tensors;
    if (o.progress) {
      QuantizeProgress p;
      p.index = index;
      p.count = count;
      p.name = &ti.name;
      p.from = ti.dtype;
      p.to = to;
      p.bytes_in = static_cast<int64_t>(ti.n_bytes);
      p.bytes_out = out_bytes;
      p.converted = !copy;
      o.progress(p);
    }
  }
  rep.n_fallback = planner.n_fallback();
  RETURN_IF_ERROR(w.WriteFile(out_path));
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

StatusOr<QuantizeFileReport> WriteQuantized(const GgufWriter& w, const std::string& out_path,
                                            const QuantizeFileOptions& o) {
  const std::string tmp = out_path + ".unquantized.tmp";
  RETURN_IF_ERROR(w.WriteFile(tmp));
  StatusOr<QuantizeFileReport> rep = [&]() -> StatusOr<QuantizeFileReport> {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(tmp));
    return QuantizeGguf(*f, out_path, o);
  }();
  std::remove(tmp.c_str());
  return rep;
}

StatusOr<FileTypeInfo> ParseWeightFileType(const std::string& s) {
  StatusOr<FileTypeInfo> t = ParseFileType(s);
  if (!t.ok()) return InvalidArgument("--dtype " + t.status().message());
  return t;
}

}  // namespace strata
