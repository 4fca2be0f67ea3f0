// Weight-times-activation products (MatVec for decode, MatMul for prefill), all weight dtypes.
//
// Version log (what changed, what it measured; 2-core AMD EPYC Zen5 host, AVX3 target):
//   v1  One SIMD tile kernel DotTile<R rows, T tokens>: one f32 accumulator per (row, token) pair,
//       then SumOfLanes, then a scalar tail. MatVec runs R=4, T=1 on the native weight bytes
//       (f16/bf16 promoted on load, Q8_0 dequantized exactly as float(q) * d); MatMul converts a
//       tile of weight rows to f32 scratch once and runs R=4 x T=4 (T=2 below AVX3, 16 registers).
//       Because every (row, token) sum is formed by the same sequence of operations on the same
//       exactly-converted values, MatMul == MatVec == DotRow bit for bit (tested).
//   v2  Software prefetch 2 KiB ahead per streamed row (FP scheduler fills with FMAs waiting on
//       misses, which capped f16 at ~half the GB/s of f32). Q8_0 MatVec one row at a time.
//       Measured on a loaded shared 2-core host (medians of interleaved passes, ratio to the
//       same-moment MeasureReadBandwidth): MatVec 4096x4096 F16 0.83, F32 ~0.85-1.0,
//       Q8_0 0.50 (v1 with 4 rows: 0.32). MatMul 1 thread, 4096x4096: F16 40-56 GFLOP/s
//       (n=16..64), BF16 32-62, Q8_0 51-62, F32 52-110.
#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/buffer.h"
#include "core/check.h"
#include "core/dtype.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul.cc"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Weight loaders: N weights of a row starting at column c, as f32; Scalar() for the tail.
struct LoadF32 {
  static constexpr int64_t kBytes = 4;
  HWY_INLINE VF operator()(DF df, const uint8_t* row, int64_t c) const {
    return hn::LoadU(df, reinterpret_cast<const float*>(row) + c);
  }
  static float Scalar(const uint8_t* row, int64_t c) {
    return reinterpret_cast<const float*>(row)[c];
  }
};
struct LoadF16 {
  static constexpr int64_t kBytes = 2;
  HWY_INLINE VF operator()(DF df, const uint8_t* row, int64_t c) const {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(row) + c));
  }
  static float Scalar(const uint8_t* row, int64_t c) {
    return F16ToF32(reinterpret_cast<const uint16_t*>(row)[c]);
  }
};
struct LoadBF16 {
  static constexpr int64_t kBytes = 2;
  HWY_INLINE VF operator()(DF df, const uint8_t* row, int64_t c) const {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Rebind<uint32_t, DF> du32;
    const auto u = hn::PromoteTo(du32, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(row) + c));
    return hn::BitCast(df, hn::ShiftLeft<16>(u));
  }
  static float Scalar(const uint8_t* row, int64_t c) {
    return Bf16ToF32(reinterpret_cast<const uint16_t*>(row)[c]);
  }
};

// Finishes one (row, token) sum: lanes, then the scalar tail [c, K).
template <class L>
HWY_INLINE float Finish(DF df, VF acc, const uint8_t* w, const float* x, int64_t c, int64_t k) {
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  // Explicit fma: the compiler may contract `s += w * x` differently in each inlined caller, which
  // would break the bit-equality of MatVec and MatMul.
  for (; c < k; ++c) s = std::fma(L::Scalar(w, c), x[c], s);
  return s;
}

// out[r * T + t] = dot(w[r][0..k), x[t][0..k)) for R weight rows and T token vectors.
// Software prefetch distance for streamed weight rows. The FP scheduler fills with FMAs waiting on
// missed loads, which caps the misses in flight per element, not per byte (f16 MatVec ran at half
// the GB/s of f32 without it); prefetches do not wait on anything. A hint: never faults.
constexpr int64_t kPrefetchBytes = 2048;

