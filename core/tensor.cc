#include "core/tensor.h"

namespace strata {

std::string TensorView::ShapeString() const {
  std::string s = "[";
  for (int i = 0; i < n_dims; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace strata
