// libFuzzer target: one .safetensors file (header length, JSON header, dtypes, shapes, offsets),
// then every tensor view's first and last byte. The input is the whole file.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "fuzz/fuzz_util.h"
#include "io/hf.h"

namespace {
volatile uint64_t g_sink = 0;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static strata::fuzz::MemFile file;
  file.Set(data, size);
  auto st = strata::SafetensorsFile::Open(file.path());
  if (!st.ok()) return 0;
  for (const auto& [k, v] : (*st)->metadata()) g_sink = g_sink + k.size() + v.size();
  for (const std::string& name : (*st)->TensorNames()) {
    auto t = (*st)->Tensor(name);
    if (!t.ok()) continue;
    const uint64_t n = static_cast<uint64_t>(strata::DTypeRowBytes(t->dtype, t->numel()));
    if (n == 0) continue;
    const auto* p = static_cast<const uint8_t*>(t->data);
    g_sink = g_sink + p[0] + p[n - 1];
  }
  return 0;
}
