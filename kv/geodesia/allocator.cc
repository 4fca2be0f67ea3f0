#include "kv/geodesia/allocator.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "kv/geodesia/accounting.h"

namespace strata::geodesia {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kSteps = kNumLevels - 1;

// Leading run of steps with ratio <= lambda, from the block's first usable column.
int NewIndex(const AllocBlock& b, const std::array<int64_t, kNumLevels>& beta, double lambda,
             const AllocatorOptions& o) {
  if (b.hot) return b.index;
  // Requant once: the run counts from column 0, so a block already below 16 never moves.
  const int start = o.cascade ? b.index : 0;
  const int steps = std::min(kSteps, o.max_index);
  int i = start;
  while (i < steps) {
    const double r = StepRatio(b, i, beta, o.mass_power);
    if (!(r <= lambda) || r == kInf) break;
    ++i;
  }
  return std::max(b.index, std::min(i, steps));
}

}  // namespace

std::array<int64_t, kNumLevels> LadderBits(int head_dim, int group_size) {
  std::array<int64_t, kNumLevels> beta{};
  for (int i = 0; i < kNumLevels; ++i) beta[i] = LevelBlockBits(kLevels[i], head_dim, group_size);
  return beta;
}

double Damage(const AllocBlock& b, int ladder_index, double mass_power) {
  const double m = std::max(b.mass, 1e-12);
  const double w = mass_power == 1 ? m : std::pow(m, mass_power);
  return w * b.err[ladder_index];
}

double StepRatio(const AllocBlock& b, int i, const std::array<int64_t, kNumLevels>& beta,
                 double mass_power) {
  if (b.hot || i < 0 || i >= kSteps || i < b.index) return kInf;
  const double dd = Damage(b, i + 1, mass_power) - Damage(b, i, mass_power);
  return dd / static_cast<double>(beta[i] - beta[i + 1]);
}

std::vector<int> ApplyLambda(const std::vector<AllocBlock>& blocks,
                             const std::array<int64_t, kNumLevels>& beta, double lambda,
                             const AllocatorOptions& o) {
  std::vector<int> idx(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) idx[b] = NewIndex(blocks[b], beta, lambda, o);
  return idx;
}

AllocResult Allocate(const std::vector<AllocBlock>& blocks,
                     const std::array<int64_t, kNumLevels>& beta, double target_bits,
                     const AllocatorOptions& o) {
  AllocResult r;
  // Blocks that can move at all, and the fixed bits of the rest.
  std::vector<int64_t> movable;
  int64_t fixed = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    const AllocBlock& blk = blocks[b];
    STRATA_CHECK(blk.index >= 0 && blk.index < kNumLevels);
    r.initial_bits += beta[blk.index];
    const bool can_move = !blk.hot && blk.index < std::min(kSteps, o.max_index) &&
                          (o.cascade || blk.index == 0);
    if (can_move) {
      movable.push_back(static_cast<int64_t>(b));
    } else {
      fixed += beta[blk.index];
    }
  }
  r.index.resize(blocks.size());
  for (size_t b = 0; b < blocks.size(); ++b) r.index[b] = blocks[b].index;
  r.lambda = -kInf;
  r.total_bits = r.initial_bits;
  // Candidate multipliers: the finite ratios of available steps. (The reference also sorts the
  // +inf sentinels of unavailable steps; applying one takes every available step, exactly as the
  // largest finite ratio does, so they add nothing.) kReference: every non-hot block's steps
  // i >= idx_b, also those of blocks that can no longer move (requant once, already quantized);
  // kExact: the movable blocks' steps only.
  std::vector<double> cand;
  cand.reserve(blocks.size() * kSteps);
  STRATA_CHECK(o.max_index >= 0 && o.max_index <= kSteps);
  auto add_steps = [&](size_t b) {
    for (int i = blocks[b].index; i < std::min(kSteps, o.max_index); ++i) {
      const double x = StepRatio(blocks[b], i, beta, o.mass_power);
      if (x != kInf) cand.push_back(x);
    }
  };
  if (o.candidates == Candidates::kReference) {
    for (size_t b = 0; b < blocks.size(); ++b) add_steps(b);  // StepRatio: +inf when hot
  } else {
    for (int64_t b : movable) add_steps(static_cast<size_t>(b));
  }
  r.feasible = static_cast<double>(r.initial_bits) <= target_bits;
  if (cand.empty()) return r;
  if (o.ratchet == Ratchet::kClean && r.feasible) return r;
  std::sort(cand.begin(), cand.end());
  cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
  auto total = [&](double lambda) {
    int64_t t = fixed;
    for (int64_t b : movable) t += beta[NewIndex(blocks[b], beta, lambda, o)];
    return t;
  };
  // Smallest p with total(cand[p]) <= target; the last candidate when none meets it.
  int64_t lo = 0, hi = static_cast<int64_t>(cand.size()) - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<double>(total(cand[mid])) <= target_bits) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  r.lambda = cand[lo];
  int64_t t = fixed;
  for (int64_t b : movable) {
    const int ni = NewIndex(blocks[b], beta, r.lambda, o);
    r.n_steps += ni - blocks[b].index;
    r.index[b] = ni;
    t += beta[ni];
  }
  r.total_bits = t;
  r.feasible = static_cast<double>(t) <= target_bits;
  return r;
}

