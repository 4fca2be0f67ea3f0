// Test helpers for the Geodesia packed attention kernel (kernels/packed_attention.h): the
// float64-reference error measure and the per-block-state / head-selection property, shared by
// the kernel's tests on random slot views and the kv/ tests on real graded layers.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/attention.h"
#include "kernels/packed_attention.h"

namespace strata::geodesia::packed_testing {

// max |got - ref| / max |ref| (absolute when ref is all zero).
inline double RelErr(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::fabs(got[i] - ref[i]));
    den = std::max(den, std::fabs(ref[i]));
  }
  return den > 0 ? num / den : num;
}

inline std::vector<float> Finalize(const SoftmaxStateBuffer& b) {
  std::vector<float> out(static_cast<size_t>(b.states().n_heads) * b.states().dv);
  FinalizeStates(b.states(), out.data());
  return out;
}

// PackedBlockIO over every block of `view` with a random head selection: head r's state is its
// selected blocks only (against the float64 reference, 1e-4 relative: f32 accumulation over a
// few hundred rows), and block i's recorded (m, d) is the state of a read of block i alone (m
// exactly; d within 1e-5 relative: the same sum rescaled in another order).
inline void ExpectHeadSelectionAndBlockStates(const PackedHeadView& view, int G, Rng& rng,
                                              const std::string& where) {
  const int D = view.head_dim;
  const int64_t n = view.n_blocks;
  std::vector<int64_t> list(n);
  std::iota(list.begin(), list.end(), 0);
  std::vector<float> q(static_cast<size_t>(G) * D);
  for (auto& x : q) x = static_cast<float>(1.5 * rng.Normal());
  std::vector<uint8_t> sel(n * G);
  for (auto& x : sel) x = rng.Below(3) != 0;
  std::vector<float> bm(n * G), bd(n * G);
  PackedBlockIO io;
  io.head_sel = sel.data();
  io.block_m = bm.data();
  io.block_d = bd.data();
  SoftmaxStateBuffer st(G, D);
  PackedAttend(view, q.data(), G, 0.125f, list.data(), n, &st.states(), &io);
  const std::vector<float> out = Finalize(st);
  for (int r = 0; r < G; ++r) {
    std::vector<int64_t> mine;
    for (int64_t i = 0; i < n; ++i) {
      if (sel[i * G + r]) mine.push_back(i);
    }
    std::vector<double> ref(D);
    PackedAttendRef(view, q.data() + r * D, 1, 0.125f, mine.data(),
                    static_cast<int64_t>(mine.size()), ref.data());
    const std::vector<float> got(out.begin() + r * D, out.begin() + (r + 1) * D);
    EXPECT_LE(RelErr(got, ref), 1e-4) << where << " head " << r;
  }
  for (int64_t i = 0; i < n; ++i) {
    SoftmaxStateBuffer one(G, D);
    PackedAttend(view, q.data(), G, 0.125f, &list[i], 1, &one.states());
    for (int r = 0; r < G; ++r) {
      EXPECT_EQ(bm[i * G + r], one.states().m[r]) << where << " block " << i << " head " << r;
      EXPECT_NEAR(bd[i * G + r], one.states().d[r], 1e-5 * one.states().d[r])
          << where << " block " << i << " head " << r;
    }
  }
}

}  // namespace strata::geodesia::packed_testing
