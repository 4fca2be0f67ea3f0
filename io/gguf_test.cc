#include "io/gguf.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/status_testing.h"

namespace strata {
namespace {

bool Contains(const std::string& text, const std::string& sub) {
  return text.find(sub) != std::string::npos;
}

std::string SeedTrace(uint64_t seed) {
  return "seed=" + std::to_string(seed) + " (replay with STRATA_TEST_SEED=" + std::to_string(seed) +
         ")";
}

// Little-endian byte builder for hand-made (often malformed) GGUF images.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& Put(T x) {
    const size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &x, sizeof(T));
    return *this;
  }
  Bytes& U32(uint32_t x) { return Put(x); }
  Bytes& U64(uint64_t x) { return Put(x); }
  Bytes& Str(const std::string& s) {
    U64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    U32(version);
    U64(n_tensors);
    return U64(n_kv);
  }
  // Tensor info with ne given fastest-first.
  Bytes& Info(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
              uint64_t offset) {
    Str(name);
    U32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) U64(d);
    U32(type);
    return U64(offset);
  }
  Bytes& PadTo(uint64_t a) {
    b.resize((b.size() + a - 1) / a * a, 0);
    return *this;
  }
  Bytes& Zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
};

StatusOr<std::unique_ptr<GgufFile>> Parse(const Bytes& bytes, const std::string& name = "t.gguf") {
  return GgufFile::FromBuffer(bytes.b, name);
}

// Deep equality of two values, with floats compared by bit pattern (F32 through its float bits).
bool SameValue(const GgufValue& a, const GgufValue& b, std::string* why) {
  if (a.type != b.type) {
    *why = std::string("type ") + GgufTypeName(a.type) + " vs " + GgufTypeName(b.type);
    return false;
  }
  switch (a.type) {
    case GgufType::kU8:
    case GgufType::kU16:
    case GgufType::kU32:
    case GgufType::kU64:
    case GgufType::kBool:
      if (a.u != b.u) *why = "unsigned " + std::to_string(a.u) + " vs " + std::to_string(b.u);
      return a.u == b.u;
    case GgufType::kI8:
    case GgufType::kI16:
    case GgufType::kI32:
    case GgufType::kI64:
      if (a.i != b.i) *why = "signed " + std::to_string(a.i) + " vs " + std::to_string(b.i);
      return a.i == b.i;
    case GgufType::kF32: {
      const bool same = F32Bits(static_cast<float>(a.f)) == F32Bits(static_cast<float>(b.f));
      if (!same) *why = "f32 " + a.DebugString() + " vs " + b.DebugString();
      return same;
    }
    case GgufType::kF64: {
      uint64_t x, y;
      std::memcpy(&x, &a.f, 8);
      std::memcpy(&y, &b.f, 8);
      if (x != y) *why = "f64 " + a.DebugString() + " vs " + b.DebugString();
      return x == y;
    }
    case GgufType::kString:
      if (a.s != b.s) *why = "string " + a.DebugString() + " vs " + b.DebugString();
      return a.s == b.s;
    case GgufType::kArray:
      if (a.array_type != b.array_type || a.size() != b.size()) {
        *why = "array " + a.DebugString() + " vs " + b.DebugString();
        return false;
      }
      for (size_t j = 0; j < a.size(); ++j) {
        if (!SameValue(a.at(j), b.at(j), why)) {
          *why = "element " + std::to_string(j) + ": " + *why;
          return false;
        }
      }
      return true;
  }
  return false;
}

GgufValue RandomScalar(GgufType t, Rng& rng) {
  const uint64_t r = rng.Next();
  switch (t) {
    case GgufType::kU8:
      return GgufValue::U8(static_cast<uint8_t>(r));
    case GgufType::kI8:
      return GgufValue::I8(static_cast<int8_t>(r));
    case GgufType::kU16:
      return GgufValue::U16(static_cast<uint16_t>(r));
    case GgufType::kI16:
      return GgufValue::I16(static_cast<int16_t>(r));
    case GgufType::kU32:
      return GgufValue::U32(static_cast<uint32_t>(r));
    case GgufType::kI32:
      return GgufValue::I32(static_cast<int32_t>(r));
    case GgufType::kU64:
      return GgufValue::U64(r);
    case GgufType::kI64:
      return GgufValue::I64(static_cast<int64_t>(r));
    case GgufType::kF32:
      return GgufValue::F32(static_cast<float>(rng.Normal() * 1e3));
    case GgufType::kF64:
      return GgufValue::F64(rng.Normal() * 1e-3);
    case GgufType::kBool:
      return GgufValue::Bool(r & 1);
    case GgufType::kString: {
      std::string s;
      const size_t n = rng.Below(20);
      for (size_t j = 0; j < n; ++j) s.push_back(static_cast<char>(rng.Below(256)));
      return GgufValue::String(s);
    }
    default:
      return GgufValue::U32(0);
  }
}

const GgufType kScalarTypes[] = {GgufType::kU8,  GgufType::kI8,   GgufType::kU16,
                                 GgufType::kI16, GgufType::kU32,  GgufType::kI32,
                                 GgufType::kU64, GgufType::kI64,  GgufType::kF32,
                                 GgufType::kF64, GgufType::kBool, GgufType::kString};

