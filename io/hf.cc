#include "io/hf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <sstream>
#include <utility>

#include "core/dtype.h"
#include "io/json_input.h"

namespace strata {
namespace {

using json = nlohmann::json;

std::string ShapeStr(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Bytes per element of a safetensors dtype string; 0 when the string is unknown.
int64_t SafetensorsElemBytes(const std::string& dt) {
  static const std::map<std::string, int64_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},     {"C64", 8}};
  auto it = kSizes.find(dt);
  return it == kSizes.end() ? 0 : it->second;
}

bool SupportedSafetensorsDType(const std::string& dt, DType* out) {
  if (dt == "F32")
    *out = DType::kF32;
  else if (dt == "F16")
    *out = DType::kF16;
  else if (dt == "BF16")
    *out = DType::kBF16;
  else
    return false;
  return true;
}

const char* SafetensorsDTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    default:
      return nullptr;
  }
}

// A non-negative JSON integer (as unsigned); false for anything else.
bool JsonUint(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < 0) return false;
    *out = static_cast<uint64_t>(i);
    return true;
  }
  return false;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, size_);
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFound(path + ": no such safetensors file");
    return IoError(path + ": open failed: " + std::strerror(err));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError(path + ": fstat failed: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + ": not a regular file");
  }
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    return DataLoss(path + ": file is " + std::to_string(f->size_) +
                    " bytes, too small for the 8-byte safetensors header length");
  }
  void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (m == MAP_FAILED) return IoError(path + ": mmap failed: " + std::strerror(err));
  f->map_ = m;
  f->base_ = static_cast<const uint8_t*>(m);
  RETURN_IF_ERROR(f->Parse());
  return f;
}

Status SafetensorsFile::Parse() {
  const std::string& p = path_;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base_[i];
  if (n > kMaxHeaderBytes) {
    return DataLoss(p + ": header length " + std::to_string(n) + " is absurd (limit " +
                    std::to_string(kMaxHeaderBytes) + "; file is " + std::to_string(size_) +
                    " bytes)");
  }
  if (n > size_ - 8) {
    return DataLoss(p + ": header length " + std::to_string(n) +
                    " runs past the end of the file (" + std::to_string(size_) + " bytes)");
  }
  if (n < 2) return DataLoss(p + ": header length " + std::to_string(n) + " is too short for JSON");
  const char* hb = reinterpret_cast<const char*>(base_ + 8);
  auto parsed = ParseUntrustedJson(std::string_view(hb, n), p + ": header");
  if (!parsed.ok()) return parsed.status();
  json h = std::move(*parsed);
  if (!h.is_object()) return DataLoss(p + ": header JSON is not an object");
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size_ - data_start;

  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return DataLoss(p + ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          return DataLoss(p + ": __metadata__ value for '" + m.key() + "' is not a string");
        }
        meta_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = p + ": tensor '" + name + "'";
    if (!v.is_object()) return DataLoss(where + ": entry is not an object");
    auto dt_it = v.find("dtype");
    auto sh_it = v.find("shape");
    auto off_it = v.find("data_offsets");
    if (dt_it == v.end() || !dt_it->is_string()) return DataLoss(where + ": missing string dtype");
    if (sh_it == v.end() || !sh_it->is_array()) return DataLoss(where + ": missing shape array");
    if (off_it == v.end() || !off_it->is_array() || off_it->size() != 2) {
      return DataLoss(where + ": data_offsets must be an array [begin, end)");
    }
    const std::string dt = dt_it->get<std::string>();
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    bool numel_overflow = false;
    for (const json& d : *sh_it) {
      uint64_t u = 0;
      if (!JsonUint(d, &u) || u > (uint64_t{1} << 62)) {
        return DataLoss(where + ": shape entry " + BriefJson(d) + " is not a non-negative integer");
      }
      shape.push_back(static_cast<int64_t>(u));
      if (__builtin_mul_overflow(numel, u, &numel)) numel_overflow = true;
    }
    uint64_t begin = 0, end = 0;
    if (!JsonUint((*off_it)[0], &begin) || !JsonUint((*off_it)[1], &end)) {
      return DataLoss(where + ": data_offsets " + BriefJson(*off_it) +
                      " are not non-negative integers");
    }
    if (begin > end) {
      return DataLoss(where + ": data_offsets [" + std::to_string(begin) + ", " +
                      std::to_string(end) + ") are reversed");
    }
    if (end > data_size) {
      return OutOfRange(where + ": data_offsets [" + std::to_string(begin) + ", " +
                        std::to_string(end) + ") run past the data section (" +
                        std::to_string(data_size) + " bytes after the " + std::to_string(n) +
                        "-byte header)");
    }
    const int64_t elem = SafetensorsElemBytes(dt);
    uint64_t want = 0;
    if (elem > 0) {
      if (numel_overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(elem), &want) ||
          want != end - begin) {
        const std::string need = numel_overflow || want / static_cast<uint64_t>(elem) != numel
                                     ? std::string("an overflowing number of bytes")
                                     : std::to_string(numel) + " x " + std::to_string(elem) +
                                           " = " + std::to_string(want) + " bytes";
        return DataLoss(where + ": shape " + ShapeStr(shape) + " of " + dt + " needs " + need +
                        ", but data_offsets [" + std::to_string(begin) + ", " +
                        std::to_string(end) + ") hold " + std::to_string(end - begin));
      }
    }
    spans.push_back({begin, end, name});
    DType t;
    if (!SupportedSafetensorsDType(dt, &t)) {
      unsupported_[name] = dt;
      continue;
    }
    if (shape.size() > 4) {
      unsupported_[name] = dt + " with " + std::to_string(shape.size()) + " dims (at most 4)";
      continue;
    }
    TensorView view;
    view.data = base_ + data_start + begin;
    view.dtype = t;
    view.n_dims = static_cast<int>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) view.shape[i] = shape[i];
    tensors_[name] = view;
  }
  // Overlap: sorted by begin, each non-empty span starts at or after the previous end.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const Span* prev = nullptr;
  for (const Span& s : spans) {
    if (s.begin == s.end) continue;  // empty tensors occupy no bytes
    if (prev != nullptr && s.begin < prev->end) {
      return DataLoss(p + ": tensor '" + s.name + "' data_offsets [" + std::to_string(s.begin) +
                      ", " + std::to_string(s.end) + ") overlap tensor '" + prev->name + "' [" +
                      std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ")");
    }
    prev = &s;
  }
  return OkStatus();
}

std::vector<std::string> SafetensorsFile::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [k, v] : tensors_) names.push_back(k);
  for (const auto& [k, v] : unsupported_) names.push_back(k);
  std::sort(names.begin(), names.end());
  return names;
}

StatusOr<TensorView> SafetensorsFile::Tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it != tensors_.end()) return it->second;
  auto u = unsupported_.find(name);
  if (u != unsupported_.end()) {
    return Unimplemented(path_ + ": tensor '" + name + "' has dtype " + u->second +
                         "; only F32, F16 and BF16 are supported");
  }
  return NotFound(path_ + ": no tensor named '" + name + "'");
}

