// The low-pass residual norms of VestigeKV's selector (kv/vestige/selector.h) as two small dense
// products on a real Fourier basis, instead of one FFT per channel (issue 21 part 5).
//
// For a block of n rows x[u, c] (u < n, c < C) and kappa kept bins (1 <= kappa < n/2):
//   lowpass(x)_u = (A_0 + 2 sum_{0<k<kappa} (A_k cos t_uk + S_k sin t_uk)) / n,
//   A_k = sum_u x_u cos t_uk,  S_k = sum_u x_u sin t_uk,  t_uk = 2 pi k u / n,
// which is exactly the inverse real FFT of the spectrum with bins >= kappa zeroed (no Nyquist bin
// since kappa < n/2). With B the [n, J] basis (J = 2 kappa - 1 columns: 1, then cos/sin of bins
// 1..kappa-1) and W = diag(1/n, 2/n, ...): Y = B^T X (J x C), low = B W Y, and
// sigma_u = || x_u - low_u ||_2. Cost 2 n J C multiply-adds (n = 4096, kappa = 16, C = 64: 16.3M),
// all channels of a row in the same vectors; no transpose.
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

// Columns of the basis per row, padded to a multiple of 4 (zero columns).
int LowpassBasisWidth(int kappa);
// basis [n, LowpassBasisWidth(kappa)] row-major f32 from f64 cos/sin of 2 pi ((k u) mod n) / n:
// column 0 = 1, column 2k-1 = cos t_uk, column 2k = sin t_uk (k = 1..kappa-1), then zeros.
std::vector<float> LowpassBasis(int64_t n, int kappa);

// Row strides of x are a multiple of this (floats), so every SIMD width reads whole vectors.
constexpr int64_t kLowpassPad = 16;

// sigma[u] = || x_u - lowpass(x)_u ||_2 for u < n. x: n rows of `ldx` floats (ldx a multiple of
// kLowpassPad), channels [0, C) used; columns [C, ldx) must be zero (they are read as padding).
// basis from LowpassBasis(n, kappa). scratch is resized as needed (reuse it across calls).
// f32 multiply-adds in a fixed order (the result depends only on the inputs and the SIMD
// target); Highway SIMD with runtime dispatch.
void LowpassResidualNorms(const float* x, int64_t ldx, int64_t n, int C, const float* basis,
                          int kappa, std::vector<float>* scratch, float* sigma);
// Scalar reference of the same formula (f32, plain loops) for tests.
void LowpassResidualNormsRef(const float* x, int64_t ldx, int64_t n, int C, const float* basis,
                             int kappa, float* sigma);

}  // namespace strata
