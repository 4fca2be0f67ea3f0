#include "io/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "core/check.h"
#include "core/quant.h"

namespace strata {

static_assert(std::endian::native == std::endian::little, "GGUF I/O assumes a little-endian host");

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
// Caps on counts a file may claim, far above any real model (a 256k vocabulary has ~1M metadata
// values), so a hostile header cannot make us allocate gigabytes before reading a byte of payload.
// Every count is also checked against the bytes left before anything is allocated for it, and
// what is allocated is a small multiple of those bytes: array numbers are packed (1x), a string
// costs 32 bytes + its text for >= 8 + its text in the file (<= 4x), a nested array ~140 bytes for
// >= 12 (<= 12x, and capped separately since real files have none).
constexpr uint64_t kMaxCount = uint64_t{1} << 30;         // any single count or length
constexpr uint64_t kMaxTotalValues = uint64_t{1} << 25;   // scalars, strings, string elements
constexpr uint64_t kMaxNestedArrays = uint64_t{1} << 16;  // arrays inside arrays, whole file
// Bytes of array elements (numbers, bools, string texts) in the whole file: real files hold a few
// MB (a 256k vocabulary's tokens, scores and types: ~10 MB), so a file claiming more is refused
// before the allocation (a 1 GiB u8 array in a sparse file would otherwise cost 1 GiB).
constexpr uint64_t kMaxArrayBytes = uint64_t{256} << 20;
constexpr uint64_t kMaxAlignment = uint64_t{1} << 30;

bool IsPow2(uint64_t a) { return a != 0 && (a & (a - 1)) == 0; }
uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

bool IsValidValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kF64); }

// Smallest encoding of one value of type t (used to bound claimed counts by the bytes left).
uint64_t MinValueBytes(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 1;
}