TEST(GgufRoundTrip, AllMetadataValueTypes) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedTrace(seed));
  Rng rng(seed);
  GgufWriter w;
  // Scalars at their extremes.
  w.Set("u8.max", GgufValue::U8(255));
  w.Set("i8.min", GgufValue::I8(-128));
  w.Set("i8.max", GgufValue::I8(127));
  w.Set("u16.max", GgufValue::U16(65535));
  w.Set("i16.min", GgufValue::I16(-32768));
  w.Set("u32.max", GgufValue::U32(std::numeric_limits<uint32_t>::max()));
  w.Set("i32.min", GgufValue::I32(std::numeric_limits<int32_t>::min()));
  w.Set("u64.max", GgufValue::U64(std::numeric_limits<uint64_t>::max()));
  w.Set("i64.min", GgufValue::I64(std::numeric_limits<int64_t>::min()));
  w.Set("i64.max", GgufValue::I64(std::numeric_limits<int64_t>::max()));
  w.Set("f32.max", GgufValue::F32(std::numeric_limits<float>::max()));
  w.Set("f32.denorm", GgufValue::F32(std::numeric_limits<float>::denorm_min()));
  w.Set("f32.neg_zero", GgufValue::F32(-0.0f));
  w.Set("f32.inf", GgufValue::F32(-std::numeric_limits<float>::infinity()));
  w.Set("f64.max", GgufValue::F64(std::numeric_limits<double>::max()));
  w.Set("f64.denorm", GgufValue::F64(std::numeric_limits<double>::denorm_min()));
  w.Set("f64.nan", GgufValue::F64(std::numeric_limits<double>::quiet_NaN()));
  w.Set("bool.true", GgufValue::Bool(true));
  w.Set("bool.false", GgufValue::Bool(false));
  w.Set("str.utf8", GgufValue::String("h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80"));
  w.Set("str.nul", GgufValue::String(std::string("a\0b\0", 4)));
  w.Set("str.empty", GgufValue::String(""));
  // Random scalars and arrays of every element type, including empty arrays.
  for (GgufType t : kScalarTypes) {
    const std::string name = GgufTypeName(t);
    w.Set("rand." + name, RandomScalar(t, rng));
    std::vector<GgufValue> elems;
    const size_t n = 1 + rng.Below(50);
    for (size_t j = 0; j < n; ++j) elems.push_back(RandomScalar(t, rng));
    w.Set("arr." + name, GgufValue::Array(t, elems));
    w.Set("empty." + name, GgufValue::Array(t, {}));
  }
  w.Set("list.strings", GgufValue::StringArray({"<s>", "</s>", std::string("\0x", 2), ""}));
  w.Set("list.f32", GgufValue::F32Array({1.5f, -2.25f, 1e-30f}));
  w.Set("list.i32", GgufValue::I32Array({-1, 0, 1, std::numeric_limits<int32_t>::max()}));
  // Nested arrays: array of arrays of i32 (ragged), and a 3-deep string nest.
  w.Set("nested.i32",
        GgufValue::Array(GgufType::kArray, {GgufValue::I32Array({1, 2, 3}), GgufValue::I32Array({}),
                                            GgufValue::I32Array({-7})}));
  w.Set("nested.deep",
        GgufValue::Array(GgufType::kArray,
                         {GgufValue::Array(GgufType::kArray, {GgufValue::StringArray({"a", "b"})}),
                          GgufValue::Array(GgufType::kArray, {})}));
  w.Set("nested.empty", GgufValue::Array(GgufType::kArray, {}));
  // Set on an existing key replaces in place (order kept).
  w.Set("replaced", GgufValue::U32(1));
  w.Set("after", GgufValue::U32(2));
  w.Set("replaced", GgufValue::String("two"));

  auto f = GgufFile::FromBuffer(w.ToBytes(), "meta.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_TRUE(g.tensors().empty());

  // Rebuild the expected list the same way the writer does and compare in order.
  ASSERT_EQ(g.metadata().size(), 22u + 3 * 12 + 3 + 3 + 2);
  for (const auto& [key, v] : g.metadata()) {
    const GgufValue* found = g.Find(key);
    ASSERT_NE(found, nullptr) << key;
  }
  // Order: insertion order, with "replaced" before "after".
  size_t i_rep = 0, i_after = 0;
  for (size_t j = 0; j < g.metadata().size(); ++j) {
    if (g.metadata()[j].first == "replaced") i_rep = j;
    if (g.metadata()[j].first == "after") i_after = j;
  }
  EXPECT_EQ(i_rep + 1, i_after);
  EXPECT_EQ(g.metadata().front().first, "u8.max");
  EXPECT_EQ(*g.GetString("replaced"), "two");

  // Every value matches what was set, bit for bit. Write once more and parse to get the written
  // values side by side with the originals.
  GgufWriter again;
  for (const auto& [key, v] : g.metadata()) again.Set(key, v);
  EXPECT_EQ(again.ToBytes(), w.ToBytes()) << "re-serialising the parsed metadata changed bytes";

  EXPECT_EQ(*g.GetInt("u8.max"), 255);
  EXPECT_EQ(*g.GetInt("i8.min"), -128);
  EXPECT_EQ(*g.GetInt("i8.max"), 127);
  EXPECT_EQ(*g.GetInt("u16.max"), 65535);
  EXPECT_EQ(*g.GetInt("i16.min"), -32768);
  EXPECT_EQ(*g.GetInt("u32.max"), 4294967295ll);
  EXPECT_EQ(*g.GetInt("i32.min"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(g.Find("u64.max")->u, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(g.GetInt("u64.max").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(*g.GetInt("i64.min"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*g.GetInt("i64.max"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(*g.GetFloat("f32.max"), static_cast<double>(std::numeric_limits<float>::max()));
  EXPECT_EQ(*g.GetFloat("f32.denorm"),
            static_cast<double>(std::numeric_limits<float>::denorm_min()));
  EXPECT_TRUE(std::signbit(*g.GetFloat("f32.neg_zero")));
  EXPECT_EQ(*g.GetFloat("f32.inf"), -INFINITY);
  EXPECT_EQ(*g.GetFloat("f64.max"), std::numeric_limits<double>::max());
  EXPECT_EQ(*g.GetFloat("f64.denorm"), std::numeric_limits<double>::denorm_min());
  EXPECT_TRUE(std::isnan(*g.GetFloat("f64.nan")));
  EXPECT_TRUE(*g.GetBool("bool.true"));
  EXPECT_FALSE(*g.GetBool("bool.false"));
  EXPECT_EQ(*g.GetString("str.utf8"), "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80");
  EXPECT_EQ(*g.GetString("str.nul"), std::string("a\0b\0", 4));
  EXPECT_EQ(*g.GetString("str.empty"), "");
  EXPECT_EQ(*g.GetStringArray("list.strings"),
            (std::vector<std::string>{"<s>", "</s>", std::string("\0x", 2), ""}));
  EXPECT_EQ(*g.GetFloatArray("list.f32"), (std::vector<float>{1.5f, -2.25f, 1e-30f}));
  EXPECT_EQ(*g.GetIntArray("list.i32"),
            (std::vector<int64_t>{-1, 0, 1, std::numeric_limits<int32_t>::max()}));
  for (GgufType t : kScalarTypes) {
    const std::string name = GgufTypeName(t);
    const GgufValue* e = g.Find("empty." + name);
    ASSERT_NE(e, nullptr) << name;
    EXPECT_EQ(e->type, GgufType::kArray);
    EXPECT_EQ(e->array_type, t);
    EXPECT_EQ(e->size(), 0u);
  }
  const GgufValue* nested = g.Find("nested.i32");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->size(), 3u);
  EXPECT_EQ(nested->at(0).size(), 3u);
  EXPECT_EQ(nested->at(0).at(2).i, 3);
  EXPECT_EQ(nested->at(1).size(), 0u);
  EXPECT_EQ(nested->at(2).at(0).i, -7);
  const GgufValue* deep = g.Find("nested.deep");
  ASSERT_NE(deep, nullptr);
  EXPECT_EQ(deep->at(0).at(0).at(1).s, "b");
}

TEST(GgufRoundTrip, RandomMetadataBitExact) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedTrace(seed));
  Rng rng(seed);
  for (int rep = 0; rep < 20; ++rep) {
    GgufWriter w;
    std::vector<std::pair<std::string, GgufValue>> want;
    const int n = static_cast<int>(rng.Below(30));
    for (int k = 0; k < n; ++k) {
      const GgufType t = kScalarTypes[rng.Below(12)];
      GgufValue v;
      if (rng.Below(3) == 0) {
        std::vector<GgufValue> e;
        const size_t m = rng.Below(10);
        for (size_t j = 0; j < m; ++j) e.push_back(RandomScalar(t, rng));
        v = GgufValue::Array(t, e);
      } else {
        v = RandomScalar(t, rng);
      }
      std::string key = "k";
      key += std::to_string(k);
      w.Set(key, v);
      want.emplace_back(key, v);
    }
    auto f = GgufFile::FromBuffer(w.ToBytes());
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_EQ((*f)->metadata().size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ((*f)->metadata()[k].first, want[k].first);
      std::string why;
      EXPECT_TRUE(SameValue((*f)->metadata()[k].second, want[k].second, &why))
          << want[k].first << ": " << why;
    }
  }
}

struct TensorCase {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

std::vector<TensorCase> RandomTensors(Rng& rng) {
  const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kI8,
                          DType::kI16, DType::kI32, DType::kI64,  DType::kF64};
  std::vector<TensorCase> out;
  int id = 0;
  for (DType t : kTypes) {
    for (int rep = 0; rep < 2; ++rep) {
      TensorCase c;
      c.name = "blk." + std::to_string(id++) + "." + std::string(DTypeName(t));
      c.dtype = t;
      const int n_dims = 1 + static_cast<int>(rng.Below(4));
      for (int d = 0; d < n_dims; ++d) c.shape.push_back(1 + static_cast<int64_t>(rng.Below(5)));
      c.shape.back() *= DTypeBlockElems(t) * (1 + static_cast<int64_t>(rng.Below(3)));
      int64_t numel = 1;
      for (int64_t d : c.shape) numel *= d;
      c.data.resize(DTypeRowBytes(t, numel));
      for (auto& b : c.data) b = static_cast<uint8_t>(rng.Next());
      out.push_back(std::move(c));
    }
  }
  return out;
}

void CheckTensors(const GgufFile& g, const std::vector<TensorCase>& cases, uint64_t align) {
  ASSERT_EQ(g.tensors().size(), cases.size());
  EXPECT_EQ(g.alignment(), align);
  EXPECT_EQ(g.data_offset() % align, 0u);
  for (size_t k = 0; k < cases.size(); ++k) {
    const TensorCase& c = cases[k];
    const GgufTensorInfo& info = g.tensors()[k];
    EXPECT_EQ(info.name, c.name);
    EXPECT_EQ(info.dtype, c.dtype) << c.name;
    EXPECT_EQ(info.shape, c.shape) << c.name;
    EXPECT_EQ(info.n_bytes, c.data.size()) << c.name;
    EXPECT_EQ(info.offset % align, 0u) << c.name;
    EXPECT_EQ(g.FindTensor(c.name), &info);
    auto v = g.Tensor(c.name);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(v->dtype, c.dtype);
    EXPECT_EQ(v->n_dims, static_cast<int>(c.shape.size()));
    for (size_t d = 0; d < c.shape.size(); ++d) EXPECT_EQ(v->shape[d], c.shape[d]);
    EXPECT_EQ(static_cast<const uint8_t*>(v->data), g.data() + g.data_offset() + info.offset);
    EXPECT_EQ((static_cast<const uint8_t*>(v->data) - g.data()) % align, 0);
    EXPECT_EQ(std::memcmp(v->data, c.data.data(), c.data.size()), 0) << c.name;
  }
}

TEST(GgufRoundTrip, AllTensorTypesByteExact) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedTrace(seed));
  Rng rng(seed);
  const std::vector<TensorCase> cases = RandomTensors(rng);
  GgufWriter w;
  w.Set("general.architecture", GgufValue::String("llama"));
  for (const TensorCase& c : cases) {
    ASSERT_TRUE(w.AddTensor(c.name, c.dtype, c.shape, c.data.data(), c.data.size()).ok());
  }
  const std::vector<uint8_t> bytes = w.ToBytes();
  auto f = GgufFile::FromBuffer(bytes, "tensors.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_FALSE((*f)->Has("general.alignment"));  // default alignment is not written
  CheckTensors(**f, cases, 32);
  // The file ends exactly at the last tensor's last byte.
  const GgufTensorInfo& last = (*f)->tensors().back();
  EXPECT_EQ((*f)->data_offset() + last.offset + last.n_bytes, bytes.size());
  EXPECT_EQ((*f)->Tensor("nope").status().code(), StatusCode::kNotFound);
  EXPECT_PRED2(Contains, (*f)->Tensor("nope").status().message(), "nope");
}

TEST(GgufRoundTrip, CustomAlignment64And4096) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedTrace(seed));
  for (uint64_t align : {uint64_t{64}, uint64_t{4096}, uint64_t{1}}) {
    Rng rng(seed + align);
    const std::vector<TensorCase> cases = RandomTensors(rng);
    GgufWriter w;
    w.set_alignment(align);
    for (const TensorCase& c : cases) {
      ASSERT_TRUE(w.AddTensor(c.name, c.dtype, c.shape, c.data.data(), c.data.size()).ok());
    }
    auto f = GgufFile::FromBuffer(w.ToBytes(), "aligned.gguf");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ((*f)->GetInt("general.alignment").value(), static_cast<int64_t>(align));
    EXPECT_EQ((*f)->Find("general.alignment")->type, GgufType::kU32);
    CheckTensors(**f, cases, align);
  }
}

TEST(GgufRoundTrip, AlignmentKeySetByCallerFollowsWriterAlignment) {
  GgufWriter w;
  w.Set("general.alignment", GgufValue::U32(7));  // wrong value: the writer's alignment wins
  w.Set("x", GgufValue::U8(1));
  w.set_alignment(128);
  const float v[4] = {1, 2, 3, 4};
  ASSERT_TRUE(w.AddTensorF32("t", DType::kF32, {4}, v).ok());
  auto f = GgufFile::FromBuffer(w.ToBytes());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->metadata().front().first, "general.alignment");  // replaced in place
  EXPECT_EQ((*f)->alignment(), 128u);
  EXPECT_EQ((*f)->data_offset() % 128, 0u);
}

