// Geodesia-KV graded block storage (see blocks.h).
#include "kv/geodesia/blocks.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/check.h"
#include "core/dtype.h"
#include "kv/geodesia/quant.h"

namespace strata::geodesia {

GradedLayer GradedLayer::Clone() const {
  GradedLayer c(c_);
  c.n_tokens_ = n_tokens_;
  c.n_valid_ = n_valid_;
  c.heads_ = heads_;
  for (size_t li = 0; li < slabs_.size(); ++li) {
    const Slab& a = slabs_[li];
    Slab& b = c.slabs_[li];
    b.slot_bytes = a.slot_bytes;
    b.seg_slots = a.seg_slots;
    b.n_slots = a.n_slots;
    b.segs.clear();
    b.bases.clear();
    for (const AlignedBuffer<uint8_t>& seg : a.segs) {
      b.segs.push_back(seg.Clone());
      b.bases.push_back(b.segs.back().data());
    }
    b.free_slots = a.free_slots;
    b.owner = a.owner;
  }
  return c;
}

const char* DemotionModeName(DemotionMode m) {
  return m == DemotionMode::kOnce ? "once" : "cascade";
}

Status ValidateGradedConfig(const GradedConfig& c) {
  if (c.n_kv_heads <= 0) {
    return InvalidArgument("geodesia: n_kv_heads must be >= 1, got " + std::to_string(c.n_kv_heads));
  }
  if (c.head_dim <= 0) {
    return InvalidArgument("geodesia: head_dim must be >= 1, got " + std::to_string(c.head_dim));
  }
  if (c.group_size <= 0 || kBlockTokens % c.group_size != 0 || c.head_dim % c.group_size != 0) {
    return InvalidArgument("geodesia: group size " + std::to_string(c.group_size) +
                           " must divide the block size 64 and the head dim " +
                           std::to_string(c.head_dim));
  }
  return OkStatus();
}

namespace {

// Quantizes a full block (64 rows of keys and values, f32 [64, D]) into a level-L slot.
void EncodeQuantized(const float* k, const float* v, int D, int g, int bits, uint8_t* slot) {
  const int P = kBlockTokens;
  const SlotLayout L = GetSlotLayout(bits, D, g);
  uint16_t* klo = reinterpret_cast<uint16_t*>(slot + L.k_lo);
  uint16_t* kst = reinterpret_cast<uint16_t*>(slot + L.k_step);
  uint16_t* vlo = reinterpret_cast<uint16_t*>(slot + L.v_lo);
  uint16_t* vst = reinterpret_cast<uint16_t*>(slot + L.v_step);
  std::vector<uint8_t> codes(P * D);
  // Keys: per channel over time groups of g tokens.
  for (int tg = 0; tg < P / g; ++tg) {
    for (int c = 0; c < D; ++c) {
      float lo = k[tg * g * D + c], hi = lo;
      for (int t = tg * g; t < (tg + 1) * g; ++t) {
        lo = std::min(lo, k[t * D + c]);
        hi = std::max(hi, k[t * D + c]);
      }
      const QuantParams p = MakeQuantParams(lo, hi, bits);
      klo[tg * D + c] = p.lo;
      kst[tg * D + c] = p.step;
      QuantizeRun(k + tg * g * D + c, g, D, p, bits, codes.data() + tg * g * D + c, D);
    }
  }
  PackCodes(codes.data(), int64_t{P} * D, bits, slot + L.k_codes);
  // Values: per token over channel groups of g channels.
  const int GV = D / g;
  for (int t = 0; t < P; ++t) {
    for (int cg = 0; cg < GV; ++cg) {
      const float* x = v + t * D + cg * g;
      float lo = x[0], hi = x[0];
      for (int c = 1; c < g; ++c) {
        lo = std::min(lo, x[c]);
        hi = std::max(hi, x[c]);
      }
      const QuantParams p = MakeQuantParams(lo, hi, bits);
      vlo[t * GV + cg] = p.lo;
      vst[t * GV + cg] = p.step;
      QuantizeRun(x, g, 1, p, bits, codes.data() + t * D + cg * g, 1);
    }
  }
  PackCodes(codes.data(), int64_t{P} * D, bits, slot + L.v_codes);
}

// Centroid of the first n rows (f64 mean, stored f16).
void EncodeCentroid(const float* k, const float* v, int n, int D, uint8_t* slot) {
  uint16_t* kc = reinterpret_cast<uint16_t*>(slot);
  uint16_t* vc = kc + D;
  for (int c = 0; c < D; ++c) {
    double sk = 0, sv = 0;
    for (int t = 0; t < n; ++t) {
      sk += k[t * D + c];
      sv += v[t * D + c];
    }
    kc[c] = F32ToF16(static_cast<float>(sk / n));
    vc[c] = F32ToF16(static_cast<float>(sv / n));
  }
}

double MaxRowDiff(const double* a, const double* b, int n, int D) {
  double worst = 0;
  for (int t = 0; t < n; ++t) {
    double s = 0;
    for (int c = 0; c < D; ++c) {
      const double e = a[t * D + c] - b[t * D + c];
      s += e * e;
    }
    worst = std::max(worst, std::sqrt(s));
  }
  return worst;
}

}  // namespace

StatusOr<GradedLayer> GradedLayer::Create(const GradedConfig& config) {
  RETURN_IF_ERROR(ValidateGradedConfig(config));
  return GradedLayer(config);
}

GradedLayer::GradedLayer(const GradedConfig& c) : c_(c), heads_(c.n_kv_heads) {
  for (int i = 0; i < kNumLevels; ++i) {
    Slab& s = slabs_[i];
    s.slot_bytes = SlotBytes(kLevels[i], c.head_dim, c.group_size);
    s.seg_slots = std::max<int64_t>(1, kSegmentBytes / s.slot_bytes);
  }
}

void GradedLayer::ResizeLastSegment(int li, int64_t slots) {
  Slab& s = slabs_[li];
  STRATA_CHECK(!s.segs.empty() && slots >= 1 && slots <= s.seg_slots);
  const int64_t old = s.last_capacity();
  if (slots == old) return;
  AlignedBuffer<uint8_t> mem(static_cast<size_t>(slots * s.slot_bytes));
  std::memcpy(mem.data(), s.segs.back().data(), std::min(old, slots) * s.slot_bytes);
  s.segs.back() = std::move(mem);
  s.bases.back() = s.segs.back().data();
  s.n_slots += slots - old;
  s.owner.resize(s.n_slots, -1);
}

void GradedLayer::GrowSlab(int li) {
  // Doubles the last segment up to seg_slots (copying at most one segment), else starts a new
  // one: full segments never move.
  Slab& s = slabs_[li];
  const int64_t first_new = s.n_slots;
  const int64_t last = s.last_capacity();
  if (!s.segs.empty() && last < s.seg_slots) {
    ResizeLastSegment(li, std::min(s.seg_slots, 2 * last));
  } else {
    s.segs.emplace_back(static_cast<size_t>(s.slot_bytes));
    s.bases.push_back(s.segs.back().data());
    s.n_slots += 1;
    s.owner.resize(s.n_slots, -1);
  }
  // Lowest offsets on top of the free list: new blocks fill the slab from the front.
  for (int64_t i = s.n_slots - 1; i >= first_new; --i) s.free_slots.push_back(i * s.slot_bytes);
}

int64_t GradedLayer::AllocSlot(int li, int h, int64_t b) {
  Slab& s = slabs_[li];
  if (s.free_slots.empty()) GrowSlab(li);
  const int64_t off = s.free_slots.back();
  s.free_slots.pop_back();
  s.owner[off / s.slot_bytes] = b * c_.n_kv_heads + h;
  return off;
}

void GradedLayer::FreeSlot(int li, int64_t offset) {
  Slab& s = slabs_[li];
  std::memset(s.at(offset), 0, s.slot_bytes);
  s.free_slots.push_back(offset);
  s.owner[offset / s.slot_bytes] = -1;
}

void GradedLayer::MaybeCompact(int li) {
  const Slab& s = slabs_[li];
  if (static_cast<int64_t>(s.free_slots.size()) * 4 > s.n_slots) CompactSlab(li);
}

void GradedLayer::CompactSlab(int li) {
  // The live slots at or above index `live` move into the holes below it (lowest hole first,
  // highest slot first); then every slot past `live` is free and its storage is released: whole
  // segments, and the tail of the new last segment. Cost O(free slots), no second copy of the slab.
  Slab& m = slabs_[li];
  const int64_t live = m.live();
  std::vector<int64_t> holes;
  for (int64_t off : m.free_slots) {
    if (off / m.slot_bytes < live) holes.push_back(off / m.slot_bytes);
  }
  std::sort(holes.begin(), holes.end());
  size_t next = 0;
  for (int64_t i = m.n_slots - 1; i >= live; --i) {
    const int64_t who = m.owner[i];
    if (who < 0) continue;
    STRATA_CHECK(next < holes.size());
    const int64_t dst = holes[next++];
    std::memcpy(m.at(dst * m.slot_bytes), m.at(i * m.slot_bytes), m.slot_bytes);
    m.owner[dst] = who;
    heads_[who % c_.n_kv_heads].offset[who / c_.n_kv_heads] = dst * m.slot_bytes;
  }
  STRATA_CHECK(next == holes.size());
  m.free_slots.clear();
  const int64_t n_segs = (live + m.seg_slots - 1) / m.seg_slots;
  m.segs.resize(n_segs);
  m.bases.resize(n_segs);
  m.n_slots = std::min(m.n_slots, n_segs * m.seg_slots);
  m.owner.resize(m.n_slots);
  if (n_segs > 0) ResizeLastSegment(li, live - (n_segs - 1) * m.seg_slots);
  m.owner.resize(live);
  m.owner.shrink_to_fit();
  STRATA_CHECK(m.n_slots == live);
}

void GradedLayer::Compact() {
  for (int li = 0; li < kNumLevels; ++li) {
    if (!slabs_[li].free_slots.empty()) CompactSlab(li);
  }
  for (Head& hd : heads_) {
    hd.box.shrink_to_fit();
    hd.res_k.shrink_to_fit();
    hd.res_v.shrink_to_fit();
  }
}

void GradedLayer::AppendExternal(const uint16_t* block_k, const uint16_t* block_v) {
  STRATA_CHECK_MSG(c_.external_open, "AppendExternal needs GradedConfig::external_open");
  const int D = c_.head_dim;
  if (n_tokens_ % kBlockTokens == 0) {
    n_valid_.push_back(0);
    for (Head& hd : heads_) {
      hd.level.push_back(16);
      hd.offset.push_back(-1);  // no slot while open
      hd.res_mask.push_back(0);
      hd.res_begin.push_back(static_cast<int32_t>(hd.res_pos.size()));
      hd.ek.push_back(0);
      hd.ev.push_back(0);
      hd.vnorm.push_back(0);
      if (c_.boxes) hd.box.resize(hd.box.size() + 2 * D, 0);
    }
  }
  const int64_t b = n_blocks() - 1;
  ++n_valid_[b];
  ++n_tokens_;
  const bool closes = n_valid_[b] == kBlockTokens;
  STRATA_CHECK_MSG(closes == (block_k != nullptr && block_v != nullptr),
                   "AppendExternal: the rows of block %lld must come exactly with the token that "
                   "closes it", static_cast<long long>(b));
  if (!closes) return;
  const SlotLayout L = GetSlotLayout(16, D, c_.group_size);
  for (int h = 0; h < c_.n_kv_heads; ++h) {
    heads_[h].offset[b] = AllocSlot(LevelIndex(16), h, b);
    uint8_t* slot = slabs_[LevelIndex(16)].at(heads_[h].offset[b]);
    const int64_t n = static_cast<int64_t>(kBlockTokens) * D;
    std::memcpy(slot + L.k_rows, block_k + h * n, n * 2);
    std::memcpy(slot + L.v_rows, block_v + h * n, n * 2);
  }
  CloseBlock(b);
}

void GradedLayer::Append(const uint16_t* k, const uint16_t* v) {
  STRATA_CHECK_MSG(!c_.external_open, "Append with GradedConfig::external_open (AppendExternal)");
  const int D = c_.head_dim;
  if (n_tokens_ % kBlockTokens == 0) {
    n_valid_.push_back(0);
    for (Head& hd : heads_) {
      hd.level.push_back(16);
      hd.offset.push_back(AllocSlot(LevelIndex(16), static_cast<int>(&hd - heads_.data()),
                                    n_blocks() - 1));
      hd.res_mask.push_back(0);
      hd.res_begin.push_back(static_cast<int32_t>(hd.res_pos.size()));
      hd.ek.push_back(0);
      hd.ev.push_back(0);
      hd.vnorm.push_back(0);
      if (c_.boxes) hd.box.resize(hd.box.size() + 2 * D, 0);
    }
  }
  const int64_t b = n_blocks() - 1;
  const int t = n_valid_[b];
  const SlotLayout L = GetSlotLayout(16, D, c_.group_size);
  Slab& slab = slabs_[LevelIndex(16)];
  for (int h = 0; h < c_.n_kv_heads; ++h) {
    uint8_t* slot = slab.at(heads_[h].offset[b]);
    std::memcpy(slot + L.k_rows + t * D * 2, k + h * D, D * 2);
    std::memcpy(slot + L.v_rows + t * D * 2, v + h * D, D * 2);
  }
  ++n_valid_[b];
  ++n_tokens_;
  if (n_valid_[b] == kBlockTokens) CloseBlock(b);
}

void GradedLayer::CloseBlock(int64_t b) {
  const int D = c_.head_dim;
  const SlotLayout L = GetSlotLayout(16, D, c_.group_size);
  for (Head& hd : heads_) {
    STRATA_CHECK(hd.level[b] == 16);
    const uint8_t* slot = slabs_[LevelIndex(16)].at(hd.offset[b]);
    const uint16_t* kr = reinterpret_cast<const uint16_t*>(slot + L.k_rows);
    const uint16_t* vr = reinterpret_cast<const uint16_t*>(slot + L.v_rows);
    if (c_.boxes) {
      uint16_t* bmin = hd.box.data() + b * 2 * D;
      uint16_t* bmax = bmin + D;
      for (int c = 0; c < D; ++c) {
        float lo = Bf16ToF32(kr[c]), hi = lo;
        for (int t = 1; t < kBlockTokens; ++t) {
          const float x = Bf16ToF32(kr[t * D + c]);
          lo = std::min(lo, x);
          hi = std::max(hi, x);
        }
        bmin[c] = F16RoundDown(lo);
        bmax[c] = F16RoundUp(hi);
      }
    }
    double vmax = 0;
    for (int t = 0; t < kBlockTokens; ++t) {
      double s = 0;
      for (int c = 0; c < D; ++c) {
        const double x = Bf16ToF32(vr[t * D + c]);
        s += x * x;
      }
      vmax = std::max(vmax, std::sqrt(s));
    }
    // Rounded up so that it stays an upper bound of every exact value norm.
    hd.vnorm[b] = std::nextafter(static_cast<float>(vmax), std::numeric_limits<float>::infinity());
  }
}

Status GradedLayer::Demote(int h, int64_t b, int level) {
  if (h < 0 || h >= c_.n_kv_heads) {
    return InvalidArgument("geodesia: Demote: KV head " + std::to_string(h) + " outside [0, " +
                           std::to_string(c_.n_kv_heads) + ")");
  }
  if (!IsLevel(level)) {
    return InvalidArgument("geodesia: Demote: level " + std::to_string(level) +
                           " is not one of 16, 8, 4, 2, 1");
  }
  if (b < 0 || !closed(b)) {
    return InvalidArgument("geodesia: Demote: block " + std::to_string(b) +
                           " is not a closed block (closed blocks: " +
                           std::to_string(n_closed_blocks()) + ")");
  }
  Head& hd = heads_[h];
  const int cur = hd.level[b];
  if (level >= cur) {
    return InvalidArgument("geodesia: Demote: head " + std::to_string(h) + " block " +
                           std::to_string(b) + " is at level " + std::to_string(cur) +
                           "; target level " + std::to_string(level) + " is not lower");
  }
  if (c_.demotion == DemotionMode::kOnce && cur != 16) {
    return InvalidArgument("geodesia: Demote: head " + std::to_string(h) + " block " +
                           std::to_string(b) + " was already re-encoded (level " +
                           std::to_string(cur) + "); demotion mode 'once' freezes it");
  }
  const int D = c_.head_dim, P = kBlockTokens;
  const PackedHeadView vw = view(h);
  std::vector<double> k_old(P * D), v_old(P * D), k_new(P * D), v_new(P * D);
  ReconstructBlock(vw, b, k_old.data(), v_old.data());
  // The source: the exact bf16 rows (level 16) or the current reconstruction in f32 (cascade).
  std::vector<float> ks(P * D), vs(P * D);
  for (int i = 0; i < P * D; ++i) {
    ks[i] = static_cast<float>(k_old[i]);
    vs[i] = static_cast<float>(v_old[i]);
  }
  const int li_new = LevelIndex(level), li_old = LevelIndex(cur);
  const int64_t off = AllocSlot(li_new, h, b);
  uint8_t* slot = slabs_[li_new].at(off);
  if (level == 1) {
    EncodeCentroid(ks.data(), vs.data(), n_valid_[b], D, slot);
  } else {
    EncodeQuantized(ks.data(), vs.data(), D, c_.group_size, level, slot);
  }
  FreeSlot(li_old, hd.offset[b]);
  hd.level[b] = static_cast<int8_t>(level);
  hd.offset[b] = off;
  ReconstructBlock(view(h), b, k_new.data(), v_new.data());
  hd.ek[b] += MaxRowDiff(k_old.data(), k_new.data(), n_valid_[b], D);
  hd.ev[b] += MaxRowDiff(v_old.data(), v_new.data(), n_valid_[b], D);
  MaybeCompact(li_old);
  return OkStatus();
}

Status GradedLayer::AddResidual(int h, int64_t pos, const uint16_t* k, const uint16_t* v) {
  if (h < 0 || h >= c_.n_kv_heads) {
    return InvalidArgument("geodesia: AddResidual: KV head " + std::to_string(h) + " outside [0, " +
                           std::to_string(c_.n_kv_heads) + ")");
  }
  if (pos < 0 || pos >= n_tokens_) {
    return InvalidArgument("geodesia: AddResidual: position " + std::to_string(pos) +
                           " outside [0, " + std::to_string(n_tokens_) + ")");
  }
  Head& hd = heads_[h];
  auto it = std::lower_bound(hd.res_pos.begin(), hd.res_pos.end(), pos);
  if (it != hd.res_pos.end() && *it == pos) {
    return InvalidArgument("geodesia: AddResidual: position " + std::to_string(pos) +
                           " of head " + std::to_string(h) + " is already overridden");
  }
  const int D = c_.head_dim;
  const int64_t idx = it - hd.res_pos.begin();
  hd.res_pos.insert(it, pos);
  hd.res_k.insert(hd.res_k.begin() + idx * D, k, k + D);
  hd.res_v.insert(hd.res_v.begin() + idx * D, v, v + D);
  const int64_t b = pos / kBlockTokens;
  hd.res_mask[b] |= uint64_t{1} << (pos % kBlockTokens);
  for (int64_t bb = b + 1; bb < n_blocks(); ++bb) ++hd.res_begin[bb];
  return OkStatus();
}

bool GradedLayer::has_residual(int h, int64_t pos) const {
  const Head& hd = heads_[h];
  return std::binary_search(hd.res_pos.begin(), hd.res_pos.end(), pos);
}

std::array<int64_t, kNumLevels> GradedLayer::level_histogram(int h) const {
  std::array<int64_t, kNumLevels> n{};
  for (int8_t l : heads_[h].level) ++n[LevelIndex(l)];
  return n;
}

const uint16_t* GradedLayer::box_min(int h, int64_t b) const {
  STRATA_CHECK_MSG(c_.boxes, "geodesia: box_min: this layer keeps no boxes (GradedConfig::boxes)");
  STRATA_CHECK(closed(b));
  return heads_[h].box.data() + b * 2 * c_.head_dim;
}

const uint16_t* GradedLayer::box_max(int h, int64_t b) const {
  return box_min(h, b) + c_.head_dim;
}

void GradedLayer::Reconstruct(int h, int64_t b, double* k, double* v) const {
  STRATA_CHECK_MSG(heads_[h].offset[b] >= 0,
                   "block %lld is open and its rows are held outside the graded layer",
                   static_cast<long long>(b));
  ReconstructBlock(view(h), b, k, v);
}

const uint8_t* GradedLayer::slot(int h, int64_t b) const {
  STRATA_CHECK_MSG(heads_[h].offset[b] >= 0,
                   "block %lld is open and its rows are held outside the graded layer",
                   static_cast<long long>(b));
  return slabs_[LevelIndex(heads_[h].level[b])].at(heads_[h].offset[b]);
}

PackedHeadView GradedLayer::view(int h) const {
  const Head& hd = heads_[h];
  PackedHeadView v;
  v.head_dim = c_.head_dim;
  v.group_size = c_.group_size;
  v.n_blocks = n_blocks();
  v.level = hd.level.data();
  v.offset = hd.offset.data();
  v.n_valid = n_valid_.data();
  for (int i = 0; i < kNumLevels; ++i) {
    v.seg[i] = slabs_[i].bases.data();
    v.seg_bytes[i] = slabs_[i].seg_bytes();
  }
  if (!hd.res_pos.empty()) {
    v.res_mask = hd.res_mask.data();
    v.res_begin = hd.res_begin.data();
    v.res_k = hd.res_k.data();
    v.res_v = hd.res_v.data();
  }
  return v;
}

ResidentBytes GradedLayer::resident_bytes(int h) const {
  const Head& hd = heads_[h];
  const int D = c_.head_dim;
  ResidentBytes r;
  // The open block's rows live with the caller under external_open.
  const int64_t n_held = c_.external_open ? n_closed_blocks() : n_blocks();
  for (int64_t b = 0; b < n_held; ++b) {
    const SlotLayout L = GetSlotLayout(hd.level[b], D, c_.group_size);
    r.payload += L.bytes - L.scale_bytes;
    r.scales += L.scale_bytes;
  }
  r.boxes = c_.boxes ? n_blocks() * 2 * D * 2 : 0;
  r.residual = static_cast<int64_t>(hd.res_pos.size()) * 2 * D * 2;
  return r;
}

ResidentBytes GradedLayer::resident_bytes() const {
  ResidentBytes r;
  for (int h = 0; h < c_.n_kv_heads; ++h) {
    const ResidentBytes x = resident_bytes(h);
    r.payload += x.payload;
    r.scales += x.scales;
    r.boxes += x.boxes;
    r.residual += x.residual;
  }
  return r;
}

int64_t GradedLayer::allocated_bytes() const {
  int64_t n = 0;
  for (const Slab& s : slabs_) {
    for (const auto& seg : s.segs) n += static_cast<int64_t>(seg.bytes());
  }
  for (const Head& hd : heads_) {
    n += static_cast<int64_t>(hd.box.capacity() + hd.res_k.capacity() + hd.res_v.capacity()) * 2;
  }
  return n;
}

}  // namespace strata::geodesia
