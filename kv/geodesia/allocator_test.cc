// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#include "kv/geodesia/allocator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/rng.h"
#include "kv/geodesia/accounting.h"

namespace strata::geodesia {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Random blocks: masses from a skewed distribution, errors increasing down the ladder (with a
// random centroid error that may undercut the 2-bit one, as §11 notes), some hot, and (for cascade
// tests) some already demoted.
std::vector<AllocBlock> RandomBlocks(Rng& rng, int nb, bool some_demoted) {
  std::vector<AllocBlock> v(nb);
  for (auto& b : v) {
    b.mass = std::exp(4.0 * rng.Normal()) * 1e-3;
    b.hot = rng.Uniform() < 0.1;
    b.index = some_demoted && !b.hot ? static_cast<int>(rng.Below(kNumLevels)) : 0;
    double e = 0;
    b.err[0] = 0;
    for (int i = 1; i < kNumLevels; ++i) {
      e += rng.Uniform() * (1 << (2 * i));
      b.err[i] = e;
    }
    if (rng.Uniform() < 0.3) b.err[4] = b.err[3] * rng.Uniform();  // centroid below 2-bit error
    for (int i = 0; i < b.index; ++i) b.err[i] = 0;  // unused above the current level
    if (b.index > 0) b.err[b.index] = 0;
  }
  return v;
}

int64_t Total(const std::vector<int>& idx, const std::array<int64_t, kNumLevels>& beta) {
  int64_t t = 0;
  for (int i : idx) t += beta[i];
  return t;
}

double Objective(const std::vector<AllocBlock>& blocks, const std::vector<int>& idx) {
  double s = 0;
  for (size_t b = 0; b < blocks.size(); ++b) s += Damage(blocks[b], idx[b], 1.0);
  return s;
}

// §12.10-§12.11 on random instances of both modes and ratchets: the budget holds when it can,
// levels never move up, every taken step has ratio <= lambda and every available untaken next
// step has ratio > lambda; lambda is the smallest candidate that meets the budget; and no swap of
// one taken step for an untaken step of the same size (same budget) lowers the objective.
TEST(GeodesiaAllocatorTest, BudgetMonotoneEquiMarginal) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int D = 128, g = 64;
  const auto beta = LadderBits(D, g);
  for (int trial = 0; trial < 300; ++trial) {
    const bool cascade = trial % 2 == 1;
    const int nb = 1 + static_cast<int>(rng.Below(60));
    std::vector<AllocBlock> blocks = RandomBlocks(rng, nb, cascade);
    const double B = 0.1 + 17.0 * rng.Uniform();
    const double target = B * 2.0 * nb * 64 * D;
    AllocatorOptions o;
    o.cascade = cascade;
    o.ratchet = trial % 4 < 2 ? Ratchet::kReference : Ratchet::kClean;
    const AllocResult r = Allocate(blocks, beta, target, o);
    SCOPED_TRACE("trial " + std::to_string(trial));
    ASSERT_EQ(r.index.size(), blocks.size());
    ASSERT_EQ(r.total_bits, Total(r.index, beta));
    // The most that can be demoted: every available step.
    const std::vector<int> all = ApplyLambda(blocks, beta, kInf, o);
    const bool can_meet = static_cast<double>(Total(all, beta)) <= target;
    if (can_meet) {
      EXPECT_LE(static_cast<double>(r.total_bits), target);
    } else {
      EXPECT_EQ(r.index, all);
    }
    for (int b = 0; b < nb; ++b) {
      EXPECT_GE(r.index[b], blocks[b].index);
      if (blocks[b].hot) {
        EXPECT_EQ(r.index[b], blocks[b].index);
      }
      if (!cascade && blocks[b].index > 0) {
        EXPECT_EQ(r.index[b], blocks[b].index);
      }
    }
    if (r.lambda == -kInf) {
      // No step: clean ratchet under budget, or nothing available.
      EXPECT_EQ(r.index, ApplyLambda(blocks, beta, -kInf, o));
      continue;
    }
    for (int b = 0; b < nb; ++b) {
      const AllocBlock& a = blocks[b];
      for (int i = a.index; i < r.index[b]; ++i) {
        // Ratio recomputed from the definition, not from the allocator.
        const double ratio = (Damage(a, i + 1, 1) - Damage(a, i, 1)) /
                             static_cast<double>(beta[i] - beta[i + 1]);
        EXPECT_LE(ratio, r.lambda) << "block " << b << " step " << i;
      }
      const int next = r.index[b];
      const bool available = !a.hot && next < kNumLevels - 1 && (cascade || a.index == 0);
      if (available) {
        const double ratio = (Damage(a, next + 1, 1) - Damage(a, next, 1)) /
                             static_cast<double>(beta[next] - beta[next + 1]);
        EXPECT_GT(ratio, r.lambda) << "block " << b << " untaken step " << next;
      }
    }
    // lambda is minimal: the next smaller candidate misses the target (unless it is the
    // reference ratchet's forced first step).
    std::vector<double> cand;
    for (int b = 0; b < nb; ++b) {
      for (int i = 0; i < kNumLevels - 1; ++i) {
        const double x = StepRatio(blocks[b], i, beta, 1);
        if (x != kInf) cand.push_back(x);
      }
    }
    double below = -kInf;
    for (double x : cand) {
      if (x < r.lambda) below = std::max(below, x);
    }
    if (below != -kInf && can_meet) {
      EXPECT_GT(static_cast<double>(Total(ApplyLambda(blocks, beta, below, o), beta)), target);
    }
    // Equal-size swaps.
    const double obj = Objective(blocks, r.index);
    for (int a = 0; a < nb; ++a) {
      if (r.index[a] == blocks[a].index) continue;
      const int undo = r.index[a] - 1;  // the transition undo -> undo + 1 is given back
      for (int b = 0; b < nb; ++b) {
        if (b == a || r.index[b] != undo || blocks[b].hot) continue;
        if (!cascade && blocks[b].index > 0) continue;
        std::vector<int> s = r.index;
        s[a] -= 1;
        s[b] += 1;
        EXPECT_GE(Objective(blocks, s), obj - 1e-9 * std::abs(obj))
            << "swap " << a << " -> " << b;
      }
    }
  }
}

// §12.11: with B >= 16 the clean ratchet demotes nothing and the reference ratchet takes
// exactly the step(s) whose ratio equals the global minimum. §12.10: below the all-centroid
// cost every non-hot block becomes a centroid.
TEST(GeodesiaAllocatorTest, RatchetAndExtremeBudgets) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int D = 64, g = 32;
  const auto beta = LadderBits(D, g);
  for (int trial = 0; trial < 50; ++trial) {
    const int nb = 2 + static_cast<int>(rng.Below(40));
    std::vector<AllocBlock> blocks = RandomBlocks(rng, nb, false);
    const double target16 = 16.0 * 2 * nb * 64 * D;
    AllocatorOptions clean;
    clean.ratchet = Ratchet::kClean;
    const AllocResult rc = Allocate(blocks, beta, target16, clean);
    EXPECT_EQ(rc.n_steps, 0);
    AllocatorOptions ref;
    const AllocResult rr = Allocate(blocks, beta, target16, ref);
    // The global minimum over every available step (later columns included, as the reference
    // sorts them all); a block moves only if its leading steps are all at that minimum, so a
    // negative 2 -> 1 ratio elsewhere can make the forced step a no-op.
    double mn = kInf;
    for (int b = 0; b < nb; ++b) {
      for (int i = 0; i < kNumLevels - 1; ++i) mn = std::min(mn, StepRatio(blocks[b], i, beta, 1));
    }
    if (mn == kInf) {
      EXPECT_EQ(rr.n_steps, 0);
      continue;
    }
    EXPECT_EQ(rr.lambda, mn);
    int64_t taken = 0;
    for (int b = 0; b < nb; ++b) {
      int run = 0;
      while (run < kNumLevels - 1 && StepRatio(blocks[b], run, beta, 1) <= mn) ++run;
      EXPECT_EQ(rr.index[b], run) << "block " << b;
      taken += run;
    }
    EXPECT_EQ(rr.n_steps, taken);
    const AllocResult low = Allocate(blocks, beta, 0.1 * 2 * nb * 64 * D, ref);
    for (int b = 0; b < nb; ++b) EXPECT_EQ(low.index[b], blocks[b].hot ? 0 : 4) << "block " << b;
  }
}

