// Geodesia-KV rate accounting: the closed forms of §1.5 (bits per 64-token block and
// per value) and the same figures measured on a GradedLayer.
//
// beta(L), bits of one block of one KV head (K + V), P = 64, D = head dim, g = group size:
//   16: 2 P D 16;  L in {8,4,2}: 2 L P D + (P/g) D 32 + P (D/g) 32;  1: 2 D 16.
// Resident bits of a head = sum_b beta(L_b) + 32 D n_residual + 32 D n_blocks (boxes), the open
// block charged as a full exact block. Values = 2 T D. Not counted (as in the reference): the
// index tables, ek/ev, the residual positions.
//
// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#pragma once

#include <array>
#include <cstdint>

#include "kv/geodesia/blocks.h"

namespace strata::geodesia {

int64_t LevelBlockBits(int level, int head_dim, int group_size);
// beta(L) / (2 P D): 16, 8.5/4.5/2.5 (D = 128, g = 64), 0.25.
double LevelBitsPerValue(int level, int head_dim, int group_size);

// Closed form of the resident bits of one KV head: blocks per level (indexed like kLevels),
// residual tokens, and whether boxes are kept (one per block).
int64_t ResidentBitsClosedForm(const std::array<int64_t, kNumLevels>& level_blocks,
                               int64_t n_residual, int head_dim, int group_size, bool boxes = true);
// Bits one query head reads (§1.5, compressed-Quest): the read blocks' beta plus their
// residual rows, plus every box (n_blocks of them) when `boxes`.
int64_t ReadBitsClosedForm(const std::array<int64_t, kNumLevels>& read_level_blocks,
                           int64_t read_residual, int64_t n_blocks, int head_dim, int group_size,
                           bool boxes = true);

// Measured on a layer: resident bits (8 x ResidentBytes::total over heads) over 2 T D n_kv_heads.
double ResidentBitsPerValue(const GradedLayer& layer);
// Closed form evaluated on the layer's histograms and residual counts (sum over heads).
int64_t ResidentBitsClosedForm(const GradedLayer& layer);

}  // namespace strata::geodesia