TEST(GgufRoundTrip, AddTensorF32Converts) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedTrace(seed));
  Rng rng(seed);
  std::vector<float> src(2 * 64);
  for (float& x : src) x = static_cast<float>(rng.Normal());
  GgufWriter w;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kF64}) {
    ASSERT_TRUE(w.AddTensorF32(std::string(DTypeName(t)), t, {2, 64}, src.data()).ok());
  }
  EXPECT_EQ(w.AddTensorF32("bad", DType::kI32, {2, 64}, src.data()).code(),
            StatusCode::kInvalidArgument);
  auto f = GgufFile::FromBuffer(w.ToBytes());
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kF64}) {
    std::vector<uint8_t> want(DTypeRowBytes(t, 128));
    FromF32(t, src.data(), want.data(), 128);
    auto v = (*f)->Tensor(std::string(DTypeName(t)));
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(std::memcmp(v->data, want.data(), want.size()), 0) << DTypeName(t);
  }
}

TEST(GgufWriterTest, AddTensorValidates) {
  GgufWriter w;
  std::vector<uint8_t> buf(34 * 4);
  // Q8_0 with a last dim that is not a multiple of 32.
  Status s = w.AddTensor("q", DType::kQ8_0, {4, 16}, buf.data(), 34 * 2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_PRED2(Contains, s.message(), "'q'");
  // Wrong byte count.
  s = w.AddTensor("f", DType::kF32, {3, 5}, buf.data(), 59);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_PRED2(Contains, s.message(), "60");
  EXPECT_PRED2(Contains, s.message(), "59");
  // Bad dims.
  EXPECT_FALSE(w.AddTensor("z", DType::kF32, {0, 4}, buf.data(), 0).ok());
  EXPECT_FALSE(w.AddTensor("n", DType::kF32, {-1, 4}, buf.data(), 16).ok());
  EXPECT_FALSE(w.AddTensor("five", DType::kI8, {1, 1, 1, 1, 1}, buf.data(), 1).ok());
  // Duplicate name.
  ASSERT_TRUE(w.AddTensor("ok", DType::kQ8_0, {4, 32}, buf.data(), 34 * 4).ok());
  s = w.AddTensor("ok", DType::kQ8_0, {4, 32}, buf.data(), 34 * 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_PRED2(Contains, s.message(), "duplicate");
}

// A small valid file with metadata of several kinds and three tensors.
std::vector<uint8_t> SmallValidFile(Rng& rng) {
  GgufWriter w;
  w.Set("general.architecture", GgufValue::String("llama"));
  w.Set("llama.block_count", GgufValue::U32(2));
  w.Set("tokenizer.ggml.tokens", GgufValue::StringArray({"a", "bc", "def"}));
  w.Set("nested", GgufValue::Array(GgufType::kArray, {GgufValue::I32Array({1, 2})}));
  w.Set("f", GgufValue::F64(0.5));
  std::vector<float> v(3 * 64);
  for (float& x : v) x = static_cast<float>(rng.Normal());
  EXPECT_TRUE(w.AddTensorF32("a", DType::kF32, {3, 5}, v.data()).ok());
  EXPECT_TRUE(w.AddTensorF32("b", DType::kQ8_0, {3, 64}, v.data()).ok());
  EXPECT_TRUE(w.AddTensorF32("c", DType::kBF16, {7}, v.data()).ok());
  return w.ToBytes();
}

TEST(GgufMalformed, TruncatedAtEveryCutPoint) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedTrace(seed));
  Rng rng(seed);
  const std::vector<uint8_t> full = SmallValidFile(rng);
  ASSERT_TRUE(GgufFile::FromBuffer(full).ok());
  for (size_t cut = 0; cut < full.size(); ++cut) {
    std::vector<uint8_t> part(full.begin(), full.begin() + cut);
    auto f = GgufFile::FromBuffer(std::move(part), "cut.gguf");
    ASSERT_FALSE(f.ok()) << "cut at " << cut << " of " << full.size() << " parsed";
    const StatusCode c = f.status().code();
    EXPECT_TRUE(c == StatusCode::kDataLoss || c == StatusCode::kOutOfRange)
        << "cut " << cut << ": " << f.status().ToString();
    EXPECT_PRED2(Contains, f.status().message(), "cut.gguf") << cut;
  }
}

