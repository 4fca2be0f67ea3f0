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
//   v3  MatVec streams one row at a time in address order. v2's 4 interleaved rows are 4 streams
//       1.5 KiB apart on 768-wide rows, which the hardware prefetchers did not follow (4 rows, no
//       software prefetch: 0.30-0.41 of the read bandwidth on the 125M llama shapes; v2:
//       0.36-0.63).
//       One row needs independent FMA chains, so the shared summation order is now kAcc
//       accumulators per row (see kAcc); MatMul keeps its R x T register tiles by converting rows
//       to a class-major layout and running one pass per accumulator class, so MatMul == MatVec ==
//       DotRow still holds bit for bit. Q8_0: same order, constant block offsets per round and a
//       SIMD scale conversion (cache-resident rate 8 -> 37 GB/s). Prefetch 8 KiB ahead of the row.
//       Measured on the same host under heavy load (9-11 runnable tasks on 2 cores, read bandwidth
//       14-20 GB/s instead of ~38; medians of interleaved passes, ratio to the same-moment
//       MeasureReadBandwidth), MatVec over all decode matrices of the synthetic 125M llama:
//       F16 0.54-0.59 -> 0.83-0.92 (1.5-1.6x), BF16 0.59-0.70 -> 1.07, Q8_0 0.51-0.62 ->
//       0.77-0.92, F32 0.57-0.75 -> 0.72-0.77; 150M deepseek2 F16 0.49-0.59 -> 0.90-0.96
//       (1.7x). Cache-resident F16 256x768: 93 -> 74 GB/s (x is re-read per row), still ~2x the
//       DRAM rate. MatMul vs v2, paired, 1 thread: 768/2048-wide shapes 0.86-1.0, 4096x4096 F16
//       0.66-0.95, F32 weights (now copied to the class-major scratch) 0.67-1.0. MatVecMany: q/k/v
//       and gate/up as one pool job in decode (1 thread: no change; 2 threads on the loaded host,
//       where every dispatch waits for a time slice: 1.6x on the 125M llama matrices).
//   v4  Quantized weights (Q4_0 ... IQ4_XS and Q8_0, issue 17): MatVec/MatVecMany/DotRow quantize x
//       once per call to int8 blocks and run the integer row dots of kernels/quant_dot.h (Q8_0's
//       exact f32-activation kernel is gone: it now carries the int8 activation error, as in
//       llama.cpp). Prefill: both paths measured on 2048 tokens, 1 thread, shapes 768x768,
//       2048x768, 768x2048 of the 125M llama (QuantDotBench.DISABLED_Prefill, GFLOP/s, host
//       heavily loaded): int8 per (row, token) with the row reused from L1 (MatMulInt8) Q4_0
//       20.0/23.8/24.2, Q8_0 23.4/26.7/32.9, Q4_K 16.5/22.1/21.0, Q6_K 22.2/15.6/24.0; rows
//       dequantized to f32 for the class-major GEMM Q4_0 77.0/35.0/25.7, Q8_0 33.9/38.5/32.9,
//       Q4_K 30.0/36.2/32.3, Q6_K 34.8/28.9/32.2 (F16 30.8/34.3/24.8). MatMul takes the f32 path
//       (the int8 path re-unpacks each weight row per token; a register-tiled int8 GEMM that
//       unpacks once for several tokens is the next step), so MatMul == MatVec bit for bit now
//       holds for F32/F16/BF16 and for n = 1; MatMulInt8 == MatVec for every dtype.
//   v5  MatVecBatch (issue 16: one decode step for B sequences, each weight row streamed from
//       memory once per step, each (row, sequence) equal to MatVec bit for bit). Float weights:
//       DotTokens (one row, T = 4 tokens, each token DotOne's kAcc accumulators, the weight
//       vector converted once for the 4) vs the MatMul tiles over class-major rows and tokens.
//       1 thread, GFLOP/s, best of 7 interleaved passes, host loaded (load average 4-6 on 2
//       cores), DotTokens / tiles: F16 768x768 B=2 63/44, B=4 78/80, B=8 123/110, B=16 95/133,
//       B=64 72/162; F16 3072x768 B=4 116/79, B=8 116/106, B=16 60/108, B=64 55/112; F16
//       768x3072 B=4 94/72, B=8 68/95, B=16 71/109; F32 and BF16 alike (BF16 768x768 B=64
//       54/158). DotTokens below B = 8, the tiles from 8 on. Quantized weights: the int8 path of
//       QuantMatMulRows (each row reused from L1 for up to 64 tokens), as MatVec's arithmetic;
//       for the 32-element formats it now unpacks each 8-block group of a row once for 4 tokens
//       (Dot32Tokens). `bench decode --batch` on the 125M Q8_0 llama, ctx 512, 2 threads, loaded
//       host: aggregate tok/s at B = 16 103-108 -> 158-184, B = 64 124-129 -> 176-267.
//   v6  Prefill of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K on x86 AVX2 / AVX-512: the integer
//       GEMM of kernels/quant_gemm.h (MatMulIntGemm; each (row, token) equals MatVec bit for bit)
//       instead of the f32 GEMM over dequantized tiles (kept as MatMulDequant). Predicted from
//       instruction counts per 32 weights (kernels/quant_gemm.cc): the GEMM ~1.5-1.75x where k is
//       long, ~1.1x at k = 576; with the GEMM ~70-80 % of a 2048-token prefill (attention most of
//       the rest), prefill ~1.1-1.5x. Measured 2026-12-07 on the 2-core AMD EPYC Zen 5 host
//       (avx512_vnni, avx_vnni, no AMX; shared with a training job, load 3-5), `strata bench
//       prefill -m FILE --tokens 2048 --rounds 1 -t T` with STRATA_QUANT_PREFILL=dequant and
//       without, interleaved per round, tok/s dequantizing -> integer (rounds):
//       1 thread: SmolLM2-135M Q4_1 361-463 -> 526-590 (3 rounds), Gemma 3 270M Q4_K_M 404-420 ->
//       535-550 (3), SmolLM2 requantized (strata quantize --allow-requantize) to Q4_0 459-471 ->
//       617-625, Q8_0 444-461 -> 649-672, Q6_K (mostly Q8_0: 576-wide rows are no whole Q6_K
//       block) 420-465 -> 495-559, Q4_K_M (mostly Q5_0/Q8_0) 427-463 -> 514-545 (2 rounds each);
//       2 threads (the second core is busy with other work, so no faster than 1): SmolLM2 Q4_1
//       357-400 -> 490-514, Gemma 3 364-397 -> 464-505, Q4_0 420-445 -> 567-585, Q8_0 449-457
//       -> 592-609, Q6_K 434-442 -> 537-539, Q4_K_M 429-441 -> 555-556.
//       Numbers: prefill now carries the int8 activation error that decode always had
//       (kernels/quant_dot.h): perplexity of the first 1024 haystack tokens (eval/
//       real_models_test.cc) SmolLM2 3.9322 -> 3.9479, Gemma 3 2.2287 -> 2.2541; greedy text of
//       the 12 testbed files quantized to Q4_0/Q4_1/Q5_0/Q8_0/Q4_K_M/Q6_K equals prefill with
//       --chunk 1 (MatVec per token) on 2 prompts each, and differs from the dequantizing path's on
//       4 of those 24 after a few tokens; `strata generate -n 32 --temp 0` on the real models:
//       SmolLM2 the same text on both paths, Gemma 3 parts from the dequantizing path's after 14
//       tokens; both still give llama.cpp's greedy text in eval/real_models_test.cc.
#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/buffer.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/quant.h"
#include "core/scratch.h"
#include "kernels/quant_dot.h"
#include "kernels/quant_gemm.h"

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