bool IsIntegerType(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

bool IsUnsignedType(GgufType t) {
  return t == GgufType::kU8 || t == GgufType::kU16 || t == GgufType::kU32 || t == GgufType::kU64 ||
         t == GgufType::kBool;
}

bool IsFloatType(GgufType t) { return t == GgufType::kF32 || t == GgufType::kF64; }

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// Bounds-checked little-endian cursor over the file image. Every read checks the bytes left first.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& path)
      : base_(base), size_(size), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  std::string FileSuffix() const { return " (file " + path_ + ")"; }

  Status Error(StatusCode code, const std::string& msg) const {
    return Status(code, msg + FileSuffix());
  }
  Status Truncated(const std::string& what, uint64_t need) const {
    return DataLoss("truncated: " + what + " needs " + std::to_string(need) + " bytes at offset " +
                    std::to_string(pos_) + " but only " + std::to_string(left()) + " remain" +
                    FileSuffix());
  }

  template <typename T>
  Status Read(T* out, const std::string& what) {
    if (left() < sizeof(T)) return Truncated(what, sizeof(T));
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return OkStatus();
  }

  Status ReadBytes(void* out, uint64_t n, const std::string& what) {
    if (left() < n) return Truncated(what, n);
    if (n != 0) std::memcpy(out, base_ + pos_, n);
    pos_ += n;
    return OkStatus();
  }

  Status ReadString(std::string* out, const std::string& what) {
    uint64_t len = 0;
    RETURN_IF_ERROR(Read(&len, "length of " + what));
    if (len > kMaxCount) {
      return Error(StatusCode::kOutOfRange, "absurd string length " + std::to_string(len) +
                                                " for " + what + " at offset " +
                                                std::to_string(pos_ - 8));
    }
    if (len > left())
      return Truncated(what + " (string of length " + std::to_string(len) + ")", len);
    out->assign(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return OkStatus();
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& path_;
};

// Bytes of one number or bool in the file (and in GgufValue::packed); 0 for strings and arrays.
uint64_t ScalarBytes(GgufType t) {
  return t == GgufType::kString || t == GgufType::kArray ? 0 : MinValueBytes(t);
}

struct ValueParser {
  Cursor& cur;
  const std::string& key;
  uint64_t& total_values;
  uint64_t& nested_arrays;
  uint64_t& array_bytes;
  const std::string what = "value of key " + Quote(key);  // built once per key, not per element

  // Counts n more values against the file's cap, before anything is allocated for them.
  Status Count(uint64_t n) {
    total_values += n;
    if (total_values > kMaxTotalValues) {
      return cur.Error(StatusCode::kOutOfRange, "more than " + std::to_string(kMaxTotalValues) +
                                                    " metadata values (at key " + Quote(key) + ")");
    }
    return OkStatus();
  }

  // Counts n more bytes of array elements against the file's cap, before they are allocated.
  Status CountBytes(uint64_t n) {
    array_bytes += n;
    if (array_bytes > kMaxArrayBytes) {
      return cur.Error(StatusCode::kOutOfRange,
                       "metadata arrays hold more than " + std::to_string(kMaxArrayBytes >> 20) +
                           " MiB (at key " + Quote(key) + ")");
    }
    return OkStatus();
  }

  // Reads one value whose type is already known.
  Status Parse(GgufType type, int depth, GgufValue* v) {
    RETURN_IF_ERROR(Count(1));
    return Payload(type, depth, v);
  }

  Status Payload(GgufType type, int depth, GgufValue* v) {
    v->type = type;
    switch (type) {
      case GgufType::kU8: {
        uint8_t x = 0;
        RETURN_IF_ERROR(cur.Read(&x, what));
        v->u = x;
        break;
      }
      case GgufType::kI8: {
        int8_t x = 0;
        RETURN_IF_ERROR(cur.Read(&x, what));
        v->i = x;
        break;
      }
      case GgufType::kU16: {
        uint16_t x = 0;
        RETURN_IF_ERROR(cur.Read(&x, what));
        v->u = x;
        break;
      }
      case GgufType::kI16: {
        int16_t x = 0;
        RETURN_IF_ERROR(cur.Read(&x, what));
        v->i = x;
        break;
      }
      case GgufType::kU32: {
        uint32_t x = 0;
        RETURN_IF_ERROR(cur.Read(&x, what));
        v->u = x;
        break;
      }
      case GgufType::kI32: {
        int32_t x = 0;
        RETURN_IF_ERROR(cur.Read(&x, what));
        v->i = x;
        break;
      }
      case GgufType::kU64: {
        uint64_t x = 0;
        RETURN_IF_ERROR(cur.Read(&x, what));
        v->u = x;
        break;
      }
      case GgufType::kI64: {
        int64_t x = 0;
        RETURN_IF_ERROR(cur.Read(&x, what));
        v->i = x;
        break;
      }
      case GgufType::kF32: {
        float x = 0;
        RETURN_IF_ERROR(cur.Read(&x, what));
        v->f = x;
        break;
      }
      case GgufType::kF64: {
        double x = 0;
        RETURN_IF_ERROR(cur.Read(&x, what));
        v->f = x;
        break;
      }
      case GgufType::kBool: {
        uint8_t x = 0;
        RETURN_IF_ERROR(cur.Read(&x, what));
        if (x > 1) {
          return cur.Error(StatusCode::kDataLoss, "bool value " + std::to_string(x) + " of key " +
                                                      Quote(key) + " is neither 0 nor 1");
        }
        v->u = x;
        break;
      }
      case GgufType::kString:
        RETURN_IF_ERROR(cur.ReadString(&v->s, what));
        break;
      case GgufType::kArray:
        RETURN_IF_ERROR(Array(depth, v));
        break;
    }
    return OkStatus();
  }

  Status Array(int depth, GgufValue* v) {
    if (depth >= GgufFile::kMaxArrayDepth) {
      return cur.Error(StatusCode::kOutOfRange, "arrays nested deeper than " +
                                                    std::to_string(GgufFile::kMaxArrayDepth) +
                                                    " in key " + Quote(key));
    }
    uint32_t et = 0;
    RETURN_IF_ERROR(cur.Read(&et, "array element type of key " + Quote(key)));
    if (!IsValidValueType(et)) {
      return cur.Error(StatusCode::kDataLoss, "unknown array element type " + std::to_string(et) +
                                                  " in key " + Quote(key));
    }
    const GgufType t = static_cast<GgufType>(et);
    v->array_type = t;
    uint64_t n = 0;
    RETURN_IF_ERROR(cur.Read(&n, "array length of key " + Quote(key)));
    if (n > kMaxCount) {
      return cur.Error(StatusCode::kOutOfRange,
                       "absurd array length " + std::to_string(n) + " in key " + Quote(key));
    }
    const uint64_t min_bytes = n * MinValueBytes(t);
    if (min_bytes > cur.left()) {
      return cur.Truncated("array of " + std::to_string(n) + " " + GgufTypeName(t) + " in key " +
                               Quote(key),
                           min_bytes);
    }
    if (const uint64_t w = ScalarBytes(t)) {
      RETURN_IF_ERROR(CountBytes(n * w));
      // Numbers and bools: the file's bytes, as they are.
      v->packed.resize(n * w);
      RETURN_IF_ERROR(cur.ReadBytes(v->packed.data(), n * w, what));
      if (t == GgufType::kBool) {
        for (uint64_t j = 0; j < n; ++j) {
          if (v->packed[j] > 1) {
            return cur.Error(StatusCode::kDataLoss, "bool element " + std::to_string(j) + " = " +
                                                        std::to_string(v->packed[j]) + " of key " +
                                                        Quote(key) + " is neither 0 nor 1");
          }
        }
      }
    } else if (t == GgufType::kString) {
      RETURN_IF_ERROR(Count(n));
      v->strings.resize(n);
      for (uint64_t j = 0; j < n; ++j) {
        RETURN_IF_ERROR(cur.ReadString(&v->strings[j], what));
        RETURN_IF_ERROR(CountBytes(v->strings[j].size()));
      }
    } else {
      nested_arrays += n;
      if (nested_arrays > kMaxNestedArrays) {
        return cur.Error(StatusCode::kOutOfRange,
                         "more than " + std::to_string(kMaxNestedArrays) +
                             " arrays inside arrays (at key " + Quote(key) + ")");
      }
      v->array.resize(n);
      for (uint64_t j = 0; j < n; ++j) {
        RETURN_IF_ERROR(Payload(GgufType::kArray, depth + 1, &v->array[j]));
      }
    }
    return OkStatus();
  }
};

// Serialisation helpers.
template <typename T>
void Put(std::vector<uint8_t>* out, T x) {
  const size_t n = out->size();
  out->resize(n + sizeof(T));
  std::memcpy(out->data() + n, &x, sizeof(T));
}

void PutString(std::vector<uint8_t>* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}

void PutPayload(std::vector<uint8_t>* out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::kU8:
      Put<uint8_t>(out, static_cast<uint8_t>(v.u));
      break;
    case GgufType::kI8:
      Put<int8_t>(out, static_cast<int8_t>(v.i));
      break;
    case GgufType::kU16:
      Put<uint16_t>(out, static_cast<uint16_t>(v.u));
      break;
    case GgufType::kI16:
      Put<int16_t>(out, static_cast<int16_t>(v.i));
      break;
    case GgufType::kU32:
      Put<uint32_t>(out, static_cast<uint32_t>(v.u));
      break;
    case GgufType::kI32:
      Put<int32_t>(out, static_cast<int32_t>(v.i));
      break;
    case GgufType::kU64:
      Put<uint64_t>(out, v.u);
      break;
    case GgufType::kI64:
      Put<int64_t>(out, v.i);
      break;
    case GgufType::kF32:
      Put<float>(out, static_cast<float>(v.f));
      break;
    case GgufType::kF64:
      Put<double>(out, v.f);
      break;
    case GgufType::kBool:
      Put<uint8_t>(out, v.u ? 1 : 0);
      break;
    case GgufType::kString:
      PutString(out, v.s);
      break;
    case GgufType::kArray:
      Put<uint32_t>(out, static_cast<uint32_t>(v.array_type));
      Put<uint64_t>(out, v.size());
      if (ScalarBytes(v.array_type) != 0) {
        out->insert(out->end(), v.packed.begin(), v.packed.end());
      } else if (v.array_type == GgufType::kString) {
        for (const std::string& e : v.strings) PutString(out, e);
      } else {
        for (const GgufValue& e : v.array) PutPayload(out, e);
      }
      break;
  }
}

// numel of a torch-order shape, or -1 when a dim is <= 0 or the product overflows the cap.
int64_t CheckedNumel(const std::vector<int64_t>& shape, int64_t cap) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d <= 0) return -1;
    if (n > cap / d) return -1;
    n *= d;
  }
  return n;
}