template <int R, int T, class L, bool kPrefetch = false>
HWY_INLINE void DotTile(const uint8_t* const* w, const float* const* x, int64_t k, float* out) {
  const DF df;
  const L load;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  VF acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = hn::Zero(df);
  int64_t c = 0;
  for (; c + n <= k; c += n) {
    VF xv[T];
    for (int t = 0; t < T; ++t) xv[t] = hn::LoadU(df, x[t] + c);
    if constexpr (kPrefetch) {
      for (int r = 0; r < R; ++r) hwy::Prefetch(w[r] + c * L::kBytes + kPrefetchBytes);
    }
    for (int r = 0; r < R; ++r) {
      const VF wv = load(df, w[r], c);
      for (int t = 0; t < T; ++t) acc[r][t] = hn::MulAdd(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) out[r * T + t] = Finish<L>(df, acc[r][t], w[r], x[t], c, k);
}

constexpr bool kPrefetchQ8 = true;  // see kPrefetchBytes

// Q8_0 rows (k % 32 == 0): weights dequantized as float(q) * d (exact in f32), then the same
// accumulation sequence as DotTile over f32, so the result equals DotTile on dequantized rows.
template <int R>
HWY_INLINE void DotTileQ8(const uint8_t* const* w, const float* x, int64_t k, float* out) {
  const DF df;
  const hn::Rebind<int8_t, DF> di8;
  const hn::Rebind<int32_t, DF> di32;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  VF acc[R];
  for (int r = 0; r < R; ++r) acc[r] = hn::Zero(df);
  const int64_t nb = k / 32;
  for (int64_t b = 0; b < nb; ++b) {
    VF dv[R];
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(w[r]) + b;
      dv[r] = hn::Set(df, F16ToF32(blk->d));
    }
    if constexpr (kPrefetchQ8) {
      for (int r = 0; r < R; ++r) hwy::Prefetch(w[r] + b * sizeof(BlockQ8_0) + kPrefetchBytes);
    }
    for (int64_t j = 0; j < 32; j += n) {
      const VF xv = hn::LoadU(df, x + b * 32 + j);
      for (int r = 0; r < R; ++r) {
        const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(w[r]) + b;
        const VF q = hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, blk->qs + j)));
        acc[r] = hn::MulAdd(hn::Mul(q, dv[r]), xv, acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hn::GetLane(hn::SumOfLanes(df, acc[r]));
}

template <class L>
void MatVecRows(const TensorView& w, const float* x, float* y, int64_t r0, int64_t r1) {
  const int64_t k = w.cols();
  const float* xs[1] = {x};
  int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const uint8_t* rows[4] = {w.row(r), w.row(r + 1), w.row(r + 2), w.row(r + 3)};
    DotTile<4, 1, L, true>(rows, xs, k, y + r);
  }
  for (; r < r1; ++r) {
    const uint8_t* rows[1] = {w.row(r)};
    DotTile<1, 1, L, true>(rows, xs, k, y + r);
  }
}

void MatVecQ8Rows(const TensorView& w, const float* x, float* y, int64_t r0, int64_t r1) {
  const int64_t k = w.cols();
  // One row at a time: measured 0.50 of the read bandwidth against 0.32 for 4 rows sharing x
  // loads (fewer concurrent streams, the per-block scalar scale work dominates anyway).
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* rows[1] = {w.row(r)};
    DotTileQ8<1>(rows, x, k, y + r);
  }
}

void MatVecRangeImpl(const TensorView& w, const float* x, float* y, int64_t r0, int64_t r1) {
  switch (w.dtype) {
    case DType::kF32:
      return MatVecRows<LoadF32>(w, x, y, r0, r1);
    case DType::kF16:
      return MatVecRows<LoadF16>(w, x, y, r0, r1);
    case DType::kBF16:
      return MatVecRows<LoadBF16>(w, x, y, r0, r1);
    case DType::kQ8_0:
      return MatVecQ8Rows(w, x, y, r0, r1);
    default:
      STRATA_CHECK_MSG(false, "MatVec: unsupported weight dtype %d", int(w.dtype));
  }
}

