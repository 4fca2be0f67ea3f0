// Geodesia-KV graded block storage: one layer's K/V per KV head in 64-token blocks at levels
// 16 (bf16), 8/4/2 (packed codes + f16 scales) and 1 (f16 centroid), with key boxes, an exact
// per-token residual overlay and the per-(head, block) tables the packed kernel reads.
//
// Layout (GPU-friendly; §1.2-§1.4, §6):
//   * one slab per level, shared by all KV heads of the layer, holding fixed-size slots. A slab is
//     a list of segments of kSegmentBytes (a whole number of slots; the last segment may be
//     smaller): slot i lives in segment i / seg_slots. Full segments never move, so growing a slab
//     copies at most its last (partial) segment, never the whole slab: peak memory stays at the
//     live bytes plus one segment per slab, where doubling a contiguous slab cost 2x transiently
//     and up to 2x in zeroed capacity. (What a paged GPU cache does with its block table.)
//       16: [K 64 x D bf16][V 64 x D bf16]                                  (256 D bytes)
//       L : [K codes 64*D*L/8][V codes 64*D*L/8]                           (packed LSB-first,
//           [K lo f16 (64/g) x D][K step f16 (64/g) x D]                    token-major t*D + d)
//           [V lo f16 64 x (D/g)][V step f16 64 x (D/g)]
//        1: [K centroid D f16][V centroid D f16]
//     keys are quantized per channel over time groups of g tokens, values per token over channel
//     groups of g channels. Scale arrays exist only inside quantized slots.
//   * per head, per block (struct-of-arrays): level (int8), byte offset of the slot in its level's
//     slab (int64), exact-residual mask (uint64, bit t = token t overridden) and the index of the
//     block's first residual row (int32); per block (shared by all heads): n_valid (int32).
//   * per head (GradedConfig::boxes, on by default): the key box of every block, [n_blocks, 2, D]
//     f16 (kmin then kmax), filled when the block closes from its exact keys, rounded OUTWARD (down
//     for kmin, up for kmax) so that U_b(q) = scale * sum_c max(q_c kmin_c, q_c kmax_c) >=
//     scale * q.k for every key of the block. (The reference rounds to nearest; outward rounding
//     differs by at most one f16 ulp and keeps the bound sound.) A closed box never changes,
//     whatever the block's later level. Only compressed-Quest reads boxes, and §1.5 charges
//     them only with its gate on, so GeodesiaPolicy keeps them only then.
//   * per head: exact residual rows, [n_res, D] bf16 K and V sorted by position.
//
// Life of a block: the open (last) block is exact and receives Append()s; when it reaches 64
// tokens it closes: its box and the max L2 norm of its exact values are recorded. A closed block
// may be demoted (Demote) to a lower level; the old slot is freed at once and the slab is compacted
// when more than a quarter of it is free (holes filled from the top, emptied segments released), so
// allocated bytes really shrink (Compact() forces it).
//
// Demotion modes (§11.4):
//   kOnce    (reference): a block is re-encoded once, from its exact bf16 rows, and is then
//            immutable: only level-16 blocks may be demoted (to any lower level). Nothing beyond the
//            block's own level-16 slot is kept, and that slot is freed by the demotion.
//   kCascade: any closed block may be demoted again, re-encoding the CURRENT reconstruction
//            (dequantized in f32) into the new level. No exact source is kept either.
// Every re-encode adds max_t ||k_old - k_new||_2 to ek(h, b) and the value analogue to ev(h, b)
// (computed in f64 over the block's valid tokens); the certificate uses them.
//
// Thread safety: const methods may run concurrently; mutators need exclusive access. Any mutator
// (Append, Demote, AddResidual, Compact) invalidates PackedHeadViews and row pointers.
//
// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/buffer.h"
#include "core/status.h"
#include "kernels/geodesia_format.h"  // levels, slot layout, PackedHeadView, ReconstructBlock

