// Non-owning tensor views: a typed pointer, up to 4 dims (outermost first) and row-major strides.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/dtype.h"

namespace strata {

// A view over raw (possibly quantized) weight storage, as laid out in a GGUF file: shape is given
// outermost-first (torch order), so a matrix [rows, cols] has cols contiguous per row.
struct TensorView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int n_dims = 0;
  std::array<int64_t, 4> shape{1, 1, 1, 1};  // outermost first

  int64_t dim(int i) const { return shape[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < n_dims; ++i) n *= shape[i];
    return n;
  }
  // Last (contiguous) dimension.
  int64_t cols() const { return n_dims ? shape[n_dims - 1] : 1; }
  int64_t rows() const { return numel() / cols(); }
  int64_t row_bytes() const { return DTypeRowBytes(dtype, cols()); }
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes(); }
  std::string ShapeString() const;
  // A view of rows [r0, r0 + n) as a 2-D matrix.
  TensorView Rows(int64_t r0, int64_t n) const {
    TensorView v = *this;
    v.data = row(r0);
    v.n_dims = 2;
    v.shape = {n, cols(), 1, 1};
    return v;
  }
};

// A dense f32 matrix view with a row stride (elements).
template <typename T>
struct MatView {
  T* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;

  MatView() = default;
  MatView(T* d, int64_t r, int64_t c) : data(d), rows(r), cols(c), stride(c) {}
  MatView(T* d, int64_t r, int64_t c, int64_t s) : data(d), rows(r), cols(c), stride(s) {}
  T* row(int64_t r) const { return data + r * stride; }
  T& at(int64_t r, int64_t c) const { return data[r * stride + c]; }
};

}  // namespace strata