// §2.4, worked by hand (D = 32, g = 32: beta = 65536 / 36864 / 20480 / 12288 / 1024 bits).
// Block A is exact with mass 1 and errors 0, 1, 2, 3, 4: its ratios are 1/28672, 1/16384,
// 1/8192, 1/11264. Block B is already at 2 bits (requant once: it can never move again) with mass
// 1e-3 and errors e(2) = 3, e(1) = 4 on its quantized data: its 2 -> 1 ratio is 1e-3/11264. Block
// C is hot. Under budget the reference ratchet applies the smallest candidate:
//   reference candidates {1e-3/11264, 1/28672, ...}: lambda = 1e-3/11264 < every ratio of A, so
//     nothing moves (B's step is listed but can never be taken);
//   exact candidates {1/28672, ...}: lambda = 1/28672, A takes its first step (16 -> 8) only.
// Over budget both lists agree: a target of A at 8 bits gives lambda = 1/28672; A at 4 bits gives
// 1/16384 (the run stops at 1/8192); A as a centroid needs 1/8192 (the whole run, 1/11264 included).
TEST(GeodesiaAllocatorTest, ReferenceCandidatesIncludeQuantizedBlocksHandWorked) {
  const auto beta = LadderBits(32, 32);
  ASSERT_EQ(beta[0], 65536);
  ASSERT_EQ(beta[1], 36864);
  ASSERT_EQ(beta[2], 20480);
  ASSERT_EQ(beta[3], 12288);
  ASSERT_EQ(beta[4], 1024);
  std::vector<AllocBlock> blocks(3);
  blocks[0].mass = 1;
  blocks[0].err = {0, 1, 2, 3, 4};
  blocks[1].index = 3;
  blocks[1].mass = 1e-3;
  blocks[1].err = {0, 0, 0, 3, 4};
  blocks[2].hot = true;
  EXPECT_DOUBLE_EQ(StepRatio(blocks[0], 0, beta, 1), 1.0 / 28672);
  EXPECT_DOUBLE_EQ(StepRatio(blocks[1], 3, beta, 1), 1e-3 / 11264);
  const double initial = static_cast<double>(beta[0] + beta[3] + beta[0]);
  AllocatorOptions ref;  // candidates reference (the default), ratchet reference
  ASSERT_EQ(ref.candidates, Candidates::kReference);
  AllocatorOptions exact;
  exact.candidates = Candidates::kExact;
  // Under budget.
  const AllocResult r_ref = Allocate(blocks, beta, initial, ref);
  EXPECT_EQ(r_ref.lambda, 1e-3 / 11264);
  EXPECT_EQ(r_ref.index, (std::vector<int>{0, 3, 0}));
  EXPECT_EQ(r_ref.n_steps, 0);
  EXPECT_EQ(r_ref.total_bits, beta[0] + beta[3] + beta[0]);
  const AllocResult r_ex = Allocate(blocks, beta, initial, exact);
  EXPECT_EQ(r_ex.lambda, 1.0 / 28672);
  EXPECT_EQ(r_ex.index, (std::vector<int>{1, 3, 0}));
  EXPECT_EQ(r_ex.n_steps, 1);
  EXPECT_EQ(r_ex.total_bits, beta[1] + beta[3] + beta[0]);
  // Over budget, both agree.
  for (const AllocatorOptions& o : {ref, exact}) {
    const auto at = [&](int ia) { return static_cast<double>(beta[ia] + beta[3] + beta[0]); };
    const AllocResult a8 = Allocate(blocks, beta, at(1), o);
    EXPECT_EQ(a8.lambda, 1.0 / 28672);
    EXPECT_EQ(a8.index, (std::vector<int>{1, 3, 0}));
    const AllocResult a4 = Allocate(blocks, beta, at(2), o);
    EXPECT_EQ(a4.lambda, 1.0 / 16384);
    EXPECT_EQ(a4.index, (std::vector<int>{2, 3, 0}));
    const AllocResult a1 = Allocate(blocks, beta, at(4), o);
    EXPECT_EQ(a1.lambda, 1.0 / 8192);
    EXPECT_EQ(a1.index, (std::vector<int>{4, 3, 0}));
    EXPECT_EQ(a1.total_bits, beta[4] + beta[3] + beta[0]);
  }
  // The clean ratchet takes no step under budget with either list.
  for (AllocatorOptions o : {ref, exact}) {
    o.ratchet = Ratchet::kClean;
    EXPECT_EQ(Allocate(blocks, beta, initial, o).n_steps, 0);
  }
}