std::string ShapeStr(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// GgufValue

const char* GgufTypeName(GgufType t) {
  switch (t) {
    case GgufType::kU8:
      return "u8";
    case GgufType::kI8:
      return "i8";
    case GgufType::kU16:
      return "u16";
    case GgufType::kI16:
      return "i16";
    case GgufType::kU32:
      return "u32";
    case GgufType::kI32:
      return "i32";
    case GgufType::kF32:
      return "f32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kU64:
      return "u64";
    case GgufType::kI64:
      return "i64";
    case GgufType::kF64:
      return "f64";
  }
  return "unknown";
}

namespace {
GgufValue MakeU(GgufType t, uint64_t x) {
  GgufValue v;
  v.type = t;
  v.u = x;
  return v;
}
GgufValue MakeI(GgufType t, int64_t x) {
  GgufValue v;
  v.type = t;
  v.i = x;
  return v;
}
GgufValue MakeF(GgufType t, double x) {
  GgufValue v;
  v.type = t;
  v.f = x;
  return v;
}
}  // namespace

GgufValue GgufValue::U8(uint8_t v) { return MakeU(GgufType::kU8, v); }
GgufValue GgufValue::I8(int8_t v) { return MakeI(GgufType::kI8, v); }
GgufValue GgufValue::U16(uint16_t v) { return MakeU(GgufType::kU16, v); }
GgufValue GgufValue::I16(int16_t v) { return MakeI(GgufType::kI16, v); }
GgufValue GgufValue::U32(uint32_t v) { return MakeU(GgufType::kU32, v); }
GgufValue GgufValue::I32(int32_t v) { return MakeI(GgufType::kI32, v); }
GgufValue GgufValue::U64(uint64_t v) { return MakeU(GgufType::kU64, v); }
GgufValue GgufValue::I64(int64_t v) { return MakeI(GgufType::kI64, v); }
GgufValue GgufValue::F32(float v) { return MakeF(GgufType::kF32, v); }
GgufValue GgufValue::F64(double v) { return MakeF(GgufType::kF64, v); }
GgufValue GgufValue::Bool(bool v) { return MakeU(GgufType::kBool, v ? 1 : 0); }

GgufValue GgufValue::String(std::string s) {
  GgufValue v;
  v.type = GgufType::kString;
  v.s = std::move(s);
  return v;
}

GgufValue GgufValue::Array(GgufType elem, std::vector<GgufValue> elems) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.array_type = elem;
  for (GgufValue& e : elems) {
    STRATA_CHECK_MSG(e.type == elem, "GgufValue::Array of %s given a %s element",
                     GgufTypeName(elem), GgufTypeName(e.type));
    if (ScalarBytes(elem) != 0) {
      PutPayload(&v.packed, e);
    } else if (elem == GgufType::kString) {
      v.strings.push_back(std::move(e.s));
    } else {
      v.array.push_back(std::move(e));
    }
  }
  return v;
}

GgufValue GgufValue::StringArray(const std::vector<std::string>& xs) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.array_type = GgufType::kString;
  v.strings = xs;
  return v;
}

