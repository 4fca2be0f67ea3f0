// Kernel benchmarks of the quantized types (disabled tests; run them by name):
//   build/release/kernels/kernels_tests --gtest_also_run_disabled_tests
//     --gtest_filter='QuantDotBench.*'
// MatVecBandwidth: decode GEMV over the decode matrices of the synthetic 125M llama (12 layers of
// q/k/v, o, gate/up, down and the 32000 x 768 output; random blocks, ~50-210 MB per type, larger
// than the caches) on one thread, as GB/s of weight bytes and as a fraction of the read bandwidth
// (MeasureReadBandwidth) measured between passes. Prefill: GFLOP/s of a 2048-token MatMul on the
// 768 x 768, 2048 x 768, 768 x 2048, 576 x 576, 1536 x 576 and 576 x 1536 (rows x cols) shapes:
// the integer GEMM (MatMul, where HasQuantGemm), the dequantize-to-f32 GEMM (MatMulDequant) and
// the int8 row dots (MatMulInt8).
// STRATA_BENCH_TYPES=Q4_0,Q8_0 limits the types.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <time.h>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/matmul.h"
#include "kernels/membw.h"
#include "kernels/quant_gemm.h"
#include "kernels/quant_testing.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

// This thread's CPU time in seconds: on a shared host it excludes the time the thread waited for
// a core, which wall time (and so every GB/s figure) includes.
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<DType> BenchTypes() {
  std::vector<DType> all = {DType::kF16};
  for (DType t : kQuantTypes) all.push_back(t);
  const char* env = std::getenv("STRATA_BENCH_TYPES");
  if (env == nullptr) return all;
  std::vector<DType> out;
  const std::string list = std::string(",") + env + ",";
  for (DType t : all) {
    std::string needle = ",";  // built in steps: GCC 12 warns (-Wrestrict) on "," + string
    needle += DTypeName(t);
    needle += ",";
    if (list.find(needle) != std::string::npos) out.push_back(t);
  }
  return out;
}

// A matrix of random blocks (or random f16 values) in a 64-byte aligned buffer.
struct Matrix {
  AlignedBuffer<uint8_t> bytes;
  TensorView view;
};

Matrix MakeMatrix(DType t, int64_t rows, int64_t cols, Rng& rng) {
  Matrix m;
  const int64_t n = rows * DTypeRowBytes(t, cols);
  m.bytes.Resize(n);
  if (t == DType::kF16) {
    std::vector<float> f(rows * cols);
    for (auto& v : f) v = static_cast<float>(rng.Normal());
    FromF32(t, f.data(), m.bytes.data(), rows * cols);
  } else {
    const std::vector<uint8_t> b = RandomBlocks(t, rows * cols / DTypeBlockElems(t), rng);
    std::copy(b.begin(), b.end(), m.bytes.data());
    // Finite, moderate scales everywhere (RandomBlocks draws f16 extremes for the tests).
    const QuantBlockInfo info = BlockInfo(t);
    const int64_t bb = DTypeBlockBytes(t);
    for (int64_t i = 0; i < n / bb; ++i) {
      for (int f = 0; f < info.n_f16; ++f) {
        const uint16_t h = F32ToF16(0.01f);
        std::memcpy(m.bytes.data() + i * bb + info.f16[f], &h, 2);
      }
    }
  }
  m.view.data = m.bytes.data();
  m.view.dtype = t;
  m.view.n_dims = 2;
  m.view.shape = {rows, cols, 1, 1};
  return m;
}

TEST(QuantDotBench, DISABLED_MatVecBandwidth) {
  Rng rng(17);
  const int64_t d = 768, kv = 256, ff = 2048, vocab = 32000;
  std::printf("%-7s %9s %10s %9s %9s %9s\n", "type", "MB", "ms/token", "GB/s", "probe", "fraction");
  for (DType t : BenchTypes()) {
    std::vector<Matrix> q, k, v, o, g, u, dn;
    for (int l = 0; l < 12; ++l) {
      q.push_back(MakeMatrix(t, d, d, rng));
      k.push_back(MakeMatrix(t, kv, d, rng));
      v.push_back(MakeMatrix(t, kv, d, rng));
      o.push_back(MakeMatrix(t, d, d, rng));
      g.push_back(MakeMatrix(t, ff, d, rng));
      u.push_back(MakeMatrix(t, ff, d, rng));
      dn.push_back(MakeMatrix(t, d, ff, rng));
    }
    Matrix out = MakeMatrix(t, vocab, d, rng);
    double bytes = static_cast<double>(out.bytes.size());
    for (int l = 0; l < 12; ++l) {
      for (const Matrix* m : {&q[l], &k[l], &v[l], &o[l], &g[l], &u[l], &dn[l]}) {
        bytes += static_cast<double>(m->bytes.size());
      }
    }
    std::vector<float> x(ff), y0(ff), y1(ff), y2(ff), logits(vocab);
    for (auto& e : x) e = static_cast<float>(rng.Normal());
    auto token = [&] {
      for (int l = 0; l < 12; ++l) {
        MatVecJob qkv[3] = {{q[l].view, y0.data()}, {k[l].view, y1.data()}, {v[l].view, y2.data()}};
        MatVecMany(qkv, 3, x.data(), nullptr);
        MatVec(o[l].view, x.data(), y0.data(), nullptr);
        MatVecJob gu[2] = {{g[l].view, y1.data()}, {u[l].view, y2.data()}};
        MatVecMany(gu, 2, x.data(), nullptr);
        MatVec(dn[l].view, y1.data(), y0.data(), nullptr);
      }
      MatVec(out.view, x.data(), logits.data(), nullptr);
    };
    token();
    // Interleaved passes: the best token time of each pass against the probe of that pass; the
    // reported pass is the one with the median fraction (the host is shared and noisy).
    std::vector<std::array<double, 3>> passes;
    for (int pass = 0; pass < 5; ++pass) {
      const double bw = *MeasureReadBandwidth(size_t{256} << 20, nullptr, 2);
      double best = 1e30;
      for (int i = 0; i < 6; ++i) {
        const auto t0 = Clock::now();
        token();
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
      }
      passes.push_back({bytes / best / bw, best, bw});
    }
    std::sort(passes.begin(), passes.end());
    const auto& m = passes[passes.size() / 2];
    std::printf("%-7s %9.1f %10.3f %9.2f %9.2f %9.3f\n", std::string(DTypeName(t)).c_str(),
                bytes / 1e6, m[1] * 1e3, bytes / m[1] / 1e9, m[2] / 1e9, m[0]);
    std::fflush(stdout);
  }
}