namespace strata::geodesia {

// Target bytes of one slab segment (rounded down to whole slots, at least one slot).
inline constexpr int64_t kSegmentBytes = int64_t{1} << 20;

enum class DemotionMode { kOnce, kCascade };
const char* DemotionModeName(DemotionMode m);

struct GradedConfig {
  int n_kv_heads = 0;
  int head_dim = 0;     // D: key and value head dim (must be equal)
  int group_size = 64;  // g: must divide 64 and head_dim
  DemotionMode demotion = DemotionMode::kOnce;
  bool boxes = true;    // keep the per-block key boxes (compressed-Quest page bounds)
  // The open (last) block's rows are held by the caller (GeodesiaPolicy: the LayerStore page),
  // not here: AppendExternal counts tokens and stores a block when it closes. The open block is
  // level 16 without a slot (offset -1; it must not be read, reconstructed or demoted) and
  // resident_bytes() leaves it out; level_histogram() still counts it at 16, as §1.5 charges it.
  bool external_open = false;
};
// Checks a config; the error names the bad value.
Status ValidateGradedConfig(const GradedConfig& c);

// Bytes a layer (or one head) keeps resident, by kind. total() is what accounting charges.
struct ResidentBytes {
  int64_t payload = 0;   // bf16 rows, packed codes, centroids (open block: a full 64-row slot,
                         // unless GradedConfig::external_open, where the caller holds it)
  int64_t scales = 0;    // f16 lo/step of quantized blocks
  int64_t boxes = 0;     // f16 key boxes, one per block (open block included)
  int64_t residual = 0;  // exact residual K and V rows
  int64_t total() const { return payload + scales + boxes + residual; }
};

class GradedLayer {
 public:
  static StatusOr<GradedLayer> Create(const GradedConfig& config);
  GradedLayer(GradedLayer&&) = default;
  GradedLayer& operator=(GradedLayer&&) = default;
  GradedLayer(const GradedLayer&) = delete;
  GradedLayer& operator=(const GradedLayer&) = delete;
  // A deep copy (every slab segment copied at its capacity, so later growth and compaction
  // follow the same steps): shares nothing with this layer.
  GradedLayer Clone() const;

  const GradedConfig& config() const { return c_; }
  int n_kv_heads() const { return c_.n_kv_heads; }
  int head_dim() const { return c_.head_dim; }
  int64_t n_tokens() const { return n_tokens_; }
  int64_t n_blocks() const { return static_cast<int64_t>(n_valid_.size()); }
  // Blocks with 64 tokens (closed): all but a partial or just-opened last block.
  int64_t n_closed_blocks() const { return n_tokens_ / kBlockTokens; }
  bool closed(int64_t b) const { return b < n_closed_blocks(); }
  int32_t n_valid(int64_t b) const { return n_valid_[b]; }

  // Appends one token for every KV head. k, v: [n_kv_heads, head_dim] bf16. (Not with
  // external_open.)
  void Append(const uint16_t* k, const uint16_t* v);
  // external_open: counts one token for every KV head. When that token closes the open block,
  // block_k and block_v ([n_kv_heads, 64, head_dim] bf16) carry the whole block, which is stored
  // exact and closed; otherwise they must be null.
  void AppendExternal(const uint16_t* block_k, const uint16_t* block_v);
  // The open block: the last block when it has fewer than 64 tokens.
  bool has_open_block() const { return n_tokens_ % kBlockTokens != 0; }

  // Re-encodes closed block b of head h at `level` (< its current level) and frees the old slot.
  // Errors (InvalidArgument, naming the values): a level not on the ladder, an open block, a
  // level not below the current one, or (kOnce) a block that is no longer exact.
  Status Demote(int h, int64_t b, int level);

  // Keeps an exact copy of token `pos` of head h (k, v: [head_dim] bf16) that overrides the
  // token's reconstruction in attention. Errors: pos outside [0, n_tokens) or already overridden.
  Status AddResidual(int h, int64_t pos, const uint16_t* k, const uint16_t* v);
  bool has_residual(int h, int64_t pos) const;
  int64_t n_residual(int h) const { return static_cast<int64_t>(heads_[h].res_pos.size()); }

  int level(int h, int64_t b) const { return heads_[h].level[b]; }
  // Blocks of head h at each ladder level, indexed like kLevels.
  std::array<int64_t, kNumLevels> level_histogram(int h) const;
  // Key box of closed block b (CHECK; and that boxes are kept): [head_dim] f16 bits each.
  bool has_boxes() const { return c_.boxes; }
  const uint16_t* box_min(int h, int64_t b) const;
  const uint16_t* box_max(int h, int64_t b) const;
  // Accumulated re-encode errors (0 for a block never demoted) and the max L2 norm of the block's
  // exact values, recorded at close (0 for the open block).
  double ek(int h, int64_t b) const { return heads_[h].ek[b]; }
  double ev(int h, int64_t b) const { return heads_[h].ev[b]; }
  float v_norm_max(int h, int64_t b) const { return heads_[h].vnorm[b]; }

