// libFuzzer target: fuzzed bytes as block-quantized weight rows of every type kernels/quant_dot.h
// serves, multiplied with activations also taken from the input, through every integer
// dot-product path on every SIMD target this CPU runs (AVX3_DL, AVX3, AVX2, SSE4, EMU128, chosen
// by hwy::SetSupportedTargetsForTest as kernels/quant_testing.h does).
//
// Input: four header bytes, then the weight bytes and the activation bytes (each cycled when the
// input is short). b0: the type (kQuantTypes order); b1: blocks per row; b2: rows (bits 0-2) and
// tokens (bits 3-4); b3: how the activations are made (bits 0-1: f16 bits, int8 times a power of
// two given by bits 2-6, or f32 bits; so Inf, NaN, subnormals and all-zero blocks occur).
//
// Checked, as kernels/quant_dot.h and kernels/matmul.h document:
// - QuantizeActivations writes the same bytes on every target (for finite activations);
// - QuantDot, QuantDotRows, QuantMatMulRows, DotRow, MatVec (with and without a pool),
//   MatVecMany, MatVecBatch, MatVecBatchMany and MatMulInt8 give QuantDotRef's float bit for bit,
//   and every target gives the same float; NaN-aware: where one side is NaN the other must be NaN
//   (any payload);
// - a token whose activations hold Inf or NaN gives NaN in every row.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "hwy/targets.h"
#include "kernels/matmul.h"
#include "kernels/quant_dot.h"

namespace {

using strata::DType;

constexpr DType kTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,  DType::kQ5_1,
                            DType::kQ8_0, DType::kQ2_K, DType::kQ3_K,  DType::kQ4_K,
                            DType::kQ5_K, DType::kQ6_K, DType::kIQ4_NL, DType::kIQ4_XS};
constexpr int64_t kTargets[] = {HWY_AVX3_DL, HWY_AVX3, HWY_AVX2, HWY_SSE4, HWY_EMU128};

bool Same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return strata::F32Bits(a) == strata::F32Bits(b);
}

struct Ctx {
  DType t;
  int64_t k, rows, n_tok;
  const char* target;
};

void Check(const Ctx& c, const char* path, int64_t row, int64_t tok, float got, float want) {
  if (Same(got, want)) return;
  std::fprintf(stderr,
               "fuzz_quant_dot: %s, target %s: %s row %lld token %lld gives %a (0x%08x), the "
               "reference %a (0x%08x); k=%lld rows=%lld tokens=%lld\n",
               std::string(strata::DTypeName(c.t)).c_str(), c.target, path, static_cast<long long>(row),
               static_cast<long long>(tok), got, strata::F32Bits(got), want,
               strata::F32Bits(want), static_cast<long long>(c.k),
               static_cast<long long>(c.rows), static_cast<long long>(c.n_tok));
  std::abort();
}

// bytes[i] = src[i % size] (zeros when src is empty).
std::vector<uint8_t> Cycle(const uint8_t* src, size_t size, size_t n) {
  std::vector<uint8_t> out(n, 0);
  if (size == 0) return out;
  for (size_t i = 0; i < n; ++i) out[i] = src[i % size];
  return out;
}