// The arithmetic ceiling: MatVec over a 64 x 2048 matrix that stays in L2, in GB/s of weight
// bytes and ns per 256 weights (one thread), by wall time and by the thread's CPU time.
TEST(QuantDotBench, DISABLED_MatVecInCache) {
  Rng rng(19);
  const int64_t rows = 64, cols = 2048, reps = 3000;
  std::printf("%-7s %9s %12s %13s %13s\n", "type", "GB/s", "ns/256 w", "cpu GB/s",
              "cpu ns/256 w");
  for (DType t : BenchTypes()) {
    Matrix w = MakeMatrix(t, rows, cols, rng);
    std::vector<float> x(cols), y(rows);
    for (auto& e : x) e = static_cast<float>(rng.Normal());
    double best = 1e30, best_cpu = 1e30;
    for (int pass = 0; pass < 5; ++pass) {
      const auto t0 = Clock::now();
      const double c0 = ThreadCpuSeconds();
      for (int i = 0; i < reps; ++i) MatVec(w.view, x.data(), y.data(), nullptr);
      best_cpu = std::min(best_cpu, (ThreadCpuSeconds() - c0) / reps);
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / reps);
    }
    const double per256 = rows * cols / 256.0;
    std::printf("%-7s %9.2f %12.2f %13.2f %13.2f\n", std::string(DTypeName(t)).c_str(),
                w.bytes.size() / best / 1e9, best * 1e9 / per256, w.bytes.size() / best_cpu / 1e9,
                best_cpu * 1e9 / per256);
    std::fflush(stdout);
  }
}

TEST(QuantDotBench, DISABLED_Prefill) {
  Rng rng(18);
  const int64_t n = 2048;
  // The 125M llama's shapes, then SmolLM2-135M's (d_model 576: 18 blocks of 32 per row).
  const int64_t shapes[][2] = {{768, 768}, {2048, 768}, {768, 2048}, {576, 576}, {1536, 576},
                               {576, 1536}};
  std::printf("%-7s %12s %10s %10s %10s  (GFLOP/s, best of 3, 1 thread)\n", "type", "shape",
              "int-gemm", "deq-f32", "row-dots");
  for (DType t : BenchTypes()) {
    for (const auto& s : shapes) {
      const int64_t rows = s[0], cols = s[1];
      if (cols % DTypeBlockElems(t) != 0) continue;  // 576 is no whole 256-element block
      Matrix w = MakeMatrix(t, rows, cols, rng);
      std::vector<float> x(n * cols), y(n * rows);
      for (auto& e : x) e = static_cast<float>(rng.Normal());
      auto time = [&](int path) {
        double best = 1e30;
        for (int i = 0; i < 3; ++i) {
          const auto t0 = Clock::now();
          if (path == 0) {
            MatMul(w.view, x.data(), n, cols, y.data(), rows, nullptr);
          } else if (path == 1) {
            MatMulDequant(w.view, x.data(), n, cols, y.data(), rows, nullptr);
          } else {
            MatMulInt8(w.view, x.data(), n, cols, y.data(), rows, nullptr);
          }
          best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
        }
        return 2.0 * rows * cols * n / best / 1e9;
      };
      const double a = time(0), b = time(1), c = time(2);
      std::printf("%-7s %5lldx%-6lld %10.1f %10.1f %10.1f%s\n", std::string(DTypeName(t)).c_str(),
                  static_cast<long long>(rows), static_cast<long long>(cols), a, b, c,
                  HasQuantGemm(t, cols) ? "" : "  (int-gemm not served: MatMul is deq-f32)");
      std::fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace strata