// ------------------------------------------------------------------------------------------------
// WriteSafetensors

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t offset = 0;
  std::set<std::string> seen;
  for (const SafetensorsTensor& t : tensors) {
    const char* dt = SafetensorsDTypeName(t.dtype);
    if (dt == nullptr) {
      return InvalidArgument(path + ": tensor '" + t.name + "' has dtype " +
                             std::string(DTypeName(t.dtype)) + "; write F32, F16 or BF16");
    }
    if (t.name == "__metadata__" || t.name.empty()) {
      return InvalidArgument(path + ": tensor name '" + t.name + "' is reserved or empty");
    }
    if (!seen.insert(t.name).second) {
      return InvalidArgument(path + ": duplicate tensor name '" + t.name + "'");
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        return InvalidArgument(path + ": tensor '" + t.name + "' has negative shape " +
                               ShapeStr(t.shape));
      numel *= d;
    }
    if (static_cast<int64_t>(t.values.size()) != numel) {
      return InvalidArgument(path + ": tensor '" + t.name + "' shape " + ShapeStr(t.shape) +
                             " needs " + std::to_string(numel) + " values, got " +
                             std::to_string(t.values.size()));
    }
    const uint64_t bytes = static_cast<uint64_t>(DTypeRowBytes(t.dtype, numel));
    h[t.name] = {{"dtype", dt}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header = h.dump();
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');
  std::vector<uint8_t> out(8 + header.size() + offset);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  uint8_t* data = out.data() + 8 + header.size();
  for (const SafetensorsTensor& t : tensors) {
    if (t.values.empty()) continue;  // (null data pointers must not reach memcpy)
    FromF32(t.dtype, t.values.data(), data, static_cast<int64_t>(t.values.size()));
    data += DTypeRowBytes(t.dtype, static_cast<int64_t>(t.values.size()));
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return IoError(tmp + ": cannot open for writing");
    f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
    if (!f) return IoError(tmp + ": write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return IoError(path + ": rename from " + tmp + " failed: " + ec.message());
  return OkStatus();
}

// ------------------------------------------------------------------------------------------------
// ConvertHfDirectory

namespace {

// Every dimension and count from config.json is at most this (the engine holds dims in an int,
// GGUF in a u32), and so is every dimension derived from them (heads x head dim, ...), computed by
// Dim() in 64 bits; a tensor is then read only when the checkpoint holds exactly that shape, so
// nothing the conversion allocates exceeds what the checkpoint's files hold.
constexpr int64_t kMaxDim = INT32_MAX;

// The product of `factors` as a tensor dimension, or an error naming `what` and the file.
StatusOr<int64_t> Dim(const std::string& file, const std::string& what,
                      std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  std::string expr;
  bool over = false;
  for (int64_t f : factors) {
    expr += (expr.empty() ? "" : " x ") + std::to_string(f);
    if (__builtin_mul_overflow(p, f, &p) || p > kMaxDim) over = true;
  }
  if (over) {
    return OutOfRange(file + ": " + what + " = " + expr + " exceeds " + std::to_string(kMaxDim) +
                      " (no tensor dimension is that large)");
  }
  return p;
}

// Typed access to config.json; every error names the key and the file.
class Config {
 public:
  Config(json j, std::string file) : j_(std::move(j)), file_(std::move(file)) {}
  const json& raw() const { return j_; }
  const std::string& file() const { return file_; }

  // Present and not null.
  bool Has(const std::string& key) const {
    auto it = j_.find(key);
    return it != j_.end() && !it->is_null();
  }
  StatusOr<int64_t> Int(const std::string& key) const {
    if (!Has(key)) return NotFound(file_ + ": missing required key \"" + key + "\"");
    return IntOf(j_.at(key), key);
  }
  StatusOr<int64_t> IntOr(const std::string& key, int64_t def) const {
    return Has(key) ? IntOf(j_.at(key), key) : StatusOr<int64_t>(def);
  }
  // An integer in [lo, hi], checked in 64 bits before it is used, cast or multiplied.
  StatusOr<int64_t> InRange(const std::string& key, int64_t lo, int64_t hi) const {
    ASSIGN_OR_RETURN(int64_t v, Int(key));
    RETURN_IF_ERROR(Check(key, v, lo, hi));
    return v;
  }
  StatusOr<int64_t> InRangeOr(const std::string& key, int64_t def, int64_t lo, int64_t hi) const {
    if (!Has(key)) return def;
    return InRange(key, lo, hi);
  }
  // A size or count: in [1, kMaxDim].
  StatusOr<int64_t> Positive(const std::string& key) const { return InRange(key, 1, kMaxDim); }
  Status Check(const std::string& key, int64_t v, int64_t lo, int64_t hi) const {
    if (v < lo) {
      return InvalidArgument(file_ + ": \"" + key + "\" must be >= " + std::to_string(lo) +
                             ", got " + std::to_string(v));
    }
    if (v > hi) {
      return OutOfRange(file_ + ": \"" + key + "\" = " + std::to_string(v) + " exceeds " +
                        std::to_string(hi));
    }
    return OkStatus();
  }
  StatusOr<double> Float(const std::string& key) const {
    if (!Has(key)) return NotFound(file_ + ": missing required key \"" + key + "\"");
    return FloatOf(j_.at(key), key);
  }
  StatusOr<double> FloatOr(const std::string& key, double def) const {
    return Has(key) ? FloatOf(j_.at(key), key) : StatusOr<double>(def);
  }
  StatusOr<bool> BoolOr(const std::string& key, bool def) const {
    if (!Has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_boolean())
      return InvalidArgument(file_ + ": \"" + key + "\" must be a bool, got " + BriefJson(v));
    return v.get<bool>();
  }
  StatusOr<std::string> StringOr(const std::string& key, const std::string& def) const {
    if (!Has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_string())
      return InvalidArgument(file_ + ": \"" + key + "\" must be a string, got " + BriefJson(v));
    return v.get<std::string>();
  }

  StatusOr<int64_t> IntOf(const json& v, const std::string& key) const {
    if (v.is_number_integer()) return v.get<int64_t>();
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
        return static_cast<int64_t>(d);
      }
    }
    return InvalidArgument(file_ + ": \"" + key + "\" must be an integer, got " + BriefJson(v));
  }
  StatusOr<double> FloatOf(const json& v, const std::string& key) const {
    if (v.is_number()) return v.get<double>();
    return InvalidArgument(file_ + ": \"" + key + "\" must be a number, got " + BriefJson(v));
  }

 private:
  json j_;
  std::string file_;
};

StatusOr<json> ReadJsonFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return NotFound(path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  ASSIGN_OR_RETURN(json j, ParseUntrustedJson(ss.str(), path));
  if (!j.is_object()) return DataLoss(path + ": top level is not a JSON object");
  return j;
}

// The checkpoint's tensors across shards; records which ones the conversion consumed.
class TensorSource {
 public:
  static StatusOr<TensorSource> Open(const std::string& dir) {
    namespace fs = std::filesystem;
    TensorSource src;
    std::vector<std::string> files;
    const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
    std::map<std::string, std::string> weight_map;
    if (fs::exists(index_path)) {
      ASSIGN_OR_RETURN(json idx, ReadJsonFile(index_path));
      auto wm = idx.find("weight_map");
      if (wm == idx.end() || !wm->is_object()) {
        return DataLoss(index_path + ": missing \"weight_map\" object");
      }
      std::set<std::string> uniq;
      for (auto it = wm->begin(); it != wm->end(); ++it) {
        if (!it.value().is_string()) {
          return DataLoss(index_path + ": weight_map entry for '" + it.key() +
                          "' is not a file name");
        }
        const std::string file = it.value().get<std::string>();
        if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
          return DataLoss(index_path + ": weight_map entry for '" + it.key() +
                          "' names a file outside the directory: '" + file + "'");
        }
        weight_map[it.key()] = file;
        uniq.insert(file);
      }
      files.assign(uniq.begin(), uniq.end());
    } else {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        if (e.path().extension() == ".safetensors" && e.is_regular_file()) {
          files.push_back(e.path().filename().string());
        }
      }
      if (ec) return IoError(dir + ": cannot list directory: " + ec.message());
      std::sort(files.begin(), files.end());
    }
    if (files.empty()) return NotFound(dir + ": no *.safetensors files");
    std::map<std::string, size_t> file_index;
    for (const std::string& name : files) {
      ASSIGN_OR_RETURN(auto f, SafetensorsFile::Open((fs::path(dir) / name).string()));
      file_index[name] = src.files_.size();
      src.files_.push_back(std::move(f));
    }
    for (size_t i = 0; i < src.files_.size(); ++i) {
      const SafetensorsFile* f = src.files_[i].get();
      for (const std::string& t : f->TensorNames()) {
        if (!weight_map.empty()) {
          auto it = weight_map.find(t);
          if (it == weight_map.end() || file_index[it->second] != i) continue;  // index wins
        }
        auto [pos, inserted] = src.where_.emplace(t, f);
        if (!inserted) {
          return DataLoss("tensor '" + t + "' appears in both " + pos->second->path() + " and " +
                          f->path());
        }
      }
    }
    for (const auto& [t, file] : weight_map) {
      if (!src.where_.count(t)) {
        return DataLoss(index_path + ": weight_map puts tensor '" + t + "' in " + file +
                        ", which does not hold it");
      }
    }
    return src;
  }

  bool Has(const std::string& name) const { return where_.count(name) != 0; }

  // The first dimension of a 2-D tensor (reads no data): NotFound / InvalidArgument otherwise.
  StatusOr<int64_t> Rows(const std::string& name) const {
    auto it = where_.find(name);
    if (it == where_.end())
      return NotFound("required tensor '" + name + "' is not in the checkpoint");
    ASSIGN_OR_RETURN(TensorView v, it->second->Tensor(name));
    if (v.n_dims != 2 || v.shape[0] < 1 || v.shape[0] > kMaxDim) {
      return InvalidArgument(it->second->path() + ": tensor '" + name + "' must be 2-D, has " +
                             std::to_string(v.n_dims) + " dims");
    }
    return v.shape[0];
  }

  // OK when tensor `name` is present with exactly `shape`; reads nothing.
  Status CheckShape(const std::string& name, const std::vector<int64_t>& shape) const {
    auto it = where_.find(name);
    if (it == where_.end())
      return NotFound("required tensor '" + name + "' is not in the checkpoint");
    ASSIGN_OR_RETURN(TensorView v, it->second->Tensor(name));
    std::vector<int64_t> got(v.shape.begin(), v.shape.begin() + v.n_dims);
    if (got != shape) {
      return InvalidArgument(it->second->path() + ": tensor '" + name + "' has shape " +
                             ShapeStr(got) + ", config.json implies " + ShapeStr(shape));
    }
    return OkStatus();
  }

  // The tensor as f32 values, its shape checked against `shape` (torch order).
  StatusOr<std::vector<float>> Read(const std::string& name, const std::vector<int64_t>& shape) {
    RETURN_IF_ERROR(CheckShape(name, shape));
    ASSIGN_OR_RETURN(TensorView v, where_.at(name)->Tensor(name));
    used_.insert(name);
    const int64_t n = v.numel();
    std::vector<float> out(static_cast<size_t>(n));
    if (n == 0) return out;
    // The mapped data may be unaligned: go through an aligned copy for the 16-bit types.
    if (v.dtype == DType::kF32) {
      std::memcpy(out.data(), v.data, static_cast<size_t>(n) * 4);
    } else {
      std::vector<uint16_t> tmp(static_cast<size_t>(n));
      std::memcpy(tmp.data(), v.data, static_cast<size_t>(n) * 2);
      ToF32(v.dtype, tmp.data(), out.data(), n);
    }
    return out;
  }

  // Names present in the checkpoint and not consumed.
  std::vector<std::string> Unused() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : where_) {
      if (!used_.count(k)) out.push_back(k);
    }
    return out;
  }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
  std::set<std::string> used_;
};

