// Tests of the Geodesia packed attention kernel on views built here from random slot bytes (no
// encoder: any code bytes and f16 scales are a valid block): SIMD (every target) and the scalar
// f32 kernel against the float64 reference, split and pool invariance, the per-block states and
// head selection, and the read-byte count. kv/geodesia/packed_attention_test.cc runs the same
// kernel over blocks a GradedLayer encoded from real rows.
#include "kernels/packed_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "kernels/packed_attention_testing.h"
#include "kernels/test_util.h"

namespace strata::geodesia {
namespace {

// One KV head's tables and slabs (one segment per level), filled at random.
struct RandomHead {
  std::vector<int8_t> level;
  std::vector<int64_t> offset;
  std::vector<int32_t> n_valid;
  std::array<std::vector<uint8_t>, kNumLevels> slab;
  std::array<const uint8_t*, kNumLevels> seg_base = {};
  std::vector<uint64_t> res_mask;
  std::vector<int32_t> res_begin;
  std::vector<uint16_t> res_k, res_v;
  PackedHeadView view;
};

// n blocks of head dim D and group g: levels cycle through the ladder from a random start,
// the last block is partial (17 valid tokens), one block is empty, and a few tokens of every
// third block are overridden by exact residual rows.
void MakeRandomHead(Rng& rng, int D, int g, int64_t n, RandomHead* x) {
  x->level.resize(n);
  x->offset.resize(n);
  x->n_valid.resize(n);
  x->res_mask.assign(n, 0);
  x->res_begin.assign(n, 0);
  const int start = static_cast<int>(rng.Below(kNumLevels));
  std::array<int64_t, kNumLevels> used = {};
  for (int64_t b = 0; b < n; ++b) {
    const int level = kLevels[(start + b) % kNumLevels];
    const int li = LevelIndex(level);
    x->level[b] = static_cast<int8_t>(level);
    x->n_valid[b] = b == n - 1 ? 17 : (b == 1 ? 0 : kBlockTokens);
    x->offset[b] = used[li];
    used[li] += SlotBytes(level, D, g);
  }
  for (int li = 0; li < kNumLevels; ++li) x->slab[li].assign(std::max<int64_t>(used[li], 1), 0);
  for (int64_t b = 0; b < n; ++b) {
    const int level = x->level[b];
    uint8_t* slot = x->slab[LevelIndex(level)].data() + x->offset[b];
    const SlotLayout L = GetSlotLayout(level, D, g);
    auto put16 = [&](int64_t at, int64_t count, auto make) {
      uint16_t* p = reinterpret_cast<uint16_t*>(slot + at);
      for (int64_t i = 0; i < count; ++i) p[i] = make();
    };
    auto bf16 = [&] { return F32ToBf16(static_cast<float>(rng.Normal())); };
    auto f16 = [&] { return F32ToF16(static_cast<float>(rng.Normal())); };
    if (level == 16) {
      put16(L.k_rows, int64_t{kBlockTokens} * D, bf16);
      put16(L.v_rows, int64_t{kBlockTokens} * D, bf16);
    } else if (level == 1) {
      put16(L.k_rows, D, f16);
      put16(L.v_rows, D, f16);
    } else {
      for (int64_t i = 0; i < L.k_lo; ++i) slot[i] = static_cast<uint8_t>(rng.Below(256));
      const int64_t nk = int64_t{kBlockTokens / g} * D, nvv = int64_t{kBlockTokens} * (D / g);
      put16(L.k_lo, nk, f16);
      put16(L.k_step, nk, [&] { return F32ToF16(0.5f / ((1 << level) - 1) *
                                                 static_cast<float>(std::fabs(rng.Normal()))); });
      put16(L.v_lo, nvv, f16);
      put16(L.v_step, nvv, [&] { return F32ToF16(0.5f / ((1 << level) - 1) *
                                                  static_cast<float>(std::fabs(rng.Normal()))); });
    }
  }
  int32_t rows = 0;
  for (int64_t b = 0; b < n; ++b) {
    x->res_begin[b] = rows;
    if (b % 3 != 0 || x->n_valid[b] == 0) continue;
    for (int i = 0; i < 3; ++i) x->res_mask[b] |= uint64_t{1} << rng.Below(x->n_valid[b]);
    rows += std::popcount(x->res_mask[b]);
  }
  x->res_k.resize(static_cast<size_t>(rows) * D);
  x->res_v.resize(x->res_k.size());
  for (auto& v : x->res_k) v = F32ToBf16(static_cast<float>(rng.Normal()));
  for (auto& v : x->res_v) v = F32ToBf16(static_cast<float>(rng.Normal()));
  PackedHeadView& w = x->view;
  w.head_dim = D;
  w.group_size = g;
  w.n_blocks = n;
  w.level = x->level.data();
  w.offset = x->offset.data();
  w.n_valid = x->n_valid.data();
  for (int li = 0; li < kNumLevels; ++li) {
    x->seg_base[li] = x->slab[li].data();
    w.seg[li] = &x->seg_base[li];
    w.seg_bytes[li] = static_cast<int64_t>(x->slab[li].size());
  }
  w.res_mask = x->res_mask.data();
  w.res_begin = x->res_begin.data();
  w.res_k = x->res_k.data();
  w.res_v = x->res_v.data();
}

using packed_testing::Finalize;
using packed_testing::RelErr;

TEST(PackedAttentionKernel, MatchesFloat64OnRandomSlots) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ThreadPool pool(3);
  struct Shape { int D, g, G; };
  // g = 8: the 32-row path on AVX-512; g = 64 the span-order codes; 16, 32 channel order.
  const Shape shapes[] = {{128, 64, 4}, {64, 32, 3}, {96, 16, 5}, {64, 8, 2}, {32, 32, 1}};
  ForEachSimdTarget([&] {
    for (const Shape& sh : shapes) {
      SCOPED_TRACE(testing::Message() << "D " << sh.D << " g " << sh.g << " G " << sh.G);
      RandomHead head;
      MakeRandomHead(rng, sh.D, sh.g, 6 + static_cast<int64_t>(rng.Below(9)), &head);
      const PackedHeadView& view = head.view;
      std::vector<float> q(static_cast<size_t>(sh.G) * sh.D);
      for (auto& x : q) x = static_cast<float>(2.0 * rng.Normal());
      const float scale = 1.f / std::sqrt(static_cast<float>(sh.D));
      std::vector<int64_t> sel(view.n_blocks);
      std::iota(sel.begin(), sel.end(), 0);
      for (int64_t i = static_cast<int64_t>(sel.size()) - 1; i > 0; --i) {
        std::swap(sel[i], sel[rng.Below(i + 1)]);
      }
      sel.resize(std::max<size_t>(1, sel.size() / 2));
      for (int pass = 0; pass < 2; ++pass) {
        const int64_t* list = pass == 0 ? nullptr : sel.data();
        const int64_t n_list = pass == 0 ? view.n_blocks : static_cast<int64_t>(sel.size());
        std::vector<double> ref(static_cast<size_t>(sh.G) * sh.D);
        PackedAttendRef(view, q.data(), sh.G, scale, list, n_list, ref.data());
        // 1e-4 relative (as the GradedLayer test): f32 dots of length D, f32 online softmax.
        SoftmaxStateBuffer scalar(sh.G, sh.D);
        PackedAttendScalar(view, q.data(), sh.G, scale, list, n_list, &scalar.states());
        EXPECT_LE(RelErr(Finalize(scalar), ref), 1e-4) << "scalar pass " << pass;
        std::vector<int64_t> ids(n_list);
        for (int64_t i = 0; i < n_list; ++i) ids[i] = list ? list[i] : i;
        SoftmaxStateBuffer simd(sh.G, sh.D);
        PackedAttend(view, q.data(), sh.G, scale, ids.data(), n_list, &simd.states());
        const std::vector<float> one = Finalize(simd);
        EXPECT_LE(RelErr(one, ref), 1e-4) << "simd pass " << pass;
        for (int splits : {1, 2, 5}) {
          SoftmaxStateBuffer st(sh.G, sh.D), st_seq(sh.G, sh.D);
          PackedAttendSplit(view, q.data(), sh.G, scale, list, n_list, splits, &pool,
                            &st.states());
          PackedAttendSplit(view, q.data(), sh.G, scale, list, n_list, splits, nullptr,
                            &st_seq.states());
          EXPECT_EQ(Finalize(st), Finalize(st_seq)) << "pool changed the result, " << splits;
          if (splits == 1) {
            EXPECT_EQ(Finalize(st), one);  // one split is one kernel call
          }
        }
      }
    }
  });
}

// Per-block states and head selection: head r's state is its selected blocks only (float64),
// and block i's recorded (m, d) is the state of a read of block i alone (m exactly).
TEST(PackedAttentionKernel, PerBlockStatesAndHeadSelection) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  ForEachSimdTarget([&] {
    const int D = 64, g = 16, G = 3;
    RandomHead head;
    MakeRandomHead(rng, D, g, 11, &head);
    packed_testing::ExpectHeadSelectionAndBlockStates(head.view, G, rng, "random head");
  });
}

// Read bytes: every listed block's slot plus 4 D bytes (bf16 K and V) per residual row.
TEST(PackedAttentionKernel, ReadBytesCountSlotsAndResidualRows) {
  Rng rng(3);
  RandomHead head;
  const int D = 32, g = 32;
  MakeRandomHead(rng, D, g, 10, &head);
  const std::vector<int64_t> list = {0, 3, 4, 9};
  int64_t want = 0;
  for (int64_t b : list) {
    want += SlotBytes(head.level[b], D, g) + std::popcount(head.res_mask[b]) * int64_t{4} * D;
  }
  EXPECT_EQ(PackedReadBytes(head.view, list.data(), 4), want);
  EXPECT_GT(want, 0);
}

}  // namespace
}  // namespace strata::geodesia