TEST(GeodesiaAllocatorTest, HotBlocks) {
  // nb = 10, q_offset = 577 (block 9), window 128: {0} + {8, 9} (current and predecessor).
  std::vector<char> hot = HotBlocks(10, 577, 4, 128);
  std::vector<char> want = {1, 0, 0, 0, 0, 0, 0, 0, 1, 1};
  EXPECT_EQ(hot, want);
  // A chunked call from 200 with 10 blocks: 2..9 hot; window 300 -> last 5.
  hot = HotBlocks(10, 200, 4, 300);
  want = {1, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(hot, want);
  hot = HotBlocks(20, 1000, 70, 0);  // 70 sinks: 2 blocks
  EXPECT_TRUE(hot[0] && hot[1] && !hot[2] && hot[14] && hot[15] && !hot[13]);
  // sinks = 0: no sink block; 1..64 sinks: one.
  hot = HotBlocks(10, 577, 0, 0);
  want = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
  EXPECT_EQ(hot, want);
  EXPECT_EQ(HotBlocks(10, 577, 1, 0)[0], 1);
  EXPECT_EQ(HotBlocks(10, 577, 64, 0)[1], 0);
  // predecessor = false: block 8 (before the query's block 9) is no longer hot unless the
  // window covers it; a chunked call from 200 (block 3) keeps 3..9.
  hot = HotBlocks(10, 577, 0, 0, false);
  want = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  EXPECT_EQ(hot, want);
  hot = HotBlocks(10, 577, 0, 64, false);
  EXPECT_EQ(hot, want);
  hot = HotBlocks(10, 577, 0, 65, false);
  want = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
  EXPECT_EQ(hot, want);
  hot = HotBlocks(10, 200, 4, 0, false);
  want = {1, 0, 0, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(hot, want);
}

// §2.3 proxies against a direct evaluation of the formulas.
TEST(GeodesiaAllocatorTest, ErrorProxies) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int g : {16, 32, 64}) {
    const int D = 64;
    std::vector<double> k(64 * D), v(64 * D);
    for (auto& x : k) x = rng.Normal();
    for (auto& x : v) x = 3 * rng.Normal();
    const BlockErrors e = ComputeBlockErrors(k.data(), v.data(), 64, D, g, true);
    EXPECT_EQ(e.ek[0], 0);
    for (int li = 1; li < 4; ++li) {
      const int L = kLevels[li];
      double ek = 0;
      for (int t0 = 0; t0 < 64; t0 += g) {
        double s = 0;
        for (int c = 0; c < D; ++c) {
          double mn = 1e300, mx = -1e300;
          for (int t = t0; t < t0 + g; ++t) mn = std::min(mn, k[t * D + c]), mx = std::max(mx, k[t * D + c]);
          s += std::pow((mx - mn) / (2.0 * ((1 << L) - 1)), 2);
        }
        ek = std::max(ek, std::sqrt(s));
      }
      EXPECT_NEAR(e.ek[li], ek, 1e-12 * ek);
      double ev = 0;
      for (int t = 0; t < 64; ++t) {
        double s = 0;
        for (int c0 = 0; c0 < D; c0 += g) {
          double mn = 1e300, mx = -1e300;
          for (int c = c0; c < c0 + g; ++c) mn = std::min(mn, v[t * D + c]), mx = std::max(mx, v[t * D + c]);
          s += g * std::pow((mx - mn) / (2.0 * ((1 << L) - 1)), 2);
        }
        ev = std::max(ev, std::sqrt(s));
      }
      EXPECT_NEAR(e.ev[li], ev, 1e-12 * ev);
    }
    double rk = 0;
    for (int t = 0; t < 64; ++t) {
      double s = 0;
      for (int c = 0; c < D; ++c) {
        double m = 0;
        for (int u = 0; u < 64; ++u) m += k[u * D + c] / 64;
        s += (k[t * D + c] - m) * (k[t * D + c] - m);
      }
      rk = std::max(rk, std::sqrt(s));
    }
    EXPECT_NEAR(e.ek[4], rk, 1e-12 * rk);
  }
}

}  // namespace
}  // namespace strata::geodesia