enum class Arch { kLlama, kQwen2, kDeepseek2, kKimiLinear, kGemma3 };

// Collects the output; 2-D/3-D weights in out_dtype, others F32.
class Emitter {
 public:
  Emitter(GgufWriter* w, DType out) : w_(w), out_(out) {}
  Status Weight(const std::string& name, const std::vector<int64_t>& shape,
                const std::vector<float>& v) {
    DType t = out_;
    if (t == DType::kQ8_0 && shape.back() % 32 != 0) t = DType::kF16;
    return w_->AddTensorF32(name, t, shape, v.data());
  }
  Status F32(const std::string& name, const std::vector<int64_t>& shape,
             const std::vector<float>& v) {
    return w_->AddTensorF32(name, DType::kF32, shape, v.data());
  }

 private:
  GgufWriter* w_;
  DType out_;
};

// llama.cpp's LlamaModel.permute: view rows as [n_head, 2, rows/n_head/2] (x cols), swap the two
// inner axes. Row h*2*half + 2*i + j of the result is row h*2*half + j*half + i of the input, so
// HF's rotate_half pairs (i, i + half) become adjacent pairs (2i, 2i+1).
std::vector<float> PermuteRows(const std::vector<float>& w, int64_t rows, int64_t cols,
                               int64_t n_head) {
  const int64_t half = rows / n_head / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < n_head; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t dst = h * 2 * half + 2 * i + j;
        const int64_t src = h * 2 * half + j * half + i;
        std::memcpy(&out[dst * cols], &w[src * cols], static_cast<size_t>(cols) * sizeof(float));
      }
    }
  }
  return out;
}

uint32_t U32(int64_t v) { return static_cast<uint32_t>(v); }

// llama.cpp's rope_freqs for rope_type "llama3" (LlamaModel.generate_extra_tensors), in float32
// following the torch code op by op (python-scalar / tensor is reciprocal-then-multiply there):
//   freqs = 1 / base^(arange(0, dim, 2) / dim); wavelen = 2 pi / freq;
//   wavelen < old_ctx / high_ff -> 1; wavelen > old_ctx / low_ff -> factor;
//   else smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff), 1 / ((1 - smooth) / factor +
//   smooth).
// Matches torch to float32 rounding (powf may differ from torch's pow in the last ulp).
std::vector<float> Llama3RopeFactors(double base, int64_t dim, double factor, double low_ff,
                                     double high_ff, double old_ctx) {
  std::vector<float> out;
  const float low_wavelen = static_cast<float>(old_ctx / low_ff);
  const float high_wavelen = static_cast<float>(old_ctx / high_ff);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  for (int64_t i = 0; i < dim; i += 2) {
    const float e = static_cast<float>(i) / static_cast<float>(dim);
    const float freq = 1.0f / std::pow(static_cast<float>(base), e);
    const float wavelen = (1.0f / freq) * two_pi;
    if (wavelen < high_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      out.push_back(static_cast<float>(factor));
    } else {
      const float smooth =
          ((1.0f / wavelen) * static_cast<float>(old_ctx) - static_cast<float>(low_ff)) /
          static_cast<float>(high_ff - low_ff);
      out.push_back(1.0f / ((1.0f - smooth) / static_cast<float>(factor) + smooth));
    }
  }
  return out;
}

struct Common {
  Arch arch;
  std::string arch_name;
  int64_t n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, n_ctx;
  bool tied;
};

Status SetRopeScaling(const Config& cfg, const Common& c, GgufWriter* w, Emitter* em,
                      int64_t rope_dim_for_llama3) {
  if (!cfg.Has("rope_scaling")) return OkStatus();
  const json& rs = cfg.raw().at("rope_scaling");
  if (!rs.is_object()) {
    return InvalidArgument(cfg.file() + ": \"rope_scaling\" must be an object, got " + BriefJson(rs));
  }
  Config r(rs, cfg.file() + " rope_scaling");
  ASSIGN_OR_RETURN(std::string type, r.StringOr("type", ""));
  ASSIGN_OR_RETURN(type, r.StringOr("rope_type", type));
  std::string lower = type;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  const std::string& a = c.arch_name;
  if (lower.empty() || lower == "default") return OkStatus();
  if (lower == "linear") {
    ASSIGN_OR_RETURN(double factor, r.Float("factor"));
    w->Set(a + ".rope.scaling.type", GgufValue::String("linear"));
    w->Set(a + ".rope.scaling.factor", GgufValue::F32(static_cast<float>(factor)));
    return OkStatus();
  }
  if (lower == "llama3") {
    ASSIGN_OR_RETURN(double base, cfg.FloatOr("rope_theta", 10000.0));
    ASSIGN_OR_RETURN(double factor, r.FloatOr("factor", 8.0));
    ASSIGN_OR_RETURN(double low, r.FloatOr("low_freq_factor", 1.0));
    ASSIGN_OR_RETURN(double high, r.FloatOr("high_freq_factor", 4.0));
    ASSIGN_OR_RETURN(double old_ctx, r.FloatOr("original_max_position_embeddings", 8192.0));
    if (low <= 0 || high <= 0 || old_ctx <= 0 || factor <= 0) {
      return InvalidArgument(cfg.file() + ": llama3 rope_scaling needs positive factor, " +
                             "low/high_freq_factor and original_max_position_embeddings, got " +
                             BriefJson(rs));
    }
    const std::vector<float> f =
        Llama3RopeFactors(base, rope_dim_for_llama3, factor, low, high, old_ctx);
    return em->F32("rope_freqs.weight", {static_cast<int64_t>(f.size())}, f);
  }
  if (lower == "yarn") {
    ASSIGN_OR_RETURN(double factor, r.Float("factor"));
    ASSIGN_OR_RETURN(int64_t orig, r.InRange("original_max_position_embeddings", 1, kMaxDim));
    w->Set(a + ".rope.scaling.type", GgufValue::String("yarn"));
    w->Set(a + ".rope.scaling.factor", GgufValue::F32(static_cast<float>(factor)));
    w->Set(a + ".rope.scaling.original_context_length", GgufValue::U32(U32(orig)));
    if (c.arch == Arch::kDeepseek2) {
      ASSIGN_OR_RETURN(double mscale_all_dim, r.FloatOr("mscale_all_dim", 0.0));
      w->Set(a + ".rope.scaling.yarn_log_multiplier",
             GgufValue::F32(static_cast<float>(0.1 * mscale_all_dim)));
    }
    return OkStatus();
  }
  return Unimplemented(cfg.file() + ": rope_scaling type '" + type + "' is not supported " +
                       "(linear, llama3, yarn)");
}