TEST(GgufMalformed, RandomCorruptionNeverCrashes) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedTrace(seed));
  Rng rng(seed);
  const std::vector<uint8_t> full = SmallValidFile(rng);
  int errors = 0;
  for (int rep = 0; rep < 3000; ++rep) {
    std::vector<uint8_t> b = full;
    const int flips = 1 + static_cast<int>(rng.Below(4));
    for (int k = 0; k < flips; ++k) {
      // Bias toward the header region where the structure lives.
      const size_t pos = rng.Below(rng.Below(2) ? b.size() : std::min<size_t>(b.size(), 300));
      b[pos] = rng.Below(4) == 0 ? 0xff : static_cast<uint8_t>(rng.Next());
    }
    auto f = GgufFile::FromBuffer(std::move(b));
    if (!f.ok()) {
      ++errors;
      EXPECT_FALSE(f.status().message().empty());
    } else {
      // Whatever parsed must be internally consistent.
      for (const GgufTensorInfo& t : (*f)->tensors()) {
        EXPECT_LE((*f)->data_offset() + t.offset + t.n_bytes, (*f)->file_size());
      }
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(GgufMalformed, EmptyFileAndBadMagic) {
  auto f = GgufFile::FromBuffer({}, "empty.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_PRED2(Contains, f.status().message(), "empty");
  EXPECT_PRED2(Contains, f.status().message(), "empty.gguf");

  f = GgufFile::FromBuffer({'G', 'G'}, "short.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_PRED2(Contains, f.status().message(), "not a GGUF file");

  Bytes b;
  b.b = {'G', 'G', 'M', 'L'};
  b.U32(3).U64(0).U64(0);
  f = Parse(b, "magic.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_PRED2(Contains, f.status().message(), "not a GGUF file (bad magic");
  EXPECT_PRED2(Contains, f.status().message(), "magic.gguf");
}

TEST(GgufMalformed, VersionChecks) {
  for (uint32_t version : {1u, 4u, 0x03000000u}) {
    Bytes b;
    b.Header(0, 0, version);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok()) << version;
    EXPECT_PRED2(Contains, f.status().message(), "version " + std::to_string(version));
    EXPECT_PRED2(Contains, f.status().message(), "t.gguf");
  }
  Bytes v2;
  v2.Header(0, 1, 2).Str("k").U32(static_cast<uint32_t>(GgufType::kU8)).Put<uint8_t>(9);
  auto f = Parse(v2);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->version(), 2u);
  EXPECT_EQ(*(*f)->GetInt("k"), 9);
}

TEST(GgufMalformed, AbsurdCounts) {
  {
    Bytes b;
    b.Header(0, uint64_t{1} << 50);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange);
    EXPECT_PRED2(Contains, f.status().message(), std::to_string(uint64_t{1} << 50));
  }
  {
    Bytes b;
    b.Header(uint64_t{1} << 50, 0);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange);
    EXPECT_PRED2(Contains, f.status().message(), "tensor count");
  }
  {
    // Plausible counts that the file is far too small to hold.
    Bytes b;
    b.Header(1000, 1000000);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  }
  {
    // An array claiming 2^60 elements, and one claiming more u64s than the file holds.
    Bytes b;
    b.Header(0, 1)
        .Str("arr")
        .U32(9)
        .U32(static_cast<uint32_t>(GgufType::kU8))
        .U64(uint64_t{1} << 60);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange);
    EXPECT_PRED2(Contains, f.status().message(), "'arr'");
    Bytes c;
    c.Header(0, 1).Str("arr").U32(9).U32(static_cast<uint32_t>(GgufType::kU64)).U64(1000);
    c.Zeros(100);
    f = Parse(c);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
    EXPECT_PRED2(Contains, f.status().message(), "'arr'");
  }
}

TEST(GgufMalformed, AbsurdStringLength) {
  {
    Bytes b;
    b.Header(0, 1).U64(uint64_t{1} << 60).Zeros(16);  // key length 2^60
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange);
    EXPECT_PRED2(Contains, f.status().message(), std::to_string(uint64_t{1} << 60));
  }
  {
    Bytes b;
    b.Header(0, 1).Str("name").U32(8).U64(uint64_t{1} << 60).Zeros(16);  // value length 2^60
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_PRED2(Contains, f.status().message(), "'name'");
  }
  {
    Bytes b;
    b.Header(0, 1).Str("name").U32(8).U64(100).Zeros(50);  // runs past the end
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
    EXPECT_PRED2(Contains, f.status().message(), "'name'");
  }
}