// Summation order, shared by every kernel below so that MatVec == DotRow == MatMul bit for bit:
// vector v of a row (columns [v N, v N + N), N = lanes) is added by fma into accumulator
// v % kAcc, in increasing v; the kAcc accumulators are then added pairwise (SumAcc), the lanes
// summed (SumOfLanes), and the k % N tail columns added by scalar fma. kAcc independent chains
// hide the FMA latency while a single row is streamed in address order (see the version log).
// 64 columns per round of accumulators on 512- and 256-bit targets, 32 on 128-bit (which has
// only 16 registers).
#if HWY_MAX_BYTES >= 64
constexpr int kAcc = 4;
#else
constexpr int kAcc = 8;
#endif

// Pairwise: (a0 + a2) + (a1 + a3), or for 8: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
HWY_INLINE VF SumAcc(const VF* a) {
#if HWY_MAX_BYTES >= 64
  return hn::Add(hn::Add(a[0], a[2]), hn::Add(a[1], a[3]));
#else
  return hn::Add(hn::Add(hn::Add(a[0], a[4]), hn::Add(a[2], a[6])),
                 hn::Add(hn::Add(a[1], a[5]), hn::Add(a[3], a[7])));
#endif
}

// Finishes one (row, token) sum: lanes, then the scalar tail [c, K).
template <class L>
HWY_INLINE float Finish(DF df, VF acc, const uint8_t* w, const float* x, int64_t c, int64_t k) {
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  // Explicit fma: the compiler may contract `s += w * x` differently in each inlined caller, which
  // would break the bit-equality of MatVec and MatMul.
  for (; c < k; ++c) s = std::fma(L::Scalar(w, c), x[c], s);
  return s;
}

// Software prefetch distance for the streamed weight row (a hint: never faults; past a matrix end
// it reads at most this many unused bytes). One row is read in address order, which the hardware
// prefetchers follow; the software prefetch keeps more misses in flight and runs ahead across
// 4 KiB page boundaries, where hardware stream prefetchers stop. Measured on the decode shapes:
// 2 KiB < 4 KiB < 8..16 KiB (flat), see the version log.
constexpr int64_t kPrefetchBytes = 8192;

// dot(w[0..k), x[0..k)) for one weight row in the shared summation order.
template <class L, bool kPrefetch = false>
HWY_INLINE float DotOne(const uint8_t* w, const float* x, int64_t k) {
  const DF df;
  const L load;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  VF acc[kAcc];
  for (int a = 0; a < kAcc; ++a) acc[a] = hn::Zero(df);
  int64_t c = 0;
  for (; c + kAcc * n <= k; c += kAcc * n) {
    if constexpr (kPrefetch) {
      // The bytes of this round, one prefetch per 64-byte line.
      for (int64_t b = 0; b < kAcc * n * L::kBytes; b += 64) {
        hwy::Prefetch(w + c * L::kBytes + kPrefetchBytes + b);
      }
    }
    for (int a = 0; a < kAcc; ++a) {
      acc[a] = hn::MulAdd(load(df, w, c + a * n), hn::LoadU(df, x + c + a * n), acc[a]);
    }
  }
  // The last (k - c) / N < kAcc full vectors; compile-time indices keep acc in registers.
  const int64_t rem = (k - c) / n;
  for (int a = 0; a < kAcc; ++a) {
    if (a < rem) acc[a] = hn::MulAdd(load(df, w, c + a * n), hn::LoadU(df, x + c + a * n), acc[a]);
  }
  return Finish<L>(df, SumAcc(acc), w, x, c + rem * n, k);
}