float DotRowImpl(DType t, const void* row, const float* x, int64_t n) {
  const uint8_t* rows[1] = {static_cast<const uint8_t*>(row)};
  const float* xs[1] = {x};
  float out = 0.f;
  switch (t) {
    case DType::kF32:
      DotTile<1, 1, LoadF32>(rows, xs, n, &out);
      break;
    case DType::kF16:
      DotTile<1, 1, LoadF16>(rows, xs, n, &out);
      break;
    case DType::kBF16:
      DotTile<1, 1, LoadBF16>(rows, xs, n, &out);
      break;
    case DType::kQ8_0:
      DotTileQ8<1>(rows, x, n, &out);
      break;
    default:
      STRATA_CHECK_MSG(false, "DotRow: unsupported weight dtype %d", int(t));
  }
  return out;
}

// Converts one weight row of k values to f32 (exact for every dtype).
void RowToF32(DType t, const uint8_t* row, int64_t k, float* dst) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  int64_t c = 0;
  switch (t) {
    case DType::kF16: {
      const LoadF16 load;
      for (; c + n <= k; c += n) hn::StoreU(load(df, row, c), df, dst + c);
      for (; c < k; ++c) dst[c] = LoadF16::Scalar(row, c);
      break;
    }
    case DType::kBF16: {
      const LoadBF16 load;
      for (; c + n <= k; c += n) hn::StoreU(load(df, row, c), df, dst + c);
      for (; c < k; ++c) dst[c] = LoadBF16::Scalar(row, c);
      break;
    }
    case DType::kQ8_0: {
      const hn::Rebind<int8_t, DF> di8;
      const hn::Rebind<int32_t, DF> di32;
      const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(row);
      for (int64_t b = 0; b < k / 32; ++b) {
        const VF dv = hn::Set(df, F16ToF32(blk[b].d));
        for (int64_t j = 0; j < 32; j += n) {
          const VF q = hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, blk[b].qs + j)));
          hn::StoreU(hn::Mul(q, dv), df, dst + b * 32 + j);
        }
      }
      break;
    }
    default:
      STRATA_CHECK_MSG(false, "MatMul: unsupported weight dtype %d", int(t));
  }
}

// Tokens per micro-tile: 4 rows x 4 tokens needs 16 accumulators + 5 live vectors (32 registers on
// AVX-512); targets with 16 registers use 4 x 2.
#if HWY_TARGET <= HWY_AVX3
constexpr int kTokTile = 4;
#else
constexpr int kTokTile = 2;
#endif

template <int R, int T>
HWY_INLINE void Tile(const uint8_t* const* w, const float* const* x, int64_t k, float* out) {
  DotTile<R, T, LoadF32>(w, x, k, out);
}

template <int R>
void TileT(int nt, const uint8_t* const* w, const float* const* x, int64_t k, float* out) {
  switch (nt) {
    case 1:
      return Tile<R, 1>(w, x, k, out);
    case 2:
      return Tile<R, 2>(w, x, k, out);
#if HWY_TARGET <= HWY_AVX3
    case 3:
      return Tile<R, 3>(w, x, k, out);
    case 4:
      return Tile<R, 4>(w, x, k, out);
#endif
    default:
      STRATA_CHECK(false);
  }
}

void TileRT(int nr, int nt, const uint8_t* const* w, const float* const* x, int64_t k, float* out) {
  switch (nr) {
    case 1:
      return TileT<1>(nt, w, x, k, out);
    case 2:
      return TileT<2>(nt, w, x, k, out);
    case 3:
      return TileT<3>(nt, w, x, k, out);
    case 4:
      return TileT<4>(nt, w, x, k, out);
    default:
      STRATA_CHECK(false);
  }
}