std::string Blk(int64_t i) { return "blk." + std::to_string(i) + "."; }
std::string Hf(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

// Reads HF tensor `hf` with shape `shape` and emits it as `gg` (weights in out_dtype when 2-D+,
// F32 when 1-D).
Status Copy(TensorSource* src, Emitter* em, const std::string& hf, const std::string& gg,
            const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(std::vector<float> v, src->Read(hf, shape));
  return shape.size() >= 2 ? em->Weight(gg, shape, v) : em->F32(gg, shape, v);
}
Status CopyIfPresent(TensorSource* src, Emitter* em, const std::string& hf, const std::string& gg,
                     const std::vector<int64_t>& shape) {
  return src->Has(hf) ? Copy(src, em, hf, gg, shape) : OkStatus();
}

// The gated FFN of one layer: mlp.{gate,up,down}_proj -> ffn_{gate,up,down}.
Status CopyDenseFfn(TensorSource* src, Emitter* em, const std::string& hf, const std::string& gg,
                    int64_t n_ff, int64_t d) {
  RETURN_IF_ERROR(Copy(src, em, hf + "mlp.gate_proj.weight", gg + "ffn_gate.weight", {n_ff, d}));
  RETURN_IF_ERROR(Copy(src, em, hf + "mlp.up_proj.weight", gg + "ffn_up.weight", {n_ff, d}));
  return Copy(src, em, hf + "mlp.down_proj.weight", gg + "ffn_down.weight", {d, n_ff});
}

Status ConvertLlamaLike(const Config& cfg, const Common& c, TensorSource* src, Emitter* em,
                        GgufWriter* w) {
  const std::string& a = c.arch_name;
  int64_t head_dim = 0;
  if (cfg.Has("head_dim")) {
    ASSIGN_OR_RETURN(head_dim, cfg.Positive("head_dim"));
  } else {
    if (c.n_embd % c.n_head != 0) {
      return InvalidArgument(cfg.file() + ": hidden_size " + std::to_string(c.n_embd) +
                             " is not a multiple of num_attention_heads " +
                             std::to_string(c.n_head) + " and no head_dim is given");
    }
    head_dim = c.n_embd / c.n_head;
  }
  if (c.arch == Arch::kLlama && head_dim % 2 != 0) {
    return InvalidArgument(cfg.file() + ": head_dim " + std::to_string(head_dim) +
                           " must be even for RoPE");
  }
  w->Set(a + ".rope.dimension_count", GgufValue::U32(U32(head_dim)));
  w->Set(a + ".attention.key_length", GgufValue::U32(U32(head_dim)));
  w->Set(a + ".attention.value_length", GgufValue::U32(U32(head_dim)));
  ASSIGN_OR_RETURN(const int64_t q_rows,
                   Dim(cfg.file(), "num_attention_heads x head_dim", {c.n_head, head_dim}));
  ASSIGN_OR_RETURN(const int64_t kv_rows,
                   Dim(cfg.file(), "num_key_value_heads x head_dim", {c.n_head_kv, head_dim}));
  // The head dim sizes the llama3 rope factors: check it against a tensor that must exist first.
  RETURN_IF_ERROR(src->CheckShape(Hf(0) + "self_attn.q_proj.weight", {q_rows, c.n_embd}));
  RETURN_IF_ERROR(SetRopeScaling(cfg, c, w, em, head_dim));

  const bool permute = c.arch == Arch::kLlama;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string hf = Hf(l), gg = Blk(l);
    RETURN_IF_ERROR(
        Copy(src, em, hf + "input_layernorm.weight", gg + "attn_norm.weight", {c.n_embd}));
    struct Proj {
      const char* hf;
      const char* gg;
      int64_t rows;
      int64_t perm_heads;  // 0: no permutation
    };
    const Proj projs[] = {{"q", "q", q_rows, permute ? c.n_head : 0},
                          {"k", "k", kv_rows, permute ? c.n_head_kv : 0},
                          {"v", "v", kv_rows, 0}};
    for (const Proj& p : projs) {
      const std::string wn = hf + "self_attn." + p.hf + "_proj.weight";
      const std::string bn = hf + "self_attn." + p.hf + "_proj.bias";
      ASSIGN_OR_RETURN(std::vector<float> wv, src->Read(wn, {p.rows, c.n_embd}));
      if (p.perm_heads) wv = PermuteRows(wv, p.rows, c.n_embd, p.perm_heads);
      RETURN_IF_ERROR(em->Weight(gg + "attn_" + p.gg + ".weight", {p.rows, c.n_embd}, wv));
      if (src->Has(bn)) {
        ASSIGN_OR_RETURN(std::vector<float> bv, src->Read(bn, {p.rows}));
        if (p.perm_heads) bv = PermuteRows(bv, p.rows, 1, p.perm_heads);
        RETURN_IF_ERROR(em->F32(gg + "attn_" + p.gg + ".bias", {p.rows}, bv));
      }
    }
    RETURN_IF_ERROR(Copy(src, em, hf + "self_attn.o_proj.weight", gg + "attn_output.weight",
                         {c.n_embd, q_rows}));
    RETURN_IF_ERROR(
        CopyIfPresent(src, em, hf + "self_attn.o_proj.bias", gg + "attn_output.bias", {c.n_embd}));
    RETURN_IF_ERROR(
        Copy(src, em, hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", {c.n_embd}));
    RETURN_IF_ERROR(CopyDenseFfn(src, em, hf, gg, c.n_ff, c.n_embd));
  }
  return OkStatus();
}

// Gemma3ForCausalLM (text), as llama.cpp's converter writes it (conversion/gemma.py,
// Gemma3Model): the norms' weights + 1 (Gemma3RMSNorm computes x * (1 + w)); no q/k permutation
// (NEOX RoPE); the sliding window, and the keys llama.cpp reads where the config departs from
// its defaults (window period 6, local RoPE base 10000, no soft-capping).
Status ConvertGemma3(const Config& cfg, const Common& c, TensorSource* src, Emitter* em,
                     GgufWriter* w) {
  const std::string& a = c.arch_name;
  ASSIGN_OR_RETURN(const int64_t head_dim, cfg.InRangeOr("head_dim", 256, 2, kMaxDim));
  if (head_dim % 2 != 0) {
    return InvalidArgument(cfg.file() + ": head_dim " + std::to_string(head_dim) +
                           " must be even for RoPE");
  }
  w->Set(a + ".attention.key_length", GgufValue::U32(U32(head_dim)));
  w->Set(a + ".attention.value_length", GgufValue::U32(U32(head_dim)));
  // llama.cpp scales queries by 1/sqrt(head_dim) (27B, 62 layers: by d_model / n_head); a config
  // with another query_pre_attn_scalar cannot be expressed in the file.
  ASSIGN_OR_RETURN(const double qpas, cfg.FloatOr("query_pre_attn_scalar", head_dim));
  const double llama_cpp_scalar =
      c.n_layer == 62 ? static_cast<double>(c.n_embd / c.n_head) : static_cast<double>(head_dim);
  if (qpas != llama_cpp_scalar) {
    return Unimplemented(cfg.file() + ": query_pre_attn_scalar " + std::to_string(qpas) +
                         " differs from the " + std::to_string(llama_cpp_scalar) +
                         " a gemma3 GGUF implies (llama.cpp has no key for it)");
  }
  if (cfg.Has("attn_logit_softcapping") && !cfg.raw().at("attn_logit_softcapping").is_null()) {
    return Unimplemented(cfg.file() + ": attn_logit_softcapping is set; gemma3 has none");
  }
  if (cfg.Has("final_logit_softcapping") && !cfg.raw().at("final_logit_softcapping").is_null()) {
    ASSIGN_OR_RETURN(const double cap, cfg.Float("final_logit_softcapping"));
    w->Set(a + ".final_logit_softcapping", GgufValue::F32(static_cast<float>(cap)));
  }
  // Layer kinds: layer_types (transformers >= 4.53) or sliding_window_pattern (period).
  ASSIGN_OR_RETURN(const int64_t window, cfg.InRangeOr("sliding_window", 0, 0, kMaxDim));
  int64_t period = 6;
  if (cfg.Has("layer_types")) {
    const json& lt = cfg.raw().at("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.n_layer) {
      return InvalidArgument(cfg.file() + ": \"layer_types\" must list " +
                             std::to_string(c.n_layer) + " layer kinds");
    }
    // The file stores a period: the list must be its pattern (global every period-th layer).
    int64_t first_global = -1;
    for (int64_t l = 0; l < c.n_layer && first_global < 0; ++l) {
      if (lt[l] == "full_attention") first_global = l;
    }
    period = first_global < 0 ? c.n_layer + 1 : first_global + 1;
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string want = l % period == period - 1 ? "full_attention" : "sliding_attention";
      if (!lt[l].is_string() || lt[l].get<std::string>() != want) {
        return Unimplemented(cfg.file() + ": layer_types[" + std::to_string(l) + "] is " +
                             BriefJson(lt[l]) + "; a gemma3 GGUF holds a period (every " +
                             std::to_string(period) + "th layer global), which this list breaks");
      }
    }
  } else if (cfg.Has("sliding_window_pattern")) {
    ASSIGN_OR_RETURN(period, cfg.InRange("sliding_window_pattern", 1, kMaxDim));
  }
  if (window > 0 && period != 1) {
    w->Set(a + ".attention.sliding_window", GgufValue::U32(U32(window)));
    if (period != 6) w->Set(a + ".attention.sliding_window_pattern", GgufValue::U32(U32(period)));
    ASSIGN_OR_RETURN(const double local_base, cfg.FloatOr("rope_local_base_freq", 10000.0));
    if (local_base != 10000.0) {
      w->Set(a + ".rope.freq_base_swa", GgufValue::F32(static_cast<float>(local_base)));
    }
  }
  if (cfg.Has("rope_scaling") && !cfg.raw().at("rope_scaling").is_null()) {
    RETURN_IF_ERROR(SetRopeScaling(cfg, c, w, em, head_dim));
  }
  ASSIGN_OR_RETURN(const int64_t q_rows,
                   Dim(cfg.file(), "num_attention_heads x head_dim", {c.n_head, head_dim}));
  ASSIGN_OR_RETURN(const int64_t kv_rows,
                   Dim(cfg.file(), "num_key_value_heads x head_dim", {c.n_head_kv, head_dim}));
  // A norm weight w as Gemma applies it: 1 + w.
  auto norm = [&](const std::string& hf, const std::string& gg, int64_t n) -> Status {
    ASSIGN_OR_RETURN(std::vector<float> v, src->Read(hf, {n}));
    for (float& x : v) x += 1.f;
    return em->F32(gg, {n}, v);
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string hf = Hf(l), gg = Blk(l);
    RETURN_IF_ERROR(norm(hf + "input_layernorm.weight", gg + "attn_norm.weight", c.n_embd));
    RETURN_IF_ERROR(Copy(src, em, hf + "self_attn.q_proj.weight", gg + "attn_q.weight",
                         {q_rows, c.n_embd}));
    RETURN_IF_ERROR(Copy(src, em, hf + "self_attn.k_proj.weight", gg + "attn_k.weight",
                         {kv_rows, c.n_embd}));
    RETURN_IF_ERROR(Copy(src, em, hf + "self_attn.v_proj.weight", gg + "attn_v.weight",
                         {kv_rows, c.n_embd}));
    RETURN_IF_ERROR(norm(hf + "self_attn.q_norm.weight", gg + "attn_q_norm.weight", head_dim));
    RETURN_IF_ERROR(norm(hf + "self_attn.k_norm.weight", gg + "attn_k_norm.weight", head_dim));
    RETURN_IF_ERROR(Copy(src, em, hf + "self_attn.o_proj.weight", gg + "attn_output.weight",
                         {c.n_embd, q_rows}));
    RETURN_IF_ERROR(
        norm(hf + "post_attention_layernorm.weight", gg + "post_attention_norm.weight", c.n_embd));
    RETURN_IF_ERROR(norm(hf + "pre_feedforward_layernorm.weight", gg + "ffn_norm.weight", c.n_embd));
    RETURN_IF_ERROR(
        norm(hf + "post_feedforward_layernorm.weight", gg + "post_ffw_norm.weight", c.n_embd));
    RETURN_IF_ERROR(CopyDenseFfn(src, em, hf, gg, c.n_ff, c.n_embd));
  }
  return OkStatus();
}

// The dimensions of one MLA attention layer (deepseek2, kimi-linear), each checked by Dim().
struct MlaDims {
  int64_t d = 0, n_head = 0, q_lora = 0, q_rows = 0, kv_row = 0, kv_lora = 0, nope = 0, vdim = 0,
          kvb_rows = 0, o_cols = 0;
};

// One layer's MLA attention tensors (at: "model.layers.L.self_attn.", gg: "blk.L."): q (a single
// q_proj, or the LoRA q_a_proj / q_a_layernorm / q_b_proj when q_lora > 0), kv_a and its norm,
// kv_b split into attn_k_b and attn_v_b, o_proj.
Status ConvertMlaAttention(TensorSource* src, Emitter* em, const std::string& at,
                           const std::string& gg, const MlaDims& m) {
  if (m.q_lora > 0) {
    RETURN_IF_ERROR(Copy(src, em, at + "q_a_proj.weight", gg + "attn_q_a.weight", {m.q_lora, m.d}));
    RETURN_IF_ERROR(
        Copy(src, em, at + "q_a_layernorm.weight", gg + "attn_q_a_norm.weight", {m.q_lora}));
    RETURN_IF_ERROR(
        Copy(src, em, at + "q_b_proj.weight", gg + "attn_q_b.weight", {m.q_rows, m.q_lora}));
  } else {
    RETURN_IF_ERROR(Copy(src, em, at + "q_proj.weight", gg + "attn_q.weight", {m.q_rows, m.d}));
  }
  RETURN_IF_ERROR(Copy(src, em, at + "kv_a_proj_with_mqa.weight", gg + "attn_kv_a_mqa.weight",
                       {m.kv_row, m.d}));
  RETURN_IF_ERROR(
      Copy(src, em, at + "kv_a_layernorm.weight", gg + "attn_kv_a_norm.weight", {m.kv_lora}));
  // kv_b_proj [n_head * (nope + v), kv_lora]: per head, rows [0, nope) are W_UK,h and rows
  // [nope, nope + v) are W_UV,h.
  const int64_t H = m.n_head, dc = m.kv_lora, nope = m.nope, vdim = m.vdim, per = nope + vdim;
  // Read (shape checked) before kb and vb are sized: they hold exactly kvb's values.
  ASSIGN_OR_RETURN(std::vector<float> kvb, src->Read(at + "kv_b_proj.weight", {m.kvb_rows, dc}));
  std::vector<float> kb(static_cast<size_t>(H * dc * nope));
  std::vector<float> vb(static_cast<size_t>(H * vdim * dc));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < nope; ++i) {
      const float* row = &kvb[(h * per + i) * dc];
      for (int64_t j = 0; j < dc; ++j) kb[(h * dc + j) * nope + i] = row[j];
    }
    std::memcpy(&vb[h * vdim * dc], &kvb[(h * per + nope) * dc],
                static_cast<size_t>(vdim * dc) * sizeof(float));
  }
  RETURN_IF_ERROR(em->Weight(gg + "attn_k_b.weight", {H, dc, nope}, kb));
  RETURN_IF_ERROR(em->Weight(gg + "attn_v_b.weight", {H, vdim, dc}, vb));
  return Copy(src, em, at + "o_proj.weight", gg + "attn_output.weight", {m.d, m.o_cols});
}