GgufValue GgufValue::F32Array(const std::vector<float>& xs) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.array_type = GgufType::kF32;
  v.packed.resize(xs.size() * sizeof(float));
  if (!xs.empty()) std::memcpy(v.packed.data(), xs.data(), v.packed.size());
  return v;
}

GgufValue GgufValue::I32Array(const std::vector<int32_t>& xs) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.array_type = GgufType::kI32;
  v.packed.resize(xs.size() * sizeof(int32_t));
  if (!xs.empty()) std::memcpy(v.packed.data(), xs.data(), v.packed.size());
  return v;
}

size_t GgufValue::size() const {
  if (type != GgufType::kArray) return 0;
  if (const uint64_t w = ScalarBytes(array_type)) return packed.size() / w;
  return array_type == GgufType::kString ? strings.size() : array.size();
}

GgufValue GgufValue::at(size_t j) const {
  STRATA_CHECK_MSG(j < size(), "GGUF array element %zu of %zu", j, size());
  if (array_type == GgufType::kString) return String(strings[j]);
  if (array_type == GgufType::kArray) return array[j];
  const uint8_t* p = packed.data() + j * ScalarBytes(array_type);
  auto get = [p](auto x) {
    std::memcpy(&x, p, sizeof(x));
    return x;
  };
  switch (array_type) {
    case GgufType::kU8: return U8(get(uint8_t{}));
    case GgufType::kI8: return I8(get(int8_t{}));
    case GgufType::kU16: return U16(get(uint16_t{}));
    case GgufType::kI16: return I16(get(int16_t{}));
    case GgufType::kU32: return U32(get(uint32_t{}));
    case GgufType::kI32: return I32(get(int32_t{}));
    case GgufType::kU64: return U64(get(uint64_t{}));
    case GgufType::kI64: return I64(get(int64_t{}));
    case GgufType::kF32: return F32(get(float{}));
    case GgufType::kF64: return F64(get(double{}));
    case GgufType::kBool: return Bool(get(uint8_t{}) != 0);
    default: break;
  }
  STRATA_CHECK_MSG(false, "GGUF array of %s", GgufTypeName(array_type));
  return {};
}

bool GgufValue::IsInteger() const { return IsIntegerType(type); }

int64_t GgufValue::AsInt() const {
  if (IsUnsignedType(type)) return static_cast<int64_t>(u);
  if (IsIntegerType(type)) return i;
  if (IsFloatType(type)) {
    if (std::isnan(f)) return 0;
    if (f >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
    if (f <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(f);
  }
  return 0;
}

double GgufValue::AsDouble() const {
  if (IsUnsignedType(type)) return static_cast<double>(u);
  if (IsIntegerType(type)) return static_cast<double>(i);
  if (IsFloatType(type)) return f;
  return 0;
}

std::string GgufValue::DebugString() const {
  switch (type) {
    case GgufType::kBool:
      return u ? "true" : "false";
    case GgufType::kString: {
      if (s.size() > 60) return "\"" + s.substr(0, 60) + "\"...";
      return "\"" + s + "\"";
    }
    case GgufType::kF32:
    case GgufType::kF64: {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.9g", f);
      return buf;
    }
    case GgufType::kArray: {
      const size_t n = size();
      std::string s = std::string("[") + GgufTypeName(array_type) + " x " + std::to_string(n) + ":";
      const size_t shown = n < 4 ? n : 4;
      for (size_t j = 0; j < shown; ++j) s += (j ? ", " : " ") + at(j).DebugString();
      if (shown < n) s += ", ...";
      return s + "]";
    }
    default:
      return IsUnsignedType(type) ? std::to_string(u) : std::to_string(i);
  }
}

// ---------------------------------------------------------------------------------------------
// GgufFile

GgufFile::~GgufFile() {
  if (map_ != nullptr) munmap(map_, size_);
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path, Load load) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string msg = "cannot open GGUF file " + path + ": " + std::strerror(e);
    return e == ENOENT ? NotFound(msg) : IoError(msg);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return IoError("cannot stat " + path + ": " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return IoError("not a regular file: " + path);
  }
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0 && load == Load::kMemory) {
    auto region = HugeRegion::Allocate(f->size_);
    if (!region.ok()) {
      ::close(fd);
      return region.status().WithContext("cannot load " + path + " into memory");
    }
    f->memory_ = std::move(region).value();
    uint64_t done = 0;
    while (done < f->size_) {
      const ssize_t got = ::pread(fd, f->memory_.data() + done,
                                  std::min<uint64_t>(f->size_ - done, uint64_t{1} << 30),
                                  static_cast<off_t>(done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        const int e = got < 0 ? errno : 0;
        ::close(fd);
        return IoError("cannot read " + path + " at byte " + std::to_string(done) + " of " +
                       std::to_string(f->size_) + ": " +
                       (got < 0 ? std::strerror(e) : "unexpected end of file"));
      }
      done += static_cast<uint64_t>(got);
    }
    f->base_ = f->memory_.data();
  } else if (f->size_ > 0) {
    void* m = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return IoError("cannot mmap " + path + " (" + std::to_string(f->size_) +
                     " bytes): " + std::strerror(e));
    }
    f->map_ = m;
    f->base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);  // the mapping stays valid
  RETURN_IF_ERROR(f->Parse());
  return f;
}

StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(std::vector<uint8_t> bytes,
                                                         std::string name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(name);
  f->owned_ = std::move(bytes);
  f->base_ = f->owned_.data();
  f->size_ = f->owned_.size();
  RETURN_IF_ERROR(f->Parse());
  return f;
}

Status GgufFile::Parse() {
  Cursor cur(base_, size_, path_);
  if (size_ == 0) return DataLoss("empty file, not a GGUF file" + cur.FileSuffix());
  if (size_ < 4) {
    return DataLoss("not a GGUF file (only " + std::to_string(size_) + " bytes)" +
                    cur.FileSuffix());
  }
  uint32_t magic = 0;
  RETURN_IF_ERROR(cur.Read(&magic, "magic"));
  if (magic != kGgufMagic) {
    char buf[96];
    std::snprintf(buf, sizeof(buf),
                  "not a GGUF file (bad magic 0x%02x%02x%02x%02x, expected 'GGUF')", base_[0],
                  base_[1], base_[2], base_[3]);
    return DataLoss(buf + cur.FileSuffix());
  }
  RETURN_IF_ERROR(cur.Read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    std::string msg = "unsupported GGUF version " + std::to_string(version_) +
                      " (only versions 2 and 3 are supported";
    if (version_ == 1) msg += "; version 1 used 32-bit counts";
    if (__builtin_bswap32(version_) == 2 || __builtin_bswap32(version_) == 3)
      msg += "; big-endian file?";
    return Unimplemented(msg + ")" + cur.FileSuffix());
  }
  uint64_t n_tensors = 0, n_kv = 0;
  RETURN_IF_ERROR(cur.Read(&n_tensors, "tensor count"));
  RETURN_IF_ERROR(cur.Read(&n_kv, "metadata count"));
  if (n_tensors > kMaxCount) {
    return cur.Error(StatusCode::kOutOfRange, "absurd tensor count " + std::to_string(n_tensors));
  }
  if (n_kv > kMaxCount) {
    return cur.Error(StatusCode::kOutOfRange, "absurd metadata count " + std::to_string(n_kv));
  }
  // Each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at
  // least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
  if (n_kv * 13 + n_tensors * 24 > cur.left()) {
    return cur.Truncated(std::to_string(n_kv) + " metadata entries and " +
                             std::to_string(n_tensors) + " tensor infos",
                         n_kv * 13 + n_tensors * 24);
  }

  // Metadata.
  uint64_t total_values = 0, nested_arrays = 0, array_bytes = 0;
  kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    RETURN_IF_ERROR(cur.ReadString(&key, "key of metadata entry " + std::to_string(k)));
    if (kv_index_.count(key)) {
      return cur.Error(StatusCode::kDataLoss, "duplicate metadata key " + Quote(key));
    }
    uint32_t type = 0;
    RETURN_IF_ERROR(cur.Read(&type, "value type of key " + Quote(key)));
    if (!IsValidValueType(type)) {
      return cur.Error(StatusCode::kDataLoss,
                       "unknown value type " + std::to_string(type) + " of key " + Quote(key));
    }
    GgufValue v;
    ValueParser vp{cur, key, total_values, nested_arrays, array_bytes};  // NOLINT
    RETURN_IF_ERROR(vp.Parse(static_cast<GgufType>(type), 0, &v));
    kv_index_[key] = kv_.size();
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const GgufValue* a = Find("general.alignment")) {
    if (!a->IsInteger()) {
      return cur.Error(StatusCode::kDataLoss, std::string("general.alignment has type ") +
                                                  GgufTypeName(a->type) + ", expected u32");
    }
    const int64_t av = a->AsInt();
    if (av <= 0 || !IsPow2(static_cast<uint64_t>(av)) ||
        static_cast<uint64_t>(av) > kMaxAlignment) {
      return cur.Error(StatusCode::kOutOfRange, "general.alignment " + a->DebugString() +
                                                    " is not a power of two in [1, 2^30]");
    }
    alignment_ = static_cast<uint64_t>(av);
  } else {
    alignment_ = kDefaultAlignment;
  }

  // Tensor infos.
  tensors_.reserve(n_tensors);
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensorInfo info;
    RETURN_IF_ERROR(cur.ReadString(&info.name, "name of tensor " + std::to_string(t)));
    if (tensor_index_.count(info.name)) {
      return cur.Error(StatusCode::kDataLoss, "duplicate tensor name " + Quote(info.name));
    }
    const std::string tn = "tensor " + Quote(info.name);
    uint32_t n_dims = 0;
    RETURN_IF_ERROR(cur.Read(&n_dims, "n_dims of " + tn));
    if (n_dims > static_cast<uint32_t>(kMaxDims)) {
      return cur.Error(StatusCode::kOutOfRange, "n_dims " + std::to_string(n_dims) + " of " + tn +
                                                    " exceeds " + std::to_string(kMaxDims));
    }
    int64_t ne[kMaxDims] = {1, 1, 1, 1};
    for (uint32_t d = 0; d < n_dims; ++d) {
      RETURN_IF_ERROR(cur.Read(&ne[d], "dimension " + std::to_string(d) + " of " + tn));
    }
    uint32_t ggml_type = 0;
    RETURN_IF_ERROR(cur.Read(&ggml_type, "type of " + tn));
    RETURN_IF_ERROR(cur.Read(&info.offset, "data offset of " + tn));
    if (!IsSupportedDType(ggml_type)) {
      return Unimplemented("unsupported tensor type " + GgmlTypeName(ggml_type) + " in tensor " +
                           info.name + cur.FileSuffix());
    }
    info.dtype = static_cast<DType>(ggml_type);
    for (uint32_t d = 0; d < n_dims; ++d) info.shape.push_back(ne[n_dims - 1 - d]);
    const int64_t numel = CheckedNumel(info.shape, kMaxTensorElems);
    if (numel < 0) {
      std::string ne_s = "ne = [";
      for (uint32_t d = 0; d < n_dims; ++d) ne_s += (d ? ", " : "") + std::to_string(ne[d]);
      return cur.Error(StatusCode::kOutOfRange,
                       "absurd dimensions " + ne_s + "] of " + tn +
                           " (each must be > 0 and the product at most 2^40)");
    }
    const int64_t block = DTypeBlockElems(info.dtype);
    if (ne[0] % block != 0) {
      return cur.Error(StatusCode::kDataLoss, "row length " + std::to_string(ne[0]) + " of " + tn +
                                                  " (" + GgmlTypeName(ggml_type) +
                                                  ") is not a multiple of the block size " +
                                                  std::to_string(block));
    }
    info.n_bytes = static_cast<uint64_t>(DTypeRowBytes(info.dtype, numel));
    if (info.offset % alignment_ != 0) {
      return cur.Error(StatusCode::kDataLoss,
                       "data offset " + std::to_string(info.offset) + " of " + tn +
                           " is not a multiple of the alignment " + std::to_string(alignment_));
    }
    tensor_index_[info.name] = tensors_.size();
    tensors_.push_back(std::move(info));
  }

  data_offset_ = AlignUp(cur.pos(), alignment_);
  for (const GgufTensorInfo& info : tensors_) {
    const uint64_t avail = size_ > data_offset_ ? size_ - data_offset_ : 0;
    if (info.offset > avail || info.n_bytes > avail - info.offset) {
      return DataLoss("truncated: data of tensor " + Quote(info.name) + " (" +
                      std::to_string(info.n_bytes) + " bytes at data offset " +
                      std::to_string(info.offset) + ", file offset " +
                      std::to_string(data_offset_ + info.offset) + ") runs past the end of the " +
                      std::to_string(size_) + "-byte file" + cur.FileSuffix());
    }
  }
  return OkStatus();
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