TEST(GgufMalformed, BadValueTypesDuplicatesAndNesting) {
  {
    Bytes b;
    b.Header(0, 1).Str("weird").U32(13).U32(0);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
    EXPECT_PRED2(Contains, f.status().message(), "'weird'");
  }
  {
    Bytes b;
    b.Header(0, 2).Str("k").U32(4).U32(1).Str("k").U32(4).U32(2);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
    EXPECT_PRED2(Contains, f.status().message(), "duplicate metadata key 'k'");
  }
  // Nesting: 8 levels parse, 9 do not.
  for (int levels : {8, 9}) {
    GgufValue v = GgufValue::I32Array({5});
    for (int l = 1; l < levels; ++l) v = GgufValue::Array(GgufType::kArray, {v});
    GgufWriter w;
    w.Set("deep", v);
    auto f = GgufFile::FromBuffer(w.ToBytes());
    if (levels <= GgufFile::kMaxArrayDepth) {
      EXPECT_TRUE(f.ok()) << f.status().ToString();
    } else {
      ASSERT_FALSE(f.ok());
      EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange);
      EXPECT_PRED2(Contains, f.status().message(), "'deep'");
    }
  }
  {
    // Deeply nested chain in a tiny file: must fail on depth, not recurse without bound.
    Bytes b;
    b.Header(0, 1).Str("bomb").U32(9);
    for (int l = 0; l < 10000; ++l) b.U32(9).U64(1);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
  }
  {
    Bytes b;
    b.Header(0, 1).Str("flag").U32(7).Put<uint8_t>(2);
    EXPECT_FALSE(Parse(b).ok());
  }
}