// Rows [r0, r1) one after another: each row is one address-ordered stream (the v1 tiles of 4
// interleaved rows defeated the hardware prefetchers on short rows).
template <class L>
void MatVecRows(const TensorView& w, const float* x, float* y, int64_t r0, int64_t r1) {
  const int64_t k = w.cols();
  const int64_t rb = w.row_bytes();
  const uint8_t* row = w.row(r0);
  for (int64_t r = r0; r < r1; ++r, row += rb) y[r] = DotOne<L, true>(row, x, k);
}

void MatVecRangeImpl(const TensorView& w, const float* x, float* y, int64_t r0, int64_t r1) {
  switch (w.dtype) {
    case DType::kF32:
      return MatVecRows<LoadF32>(w, x, y, r0, r1);
    case DType::kF16:
      return MatVecRows<LoadF16>(w, x, y, r0, r1);
    case DType::kBF16:
      return MatVecRows<LoadBF16>(w, x, y, r0, r1);
    default:
      // Quantized weights take the integer kernels (kernels/quant_dot.h) before dispatch here.
      STRATA_CHECK_MSG(false, "MatVec: unsupported weight dtype %d", int(w.dtype));
  }
}

// The dot products of one weight row with T token vectors in DotOne's summation order, each
// token with its own kAcc accumulators (the same fma sequence on the same values, so each result
// equals DotOne(w, x[t]) bit for bit); each weight vector is loaded and converted once for the T
// tokens. T = 4 on AVX-512: 16 accumulators + the weight and x vectors fit its 32 registers.
template <class L, int T, bool kPrefetch>
HWY_INLINE void DotTokens(const uint8_t* w, const float* const* x, int64_t k, float* out) {
  const DF df;
  const L load;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  VF acc[T][kAcc];
  for (int t = 0; t < T; ++t)
    for (int a = 0; a < kAcc; ++a) acc[t][a] = hn::Zero(df);
  int64_t c = 0;
  for (; c + kAcc * n <= k; c += kAcc * n) {
    if constexpr (kPrefetch) {
      for (int64_t b = 0; b < kAcc * n * L::kBytes; b += 64) {
        hwy::Prefetch(w + c * L::kBytes + kPrefetchBytes + b);
      }
    }
    for (int a = 0; a < kAcc; ++a) {
      const VF wv = load(df, w, c + a * n);
      for (int t = 0; t < T; ++t) {
        acc[t][a] = hn::MulAdd(wv, hn::LoadU(df, x[t] + c + a * n), acc[t][a]);
      }
    }
  }
  const int64_t rem = (k - c) / n;
  for (int a = 0; a < kAcc; ++a) {
    if (a < rem) {
      const VF wv = load(df, w, c + a * n);
      for (int t = 0; t < T; ++t) {
        acc[t][a] = hn::MulAdd(wv, hn::LoadU(df, x[t] + c + a * n), acc[t][a]);
      }
    }
  }
  for (int t = 0; t < T; ++t) out[t] = Finish<L>(df, SumAcc(acc[t]), w, x[t], c + rem * n, k);
}

// Tokens per DotTokens tile (see there); 16-register targets run one token at a time, the row
// re-read from L1 for each.
#if HWY_TARGET <= HWY_AVX3
constexpr int kBatchTile = 4;
#else
constexpr int kBatchTile = 1;
#endif

// MatVecBatch rows [r0, r1) for float weights: each row streamed once (with MatVec's software
// prefetch on its first tile of tokens), then reused from L1 for the remaining tiles.
template <class L>
void MatVecBatchRows(const TensorView& w, const float* x, int64_t nb, int64_t x_stride, float* y,
                     int64_t y_stride, int64_t r0, int64_t r1) {
  const int64_t k = w.cols();
  const int64_t rb = w.row_bytes();
  const uint8_t* row = w.row(r0);
  for (int64_t r = r0; r < r1; ++r, row += rb) {
    for (int64_t t0 = 0; t0 < nb; t0 += kBatchTile) {
      const int nt = static_cast<int>(std::min<int64_t>(kBatchTile, nb - t0));
      const float* xs[kBatchTile];
      float out[kBatchTile];
      for (int t = 0; t < nt; ++t) xs[t] = x + (t0 + t) * x_stride;
      if (nt == kBatchTile) {
        if (t0 == 0) {
          DotTokens<L, kBatchTile, true>(row, xs, k, out);
        } else {
          DotTokens<L, kBatchTile, false>(row, xs, k, out);
        }
      } else {
        for (int t = 0; t < nt; ++t) DotTokens<L, 1, false>(row, xs + t, k, out + t);
      }
      for (int t = 0; t < nt; ++t) y[(t0 + t) * y_stride + r] = out[t];
    }
  }
}

void MatVecBatchRangeImpl(const TensorView& w, const float* x, int64_t nb, int64_t x_stride,
                          float* y, int64_t y_stride, int64_t r0, int64_t r1) {
  switch (w.dtype) {
    case DType::kF32:
      return MatVecBatchRows<LoadF32>(w, x, nb, x_stride, y, y_stride, r0, r1);
    case DType::kF16:
      return MatVecBatchRows<LoadF16>(w, x, nb, x_stride, y, y_stride, r0, r1);
    case DType::kBF16:
      return MatVecBatchRows<LoadBF16>(w, x, nb, x_stride, y, y_stride, r0, r1);
    default:
      STRATA_CHECK_MSG(false, "MatVecBatch: unsupported weight dtype %d", int(w.dtype));
  }
}