namespace {

Status Missing(const std::string& key, const std::string& path) {
  return NotFound("metadata key " + Quote(key) + " not found (file " + path + ")");
}

Status WrongKind(const std::string& key, const GgufValue& v, const char* want,
                 const std::string& path) {
  std::string got = GgufTypeName(v.type);
  if (v.type == GgufType::kArray) got += std::string(" of ") + GgufTypeName(v.array_type);
  return InvalidArgument("metadata key " + Quote(key) + " is " + got + ", expected " + want +
                         " (file " + path + ")");
}

}  // namespace

StatusOr<std::string> GgufFile::GetString(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key, path_);
  if (v->type != GgufType::kString) return WrongKind(key, *v, "a string", path_);
  return v->s;
}

StatusOr<int64_t> GgufFile::GetInt(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key, path_);
  if (!v->IsInteger()) return WrongKind(key, *v, "an integer", path_);
  if (v->type == GgufType::kU64 && v->u > static_cast<uint64_t>(INT64_MAX)) {
    return OutOfRange("metadata key " + Quote(key) + " value " + std::to_string(v->u) +
                      " does not fit in int64 (file " + path_ + ")");
  }
  return v->AsInt();
}

StatusOr<double> GgufFile::GetFloat(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key, path_);
  if (!v->IsInteger() && !IsFloatType(v->type)) return WrongKind(key, *v, "a number", path_);
  return v->AsDouble();
}

StatusOr<bool> GgufFile::GetBool(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key, path_);
  if (v->type != GgufType::kBool) return WrongKind(key, *v, "a bool", path_);
  return v->u != 0;
}

StatusOr<std::vector<std::string>> GgufFile::GetStringArray(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key, path_);
  if (v->type != GgufType::kArray || v->array_type != GgufType::kString) {
    return WrongKind(key, *v, "an array of strings", path_);
  }
  return v->strings;
}

StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key, path_);
  if (v->type != GgufType::kArray || !IsIntegerType(v->array_type)) {
    return WrongKind(key, *v, "an array of integers", path_);
  }
  std::vector<int64_t> out;
  out.reserve(v->size());
  for (size_t j = 0; j < v->size(); ++j) {
    const GgufValue e = v->at(j);
    if (e.type == GgufType::kU64 && e.u > static_cast<uint64_t>(INT64_MAX)) {
      return OutOfRange("metadata key " + Quote(key) + " element " + std::to_string(j) + " value " +
                        std::to_string(e.u) + " does not fit in int64 (file " + path_ + ")");
    }
    out.push_back(e.AsInt());
  }
  return out;
}

