// Geodesia-KV budgeted allocator: the Lagrangian lambda-bisection over marginal damage ratios of
// §2.4, the hot set of §2.2 and the error proxies of §2.3.
//
// Per KV head and call, block b sits at ladder index idx_b (kLevels = {16, 8, 4, 2, 1}). Step i
// moves a block from kLevels[i] to kLevels[i + 1] with ratio
//   r[b, i] = (damage_b(L_{i+1}) - damage_b(L_i)) / (beta(L_i) - beta(L_{i+1})),
//   damage_b(L) = max(mass_b, 1e-12)^p * e_b(L),  e_b(L) = ek_b(L) + w_v * ev_b(L).
// apply(lambda): a block takes the leading run of its available steps with r <= lambda; the run
// starts at column 0 in requant-once mode (the reference: a block already below 16 never moves
// again) and at column idx_b in cascade mode. lambda is the smallest candidate ratio whose total
// bits meet the target (binary search over the sorted ratios; total(lambda) is non-increasing).
// Candidate multipliers (§2.4): kReference (the reference) lists every available step of every
// non-hot block, i >= idx_b, including the later steps of blocks already below 16 bits in
// requant-once mode (their ratios come from errors computed on the quantized data). Those steps
// can never be taken (the run counts from column 0), but under budget one of them can be the
// smallest candidate, and then the forced ratchet step moves nothing. kExact lists the steps of
// blocks that can still move only (still-exact blocks in requant-once mode; the same list in
// cascade mode).
// Ratchet (§11.5): kReference applies the smallest candidate even when the current total
// already meets the target (each call takes at least the globally cheapest step); kClean takes no
// step then. Levels only ever move down.
//
// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "kv/geodesia/blocks.h"

namespace strata::geodesia {

enum class Ratchet { kReference, kClean };
enum class Candidates { kReference, kExact };

// One block as the allocator sees it.
struct AllocBlock {
  int index = 0;      // current ladder index (0 = level 16 ... 4 = level 1)
  bool hot = false;   // never demoted at this call
  double mass = 0;    // EMA mass
  // e_b(L) for every ladder level, indexed like kLevels (err[0] = 0 for an exact block; entries
  // above the current level are unused). Computed on the block's current reconstruction
  // (err[index] of a quantized block is its own level's proxy on that data in requant-once mode,
  // and 0 in cascade mode: the marginal error of a further re-encode).
  std::array<double, kNumLevels> err = {};
};

struct AllocatorOptions {
  double mass_power = 1;  // p
  Ratchet ratchet = Ratchet::kReference;
  bool cascade = false;  // steps may start at the current level (requant cascade)
  Candidates candidates = Candidates::kReference;
  // Ladder floor: no step below ladder index max_index (4 = the centroid, the reference; 3: no
  // block below 2 bits, so every token stays recoverable the way KIVI-2 keeps it).
  int max_index = kNumLevels - 1;
};

struct AllocResult {
  std::vector<int> index;     // new ladder index per block (>= the old one)
  double lambda = 0;          // the multiplier applied (-inf when no step was applied)
  int64_t total_bits = 0;     // sum of beta over all blocks after allocation
  int64_t initial_bits = 0;   // before
  int64_t n_steps = 0;        // level steps taken (sum of index increases)
  bool feasible = true;       // total_bits <= target (false: every available step was taken)
};

// beta(L) per ladder index for this geometry (LevelBlockBits of accounting.h).
std::array<int64_t, kNumLevels> LadderBits(int head_dim, int group_size);

// damage_b(L) / ratio helpers (exposed for tests).
double Damage(const AllocBlock& b, int ladder_index, double mass_power);
// r[b, i]; +inf when the step is unavailable (hot, i >= 4, or i < b.index).
double StepRatio(const AllocBlock& b, int i, const std::array<int64_t, kNumLevels>& beta,
                 double mass_power);

// Solves one allocation. target_bits: the budget B * 2 * nb * 64 * D (minus what the caller
// charges against it).
AllocResult Allocate(const std::vector<AllocBlock>& blocks,
                     const std::array<int64_t, kNumLevels>& beta, double target_bits,
                     const AllocatorOptions& o);
// The level indices apply(lambda) gives (the inner step of Allocate; for tests).
std::vector<int> ApplyLambda(const std::vector<AllocBlock>& blocks,
                             const std::array<int64_t, kNumLevels>& beta, double lambda,
                             const AllocatorOptions& o);

// Hot blocks at a call whose first query sits at q_offset, with nb blocks in the cache: block
// [0, ceil(sinks / 64)) (none for sinks = 0), blocks >= floor(q_offset / 64) - 1 (the query's
// block and its predecessor, the reference; predecessor = false: from the query's block on),
// the last ceil(window / 64) blocks.
std::vector<char> HotBlocks(int64_t nb, int64_t q_offset, int64_t sinks, int64_t window,
                            bool predecessor = true);

// Error proxies of one block (§2.3) from its current rows. k, v: [64, D] f64, the first
// n_valid rows valid. ek[i], ev[i] for every ladder index (index 0 = 0). Keys: time groups of
// min(g, 64) tokens per channel; values: channel groups of g per token.
struct BlockErrors {
  std::array<double, kNumLevels> ek = {};
  std::array<double, kNumLevels> ev = {};
};
BlockErrors ComputeBlockErrors(const double* k, const double* v, int n_valid, int head_dim,
                               int group_size, bool with_values);

}  // namespace strata::geodesia