void MatMulRangeImpl(const TensorView& w, const float* x, int64_t n_tok, int64_t x_stride, float* y,
                     int64_t y_stride, int64_t r0, int64_t r1) {
  const int64_t k = w.cols();
  // Rows per conversion tile: about 256 KiB of f32 (L2-resident), a multiple of 4, in [4, 32].
  int64_t rt = std::clamp<int64_t>((256 * 1024 / 4) / std::max<int64_t>(k, 1), 4, 32) & ~3;
  thread_local AlignedBuffer<float> scratch;
  const bool is_f32 = w.dtype == DType::kF32;
  if (!is_f32 && scratch.size() < static_cast<size_t>(rt * k)) scratch.Resize(rt * k);
  std::vector<const uint8_t*> rows(rt);
  for (int64_t ra = r0; ra < r1; ra += rt) {
    const int64_t nr = std::min(rt, r1 - ra);
    for (int64_t i = 0; i < nr; ++i) {
      if (is_f32) {
        rows[i] = w.row(ra + i);
      } else {
        float* dst = scratch.data() + i * k;
        RowToF32(w.dtype, w.row(ra + i), k, dst);
        rows[i] = reinterpret_cast<const uint8_t*>(dst);
      }
    }
    for (int64_t t0 = 0; t0 < n_tok; t0 += kTokTile) {
      const int nt = static_cast<int>(std::min<int64_t>(kTokTile, n_tok - t0));
      const float* xs[kTokTile];
      for (int t = 0; t < nt; ++t) xs[t] = x + (t0 + t) * x_stride;
      for (int64_t i = 0; i < nr; i += 4) {
        const int ni = static_cast<int>(std::min<int64_t>(4, nr - i));
        float out[4 * kTokTile];
        TileRT(ni, nt, rows.data() + i, xs, k, out);
        for (int r = 0; r < ni; ++r)
          for (int t = 0; t < nt; ++t) y[(t0 + t) * y_stride + ra + i + r] = out[r * nt + t];
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {

HWY_EXPORT(MatVecRangeImpl);
HWY_EXPORT(MatMulRangeImpl);
HWY_EXPORT(DotRowImpl);

namespace {
constexpr int64_t kRowGrain = 16;

void CheckWeight(const TensorView& w) {
  STRATA_CHECK_MSG(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16 ||
                       w.dtype == DType::kQ8_0,
                   "unsupported weight dtype %d", int(w.dtype));
  if (w.dtype == DType::kQ8_0)
    STRATA_CHECK_MSG(w.cols() % 32 == 0, "Q8_0 cols %lld", (long long)w.cols());
}
}  // namespace

void MatVec(const TensorView& w, const float* x, float* y, ThreadPool* pool) {
  CheckWeight(w);
  const int64_t rows = w.rows();
  if (pool == nullptr || pool->size() == 1 || rows < 2 * kRowGrain) {
    HWY_DYNAMIC_DISPATCH(MatVecRangeImpl)(w, x, y, 0, rows);
    return;
  }
  pool->ParallelForGrain(rows, kRowGrain, [&](int64_t b, int64_t e, int) {
    HWY_DYNAMIC_DISPATCH(MatVecRangeImpl)(w, x, y, b, e);
  });
}

void MatMul(const TensorView& w, const float* x, int64_t n, int64_t x_stride, float* y,
            int64_t y_stride, ThreadPool* pool) {
  CheckWeight(w);
  if (n <= 0) return;
  if (n == 1) {
    // One token: the streaming kernel (identical results, no conversion pass).
    MatVec(w, x, y, pool);
    return;
  }
  const int64_t rows = w.rows();
  if (pool == nullptr || pool->size() == 1 || rows < 2 * kRowGrain) {
    HWY_DYNAMIC_DISPATCH(MatMulRangeImpl)(w, x, n, x_stride, y, y_stride, 0, rows);
    return;
  }
  pool->ParallelForGrain(rows, kRowGrain, [&](int64_t b, int64_t e, int) {
    HWY_DYNAMIC_DISPATCH(MatMulRangeImpl)(w, x, n, x_stride, y, y_stride, b, e);
  });
}

float DotRow(DType t, const void* row, const float* x, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotRowImpl)(t, row, x, n);
}

void MatVecRef(const TensorView& w, const float* x, float* y) {
  const int64_t k = w.cols();
  std::vector<float> row(k);
  for (int64_t r = 0; r < w.rows(); ++r) {
    ToF32(w.dtype, w.row(r), row.data(), k);
    double s = 0;
    for (int64_t c = 0; c < k; ++c) s += static_cast<double>(row[c]) * x[c];
    y[r] = static_cast<float>(s);
  }
}

}  // namespace strata
#endif  // HWY_ONCE