float DotRowImpl(DType t, const void* row, const float* x, int64_t n) {
  const uint8_t* w = static_cast<const uint8_t*>(row);
  switch (t) {
    case DType::kF32:
      return DotOne<LoadF32>(w, x, n);
    case DType::kF16:
      return DotOne<LoadF16>(w, x, n);
    case DType::kBF16:
      return DotOne<LoadBF16>(w, x, n);
    default:
      STRATA_CHECK_MSG(false, "DotRow: unsupported weight dtype %d", int(t));
  }
  return 0.f;
}

// MatMul layout ("class-major"): a row of k values converted exactly to f32 with its full
// vectors grouped by accumulator class, vectors a, a + kAcc, a + 2 kAcc, ... for a = 0, 1, ...,
// then the k % N tail columns in place. Each class is then one contiguous stream for the tiles.
// First column of class a's segment, for nv full vectors of n lanes.
HWY_INLINE int64_t ClassStart(int64_t a, int64_t nv, int64_t n) {
  int64_t vecs = 0;
  for (int64_t b = 0; b < a; ++b) vecs += nv > b ? (nv - b - 1) / kAcc + 1 : 0;
  return vecs * n;
}

// Q8_0 weights as a loader: float(q) * d, exact (k % 32 == 0, so Scalar serves no tail).
struct LoadQ8 {
  HWY_INLINE VF operator()(DF df, const uint8_t* row, int64_t c) const {
    const hn::Rebind<int8_t, DF> di8;
    const hn::Rebind<int32_t, DF> di32;
    const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(row)[c / 32];
    const VF q = hn::ConvertTo(df, hn::PromoteTo(di32, hn::LoadU(di8, blk.qs + c % 32)));
    return hn::Mul(q, hn::Set(df, F16ToF32(blk.d)));
  }
  static float Scalar(const uint8_t* row, int64_t c) {
    const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(row)[c / 32];
    return static_cast<float>(blk.qs[c % 32]) * F16ToF32(blk.d);
  }
};

template <class L>
void ToClassMajorT(const uint8_t* row, int64_t k, float* dst) {
  const DF df;
  const L load;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t nv = k / n;
  // Reads the row in address order, writes kAcc class streams.
  float* d[kAcc];
  for (int a = 0; a < kAcc; ++a) d[a] = dst + ClassStart(a, nv, n);
  int64_t v = 0;
  for (; v + kAcc <= nv; v += kAcc) {
    for (int a = 0; a < kAcc; ++a, d[a - 1] += n) hn::StoreU(load(df, row, (v + a) * n), df, d[a]);
  }
  for (int a = 0; v < nv; ++v, ++a) hn::StoreU(load(df, row, v * n), df, d[a]);
  for (int64_t c = nv * n; c < k; ++c) dst[c] = L::Scalar(row, c);
}

void ToClassMajor(DType t, const void* row, int64_t k, float* dst) {
  const uint8_t* p = static_cast<const uint8_t*>(row);
  switch (t) {
    case DType::kF32:
      return ToClassMajorT<LoadF32>(p, k, dst);
    case DType::kF16:
      return ToClassMajorT<LoadF16>(p, k, dst);
    case DType::kBF16:
      return ToClassMajorT<LoadBF16>(p, k, dst);
    case DType::kQ8_0:
      return ToClassMajorT<LoadQ8>(p, k, dst);
    default: {
      STRATA_CHECK_MSG(IsQuantized(t), "MatMul: unsupported weight dtype %d", int(t));
      thread_local AlignedBuffer<float> f;
      if (f.size() < static_cast<size_t>(k)) f.Resize(k);
      DequantizeRow(t, row, f.data(), k);
      return ToClassMajorT<LoadF32>(reinterpret_cast<const uint8_t*>(f.data()), k, dst);
    }
  }
}

// Tokens per micro-tile: 4 rows x 4 tokens needs 16 accumulators + 5 live vectors (32 registers on
// AVX-512); targets with 16 registers use 4 x 2.
#if HWY_TARGET <= HWY_AVX3
constexpr int kTokTile = 4;
#else
constexpr int kTokTile = 2;
#endif

// out[r * T + t] = dot(w[r], x[t]) for R weight rows and T token vectors, all class-major f32
// rows of k values, in the shared summation order: one contiguous pass per accumulator class with
// R x T accumulators live (each weight load reused T times, each x load R times), then SumAcc per
// (row, token). start[a] = ClassStart(a), a = 0..kAcc.
template <int R, int T>
HWY_INLINE void Tile(const float* const* w, const float* const* x, int64_t k, const int64_t* start,
                     float* out) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  VF part[R][T][kAcc];
  for (int a = 0; a < kAcc; ++a) {
    VF acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = hn::Zero(df);
    for (int64_t c = start[a]; c < start[a + 1]; c += n) {
      VF xv[T];
      for (int t = 0; t < T; ++t) xv[t] = hn::LoadU(df, x[t] + c);
      for (int r = 0; r < R; ++r) {
        const VF wv = hn::LoadU(df, w[r] + c);
        for (int t = 0; t < T; ++t) acc[r][t] = hn::MulAdd(wv, xv[t], acc[r][t]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) part[r][t][a] = acc[r][t];
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      const uint8_t* wr = reinterpret_cast<const uint8_t*>(w[r]);
      out[r * T + t] = Finish<LoadF32>(df, SumAcc(part[r][t]), wr, x[t], start[kAcc], k);
    }
  }
}