  // ReconstructBlock(view(h), b, k, v).
  void Reconstruct(int h, int64_t b, double* k, double* v) const;
  // Raw slot bytes of block b (SlotBytes(level) of them): for byte-identity checks.
  const uint8_t* slot(int h, int64_t b) const;

  PackedHeadView view(int h) const;

  ResidentBytes resident_bytes() const;       // all heads
  ResidentBytes resident_bytes(int h) const;  // one head
  // Bytes actually allocated (slab segment capacities + tables' payload arrays); >= resident
  // total, equal right after Compact().
  int64_t allocated_bytes() const;
  // Packs every slab to its live slots and releases the rest.
  void Compact();

 private:
  // A level's slots in segments (see the layout note above). Slot i (byte offset i * slot_bytes
  // in the slab) is byte (i % seg_slots) * slot_bytes of segment i / seg_slots. Every segment but
  // the last holds seg_slots slots; the last grows 1, 2, 4, ... slots up to seg_slots, then a new
  // segment starts. Freed slots go to a free list; compaction moves the highest live slots into
  // the lowest holes and releases the segments (and the part of the last one) past the live ones.
  struct Slab {
    int64_t slot_bytes = 0;
    int64_t seg_slots = 0;               // slots per full segment
    int64_t n_slots = 0;                 // capacity in slots (over all segments)
    std::vector<AlignedBuffer<uint8_t>> segs;
    std::vector<const uint8_t*> bases;   // segs[i].data(), what views point at
    std::vector<int64_t> free_slots;     // byte offsets of free slots
    std::vector<int64_t> owner;          // [n_slots] b * n_kv_heads + h of a live slot, -1 free
    int64_t live() const { return n_slots - static_cast<int64_t>(free_slots.size()); }
    int64_t seg_bytes() const { return seg_slots * slot_bytes; }
    uint8_t* at(int64_t off) { return segs[off / seg_bytes()].data() + off % seg_bytes(); }
    const uint8_t* at(int64_t off) const {
      return segs[off / seg_bytes()].data() + off % seg_bytes();
    }
    // Capacity of the last segment in slots (0 without segments).
    int64_t last_capacity() const {
      return segs.empty() ? 0 : n_slots - static_cast<int64_t>(segs.size() - 1) * seg_slots;
    }
  };
  struct Head {
    std::vector<int8_t> level;       // [n_blocks]
    std::vector<int64_t> offset;     // [n_blocks] byte offset in the level's slab
    std::vector<uint64_t> res_mask;  // [n_blocks]
    std::vector<int32_t> res_begin;  // [n_blocks]
    std::vector<double> ek, ev;      // [n_blocks]
    std::vector<float> vnorm;        // [n_blocks]
    std::vector<uint16_t> box;       // [n_blocks, 2, D] f16 (empty without boxes)
    std::vector<int64_t> res_pos;    // [n_res] ascending
    std::vector<uint16_t> res_k;     // [n_res, D] bf16
    std::vector<uint16_t> res_v;     // [n_res, D] bf16
  };

  explicit GradedLayer(const GradedConfig& c);
  // A free slot of level index li for block b of head h (the slab grows when none is free).
  int64_t AllocSlot(int li, int h, int64_t b);
  void GrowSlab(int li);
  // Resizes the last segment of a slab to `slots` slots (keeps min(old, new) slots' bytes).
  void ResizeLastSegment(int li, int64_t slots);
  void FreeSlot(int li, int64_t offset);
  void MaybeCompact(int li);
  void CompactSlab(int li);
  void CloseBlock(int64_t b);

  GradedConfig c_;
  int64_t n_tokens_ = 0;
  std::vector<int32_t> n_valid_;  // [n_blocks]
  std::array<Slab, kNumLevels> slabs_;
  std::vector<Head> heads_;
};

// scale * sum_c max(q_c kmin_c, q_c kmax_c) in f64: the compressed-Quest page bound (§4).
// Channels with q_c = 0 add 0 (an infinite box edge, from a key beyond the f16 range, then does
// not turn the bound into NaN); an infinite edge elsewhere gives an infinite, still sound, bound.
// (kv/geodesia/box_bound.cc: SIMD; the summation order is that of the CPU's SIMD target.)
double BoxUpperBound(const uint16_t* kmin, const uint16_t* kmax, const float* q, int head_dim,
                     float scale);
// The same for n_q query heads (q: [n_q, head_dim]) against one box: u[r], bit-identical to
// BoxUpperBound of head r alone.
void BoxUpperBounds(const uint16_t* kmin, const uint16_t* kmax, const float* q, int n_q,
                    int head_dim, float scale, double* u);

}  // namespace strata::geodesia