TEST(GgufMalformed, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    Bytes b;
    b.Header(0, 1).Str("general.alignment").U32(4).U32(a);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok()) << a;
    EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange);
    EXPECT_PRED2(Contains, f.status().message(), "general.alignment");
  }
  Bytes b;
  b.Header(0, 1).Str("general.alignment").U32(8).Str("32");
  EXPECT_FALSE(Parse(b).ok());
}

// A one-tensor file: F32 tensor `name` with ne (fastest first), type and offset, followed by
// `data_bytes` of data after the padding.
Bytes OneTensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
                uint64_t offset, size_t data_bytes) {
  Bytes b;
  b.Header(1, 0).Info(name, ne, type, offset).PadTo(32).Zeros(data_bytes);
  return b;
}

TEST(GgufMalformed, TensorChecks) {
  // Baseline: a correct one-tensor file parses.
  {
    auto f = Parse(OneTensor("w", {4, 2}, 0, 0, 32));
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_EQ((*f)->tensors()[0].shape, (std::vector<int64_t>{2, 4}));
  }
  // Data past the end of the file.
  {
    auto f = Parse(OneTensor("blk.0.w", {4, 2}, 0, 0, 31));
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
    EXPECT_PRED2(Contains, f.status().message(), "'blk.0.w'");
    EXPECT_PRED2(Contains, f.status().message(), "t.gguf");
    f = Parse(OneTensor("far", {4}, 0, uint64_t{1} << 62, 64));
    ASSERT_FALSE(f.ok());
    EXPECT_PRED2(Contains, f.status().message(), "'far'");
    f = Parse(OneTensor("wrap", {4}, 0, ~uint64_t{31}, 64));  // offset + size wraps around
    ASSERT_FALSE(f.ok());
  }
  // Absurd dims.
  const std::vector<std::vector<uint64_t>> bad_dims = {{0},
                                                       {4, 0},
                                                       {uint64_t{1} << 63},
                                                       {~uint64_t{0}},
                                                       {uint64_t{1} << 32, uint64_t{1} << 32},
                                                       {uint64_t{1} << 21, uint64_t{1} << 20}};
  for (const auto& ne : bad_dims) {
    auto f = Parse(OneTensor("dims", ne, 0, 0, 64));
    ASSERT_FALSE(f.ok()) << ne.size();
    EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange) << f.status().ToString();
    EXPECT_PRED2(Contains, f.status().message(), "'dims'");
  }
  // n_dims 5.
  {
    auto f = Parse(OneTensor("five", {1, 1, 1, 1, 1}, 0, 0, 64));
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange);
    EXPECT_PRED2(Contains, f.status().message(), "n_dims 5");
  }
  // Q8_0 row not a whole number of blocks.
  {
    auto f = Parse(OneTensor("q", {16, 2}, 8, 0, 128));
    ASSERT_FALSE(f.ok());
    EXPECT_PRED2(Contains, f.status().message(), "block size 32");
    EXPECT_PRED2(Contains, f.status().message(), "'q'");
  }
  // Misaligned offset.
  {
    Bytes b;
    b.Header(2, 0).Info("a", {4}, 0, 0).Info("b", {4}, 0, 16).PadTo(32).Zeros(64);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
    EXPECT_PRED2(Contains, f.status().message(), "'b'");
    EXPECT_PRED2(Contains, f.status().message(), "alignment 32");
  }
  // Duplicate tensor name.
  {
    Bytes b;
    b.Header(2, 0).Info("a", {4}, 0, 0).Info("a", {4}, 0, 32).PadTo(32).Zeros(64);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_PRED2(Contains, f.status().message(), "duplicate tensor name 'a'");
  }
}

TEST(GgufMalformed, UnsupportedTensorType) {
  // IQ2_XXS (ggml type 16) is a real type Strata does not implement.
  auto f = Parse(OneTensor("blk.0.attn_q.weight", {256, 4}, 16, 0, 4096), "X");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(f.status().message(),
            "unsupported tensor type IQ2_XXS in tensor blk.0.attn_q.weight (file X)");
  f = Parse(OneTensor("odd", {4}, 999, 0, 64));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kUnimplemented);
  EXPECT_PRED2(Contains, f.status().message(), "unsupported tensor type");
  EXPECT_PRED2(Contains, f.status().message(), "odd");
}

