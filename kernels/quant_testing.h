// Test helper: random blocks of every block-quantized type with the scale/min corner cases, and a
// loop over every SIMD target of kernels/quant_dot.cc (which also compiles AVX3_DL).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "core/rng.h"
#include "hwy/targets.h"

namespace strata {

inline constexpr DType kQuantTypes[] = {DType::kQ4_0, DType::kQ4_1,  DType::kQ5_0,  DType::kQ5_1,
                                        DType::kQ8_0, DType::kQ2_K,  DType::kQ3_K,  DType::kQ4_K,
                                        DType::kQ5_K, DType::kQ6_K,  DType::kIQ4_NL, DType::kIQ4_XS};

// Where the fields of one block are: f16 scale fields (byte offsets), the integer sub-block scale
// bytes [sc_lo, sc_hi) and the code bytes [code_lo, code_hi) (codes 0 give the min part alone).
struct QuantBlockInfo {
  int f16[2];
  int n_f16;
  int sc_lo, sc_hi;
  int code_lo, code_hi;
  bool has_min;  // value = d * scale * code - min (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K)
};

inline QuantBlockInfo BlockInfo(DType t) {
  switch (t) {
    case DType::kQ4_0: return {{0, 0}, 1, 0, 0, 2, 18, false};
    case DType::kQ4_1: return {{0, 2}, 2, 0, 0, 4, 20, true};
    case DType::kQ5_0: return {{0, 0}, 1, 0, 0, 2, 22, false};
    case DType::kQ5_1: return {{0, 2}, 2, 0, 0, 4, 24, true};
    case DType::kQ8_0: return {{0, 0}, 1, 0, 0, 2, 34, false};
    case DType::kIQ4_NL: return {{0, 0}, 1, 0, 0, 2, 18, false};
    case DType::kQ2_K: return {{80, 82}, 2, 0, 16, 16, 80, true};
    case DType::kQ3_K: return {{108, 0}, 1, 96, 108, 0, 96, false};
    case DType::kQ4_K: return {{0, 2}, 2, 4, 16, 16, 144, true};
    case DType::kQ5_K: return {{0, 2}, 2, 4, 16, 16, 176, true};
    case DType::kQ6_K: return {{208, 0}, 1, 192, 208, 0, 192, false};
    case DType::kIQ4_XS: return {{0, 0}, 1, 2, 8, 8, 136, false};
    default: return {{0, 0}, 0, 0, 0, 0, 0, false};
  }
}

// One f16 scale: mostly ordinary magnitudes of either sign (so mins are negative too), else the
// corner cases: zero, the largest finite f16, the smallest subnormal, the smallest normal.
inline uint16_t RandomScaleF16(Rng& rng) {
  const uint16_t sign = rng.Below(2) ? 0x8000 : 0;
  switch (rng.Below(10)) {
    case 0: return sign;
    case 1: return sign | 0x7bff;  // 65504
    case 2: return sign | 0x0001;  // 2^-24
    case 3: return sign | 0x0400;  // 2^-14
    default: return F32ToF16(rng.UniformF(1e-3f, 2.f)) | sign;
  }
}

// nb random blocks of type t; each block draws its own corner cases (scales all zero, all ones =
// the largest 4/6-bit scales, codes all zero or all ones).
inline std::vector<uint8_t> RandomBlocks(DType t, int64_t nb, Rng& rng) {
  const int64_t bb = DTypeBlockBytes(t);
  const QuantBlockInfo info = BlockInfo(t);
  std::vector<uint8_t> v(nb * bb);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = v.data() + b * bb;
    for (int64_t i = 0; i < bb; ++i) p[i] = static_cast<uint8_t>(rng.Next());
    const uint64_t sc_mode = rng.Below(8);
    if (sc_mode == 0) std::memset(p + info.sc_lo, 0, info.sc_hi - info.sc_lo);
    if (sc_mode == 1) std::memset(p + info.sc_lo, 0xff, info.sc_hi - info.sc_lo);
    if (sc_mode == 2 && t == DType::kQ6_K) {
      for (int i = info.sc_lo; i < info.sc_hi; ++i) p[i] = rng.Below(2) ? 0x7f : 0x80;  // +-127/-128
    }
    const uint64_t code_mode = rng.Below(12);
    if (code_mode == 0) std::memset(p + info.code_lo, 0, info.code_hi - info.code_lo);
    if (code_mode == 1) std::memset(p + info.code_lo, 0xff, info.code_hi - info.code_lo);
    for (int f = 0; f < info.n_f16; ++f) {
      const uint16_t h = RandomScaleF16(rng);
      std::memcpy(p + info.f16[f], &h, 2);
    }
  }
  return v;
}

// The min part of every element (0 for the types without a min): the dequantized value of the
// block with its codes zeroed, e.g. -dmin * m_j for Q4_K.
inline std::vector<float> MinParts(DType t, const uint8_t* row, int64_t k) {
  std::vector<float> m(k, 0.f);
  const QuantBlockInfo info = BlockInfo(t);
  if (!info.has_min) return m;
  const int64_t bb = DTypeBlockBytes(t);
  const int64_t nb = k / DTypeBlockElems(t);
  std::vector<uint8_t> z(row, row + nb * bb);
  for (int64_t b = 0; b < nb; ++b) {
    std::memset(z.data() + b * bb + info.code_lo, 0, info.code_hi - info.code_lo);
  }
  DequantizeRow(t, z.data(), m.data(), k);
  return m;
}

// Runs body once per SIMD target of the quantized kernels that this CPU supports (AVX3_DL with
// VNNI, AVX3, AVX2, SSE4, EMU128), then restores the normal dispatch.
template <class F>
void ForEachQuantTarget(F&& body) {
  hwy::SetSupportedTargetsForTest(0);
  const int64_t supported = hwy::SupportedTargets();
  const int64_t targets[] = {HWY_AVX3_DL, HWY_AVX3, HWY_AVX2, HWY_SSE4, HWY_EMU128};
  for (int64_t target : targets) {
    if ((supported & target) == 0) continue;
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(testing::Message() << "SIMD target " << hwy::TargetName(target));
    body();
    if (testing::Test::HasFatalFailure()) break;
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace strata