StatusOr<std::vector<float>> GgufFile::GetFloatArray(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Missing(key, path_);
  if (v->type != GgufType::kArray ||
      (!IsIntegerType(v->array_type) && !IsFloatType(v->array_type))) {
    return WrongKind(key, *v, "an array of numbers", path_);
  }
  std::vector<float> out;
  out.reserve(v->size());
  for (size_t j = 0; j < v->size(); ++j) out.push_back(static_cast<float>(v->at(j).AsDouble()));
  return out;
}

StatusOr<int64_t> GgufFile::GetIntIn(const std::string& key, int64_t lo, int64_t hi) const {
  ASSIGN_OR_RETURN(int64_t v, GetInt(key));
  if (v < lo || v > hi) {
    return OutOfRange("metadata key " + Quote(key) + " = " + std::to_string(v) +
                      " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) +
                      "] (file " + path_ + ")");
  }
  return v;
}

StatusOr<int64_t> GgufFile::GetIntOr(const std::string& key, int64_t def) const {
  if (!Has(key)) return def;
  return GetInt(key);
}

StatusOr<int64_t> GgufFile::GetIntInOr(const std::string& key, int64_t def, int64_t lo,
                                       int64_t hi) const {
  if (!Has(key)) return def;
  return GetIntIn(key, lo, hi);
}

StatusOr<double> GgufFile::GetFloatOr(const std::string& key, double def) const {
  if (!Has(key)) return def;
  return GetFloat(key);
}

StatusOr<bool> GgufFile::GetBoolOr(const std::string& key, bool def) const {
  if (!Has(key)) return def;
  return GetBool(key);
}

StatusOr<std::string> GgufFile::GetStringOr(const std::string& key,
                                            const std::string& def) const {
  if (!Has(key)) return def;
  return GetString(key);
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

StatusOr<TensorView> GgufFile::Tensor(const std::string& name) const {
  const GgufTensorInfo* info = FindTensor(name);
  if (!info) return NotFound("tensor " + Quote(name) + " not found (file " + path_ + ")");
  TensorView v;
  v.data = base_ + data_offset_ + info->offset;
  v.dtype = info->dtype;
  v.n_dims = static_cast<int>(info->shape.size());
  for (size_t d = 0; d < info->shape.size(); ++d) v.shape[d] = info->shape[d];
  return v;
}

// ---------------------------------------------------------------------------------------------
// GgufWriter

void GgufWriter::Set(const std::string& key, GgufValue value) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::set_alignment(uint64_t a) {
  STRATA_CHECK_MSG(IsPow2(a) && a <= kMaxAlignment,
                   "GGUF alignment %" PRIu64 " is not a power of two in [1, 2^30]", a);
  alignment_ = a;
}

Status GgufWriter::AddTensor(const std::string& name, DType dtype,
                             const std::vector<int64_t>& shape, const void* data, size_t n_bytes) {
  if (!IsSupportedDType(static_cast<uint32_t>(dtype))) {
    return InvalidArgument("tensor " + Quote(name) + ": unsupported dtype " +
                           GgmlTypeName(static_cast<uint32_t>(dtype)));
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) return InvalidArgument("duplicate tensor name " + Quote(name));
  }
  if (shape.size() > 4) {
    return InvalidArgument("tensor " + Quote(name) + " has " + std::to_string(shape.size()) +
                           " dims, at most 4 are allowed");
  }
  const int64_t numel = CheckedNumel(shape, int64_t{1} << 40);
  if (numel < 0) {
    return InvalidArgument("tensor " + Quote(name) + " has invalid shape " + ShapeStr(shape) +
                           " (dims must be > 0, at most 2^40 elements)");
  }
  const int64_t last = shape.empty() ? 1 : shape.back();
  const int64_t block = DTypeBlockElems(dtype);
  if (last % block != 0) {
    return InvalidArgument("tensor " + Quote(name) + " shape " + ShapeStr(shape) +
                           ": last dim is not a multiple of the " + std::string(DTypeName(dtype)) +
                           " block size " + std::to_string(block));
  }
  const uint64_t want = static_cast<uint64_t>(DTypeRowBytes(dtype, numel));
  if (n_bytes != want) {
    return InvalidArgument("tensor " + Quote(name) + " " + std::string(DTypeName(dtype)) + " " +
                           ShapeStr(shape) + " needs " + std::to_string(want) + " bytes, got " +
                           std::to_string(n_bytes));
  }
  if (data == nullptr && n_bytes > 0) {
    return InvalidArgument("tensor " + Quote(name) + ": null data");
  }
  PendingTensor t{name, dtype, shape, {}};
  const uint8_t* p = static_cast<const uint8_t*>(data);
  t.data.assign(p, p + n_bytes);
  tensors_.push_back(std::move(t));
  return OkStatus();
}