std::vector<char> HotBlocks(int64_t nb, int64_t q_offset, int64_t sinks, int64_t window,
                            bool predecessor) {
  std::vector<char> hot(nb, 0);
  // sinks = 0: no sink block (beyond the reference, whose sinks = 4 always holds block 0).
  const int64_t n_sink = (sinks + kBlockTokens - 1) / kBlockTokens;
  for (int64_t b = 0; b < std::min(nb, n_sink); ++b) hot[b] = 1;
  const int64_t first_recent = q_offset / kBlockTokens - (predecessor ? 1 : 0);
  for (int64_t b = std::max<int64_t>(0, first_recent); b < nb; ++b) hot[b] = 1;
  const int64_t n_win = (window + kBlockTokens - 1) / kBlockTokens;
  for (int64_t b = std::max<int64_t>(0, nb - n_win); b < nb; ++b) hot[b] = 1;
  return hot;
}

BlockErrors ComputeBlockErrors(const double* k, const double* v, int n_valid, int D, int g,
                               bool with_values) {
  BlockErrors e;
  STRATA_CHECK(n_valid > 0 && n_valid <= kBlockTokens);
  const int tg = std::min(g, kBlockTokens);
  const int vg = std::min(g, D);
  // Key ranges per (time group, channel); value ranges per (token, channel group).
  for (int li = 1; li < kNumLevels - 1; ++li) {
    const double denom = 2.0 * ((1 << kLevels[li]) - 1);
    double ek = 0;
    for (int t0 = 0; t0 < n_valid; t0 += tg) {
      const int t1 = std::min(n_valid, t0 + tg);
      double s = 0;
      for (int c = 0; c < D; ++c) {
        double mn = k[t0 * D + c], mx = mn;
        for (int t = t0 + 1; t < t1; ++t) {
          mn = std::min(mn, k[t * D + c]);
          mx = std::max(mx, k[t * D + c]);
        }
        const double h = (mx - mn) / denom;
        s += h * h;
      }
      ek = std::max(ek, std::sqrt(s));
    }
    e.ek[li] = ek;
    if (with_values) {
      double ev = 0;
      for (int t = 0; t < n_valid; ++t) {
        double s = 0;
        for (int c0 = 0; c0 < D; c0 += vg) {
          const int c1 = std::min(D, c0 + vg);
          double mn = v[t * D + c0], mx = mn;
          for (int c = c0 + 1; c < c1; ++c) {
            mn = std::min(mn, v[t * D + c]);
            mx = std::max(mx, v[t * D + c]);
          }
          const double h = (mx - mn) / denom;
          s += (c1 - c0) * h * h;
        }
        ev = std::max(ev, std::sqrt(s));
      }
      e.ev[li] = ev;
    }
  }
  // Centroid: the radius max_t ||x_t - mean x||.
  auto radius = [&](const double* x) {
    std::vector<double> mean(D, 0.0);
    for (int t = 0; t < n_valid; ++t) {
      for (int c = 0; c < D; ++c) mean[c] += x[t * D + c];
    }
    for (int c = 0; c < D; ++c) mean[c] /= n_valid;
    double r = 0;
    for (int t = 0; t < n_valid; ++t) {
      double s = 0;
      for (int c = 0; c < D; ++c) {
        const double d = x[t * D + c] - mean[c];
        s += d * d;
      }
      r = std::max(r, std::sqrt(s));
    }
    return r;
  };
  e.ek[kNumLevels - 1] = radius(k);
  if (with_values) e.ev[kNumLevels - 1] = radius(v);
  return e;
}

}  // namespace strata::geodesia