// Where a checkpoint keeps one MoE layer's tensors, relative to "model.layers.L.".
struct MoeNames {
  std::string router;    // + ".weight", + ".e_score_correction_bias" (optional)
  std::string experts;   // + "E." + part + ".weight"
  const char* parts[3];  // the gate, up and down projections inside an expert
  std::string shared;    // + "gate_proj.weight", "up_proj.weight", "down_proj.weight"
};

// The dimensions of one layer's FFN.
struct FfnDims {
  int64_t d = 0, n_ff = 0, n_expert = 0, moe_ff = 0;
  int64_t sh_ff = 0;  // the shared experts' width; 0: none
};

// One layer's FFN (hf: "model.layers.L.", gg: "blk.L."): dense (mlp.{gate,up,down}_proj), or MoE
// (router, its optional selection bias, the experts stacked per projection, shared experts).
Status ConvertFfn(TensorSource* src, Emitter* em, const std::string& hf, const std::string& gg,
                  bool moe, const FfnDims& f, const MoeNames& names) {
  const int64_t d = f.d, n_expert = f.n_expert, moe_ff = f.moe_ff;
  if (!moe) return CopyDenseFfn(src, em, hf, gg, f.n_ff, d);
  const std::string router = hf + names.router;
  RETURN_IF_ERROR(Copy(src, em, router + ".weight", gg + "ffn_gate_inp.weight", {n_expert, d}));
  RETURN_IF_ERROR(CopyIfPresent(src, em, router + ".e_score_correction_bias",
                                gg + "exp_probs_b.bias", {n_expert}));
  struct Part {
    const char* gg;
    int64_t rows, cols;
  };
  const Part parts[] = {{"gate", moe_ff, d}, {"up", moe_ff, d}, {"down", d, moe_ff}};
  for (int k = 0; k < 3; ++k) {
    const Part& p = parts[k];
    auto expert = [&](int64_t e) {
      return hf + names.experts + std::to_string(e) + "." + names.parts[k] + ".weight";
    };
    // Every expert's shape is checked before the stack is sized: then it holds no more values
    // than the checkpoint does.
    for (int64_t e = 0; e < n_expert; ++e) {
      RETURN_IF_ERROR(src->CheckShape(expert(e), {p.rows, p.cols}));
    }
    std::vector<float> stacked;
    stacked.reserve(static_cast<size_t>(n_expert * p.rows * p.cols));
    for (int64_t e = 0; e < n_expert; ++e) {
      ASSIGN_OR_RETURN(std::vector<float> v, src->Read(expert(e), {p.rows, p.cols}));
      stacked.insert(stacked.end(), v.begin(), v.end());
    }
    RETURN_IF_ERROR(
        em->Weight(gg + "ffn_" + p.gg + "_exps.weight", {n_expert, p.rows, p.cols}, stacked));
  }
  if (f.sh_ff > 0) {
    const std::string sh = hf + names.shared;
    RETURN_IF_ERROR(
        Copy(src, em, sh + "gate_proj.weight", gg + "ffn_gate_shexp.weight", {f.sh_ff, d}));
    RETURN_IF_ERROR(Copy(src, em, sh + "up_proj.weight", gg + "ffn_up_shexp.weight", {f.sh_ff, d}));
    RETURN_IF_ERROR(
        Copy(src, em, sh + "down_proj.weight", gg + "ffn_down_shexp.weight", {d, f.sh_ff}));
  }
  return OkStatus();
}