template <int R>
void TileT(int nt, const float* const* w, const float* const* x, int64_t k, const int64_t* start,
           float* out) {
  switch (nt) {
    case 1:
      return Tile<R, 1>(w, x, k, start, out);
    case 2:
      return Tile<R, 2>(w, x, k, start, out);
#if HWY_TARGET <= HWY_AVX3
    case 3:
      return Tile<R, 3>(w, x, k, start, out);
    case 4:
      return Tile<R, 4>(w, x, k, start, out);
#endif
    default:
      STRATA_CHECK(false);
  }
}

void TileRT(int nr, int nt, const float* const* w, const float* const* x, int64_t k,
            const int64_t* start, float* out) {
  switch (nr) {
    case 1:
      return TileT<1>(nt, w, x, k, start, out);
    case 2:
      return TileT<2>(nt, w, x, k, start, out);
    case 3:
      return TileT<3>(nt, w, x, k, start, out);
    case 4:
      return TileT<4>(nt, w, x, k, start, out);
    default:
      STRATA_CHECK(false);
  }
}

// Rows [r0, r1) of Y for class-major tokens xc [n_tok, k].
void MatMulRows(const TensorView& w, const float* xc, int64_t n_tok, float* y, int64_t y_stride,
                int64_t r0, int64_t r1) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t k = w.cols();
  int64_t start[kAcc + 1];
  for (int a = 0; a <= kAcc; ++a) start[a] = ClassStart(a, k / n, n);
  // Rows per conversion tile: about 256 KiB of f32 (L2-resident), a multiple of 4, in [4, 32].
  const int64_t rt = std::clamp<int64_t>((256 * 1024 / 4) / std::max<int64_t>(k, 1), 4, 32) & ~3;
  thread_local AlignedBuffer<float> scratch;
  if (scratch.size() < static_cast<size_t>(rt * k)) scratch.Resize(rt * k);
  std::vector<const float*> rows(rt);
  for (int64_t ra = r0; ra < r1; ra += rt) {
    const int64_t nr = std::min(rt, r1 - ra);
    for (int64_t i = 0; i < nr; ++i) {
      float* dst = scratch.data() + i * k;
      ToClassMajor(w.dtype, w.row(ra + i), k, dst);
      rows[i] = dst;
    }
    for (int64_t t0 = 0; t0 < n_tok; t0 += kTokTile) {
      const int nt = static_cast<int>(std::min<int64_t>(kTokTile, n_tok - t0));
      const float* xs[kTokTile];
      for (int t = 0; t < nt; ++t) xs[t] = xc + (t0 + t) * k;
      for (int64_t i = 0; i < nr; i += 4) {
        const int ni = static_cast<int>(std::min<int64_t>(4, nr - i));
        float out[4 * kTokTile];
        TileRT(ni, nt, rows.data() + i, xs, k, start, out);
        for (int r = 0; r < ni; ++r)
          for (int t = 0; t < nt; ++t) y[(t0 + t) * y_stride + ra + i + r] = out[r * nt + t];
      }
    }
  }
}

// The tokens are put in class-major order once (shared by all threads), then rows are split.
void MatMulImpl(const TensorView& w, const float* x, int64_t n_tok, int64_t x_stride, float* y,
                int64_t y_stride, int64_t grain, ThreadPool* pool) {
  const int64_t k = w.cols();
  ScratchScope ws;
  std::span<float> xc = ws.Floats(n_tok * k);
  for (int64_t t = 0; t < n_tok; ++t) {
    ToClassMajorT<LoadF32>(reinterpret_cast<const uint8_t*>(x + t * x_stride), k,
                           xc.data() + t * k);
  }
  const int64_t rows = w.rows();
  if (pool == nullptr || pool->size() == 1 || rows < 2 * grain) {
    MatMulRows(w, xc.data(), n_tok, y, y_stride, 0, rows);
    return;
  }
  pool->ParallelForGrain(rows, grain, [&](int64_t b, int64_t e, int) HWY_ATTR {
    MatMulRows(w, xc.data(), n_tok, y, y_stride, b, e);
  });
}

