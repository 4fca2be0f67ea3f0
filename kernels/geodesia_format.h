// Geodesia-KV's packed block format as the kernels read it: the level ladder, the byte layout of
// a block's slot at each level, LSB-first bit packing, the per-head table view (PackedHeadView)
// and the float64 decode of a block. Storage and encoding live in kv/geodesia/ (blocks.h,
// quant.h); this is the part the packed attention kernel (kernels/packed_attention.h) needs.
#pragma once

#include <array>
#include <cstdint>

namespace strata::geodesia {

inline constexpr int kBlockTokens = 64;
inline constexpr int kNumLevels = 5;
// The ladder, highest first. A level's index in it selects its slab.
inline constexpr std::array<int, kNumLevels> kLevels = {16, 8, 4, 2, 1};
// Index of a level in kLevels (16 -> 0 ... 1 -> 4), -1 for a level not on the ladder.
constexpr int LevelIndex(int level) {
  switch (level) {
    case 16: return 0;
    case 8: return 1;
    case 4: return 2;
    case 2: return 3;
    case 1: return 4;
    default: return -1;
  }
}
constexpr bool IsLevel(int level) { return LevelIndex(level) >= 0; }

// Byte offsets of the parts of one block's slot at a level (D = head dim, g = group size, L =
// level). Level 16: k_rows = 0 and v_rows = 64 D * 2 ([64, D] bf16 each). Level L in {8,4,2}:
// k_codes, v_codes (64 D L / 8 bytes each), k_lo, k_step ([64/g, D] f16), v_lo, v_step ([64, D/g]
// f16). Level 1: k_rows = 0 and v_rows = 2 D ([D] f16 centroids). Unused parts are -1.
struct SlotLayout {
  int64_t k_rows = -1, v_rows = -1;
  int64_t k_codes = -1, v_codes = -1, k_lo = -1, k_step = -1, v_lo = -1, v_step = -1;
  int64_t bytes = 0;        // whole slot
  int64_t scale_bytes = 0;  // of which f16 scales (quantized levels only)
};
SlotLayout GetSlotLayout(int level, int head_dim, int group_size);
// Bytes of one block's slot at `level` (payload + scales).
int64_t SlotBytes(int level, int head_dim, int group_size);

// Bit packing, LSB first: code j of a byte sits at bits [j * bits, (j + 1) * bits), and byte i
// holds codes [i * 8 / bits, (i + 1) * 8 / bits). bits in {2, 4, 8}; n must be a multiple of
// 8 / bits. Codes must be < 2^bits (CHECK in Pack). Example: 2-bit (1, 2, 3, 0) -> 0x39.
int64_t PackedBytes(int64_t n_codes, int bits);  // n * bits / 8
void PackCodes(const uint8_t* codes, int64_t n, int bits, uint8_t* out);
void UnpackCodes(const uint8_t* packed, int64_t n, int bits, uint8_t* codes);

// The tables of one KV head as the packed kernel reads them: plain pointers (GradedLayer::view in
// kv/geodesia/blocks.h builds one over its slabs; valid until the layer's next mutation).
struct PackedHeadView {
  int head_dim = 0;
  int group_size = 0;
  int64_t n_blocks = 0;
  const int8_t* level = nullptr;    // [n_blocks] 16, 8, 4, 2 or 1
  const int64_t* offset = nullptr;  // [n_blocks] byte offset of the slot in its level's slab
  const int32_t* n_valid = nullptr;  // [n_blocks] valid tokens, 0..64 (0: the block is skipped)
  // Per level: the slab's segment bases, and the bytes of a full segment. The slot at slab byte
  // offset o is at seg[li][o / seg_bytes[li]] + o % seg_bytes[li].
  std::array<const uint8_t* const*, kNumLevels> seg = {};
  std::array<int64_t, kNumLevels> seg_bytes = {};
  // Exact residual overlay; all null when the head has none. Token t of block b is overridden
  // when bit t of res_mask[b] is set; its exact rows are row
  // res_begin[b] + popcount(res_mask[b] & ((1 << t) - 1)) of res_k / res_v.
  const uint64_t* res_mask = nullptr;  // [n_blocks]
  const int32_t* res_begin = nullptr;  // [n_blocks]
  const uint16_t* res_k = nullptr;     // [n_res, head_dim] bf16
  const uint16_t* res_v = nullptr;     // [n_res, head_dim] bf16

  // Start of block b's slot.
  const uint8_t* slot(int64_t b) const {
    const int li = LevelIndex(level[b]);
    return seg[li][offset[b] / seg_bytes[li]] + offset[b] % seg_bytes[li];
  }
};

// Block b of a view decoded into f64 (no residual overlay): k, v: [64, head_dim], rows
// [n_valid, 64) zero. The exact values the stored representation denotes: bf16 rows, code * step +
// lo (computed in f64), or the f16 centroid on every valid row.
void ReconstructBlock(const PackedHeadView& view, int64_t b, double* k, double* v);

}  // namespace strata::geodesia