TEST(GgufGetters, MissingAndWrongKind) {
  GgufWriter w;
  w.Set("s", GgufValue::String("hi"));
  w.Set("i", GgufValue::I16(-3));
  w.Set("u", GgufValue::U8(200));
  w.Set("f", GgufValue::F32(0.25f));
  w.Set("b", GgufValue::Bool(true));
  w.Set("sa", GgufValue::StringArray({"x"}));
  w.Set("ia", GgufValue::Array(GgufType::kU16, {GgufValue::U16(7), GgufValue::U16(65535)}));
  auto f = GgufFile::FromBuffer(w.ToBytes(), "get.gguf");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const GgufFile& g = **f;

  auto miss = g.GetInt("llama.context_length");
  ASSERT_FALSE(miss.ok());
  EXPECT_EQ(miss.status().code(), StatusCode::kNotFound);
  EXPECT_PRED2(Contains, miss.status().message(), "llama.context_length");
  EXPECT_PRED2(Contains, miss.status().message(), "get.gguf");
  EXPECT_EQ(g.GetString("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(g.GetStringArray("nope").status().code(), StatusCode::kNotFound);

  auto wrong = g.GetInt("s");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_PRED2(Contains, wrong.status().message(), "'s'");
  EXPECT_PRED2(Contains, wrong.status().message(), "get.gguf");
  EXPECT_EQ(g.GetInt("b").status().code(), StatusCode::kInvalidArgument);  // bool is not an int
  EXPECT_EQ(g.GetInt("f").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetString("i").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetBool("i").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetFloat("s").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetFloat("b").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetStringArray("ia").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetIntArray("sa").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetFloatArray("sa").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g.GetStringArray("s").status().code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(*g.GetInt("i"), -3);
  EXPECT_EQ(*g.GetInt("u"), 200);
  EXPECT_EQ(*g.GetFloat("f"), 0.25);
  EXPECT_EQ(*g.GetFloat("i"), -3.0);  // integers are accepted as floats
  EXPECT_TRUE(*g.GetBool("b"));
  EXPECT_EQ(*g.GetIntArray("ia"), (std::vector<int64_t>{7, 65535}));
  EXPECT_EQ(*g.GetFloatArray("ia"), (std::vector<float>{7.f, 65535.f}));

  // Absent: the default. Present with the wrong type: an error naming the key, its type and the
  // expected one, never the default.
  EXPECT_EQ(*g.GetIntOr("nope", 42), 42);
  EXPECT_EQ(*g.GetIntOr("u", 42), 200);
  auto wrong_or = g.GetIntOr("s", 42);
  ASSERT_FALSE(wrong_or.ok());
  EXPECT_EQ(wrong_or.status().code(), StatusCode::kInvalidArgument);
  EXPECT_PRED2(Contains, wrong_or.status().message(), "'s' is string, expected an integer");
  EXPECT_EQ(*g.GetFloatOr("nope", 1.5), 1.5);
  EXPECT_EQ(*g.GetFloatOr("f", 1.5), 0.25);
  EXPECT_FALSE(g.GetFloatOr("s", 1.5).ok());
  EXPECT_TRUE(*g.GetBoolOr("nope", true));
  EXPECT_TRUE(*g.GetBoolOr("b", false));
  auto u8_bool = g.GetBoolOr("u", false);
  ASSERT_FALSE(u8_bool.ok());
  EXPECT_PRED2(Contains, u8_bool.status().message(), "'u' is u8, expected a bool");
  EXPECT_EQ(*g.GetStringOr("nope", "d"), "d");
  EXPECT_EQ(*g.GetStringOr("s", "d"), "hi");
  EXPECT_FALSE(g.GetStringOr("i", "d").ok());
  // Ranges are checked in 64 bits before any narrowing.
  EXPECT_EQ(*g.GetIntIn("u", 0, 200), 200);
  auto out = g.GetIntIn("u", 0, 199);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kOutOfRange);
  EXPECT_PRED2(Contains, out.status().message(), "'u' = 200 is outside [0, 199]");
  EXPECT_EQ(*g.GetIntInOr("nope", 7, 0, 1), 7);  // the default is the caller's, not checked
  EXPECT_FALSE(g.GetIntInOr("i", 7, 0, 10).ok());

  EXPECT_TRUE(g.Find("u")->IsInteger());
  EXPECT_FALSE(g.Find("b")->IsInteger());
  EXPECT_EQ(g.Find("b")->AsInt(), 1);
  EXPECT_EQ(g.Find("f")->AsDouble(), 0.25);
  EXPECT_PRED2(Contains, g.Find("sa")->DebugString(), "string");
}

class GgufFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/strata_gguf_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(GgufFileTest, WriteThenOpenMapped) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedTrace(seed));
  Rng rng(seed);
  const std::vector<TensorCase> cases = RandomTensors(rng);
  GgufWriter w;
  w.Set("general.name", GgufValue::String("tiny"));
  w.set_alignment(64);
  for (const TensorCase& c : cases) {
    ASSERT_TRUE(w.AddTensor(c.name, c.dtype, c.shape, c.data.data(), c.data.size()).ok());
  }
  const std::string path = dir_ + "/model.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ((*f)->file_size(), std::filesystem::file_size(path));
  EXPECT_EQ(*(*f)->GetString("general.name"), "tiny");
  CheckTensors(**f, cases, 64);
  // The file on disk is the same as the in-memory image.
  const std::vector<uint8_t> mem = w.ToBytes();
  ASSERT_EQ(mem.size(), (*f)->file_size());
  EXPECT_EQ(std::memcmp(mem.data(), (*f)->data(), mem.size()), 0);
  // Read into memory instead of mapped: the same image, metadata and tensors.
  auto fm = GgufFile::Open(path, GgufFile::Load::kMemory);
  ASSERT_TRUE(fm.ok()) << fm.status().ToString();
  ASSERT_EQ((*fm)->file_size(), mem.size());
  EXPECT_EQ(std::memcmp(mem.data(), (*fm)->data(), mem.size()), 0);
  EXPECT_EQ(*(*fm)->GetString("general.name"), "tiny");
  CheckTensors(**fm, cases, 64);
  // Overwriting an existing file replaces it.
  GgufWriter w2;
  w2.Set("general.name", GgufValue::String("second"));
  ASSERT_TRUE(w2.WriteFile(path).ok());
  auto f2 = GgufFile::Open(path);
  ASSERT_TRUE(f2.ok()) << f2.status().ToString();
  EXPECT_EQ(*(*f2)->GetString("general.name"), "second");
  EXPECT_TRUE((*f2)->tensors().empty());
}