Status GgufWriter::AddTensorF32(const std::string& name, DType dtype,
                                const std::vector<int64_t>& shape, const float* values) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16 &&
      dtype != DType::kF64 && !IsQuantized(dtype)) {
    return InvalidArgument("tensor " + Quote(name) + ": cannot convert f32 into " +
                           std::string(DTypeName(dtype)));
  }
  if (shape.size() > 4) {
    return InvalidArgument("tensor " + Quote(name) + " has " + std::to_string(shape.size()) +
                           " dims, at most 4 are allowed");
  }
  const int64_t numel = CheckedNumel(shape, int64_t{1} << 40);
  if (numel < 0) {
    return InvalidArgument("tensor " + Quote(name) + " has invalid shape " + ShapeStr(shape));
  }
  const int64_t last = shape.empty() ? 1 : shape.back();
  if (last % DTypeBlockElems(dtype) != 0) {
    return InvalidArgument("tensor " + Quote(name) + " shape " + ShapeStr(shape) +
                           ": last dim is not a multiple of the " + std::string(DTypeName(dtype)) +
                           " block size " + std::to_string(DTypeBlockElems(dtype)));
  }
  std::vector<uint8_t> buf(static_cast<size_t>(DTypeRowBytes(dtype, numel)));
  if (IsQuantized(dtype)) {  // the quantizer refuses NaN/Inf instead of encoding garbage
    const Status s = QuantizeRow(dtype, values, buf.data(), numel);
    if (!s.ok()) return InvalidArgument("tensor " + Quote(name) + ": " + s.message());
  } else {
    FromF32(dtype, values, buf.data(), numel);
  }
  return AddTensor(name, dtype, shape, buf.data(), buf.size());
}

std::vector<uint64_t> GgufWriter::TensorOffsets() const {
  std::vector<uint64_t> offs;
  uint64_t off = 0;
  for (const PendingTensor& t : tensors_) {
    offs.push_back(off);
    off = AlignUp(off + t.data.size(), alignment_);
  }
  return offs;
}

std::vector<uint8_t> GgufWriter::HeaderBytes() const {
  // The alignment key always agrees with alignment_: replaced in place if the caller set it,
  // appended when the alignment is not the default.
  std::vector<std::pair<std::string, GgufValue>> kv = kv_;
  bool has_align = false;
  for (auto& e : kv) {
    if (e.first == "general.alignment") {
      e.second = GgufValue::U32(static_cast<uint32_t>(alignment_));
      has_align = true;
    }
  }
  if (!has_align && alignment_ != kDefaultAlignment) {
    kv.emplace_back("general.alignment", GgufValue::U32(static_cast<uint32_t>(alignment_)));
  }

  std::vector<uint8_t> out;
  Put<uint32_t>(&out, kGgufMagic);
  Put<uint32_t>(&out, 3);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, kv.size());
  for (const auto& [key, v] : kv) {
    PutString(&out, key);
    Put<uint32_t>(&out, static_cast<uint32_t>(v.type));
    PutPayload(&out, v);
  }
  const std::vector<uint64_t> offs = TensorOffsets();
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const PendingTensor& pt = tensors_[t];
    PutString(&out, pt.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(pt.shape.size()));
    for (size_t d = pt.shape.size(); d-- > 0;) Put<uint64_t>(&out, pt.shape[d]);  // fastest first
    Put<uint32_t>(&out, static_cast<uint32_t>(pt.dtype));
    Put<uint64_t>(&out, offs[t]);
  }
  // Pad to the data section only when there is data: the file ends at its last meaningful byte,
  // so any truncation is detectable.
  if (!tensors_.empty()) out.resize(AlignUp(out.size(), alignment_), 0);
  return out;
}

std::vector<uint8_t> GgufWriter::ToBytes() const {
  std::vector<uint8_t> out = HeaderBytes();
  const uint64_t data_start = out.size();
  const std::vector<uint64_t> offs = TensorOffsets();
  for (size_t t = 0; t < tensors_.size(); ++t) {
    out.resize(data_start + offs[t], 0);
    out.insert(out.end(), tensors_[t].data.begin(), tensors_[t].data.end());
  }
  return out;
}

namespace {

Status WriteAll(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return IoError("cannot write " + path + ": " + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

}  // namespace

Status GgufWriter::WriteFile(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return IoError("cannot create " + tmp + " (for " + path + "): " + std::strerror(errno));
  }
  auto fail = [&](Status s) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  const std::vector<uint8_t> header = HeaderBytes();
  Status s = WriteAll(fd, header.data(), header.size(), tmp);
  if (!s.ok()) return fail(s);
  const std::vector<uint64_t> offs = TensorOffsets();
  uint64_t written = 0;  // bytes of the data section so far
  static const uint8_t kZeros[4096] = {};
  for (size_t t = 0; t < tensors_.size(); ++t) {
    while (written < offs[t]) {
      const size_t pad = static_cast<size_t>(std::min<uint64_t>(offs[t] - written, sizeof(kZeros)));
      s = WriteAll(fd, kZeros, pad, tmp);
      if (!s.ok()) return fail(s);
      written += pad;
    }
    s = WriteAll(fd, tensors_[t].data.data(), tensors_[t].data.size(), tmp);
    if (!s.ok()) return fail(s);
    written += tensors_[t].data.size();
  }
  if (::fsync(fd) != 0) return fail(IoError("cannot fsync " + tmp + ": " + std::strerror(errno)));
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return IoError("cannot close " + tmp + ": " + std::strerror(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return IoError("cannot rename " + tmp + " to " + path + ": " + std::strerror(e));
  }
  // Make the rename durable (best effort: some filesystems refuse fsync on a directory).
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return OkStatus();
}

}  // namespace strata