strata::ThreadPool& Pool() {
  static strata::ThreadPool pool(2);
  return pool;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  if (size < 4) return 0;
  const DType t = kTypes[data[0] % (sizeof(kTypes) / sizeof(kTypes[0]))];
  const int64_t be = DTypeBlockElems(t);
  const int64_t nb = 1 + data[1] % (be == 32 ? 40 : 6);
  const int64_t k = nb * be;
  const int64_t rows = 1 + (data[2] & 7) % 5;
  const int64_t n_tok = 1 + ((data[2] >> 3) & 3);
  const uint8_t amode = data[3] & 3;
  const int shift = (data[3] >> 2) & 31;
  data += 4;
  size -= 4;

  const int64_t rb = DTypeRowBytes(t, k);
  const size_t wbytes = static_cast<size_t>(rows * rb);
  const size_t wtake = size < wbytes ? size : wbytes;
  const std::vector<uint8_t> w = Cycle(data, wtake, wbytes);
  const uint8_t* arest = data + wtake;
  const size_t asize = size - wtake;

  // Activations [n_tok, k], row-major.
  std::vector<float> x(static_cast<size_t>(n_tok * k));
  if (amode == 0 || amode == 3) {
    const std::vector<uint8_t> b = Cycle(arest, asize, 2 * x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = F16ToF32(static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8)));
    }
  } else if (amode == 1) {
    const std::vector<uint8_t> b = Cycle(arest, asize, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = std::ldexp(static_cast<float>(static_cast<int8_t>(b[i])), shift - 16);
    }
  } else {
    const std::vector<uint8_t> b = Cycle(arest, asize, 4 * x.size());
    std::memcpy(x.data(), b.data(), b.size());
  }
  std::vector<bool> finite(n_tok, true);
  for (int64_t j = 0; j < n_tok; ++j) {
    for (int64_t i = 0; i < k; ++i) finite[j] = finite[j] && std::isfinite(x[j * k + i]);
  }

  TensorView wv;
  wv.data = w.data();
  wv.dtype = t;
  wv.n_dims = 2;
  wv.shape = {rows, k, 1, 1};
  const int64_t ab = ActivationBytes(t, k);

  hwy::SetSupportedTargetsForTest(0);
  const int64_t supported = hwy::SupportedTargets();
  std::vector<uint8_t> first_acts;
  std::vector<float> first_y;
  for (int64_t target : kTargets) {
    if ((supported & target) == 0) continue;
    hwy::SetSupportedTargetsForTest(target);
    const Ctx c{t, k, rows, n_tok, hwy::TargetName(target)};

    std::vector<uint8_t> acts(static_cast<size_t>(n_tok * ab));
    for (int64_t j = 0; j < n_tok; ++j) QuantizeActivations(t, &x[j * k], k, &acts[j * ab]);
    // The reference, per (token, row).
    std::vector<float> ref(static_cast<size_t>(n_tok * rows));
    for (int64_t j = 0; j < n_tok; ++j) {
      for (int64_t r = 0; r < rows; ++r) {
        ref[j * rows + r] = QuantDotRef(t, wv.row(r), &acts[j * ab], k);
        if (!finite[j] && !std::isnan(ref[j * rows + r])) {
          Check(c, "non-finite activations: QuantDotRef", r, j, ref[j * rows + r], NAN);
        }
      }
    }
    if (first_acts.empty()) {
      first_acts = acts;
      first_y = ref;
    } else {
      for (int64_t j = 0; j < n_tok; ++j) {
        if (finite[j] && std::memcmp(&acts[j * ab], &first_acts[j * ab], ab) != 0) {
          std::fprintf(stderr, "fuzz_quant_dot: %s, target %s: QuantizeActivations of token %lld "
                       "differs from the first target's\n", std::string(DTypeName(t)).c_str(), c.target,
                       static_cast<long long>(j));
          std::abort();
        }
        for (int64_t r = 0; r < rows; ++r) {
          Check(c, "QuantDotRef vs the first target's", r, j, ref[j * rows + r],
                first_y[j * rows + r]);
        }
      }
    }

    std::vector<float> y(static_cast<size_t>(n_tok * rows));
    for (int64_t j = 0; j < n_tok; ++j) {
      const uint8_t* a = &acts[j * ab];
      for (int64_t r = 0; r < rows; ++r) {
        Check(c, "QuantDot", r, j, QuantDot(t, wv.row(r), a, k), ref[j * rows + r]);
        Check(c, "DotRow", r, j, DotRow(t, wv.row(r), &x[j * k], k), ref[j * rows + r]);
      }
      QuantDotRows(t, w.data(), rb, a, k, y.data(), rows);
      for (int64_t r = 0; r < rows; ++r) Check(c, "QuantDotRows", r, j, y[r], ref[j * rows + r]);
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &Pool()}) {
        MatVec(wv, &x[j * k], y.data(), pool);
        for (int64_t r = 0; r < rows; ++r) Check(c, "MatVec", r, j, y[r], ref[j * rows + r]);
      }
      // Two jobs over the rows [0, h) and [h, rows).
      const int64_t h = rows / 2;
      std::vector<float> y0(static_cast<size_t>(rows)), y1(static_cast<size_t>(rows));
      MatVecJob jobs[2] = {{wv.Rows(0, h), y0.data()}, {wv.Rows(h, rows - h), y1.data()}};
      MatVecMany(h > 0 ? jobs : jobs + 1, h > 0 ? 2 : 1, &x[j * k], &Pool());
      for (int64_t r = 0; r < rows; ++r) {
        Check(c, "MatVecMany", r, j, r < h ? y0[r] : y1[r - h], ref[j * rows + r]);
      }
    }
    auto check_all = [&](const char* path, const std::vector<float>& got) {
      for (int64_t j = 0; j < n_tok; ++j) {
        for (int64_t r = 0; r < rows; ++r) Check(c, path, r, j, got[j * rows + r], ref[j * rows + r]);
      }
    };
    std::fill(y.begin(), y.end(), -1.f);
    QuantMatMulRows(wv, acts.data(), ab, n_tok, y.data(), rows, 0, rows);
    check_all("QuantMatMulRows", y);
    std::fill(y.begin(), y.end(), -1.f);
    MatVecBatch(wv, x.data(), n_tok, k, y.data(), rows, &Pool());
    check_all("MatVecBatch", y);
    std::fill(y.begin(), y.end(), -1.f);
    MatVecBatchJob bjob{wv, y.data(), rows};
    MatVecBatchMany(&bjob, 1, x.data(), n_tok, k, nullptr);
    check_all("MatVecBatchMany", y);
    std::fill(y.begin(), y.end(), -1.f);
    MatMulInt8(wv, x.data(), n_tok, k, y.data(), rows, nullptr);
    check_all("MatMulInt8", y);
  }
  hwy::SetSupportedTargetsForTest(0);
  return 0;
}