TEST_F(GgufFileTest, OpenErrorsNameThePath) {
  const std::string missing = dir_ + "/does_not_exist.gguf";
  auto f = GgufFile::Open(missing);
  ASSERT_FALSE(f.ok());
  EXPECT_TRUE(f.status().code() == StatusCode::kNotFound ||
              f.status().code() == StatusCode::kIoError);
  EXPECT_PRED2(Contains, f.status().message(), missing);
  f = GgufFile::Open(missing, GgufFile::Load::kMemory);
  ASSERT_FALSE(f.ok());
  EXPECT_PRED2(Contains, f.status().message(), missing);

  const std::string empty = dir_ + "/empty.gguf";
  {
    FILE* fp = std::fopen(empty.c_str(), "wb");
    ASSERT_NE(fp, nullptr);
    std::fclose(fp);
  }
  f = GgufFile::Open(empty);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_PRED2(Contains, f.status().message(), "empty");
  EXPECT_PRED2(Contains, f.status().message(), empty);

  f = GgufFile::Open(dir_);  // a directory
  ASSERT_FALSE(f.ok());
  EXPECT_PRED2(Contains, f.status().message(), dir_);

  GgufWriter w;
  const std::string bad = dir_ + "/no/such/dir/out.gguf";
  Status s = w.WriteFile(bad);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_PRED2(Contains, s.message(), bad);
}

TEST_F(GgufFileTest, TruncatedFileOnDisk) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(SeedTrace(seed));
  Rng rng(seed);
  const std::vector<uint8_t> full = SmallValidFile(rng);
  const std::string path = dir_ + "/trunc.gguf";
  for (size_t cut : {size_t{3}, size_t{30}, full.size() / 2, full.size() - 1}) {
    FILE* fp = std::fopen(path.c_str(), "wb");
    ASSERT_NE(fp, nullptr);
    ASSERT_EQ(std::fwrite(full.data(), 1, cut, fp), cut);
    std::fclose(fp);
    auto f = GgufFile::Open(path);
    ASSERT_FALSE(f.ok()) << cut;
    EXPECT_PRED2(Contains, f.status().message(), path);
  }
}

// D4 (issue 13): an array was given one ~88-byte GgufValue per element before any cap was checked,
// so a 4 KB sparse file claiming 2^24 u8 took 1.46 GB and 2^30 ended in bad_alloc. Numbers are now
// held packed: the array costs the bytes it occupies. Built as a sparse file on disk, as found.
TEST_F(GgufFileTest, ArrayMemoryIsBoundedByItsBytes) {
  constexpr uint64_t kN = uint64_t{1} << 24;
  Bytes b;
  b.Header(0, 1).Str("arr").U32(9).U32(static_cast<uint32_t>(GgufType::kU8)).U64(kN);
  const std::string path = dir_ + "/sparse.gguf";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.b.data()), static_cast<std::streamsize>(b.b.size()));
  }
  std::filesystem::resize_file(path, b.b.size() + kN);  // a hole: no bytes on disk
#if !defined(__SANITIZE_ADDRESS__)
  const size_t before = mallinfo2().uordblks + mallinfo2().hblkhd;
#endif
  auto f = GgufFile::Open(path);
  ASSERT_OK(f.status());
  const GgufValue* v = (*f)->Find("arr");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->size(), kN);
  EXPECT_EQ(v->packed.size(), kN);  // one byte per u8
  EXPECT_TRUE(v->array.empty());
  EXPECT_EQ(v->at(kN - 1).u, 0u);
#if !defined(__SANITIZE_ADDRESS__)
  const size_t after = mallinfo2().uordblks + mallinfo2().hblkhd;
  EXPECT_LT(after - before, kN + kN / 4) << "the 16 MiB array cost " << (after - before);
#endif
}

// An array bigger than the metadata cap (256 MiB) is refused before it is allocated (under ASan's
// allocation limit a 1 GiB array aborted instead of failing cleanly).
TEST_F(GgufFileTest, MetadataArraysOverTheCapAreRefused) {
  constexpr uint64_t kN = (uint64_t{256} << 20) + 1;
  Bytes b;
  b.Header(0, 1).Str("arr").U32(9).U32(static_cast<uint32_t>(GgufType::kU8)).U64(kN);
  const std::string path = dir_ + "/big.gguf";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.b.data()), static_cast<std::streamsize>(b.b.size()));
  }
  std::filesystem::resize_file(path, b.b.size() + kN);  // sparse
  auto f = GgufFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange);
  EXPECT_PRED2(Contains, f.status().message(), "metadata arrays hold more than 256 MiB");
}

TEST(GgufMalformed, StringAndNestedArrayCountsAreCappedBeforeAllocation) {
  {
    // 2^25 + 1 empty strings: more values than the cap, refused before the strings are sized.
    constexpr uint64_t kN = (uint64_t{1} << 25) + 1;
    Bytes b;
    b.Header(0, 1).Str("s").U32(9).U32(static_cast<uint32_t>(GgufType::kString)).U64(kN);
    b.Zeros(kN * 8);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange);
    EXPECT_PRED2(Contains, f.status().message(), "more than 33554432 metadata values");
  }
  {
    // 2^16 + 1 empty nested arrays (12 bytes each in the file, ~140 in memory).
    constexpr uint64_t kN = (uint64_t{1} << 16) + 1;
    Bytes b;
    b.Header(0, 1).Str("n").U32(9).U32(static_cast<uint32_t>(GgufType::kArray)).U64(kN);
    for (uint64_t j = 0; j < kN; ++j) b.U32(static_cast<uint32_t>(GgufType::kU8)).U64(0);
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kOutOfRange);
    EXPECT_PRED2(Contains, f.status().message(), "arrays inside arrays");
  }
  {
    // A bool array element that is neither 0 nor 1 is refused like a scalar bool.
    Bytes b;
    b.Header(0, 1).Str("b").U32(9).U32(static_cast<uint32_t>(GgufType::kBool)).U64(3);
    b.b.insert(b.b.end(), {1, 0, 7});
    auto f = Parse(b);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
    EXPECT_PRED2(Contains, f.status().message(), "bool element 2 = 7");
  }
}

}  // namespace
}  // namespace strata