// MatVecBatch for float weights through the prefill GEMM's tiles (equal to MatVec bit for bit
// for F32/F16/BF16): nb token vectors put in class-major order once, then rows [r0, r1).
void ClassMajorTokensImpl(const float* x, int64_t nb, int64_t x_stride, int64_t k, float* xc) {
  for (int64_t t = 0; t < nb; ++t) {
    ToClassMajorT<LoadF32>(reinterpret_cast<const uint8_t*>(x + t * x_stride), k, xc + t * k);
  }
}
void MatMulRowsImpl(const TensorView& w, const float* xc, int64_t nb, float* y, int64_t y_stride,
                    int64_t r0, int64_t r1) {
  MatMulRows(w, xc, nb, y, y_stride, r0, r1);
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {

HWY_EXPORT(MatVecRangeImpl);
HWY_EXPORT(MatMulImpl);
HWY_EXPORT(DotRowImpl);
HWY_EXPORT(MatVecBatchRangeImpl);
HWY_EXPORT(ClassMajorTokensImpl);
HWY_EXPORT(MatMulRowsImpl);

namespace {
constexpr int64_t kRowGrain = 16;

// The calling thread's quantized activations: slot 0 for the 32-element activation blocks, 1 for
// the 256-element ones (MatVecMany may mix both, e.g. Q4_K and Q6_K in a Q4_K_M layer). The pool
// workers read the caller's buffer while the caller waits in ParallelForGrain.
// `n` vectors of k elements (MatVecBatch) are ActivationBytes(t, k) apart.
uint8_t* ActBuffer(DType t, int64_t k, int64_t n = 1) {
  thread_local AlignedBuffer<uint8_t> buf[2];
  AlignedBuffer<uint8_t>& b = buf[ActivationBlockElems(t) == 256 ? 1 : 0];
  const int64_t bytes = ActivationBytes(t, k) * n;
  if (b.size() < static_cast<size_t>(bytes)) b.Resize(bytes);
  return b.data();
}

// Rows [r0, r1) of a quantized weight against quantized activations.
void QuantRows(const TensorView& w, const uint8_t* act, float* y, int64_t r0, int64_t r1) {
  if (r1 > r0) QuantDotRows(w.dtype, w.row(r0), w.row_bytes(), act, w.cols(), y + r0, r1 - r0);
}

void CheckWeight(const TensorView& w) {
  STRATA_CHECK_MSG(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16 ||
                       IsQuantized(w.dtype),
                   "unsupported weight dtype %d", int(w.dtype));
  STRATA_CHECK_MSG(w.cols() % DTypeBlockElems(w.dtype) == 0, "%s cols %lld",
                   std::string(DTypeName(w.dtype)).c_str(), (long long)w.cols());
}
}  // namespace

namespace {
// STRATA_QUANT_PREFILL=dequant: prefill of quantized weights through the dequantizing f32 GEMM
// even where the integer GEMM serves the type (for comparisons of the two paths; read once).
bool DequantPrefillForced() {
  static const bool forced = [] {
    const char* e = std::getenv("STRATA_QUANT_PREFILL");
    return e != nullptr && std::strcmp(e, "dequant") == 0;
  }();
  return forced;
}

// The integer prefill GEMM (kernels/quant_gemm.h): every token quantized to int8 blocks as MatVec
// does and put in the GEMM's layout once (tokens split across the pool), then rows split across
// the pool. Each (row, token) equals MatVec of that token bit for bit.
void MatMulIntGemm(const TensorView& w, const float* x, int64_t n, int64_t x_stride, float* y,
                   int64_t y_stride, ThreadPool* pool) {
  const DType t = w.dtype;
  const int64_t k = w.cols();
  const int64_t tb = QuantGemmTokenBytes(t, k);
  ScratchScope ws;
  std::span<uint8_t> toks = ws.U8(static_cast<size_t>(n * tb));
  auto prepare = [&](int64_t b, int64_t e) {
    uint8_t* act = ActBuffer(t, k);  // this thread's
    for (int64_t j = b; j < e; ++j) {
      QuantizeActivations(t, x + j * x_stride, k, act);
      PrepareQuantGemmToken(t, act, k, toks.data() + j * tb);
    }
  };
  auto rows = [&](int64_t b, int64_t e) {
    QuantGemmRows(w, toks.data(), tb, n, y, y_stride, b, e);
  };
  if (pool == nullptr || pool->size() == 1) {
    prepare(0, n);
    rows(0, w.rows());
    return;
  }
  pool->ParallelForGrain(n, 8, [&](int64_t b, int64_t e, int) { prepare(b, e); });
  if (w.rows() < 2 * kRowGrain) {
    rows(0, w.rows());
    return;
  }
  pool->ParallelForGrain(w.rows(), kRowGrain, [&](int64_t b, int64_t e, int) { rows(b, e); });
}
}  // namespace

void MatVec(const TensorView& w, const float* x, float* y, ThreadPool* pool) {
  CheckWeight(w);
  const int64_t rows = w.rows();
  if (IsQuantized(w.dtype)) {
    // x is quantized once to int8 blocks, then every row is an integer dot product.
    uint8_t* act = ActBuffer(w.dtype, w.cols());
    QuantizeActivations(w.dtype, x, w.cols(), act);
    if (pool == nullptr || pool->size() == 1 || rows < 2 * kRowGrain) {
      QuantRows(w, act, y, 0, rows);
      return;
    }
    pool->ParallelForGrain(rows, kRowGrain,
                           [&](int64_t b, int64_t e, int) { QuantRows(w, act, y, b, e); });
    return;
  }
  if (pool == nullptr || pool->size() == 1 || rows < 2 * kRowGrain) {
    HWY_DYNAMIC_DISPATCH(MatVecRangeImpl)(w, x, y, 0, rows);
    return;
  }
  pool->ParallelForGrain(rows, kRowGrain, [&](int64_t b, int64_t e, int) {
    HWY_DYNAMIC_DISPATCH(MatVecRangeImpl)(w, x, y, b, e);
  });
}

void MatVecMany(const MatVecJob* jobs, int n_jobs, const float* x, ThreadPool* pool) {
  int64_t total = 0;
  for (int j = 0; j < n_jobs; ++j) {
    CheckWeight(jobs[j].w);
    STRATA_CHECK_MSG(jobs[j].w.cols() == jobs[0].w.cols(), "MatVecMany: cols %lld vs %lld",
                     (long long)jobs[j].w.cols(), (long long)jobs[0].w.cols());
    total += jobs[j].w.rows();
  }
  // x quantized once per activation block size the quantized jobs need (at most two).
  uint8_t* act[2] = {nullptr, nullptr};
  for (int j = 0; j < n_jobs; ++j) {
    const DType t = jobs[j].w.dtype;
    if (!IsQuantized(t)) continue;
    uint8_t*& a = act[ActivationBlockElems(t) == 256 ? 1 : 0];
    if (a == nullptr) {
      a = ActBuffer(t, jobs[0].w.cols());
      QuantizeActivations(t, x, jobs[0].w.cols(), a);
    }
  }
  // Rows [b, e) of the concatenation, job by job.
  auto run = [&](int64_t b, int64_t e) {
    int64_t off = 0;
    for (int j = 0; j < n_jobs && off < e; ++j) {
      const int64_t rows = jobs[j].w.rows();
      const int64_t lo = std::max(b, off), hi = std::min(e, off + rows);
      const DType t = jobs[j].w.dtype;
      if (lo < hi && IsQuantized(t)) {
        QuantRows(jobs[j].w, act[ActivationBlockElems(t) == 256 ? 1 : 0], jobs[j].y, lo - off,
                  hi - off);
      } else if (lo < hi) {
        HWY_DYNAMIC_DISPATCH(MatVecRangeImpl)(jobs[j].w, x, jobs[j].y, lo - off, hi - off);
      }
      off += rows;
    }
  };
  if (pool == nullptr || pool->size() == 1 || total < 2 * kRowGrain) {
    run(0, total);
    return;
  }
  pool->ParallelForGrain(total, kRowGrain, [&](int64_t b, int64_t e, int) { run(b, e); });
}

namespace {
// The B activation vectors of X quantized for weight type t, ActivationBytes(t, k) apart, in the
// calling thread's buffer (the pool workers read it while the caller waits).
uint8_t* QuantizeBatch(DType t, const float* x, int64_t nb, int64_t x_stride, int64_t k) {
  const int64_t ab = ActivationBytes(t, k);
  uint8_t* act = ActBuffer(t, k, nb);
  for (int64_t b = 0; b < nb; ++b) QuantizeActivations(t, x + b * x_stride, k, act + b * ab);
  return act;
}

// Float weights: from this batch size on, MatVecBatch runs the prefill GEMM's 4 x 4 register
// tiles over class-major rows (MatMulRows, equal to MatVec bit for bit) instead of DotTokens (one
// row, 4 tokens, kAcc accumulators each): measured (v5 in the version log) DotTokens faster at
// B <= 4 (no conversion pass), the tiles from B = 8 to 16 on (DotTokens' B token vectors leave L1).
constexpr int64_t kTileMinBatch = 8;

// Rows [r0, r1) of one batched product (act: QuantizeBatch's vectors for a quantized w; xc: the
// class-major tokens for the float tiles, null for DotTokens).
void BatchRows(const TensorView& w, const float* x, const uint8_t* act, const float* xc, int64_t nb,
               int64_t x_stride, float* y, int64_t y_stride, int64_t r0, int64_t r1) {
  if (r1 <= r0) return;
  if (xc != nullptr) {
    HWY_DYNAMIC_DISPATCH(MatMulRowsImpl)(w, xc, nb, y, y_stride, r0, r1);
  } else if (IsQuantized(w.dtype)) {
    // Each row is reused from L1 for up to 64 tokens (quant_dot.cc), so for B <= 64 every row is
    // streamed from memory once.
    QuantMatMulRows(w, act, ActivationBytes(w.dtype, w.cols()), nb, y, y_stride, r0, r1);
  } else {
    HWY_DYNAMIC_DISPATCH(MatVecBatchRangeImpl)(w, x, nb, x_stride, y, y_stride, r0, r1);
  }
}

// The nb token vectors in class-major order for the float tiles, in the calling thread's buffer
// (reused across calls: a fresh allocation of this size per product costs page faults; the pool
// workers read it while the caller waits).
const float* ClassMajorTokens(const float* x, int64_t nb, int64_t x_stride, int64_t k) {
  thread_local AlignedBuffer<float> buf;
  if (buf.size() < static_cast<size_t>(nb * k)) buf.Resize(nb * k);
  HWY_DYNAMIC_DISPATCH(ClassMajorTokensImpl)(x, nb, x_stride, k, buf.data());
  return buf.data();
}

void CheckBatch(const TensorView& w, int64_t nb, int64_t x_stride, int64_t y_stride) {
  CheckWeight(w);
  STRATA_CHECK_MSG(nb >= 1, "MatVecBatch: batch of %lld", (long long)nb);
  STRATA_CHECK_MSG(nb == 1 || (x_stride >= w.cols() && y_stride >= w.rows()),
                   "MatVecBatch: strides %lld/%lld for a [%lld, %lld] weight", (long long)x_stride,
                   (long long)y_stride, (long long)w.rows(), (long long)w.cols());
}
}  // namespace

void MatVecBatch(const TensorView& w, const float* x, int64_t nb, int64_t x_stride, float* y,
                 int64_t y_stride, ThreadPool* pool) {
  CheckBatch(w, nb, x_stride, y_stride);
  if (nb == 1) {
    MatVec(w, x, y, pool);
    return;
  }
  const uint8_t* act =
      IsQuantized(w.dtype) ? QuantizeBatch(w.dtype, x, nb, x_stride, w.cols()) : nullptr;
  const bool tiles = !IsQuantized(w.dtype) && nb >= kTileMinBatch;
  const float* xcp = tiles ? ClassMajorTokens(x, nb, x_stride, w.cols()) : nullptr;
  const int64_t rows = w.rows();
  if (pool == nullptr || pool->size() == 1 || rows < 2 * kRowGrain) {
    BatchRows(w, x, act, xcp, nb, x_stride, y, y_stride, 0, rows);
    return;
  }
  pool->ParallelForGrain(rows, kRowGrain, [&](int64_t b, int64_t e, int) {
    BatchRows(w, x, act, xcp, nb, x_stride, y, y_stride, b, e);
  });
}

void MatVecBatchMany(const MatVecBatchJob* jobs, int n_jobs, const float* x, int64_t nb,
                     int64_t x_stride, ThreadPool* pool) {
  if (nb == 1) {
    std::vector<MatVecJob> one(n_jobs);
    for (int j = 0; j < n_jobs; ++j) one[j] = {jobs[j].w, jobs[j].y};
    MatVecMany(one.data(), n_jobs, x, pool);
    return;
  }
  int64_t total = 0;
  for (int j = 0; j < n_jobs; ++j) {
    CheckBatch(jobs[j].w, nb, x_stride, jobs[j].y_stride);
    STRATA_CHECK_MSG(jobs[j].w.cols() == jobs[0].w.cols(), "MatVecBatchMany: cols %lld vs %lld",
                     (long long)jobs[j].w.cols(), (long long)jobs[0].w.cols());
    total += jobs[j].w.rows();
  }
  // X quantized once per activation block size the quantized jobs need (at most two).
  const uint8_t* act[2] = {nullptr, nullptr};
  for (int j = 0; j < n_jobs; ++j) {
    const DType t = jobs[j].w.dtype;
    if (!IsQuantized(t)) continue;
    const uint8_t*& a = act[ActivationBlockElems(t) == 256 ? 1 : 0];
    if (a == nullptr) a = QuantizeBatch(t, x, nb, x_stride, jobs[0].w.cols());
  }
  const float* xc = nullptr;
  for (int j = 0; j < n_jobs && nb >= kTileMinBatch && xc == nullptr; ++j) {
    if (!IsQuantized(jobs[j].w.dtype)) xc = ClassMajorTokens(x, nb, x_stride, jobs[0].w.cols());
  }
  auto run = [&](int64_t b, int64_t e) {
    int64_t off = 0;
    for (int j = 0; j < n_jobs && off < e; ++j) {
      const MatVecBatchJob& job = jobs[j];
      const int64_t rows = job.w.rows();
      const int64_t lo = std::max(b, off), hi = std::min(e, off + rows);
      const uint8_t* a =
          IsQuantized(job.w.dtype) ? act[ActivationBlockElems(job.w.dtype) == 256 ? 1 : 0] : nullptr;
      const float* c = IsQuantized(job.w.dtype) ? nullptr : xc;
      BatchRows(job.w, x, a, c, nb, x_stride, job.y, job.y_stride, lo - off, hi - off);
      off += rows;
    }
  };
  if (pool == nullptr || pool->size() == 1 || total < 2 * kRowGrain) {
    run(0, total);
    return;
  }
  pool->ParallelForGrain(total, kRowGrain, [&](int64_t b, int64_t e, int) { run(b, e); });
}

void MatVecBatchRef(const TensorView& w, const float* x, int64_t nb, int64_t x_stride, float* y,
                    int64_t y_stride) {
  for (int64_t b = 0; b < nb; ++b) MatVec(w, x + b * x_stride, y + b * y_stride, nullptr);
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
  // Quantized weights: the integer GEMM where it serves the type on this CPU (measured faster than
  // the dequantizing path, see v6 in the version log), else tiles of rows dequantized exactly to
  // f32 for the class-major GEMM (measured faster than the row dots of MatMulInt8, v4).
  if (IsQuantized(w.dtype) && HasQuantGemm(w.dtype, w.cols()) && !DequantPrefillForced()) {
    MatMulIntGemm(w, x, n, x_stride, y, y_stride, pool);
    return;
  }
  HWY_DYNAMIC_DISPATCH(MatMulImpl)(w, x, n, x_stride, y, y_stride, kRowGrain, pool);
}

void MatMulDequant(const TensorView& w, const float* x, int64_t n, int64_t x_stride, float* y,
                   int64_t y_stride, ThreadPool* pool) {
  CheckWeight(w);
  if (n <= 0) return;
  HWY_DYNAMIC_DISPATCH(MatMulImpl)(w, x, n, x_stride, y, y_stride, kRowGrain, pool);
}

void MatMulInt8(const TensorView& w, const float* x, int64_t n, int64_t x_stride, float* y,
                int64_t y_stride, ThreadPool* pool) {
  CheckWeight(w);
  if (n <= 0) return;
  if (!IsQuantized(w.dtype)) {
    MatMul(w, x, n, x_stride, y, y_stride, pool);
    return;
  }
  // Every token's activations quantized once (as MatVec does), then each (row, token) is the
  // MatVec integer dot, with each row reused from L1 across a tile of tokens.
  const int64_t k = w.cols();
  const int64_t ab = ActivationBytes(w.dtype, k);
  ScratchScope ws;
  std::span<uint8_t> acts = ws.U8(static_cast<size_t>(n * ab));
  auto quantize = [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      QuantizeActivations(w.dtype, x + t * x_stride, k, acts.data() + t * ab);
    }
  };
  auto rows = [&](int64_t b, int64_t e) {
    QuantMatMulRows(w, acts.data(), ab, n, y, y_stride, b, e);
  };
  if (pool == nullptr || pool->size() == 1) {
    quantize(0, n);
    rows(0, w.rows());
    return;
  }
  pool->ParallelForGrain(n, 8, [&](int64_t b, int64_t e, int) { quantize(b, e); });
  if (w.rows() < 2 * kRowGrain) {
    rows(0, w.rows());
    return;
  }
  pool->ParallelForGrain(w.rows(), kRowGrain, [&](int64_t b, int64_t e, int) { rows(b, e); });
}

float DotRow(DType t, const void* row, const float* x, int64_t n) {
  if (IsQuantized(t)) {
    uint8_t* act = ActBuffer(t, n);
    QuantizeActivations(t, x, n, act);
    return QuantDot(t, row, act, n);
  }
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