Status ConvertDeepseek2(const Config& cfg, const Common& c, TensorSource* src, Emitter* em,
                        GgufWriter* w) {
  const std::string& a = c.arch_name;
  int64_t q_lora = 0;
  if (cfg.Has("q_lora_rank")) {
    ASSIGN_OR_RETURN(q_lora, cfg.Positive("q_lora_rank"));
  }
  // Written even without a q LoRA (0: the single attn_q path): llama.cpp requires the key for
  // every deepseek2 model except those it recognises as "lite" by their layer count.
  w->Set(a + ".attention.q_lora_rank", GgufValue::U32(U32(q_lora)));
  ASSIGN_OR_RETURN(int64_t kv_lora, cfg.Positive("kv_lora_rank"));
  ASSIGN_OR_RETURN(int64_t nope, cfg.Positive("qk_nope_head_dim"));
  ASSIGN_OR_RETURN(int64_t rope, cfg.Positive("qk_rope_head_dim"));
  ASSIGN_OR_RETURN(int64_t vdim, cfg.Positive("v_head_dim"));
  if (rope % 2 != 0) {
    return InvalidArgument(cfg.file() + ": qk_rope_head_dim " + std::to_string(rope) +
                           " must be even for RoPE");
  }
  ASSIGN_OR_RETURN(const int64_t kv_row,
                   Dim(cfg.file(), "kv_lora_rank + qk_rope_head_dim", {kv_lora + rope}));
  ASSIGN_OR_RETURN(const int64_t qk_dim,
                   Dim(cfg.file(), "qk_nope_head_dim + qk_rope_head_dim", {nope + rope}));
  w->Set(a + ".attention.kv_lora_rank", GgufValue::U32(U32(kv_lora)));
  w->Set(a + ".attention.key_length", GgufValue::U32(U32(kv_row)));
  w->Set(a + ".attention.value_length", GgufValue::U32(U32(kv_lora)));
  w->Set(a + ".attention.key_length_mla", GgufValue::U32(U32(qk_dim)));
  w->Set(a + ".attention.value_length_mla", GgufValue::U32(U32(vdim)));
  w->Set(a + ".attention.head_count_kv", GgufValue::U32(1));
  w->Set(a + ".rope.dimension_count", GgufValue::U32(U32(rope)));

  ASSIGN_OR_RETURN(int64_t n_dense, cfg.InRangeOr("first_k_dense_replace", 0, 0, c.n_layer));
  ASSIGN_OR_RETURN(int64_t n_expert, cfg.InRangeOr("n_routed_experts", 0, 0, kMaxDim));
  ASSIGN_OR_RETURN(int64_t moe_freq, cfg.InRangeOr("moe_layer_freq", 1, 1, kMaxDim));
  // Without routed experts every layer is dense; llama.cpp reads that from the leading dense count
  // (a layer past it must be MoE) and requires the two expert keys below even then, as its own
  // converter writes them for dense deepseek2 models (intermediate_size, 0 shared).
  w->Set(a + ".leading_dense_block_count", GgufValue::U32(U32(n_expert > 0 ? n_dense : c.n_layer)));
  int64_t moe_ff = 0, n_shared = 0;
  if (n_expert == 0) {
    w->Set(a + ".expert_feed_forward_length", GgufValue::U32(U32(c.n_ff)));
    w->Set(a + ".expert_shared_count", GgufValue::U32(0));
  }
  if (n_expert > 0) {
    ASSIGN_OR_RETURN(moe_ff, cfg.Positive("moe_intermediate_size"));
    ASSIGN_OR_RETURN(int64_t n_used, cfg.InRange("num_experts_per_tok", 1, n_expert));
    ASSIGN_OR_RETURN(n_shared, cfg.InRangeOr("n_shared_experts", 0, 0, kMaxDim));
    ASSIGN_OR_RETURN(double scale, cfg.FloatOr("routed_scaling_factor", 1.0));
    ASSIGN_OR_RETURN(bool norm, cfg.BoolOr("norm_topk_prob", false));
    ASSIGN_OR_RETURN(std::string scoring, cfg.StringOr("scoring_func", "softmax"));
    uint32_t gating = 0;
    if (scoring == "softmax") {
      gating = 1;
    } else if (scoring == "sigmoid") {
      gating = 2;
    } else {
      return Unimplemented(cfg.file() + ": scoring_func '" + scoring +
                           "' is not supported (softmax, sigmoid)");
    }
    w->Set(a + ".expert_feed_forward_length", GgufValue::U32(U32(moe_ff)));
    w->Set(a + ".expert_count", GgufValue::U32(U32(n_expert)));
    w->Set(a + ".expert_used_count", GgufValue::U32(U32(n_used)));
    w->Set(a + ".expert_shared_count", GgufValue::U32(U32(n_shared)));
    w->Set(a + ".expert_weights_scale", GgufValue::F32(static_cast<float>(scale)));
    w->Set(a + ".expert_weights_norm", GgufValue::Bool(norm));
    w->Set(a + ".expert_gating_func", GgufValue::U32(gating));
    if (cfg.Has("n_group")) {
      ASSIGN_OR_RETURN(int64_t g, cfg.InRange("n_group", 1, n_expert));
      w->Set(a + ".expert_group_count", GgufValue::U32(U32(g)));
    }
    if (cfg.Has("topk_group")) {
      ASSIGN_OR_RETURN(int64_t g, cfg.InRange("topk_group", 1, n_expert));
      w->Set(a + ".expert_group_used_count", GgufValue::U32(U32(g)));
    }
  }
  ASSIGN_OR_RETURN(bool use_nope, cfg.BoolOr("mla_use_nope", false));
  if (use_nope) w->Set(a + ".attention.mla_use_nope", GgufValue::Bool(true));
  const int64_t d = c.n_embd;
  ASSIGN_OR_RETURN(const int64_t q_rows, Dim(cfg.file(),
                                             "num_attention_heads x (qk_nope_head_dim + "
                                             "qk_rope_head_dim)",
                                             {c.n_head, qk_dim}));
  ASSIGN_OR_RETURN(const int64_t kvb_rows,
                   Dim(cfg.file(), "num_attention_heads x (qk_nope_head_dim + v_head_dim)",
                       {c.n_head, nope + vdim}));
  ASSIGN_OR_RETURN(const int64_t o_cols,
                   Dim(cfg.file(), "num_attention_heads x v_head_dim", {c.n_head, vdim}));
  int64_t sh_ff = 0;
  if (n_shared > 0) {
    ASSIGN_OR_RETURN(sh_ff, Dim(cfg.file(), "moe_intermediate_size x n_shared_experts",
                                {moe_ff, n_shared}));
  }
  // The rope dim sizes the llama3 rope factors: check it against a tensor that must exist first.
  RETURN_IF_ERROR(
      src->CheckShape(Hf(0) + "self_attn.kv_a_proj_with_mqa.weight", {kv_row, d}));
  RETURN_IF_ERROR(SetRopeScaling(cfg, c, w, em, rope));

  const MlaDims mla{d, c.n_head, q_lora, q_rows, kv_row, kv_lora, nope, vdim, kvb_rows, o_cols};
  const FfnDims ffn{d, c.n_ff, n_expert, moe_ff, n_shared > 0 ? sh_ff : 0};
  const MoeNames names{
      "mlp.gate", "mlp.experts.", {"gate_proj", "up_proj", "down_proj"}, "mlp.shared_experts."};
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string hf = Hf(l), gg = Blk(l);
    RETURN_IF_ERROR(Copy(src, em, hf + "input_layernorm.weight", gg + "attn_norm.weight", {d}));
    RETURN_IF_ERROR(ConvertMlaAttention(src, em, hf + "self_attn.", gg, mla));
    RETURN_IF_ERROR(
        Copy(src, em, hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", {d}));
    const bool moe = n_expert > 0 && l >= n_dense && l % moe_freq == 0;
    RETURN_IF_ERROR(ConvertFfn(src, em, hf, gg, moe, ffn, names));
  }
  return OkStatus();
}

// Reads `name` with whichever of `shapes` the checkpoint holds (layouts that differ only by
// size-1 axes); the error lists every accepted shape.
StatusOr<std::vector<float>> ReadAnyShape(TensorSource* src, const std::string& name,
                                          const std::vector<std::vector<int64_t>>& shapes) {
  for (const auto& s : shapes) {
    if (src->CheckShape(name, s).ok()) return src->Read(name, s);
  }
  std::string all;
  for (const auto& s : shapes) all += (all.empty() ? "" : " or ") + ShapeStr(s);
  RETURN_IF_ERROR(src->CheckShape(name, shapes.front()).WithContext("accepted shapes: " + all));
  return src->Read(name, shapes.front());
}

// KimiLinearForCausalLM ("kimi-linear"), as llama.cpp's converter lays it out: KDA layers and
// NoPE MLA layers marked by a per-layer attention.head_count_kv array (0 = KDA, 1 = MLA);
// ssm_a = -exp(A_log); conv weights as ggml ne [W, 1, C, 1]; kv_b split as for deepseek2;
// experts (w1 gate, w3 up, w2 down) stacked; the selection bias as exp_probs_b.bias.
Status ConvertKimiLinear(const Config& cfg, const Common& c, TensorSource* src, Emitter* em,
                         GgufWriter* w) {
  const std::string& a = c.arch_name;
  const std::string& file = cfg.file();
  const int64_t d = c.n_embd, L = c.n_layer;
  if (!cfg.Has("linear_attn_config") || !cfg.raw().at("linear_attn_config").is_object()) {
    return NotFound(file + ": missing required object \"linear_attn_config\"");
  }
  const Config la(cfg.raw().at("linear_attn_config"), file + " linear_attn_config");
  // kda_layers / full_attn_layers are 1-based layer numbers.
  auto layer_list = [&](const std::string& key, std::vector<uint8_t>* mark) -> Status {
    if (!la.Has(key)) return OkStatus();
    const json& v = la.raw().at(key);
    if (!v.is_array()) return InvalidArgument(la.file() + ": \"" + key + "\" must be an array");
    for (const json& e : v) {
      ASSIGN_OR_RETURN(int64_t n, la.IntOf(e, key));
      if (n < 1 || n > L) {
        return InvalidArgument(la.file() + ": \"" + key + "\" holds layer " + std::to_string(n) +
                               ", outside 1.." + std::to_string(L) + " (num_hidden_layers)");
      }
      (*mark)[n - 1] = 1;
    }
    return OkStatus();
  };
  std::vector<uint8_t> is_kda(L, 0), is_full(L, 0);
  RETURN_IF_ERROR(layer_list("kda_layers", &is_kda));
  RETURN_IF_ERROR(layer_list("full_attn_layers", &is_full));
  if (!la.Has("kda_layers")) {  // only the full-attention list: every other layer is KDA
    for (int64_t l = 0; l < L; ++l) is_kda[l] = !is_full[l];
  }
  for (int64_t l = 0; l < L; ++l) {
    if (is_kda[l] && is_full[l]) {
      return InvalidArgument(la.file() + ": layer " + std::to_string(l + 1) +
                             " is in both kda_layers and full_attn_layers");
    }
    if (la.Has("kda_layers") && la.Has("full_attn_layers") && !is_kda[l] && !is_full[l]) {
      return InvalidArgument(la.file() + ": layer " + std::to_string(l + 1) +
                             " is in neither kda_layers nor full_attn_layers");
    }
  }
  ASSIGN_OR_RETURN(const int64_t H, la.InRangeOr("num_heads", c.n_head, 1, kMaxDim));
  if (H != c.n_head) {
    return InvalidArgument(la.file() + ": \"num_heads\" = " + std::to_string(H) +
                           " differs from num_attention_heads = " + std::to_string(c.n_head) +
                           " (the GGUF layout has one head count for KDA and MLA)");
  }
  ASSIGN_OR_RETURN(const int64_t D, la.InRangeOr("head_dim", 128, 1, kMaxDim));
  ASSIGN_OR_RETURN(const int64_t W, la.InRangeOr("short_conv_kernel_size", 4, 1, 64));
  ASSIGN_OR_RETURN(const int64_t C, Dim(file, "linear_attn_config num_heads x head_dim", {H, D}));

  // MLA geometry (no q LoRA, NoPE).
  if (cfg.Has("q_lora_rank")) {
    return Unimplemented(file + ": \"q_lora_rank\" is set; kimi-linear has a single q_proj");
  }
  ASSIGN_OR_RETURN(const int64_t kv_lora, cfg.Positive("kv_lora_rank"));
  ASSIGN_OR_RETURN(const int64_t nope, cfg.Positive("qk_nope_head_dim"));
  ASSIGN_OR_RETURN(const int64_t rope, cfg.Positive("qk_rope_head_dim"));
  ASSIGN_OR_RETURN(const int64_t vdim, cfg.Positive("v_head_dim"));
  ASSIGN_OR_RETURN(const bool use_nope, cfg.BoolOr("mla_use_nope", true));
  if (!use_nope) {
    return Unimplemented(file + ": \"mla_use_nope\" = false (kimi-linear MLA layers are NoPE)");
  }
  ASSIGN_OR_RETURN(const int64_t kv_row, Dim(file, "kv_lora_rank + qk_rope_head_dim",
                                             {kv_lora + rope}));
  ASSIGN_OR_RETURN(const int64_t qk_dim, Dim(file, "qk_nope_head_dim + qk_rope_head_dim",
                                             {nope + rope}));
  ASSIGN_OR_RETURN(const int64_t q_rows, Dim(file, "num_attention_heads x qk head dim",
                                             {c.n_head, qk_dim}));
  ASSIGN_OR_RETURN(const int64_t kvb_rows, Dim(file, "num_attention_heads x (nope + v)",
                                               {c.n_head, nope + vdim}));
  ASSIGN_OR_RETURN(const int64_t o_cols, Dim(file, "num_attention_heads x v_head_dim",
                                             {c.n_head, vdim}));

  // MoE (both spellings of the keys: Kimi's config and the DeepSeek-style aliases).
  auto int_key = [&](const char* k1, const char* k2, int64_t def, int64_t lo,
                     int64_t hi) -> StatusOr<int64_t> {
    if (cfg.Has(k1)) return cfg.InRange(k1, lo, hi);
    return cfg.InRangeOr(k2, def, lo, hi);
  };
  ASSIGN_OR_RETURN(const int64_t n_expert, int_key("num_experts", "n_routed_experts", 0, 0,
                                                   kMaxDim));
  ASSIGN_OR_RETURN(const int64_t n_dense, cfg.InRangeOr("first_k_dense_replace", 0, 0, L));
  ASSIGN_OR_RETURN(const int64_t moe_freq, cfg.InRangeOr("moe_layer_freq", 1, 1, kMaxDim));
  int64_t moe_ff = 0, n_shared = 0, n_used = 0;
  double scale = 1.0;
  uint32_t gating = 2;
  if (n_expert > 0) {
    ASSIGN_OR_RETURN(moe_ff, cfg.Positive("moe_intermediate_size"));
    ASSIGN_OR_RETURN(n_used, int_key("num_experts_per_token", "num_experts_per_tok", -1, 1,
                                     n_expert));
    ASSIGN_OR_RETURN(n_shared, int_key("num_shared_experts", "n_shared_experts", 0, 0, kMaxDim));
    ASSIGN_OR_RETURN(scale, cfg.FloatOr("routed_scaling_factor", 1.0));
    std::string act;
    ASSIGN_OR_RETURN(act, cfg.StringOr("moe_router_activation_func", ""));
    if (act.empty()) {
      ASSIGN_OR_RETURN(act, cfg.StringOr("scoring_func", "sigmoid"));
    }
    if (act == "sigmoid") {
      gating = 2;
    } else if (act == "softmax") {
      gating = 1;
    } else {
      return Unimplemented(file + ": \"moe_router_activation_func\" '" + act +
                           "' (sigmoid, softmax)");
    }
    bool renorm = true;
    if (cfg.Has("moe_renormalize")) {
      ASSIGN_OR_RETURN(renorm, cfg.BoolOr("moe_renormalize", true));
    } else {
      ASSIGN_OR_RETURN(renorm, cfg.BoolOr("norm_topk_prob", true));
    }
    if (!renorm) {
      return Unimplemented(file + ": \"moe_renormalize\" = false (llama.cpp's kimi-linear "
                           "graph always renormalises the routed weights)");
    }
  }

  w->Set(a + ".context_length", GgufValue::U32(U32(c.n_ctx)));
  {
    std::vector<int32_t> kv(L);
    for (int64_t l = 0; l < L; ++l) kv[l] = is_kda[l] ? 0 : 1;
    w->Set(a + ".attention.head_count_kv", GgufValue::I32Array(kv));
  }
  w->Set(a + ".attention.key_length", GgufValue::U32(U32(kv_row)));
  ASSIGN_OR_RETURN(const int64_t head_dim, cfg.InRangeOr("head_dim", c.n_embd / c.n_head, 1,
                                                         kMaxDim));
  w->Set(a + ".attention.value_length", GgufValue::U32(U32(head_dim)));  // unused (llama.cpp)
  w->Set(a + ".attention.key_length_mla", GgufValue::U32(U32(qk_dim)));
  w->Set(a + ".attention.value_length_mla", GgufValue::U32(U32(vdim)));
  w->Set(a + ".attention.kv_lora_rank", GgufValue::U32(U32(kv_lora)));
  w->Set(a + ".rope.dimension_count", GgufValue::U32(U32(rope)));
  w->Set(a + ".ssm.conv_kernel", GgufValue::U32(U32(W)));
  w->Set(a + ".kda.head_dim", GgufValue::U32(U32(D)));
  w->Set(a + ".leading_dense_block_count", GgufValue::U32(U32(n_expert > 0 ? n_dense : L)));
  if (n_expert > 0) {
    w->Set(a + ".expert_count", GgufValue::U32(U32(n_expert)));
    w->Set(a + ".expert_used_count", GgufValue::U32(U32(n_used)));
    w->Set(a + ".expert_feed_forward_length", GgufValue::U32(U32(moe_ff)));
    w->Set(a + ".expert_shared_count", GgufValue::U32(U32(n_shared)));
    w->Set(a + ".expert_weights_scale", GgufValue::F32(static_cast<float>(scale)));
    w->Set(a + ".expert_gating_func", GgufValue::U32(gating));
  }

  const MlaDims mla{d, c.n_head, 0, q_rows, kv_row, kv_lora, nope, vdim, kvb_rows, o_cols};
  const MoeNames names{"block_sparse_moe.gate",
                       "block_sparse_moe.experts.",
                       {"w1", "w3", "w2"},
                       "block_sparse_moe.shared_experts."};
  for (int64_t l = 0; l < L; ++l) {
    const std::string hf = Hf(l), gg = Blk(l), at = hf + "self_attn.";
    RETURN_IF_ERROR(Copy(src, em, hf + "input_layernorm.weight", gg + "attn_norm.weight", {d}));
    if (is_kda[l]) {
      for (const char* x : {"q", "k", "v"}) {
        RETURN_IF_ERROR(Copy(src, em, at + x + "_proj.weight", gg + "attn_" + x + ".weight",
                             {C, d}));
        const std::string cn = at + x + "_conv1d.weight";
        ASSIGN_OR_RETURN(std::vector<float> cv, ReadAnyShape(src, cn, {{C, W}, {C, 1, W}}));
        RETURN_IF_ERROR(em->F32(gg + "ssm_conv1d_" + x + ".weight", {1, C, 1, W}, cv));
      }
      // The gate ranks are read from the checkpoint (head_dim in the released model).
      int64_t rf = 0, rg = 0;
      for (auto [name, r] : {std::pair<const char*, int64_t*>{"f_a_proj.weight", &rf},
                             std::pair<const char*, int64_t*>{"g_a_proj.weight", &rg}}) {
        const std::string n = at + name;
        if (!src->Has(n)) return NotFound("required tensor '" + n + "' is not in the checkpoint");
        ASSIGN_OR_RETURN(*r, src->Rows(n));
      }
      RETURN_IF_ERROR(Copy(src, em, at + "f_a_proj.weight", gg + "ssm_f_a.weight", {rf, d}));
      RETURN_IF_ERROR(Copy(src, em, at + "f_b_proj.weight", gg + "ssm_f_b.weight", {C, rf}));
      ASSIGN_OR_RETURN(std::vector<float> alog,
                       ReadAnyShape(src, at + "A_log", {{1, 1, H, 1}, {H, 1}, {H}}));
      for (float& v : alog) v = -std::exp(v);
      RETURN_IF_ERROR(em->F32(gg + "ssm_a", {1, 1, H, 1}, alog));
      ASSIGN_OR_RETURN(std::vector<float> dt, ReadAnyShape(src, at + "dt_bias", {{C}, {H, D}}));
      RETURN_IF_ERROR(em->F32(gg + "ssm_dt.bias", {C}, dt));
      RETURN_IF_ERROR(Copy(src, em, at + "b_proj.weight", gg + "ssm_beta.weight", {H, d}));
      RETURN_IF_ERROR(Copy(src, em, at + "g_a_proj.weight", gg + "ssm_g_a.weight", {rg, d}));
      RETURN_IF_ERROR(Copy(src, em, at + "g_b_proj.weight", gg + "ssm_g_b.weight", {C, rg}));
      RETURN_IF_ERROR(Copy(src, em, at + "o_norm.weight", gg + "ssm_norm.weight", {D}));
      RETURN_IF_ERROR(Copy(src, em, at + "o_proj.weight", gg + "attn_output.weight", {d, C}));
    } else {
      RETURN_IF_ERROR(ConvertMlaAttention(src, em, at, gg, mla));
    }
    RETURN_IF_ERROR(
        Copy(src, em, hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", {d}));
    const bool moe = n_expert > 0 && l >= n_dense && l % moe_freq == 0;
    FfnDims ffn{d, c.n_ff, n_expert, moe_ff, 0};
    if (moe && n_shared > 0) {
      ASSIGN_OR_RETURN(ffn.sh_ff,
                       Dim(file, "moe_intermediate_size x num_shared_experts", {moe_ff, n_shared}));
    }
    RETURN_IF_ERROR(ConvertFfn(src, em, hf, gg, moe, ffn, names));
  }
  return OkStatus();
}

// Tensors a checkpoint may carry that the engine does not need.
bool Skippable(const std::string& name, int64_t n_layer) {
  if (name.find("rotary_emb.inv_freq") != std::string::npos) return true;
  // Layers beyond num_hidden_layers (DeepSeek's multi-token-prediction layers).
  const std::string pre = "model.layers.";
  if (name.compare(0, pre.size(), pre) == 0) {
    const size_t dot = name.find('.', pre.size());
    const std::string idx = name.substr(pre.size(), dot - pre.size());
    if (!idx.empty() && std::all_of(idx.begin(), idx.end(), ::isdigit) && idx.size() < 10 &&
        std::stoll(idx) >= n_layer) {
      return true;
    }
  }
  return false;
}

uint32_t FileType(DType t) {
  switch (t) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kQ8_0:
      return 7;
    case DType::kBF16:
      return 32;
    default:
      return 1;
  }
}

}  // namespace

StatusOr<GgufWriter> ConvertHfDirectory(const std::string& dir, const HfConvertOptions& opts) {
  namespace fs = std::filesystem;
  const DType out = opts.out_dtype;
  if (out != DType::kF32 && out != DType::kF16 && out != DType::kBF16 && out != DType::kQ8_0) {
    return InvalidArgument("out_dtype " + std::string(DTypeName(out)) +
                           " is not supported; use F32, F16, BF16 or Q8_0");
  }
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(cfg_path)) return NotFound(cfg_path + ": no config.json in " + dir);
  ASSIGN_OR_RETURN(json cj, ReadJsonFile(cfg_path));
  const Config cfg(std::move(cj), cfg_path);

  std::string hf_arch;
  {
    const json& j = cfg.raw();
    auto it = j.find("architectures");
    if (it == j.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) {
      return InvalidArgument(cfg_path + ": \"architectures\" must be a non-empty array of names");
    }
    hf_arch = (*it)[0].get<std::string>();
  }
  Common c{};
  if (hf_arch == "LlamaForCausalLM") {
    c.arch = Arch::kLlama;
    c.arch_name = "llama";
  } else if (hf_arch == "Qwen2ForCausalLM") {
    c.arch = Arch::kQwen2;
    c.arch_name = "qwen2";
  } else if (hf_arch == "DeepseekV2ForCausalLM") {
    c.arch = Arch::kDeepseek2;
    c.arch_name = "deepseek2";
  } else if (hf_arch == "KimiLinearForCausalLM") {
    c.arch = Arch::kKimiLinear;
    c.arch_name = "kimi-linear";
  } else if (hf_arch == "Gemma3ForCausalLM") {
    c.arch = Arch::kGemma3;
    c.arch_name = "gemma3";
  } else {
    return Unimplemented(cfg_path + ": architecture '" + hf_arch + "' is not supported " +
                         "(LlamaForCausalLM, Qwen2ForCausalLM, DeepseekV2ForCausalLM, "
                         "KimiLinearForCausalLM, Gemma3ForCausalLM)");
  }
  ASSIGN_OR_RETURN(c.n_layer, cfg.Positive("num_hidden_layers"));
  ASSIGN_OR_RETURN(c.n_embd, cfg.Positive("hidden_size"));
  ASSIGN_OR_RETURN(c.n_ff, cfg.Positive("intermediate_size"));
  ASSIGN_OR_RETURN(c.n_head, cfg.Positive("num_attention_heads"));
  ASSIGN_OR_RETURN(c.n_head_kv, cfg.InRangeOr("num_key_value_heads", c.n_head, 1, kMaxDim));
  ASSIGN_OR_RETURN(c.n_vocab, cfg.Positive("vocab_size"));
  if (c.arch == Arch::kKimiLinear && !cfg.Has("max_position_embeddings")) {
    ASSIGN_OR_RETURN(c.n_ctx, cfg.Positive("model_max_length"));  // Kimi's config.json
  } else {
    ASSIGN_OR_RETURN(c.n_ctx, cfg.Positive("max_position_embeddings"));
  }
  ASSIGN_OR_RETURN(double eps, cfg.Float("rms_norm_eps"));
  ASSIGN_OR_RETURN(double theta,
                   cfg.FloatOr("rope_theta", c.arch == Arch::kGemma3 ? 1000000.0 : 10000.0));
  // Gemma ties its output to the embeddings unless the config says otherwise.
  ASSIGN_OR_RETURN(c.tied, cfg.BoolOr("tie_word_embeddings", c.arch == Arch::kGemma3));
  if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0) {
    return InvalidArgument(cfg_path + ": num_key_value_heads " + std::to_string(c.n_head_kv) +
                           " must be > 0 and divide num_attention_heads " +
                           std::to_string(c.n_head));
  }
  std::string name = fs::path(dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(dir).lexically_normal().parent_path().filename().string();
  ASSIGN_OR_RETURN(std::string name_or_path, cfg.StringOr("_name_or_path", ""));
  if (!name_or_path.empty()) name = fs::path(name_or_path).filename().string();

  ASSIGN_OR_RETURN(TensorSource src, TensorSource::Open(dir));

  GgufWriter w;
  Emitter em(&w, out);
  const std::string& a = c.arch_name;
  w.Set("general.architecture", GgufValue::String(a));
  w.Set("general.name", GgufValue::String(name));
  w.Set("general.file_type", GgufValue::U32(FileType(out)));
  w.Set(a + ".vocab_size", GgufValue::U32(U32(c.n_vocab)));
  w.Set(a + ".context_length", GgufValue::U32(U32(c.n_ctx)));
  w.Set(a + ".embedding_length", GgufValue::U32(U32(c.n_embd)));
  w.Set(a + ".block_count", GgufValue::U32(U32(c.n_layer)));
  w.Set(a + ".feed_forward_length", GgufValue::U32(U32(c.n_ff)));
  w.Set(a + ".attention.head_count", GgufValue::U32(U32(c.n_head)));
  w.Set(a + ".attention.head_count_kv", GgufValue::U32(U32(c.n_head_kv)));
  w.Set(a + ".attention.layer_norm_rms_epsilon", GgufValue::F32(static_cast<float>(eps)));
  w.Set(a + ".rope.freq_base", GgufValue::F32(static_cast<float>(theta)));

  RETURN_IF_ERROR(
      Copy(&src, &em, "model.embed_tokens.weight", "token_embd.weight", {c.n_vocab, c.n_embd}));
  if (c.arch == Arch::kDeepseek2) {
    RETURN_IF_ERROR(ConvertDeepseek2(cfg, c, &src, &em, &w));
  } else if (c.arch == Arch::kKimiLinear) {
    RETURN_IF_ERROR(ConvertKimiLinear(cfg, c, &src, &em, &w));
  } else if (c.arch == Arch::kGemma3) {
    RETURN_IF_ERROR(ConvertGemma3(cfg, c, &src, &em, &w));
  } else {
    RETURN_IF_ERROR(ConvertLlamaLike(cfg, c, &src, &em, &w));
  }
  if (c.arch == Arch::kGemma3) {  // 1 + w, as every Gemma norm
    ASSIGN_OR_RETURN(std::vector<float> v, src.Read("model.norm.weight", {c.n_embd}));
    for (float& x : v) x += 1.f;
    RETURN_IF_ERROR(em.F32("output_norm.weight", {c.n_embd}, v));
  } else {
    RETURN_IF_ERROR(Copy(&src, &em, "model.norm.weight", "output_norm.weight", {c.n_embd}));
  }
  if (!c.tied) {
    RETURN_IF_ERROR(Copy(&src, &em, "lm_head.weight", "output.weight", {c.n_vocab, c.n_embd}));
  } else if (src.Has("lm_head.weight")) {
    // Tied: llama.cpp drops the duplicate; so do we (the engine reads token_embd for the output).
    ASSIGN_OR_RETURN(std::vector<float> unused, src.Read("lm_head.weight", {c.n_vocab, c.n_embd}));
    (void)unused;
  }
  for (const std::string& t : src.Unused()) {
    if (!Skippable(t, c.n_layer)) {
      return Unimplemented(dir + ": HF tensor '" + t + "' has no " + a +
                           " mapping (refusing to drop a weight silently)");
    }
  }
  return w;
}

}  // namespace strata
