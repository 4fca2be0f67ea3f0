#include "kv/baselines/kivi.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/geodesia_format.h"
#include "kernels/ops.h"
#include "kv/baselines/common.h"
#include "kv/baselines/dequant_read.h"

namespace strata::baselines {

KiviQuantParams KiviQuantize(const float* x, int64_t n, int64_t stride, int bits,
                             uint8_t* codes) {
  constexpr float kMax = 65504.f;
  float mn = std::numeric_limits<float>::infinity(), mx = -mn;
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::clamp(x[i * stride], -kMax, kMax);
    mn = std::min(mn, v);
    mx = std::max(mx, v);
  }
  KiviQuantParams p;
  if (n == 0) return p;
  p.lo = F16RoundDown(mn);
  const float lo = F16ToF32(p.lo);
  const int levels = (1 << bits) - 1;
  const float range = mx - lo;
  if (range > 0) p.step = F16RoundUp(range / levels);
  const float step = F16ToF32(p.step);
  for (int64_t i = 0; i < n; ++i) {
    if (step == 0.f) {
      codes[i] = 0;
      continue;
    }
    const float v = std::clamp(x[i * stride], -kMax, kMax);
    const float c = std::nearbyint((v - lo) / step);
    codes[i] = static_cast<uint8_t>(std::clamp(c, 0.f, static_cast<float>(levels)));
  }
  return p;
}

// Geodesia's packing (the slot format the packed kernel reads) for the whole bytes; a trailing
// partial byte through an 8 / bits zero-padded copy.
void KiviPack(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  STRATA_CHECK(bits == 2 || bits == 4 || bits == 8);
  const int per = 8 / bits;
  const int64_t whole = n - n % per;
  geodesia::PackCodes(codes, whole, bits, out);
  if (whole == n) return;
  uint8_t last[8] = {};
  std::copy(codes + whole, codes + n, last);
  geodesia::PackCodes(last, per, bits, out + whole / per);
}

void KiviUnpack(const uint8_t* packed, int64_t n, int bits, uint8_t* codes) {
  STRATA_CHECK(bits == 2 || bits == 4 || bits == 8);
  const int per = 8 / bits;
  const int64_t whole = n - n % per;
  geodesia::UnpackCodes(packed, whole, bits, codes);
  if (whole == n) return;
  uint8_t last[8];
  geodesia::UnpackCodes(packed + whole / per, per, bits, last);
  std::copy(last, last + (n - whole), codes + whole);
}

Status KiviPolicy::Bind(const std::vector<LayerGeometry>& layers) {
  if (math_from_cache_ && !layers.empty()) math_ = geodesia::PackedCodesMath(layers[0].attn_math);
  layers_.clear();
  layers_.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    Layer& L = layers_[l];
    L.g = layers[l];
    L.mla = L.g.kind == AttnKind::kMla;
    L.n_vg = (L.g.v_dim + kGroup - 1) / kGroup;
    L.packed = !L.mla && L.g.k_dim == L.g.v_dim && L.g.k_dim > 0 && L.g.k_dim % kGroup == 0;
    if (L.packed) L.slot_bytes = geodesia::SlotBytes(bits_, L.g.k_dim, kGroup);
    L.heads.resize(L.g.n_kv_heads);
  }
  return OkStatus();
}

int64_t KiviPolicy::GroupBytes(int layer) const {
  const Layer& L = layers_[layer];
  int64_t b = KeyCodeBytes(L) + int64_t{2} * L.g.k_dim * 2;
  if (!L.mla) b += ValCodeBytes(L) + int64_t{kGroup} * L.n_vg * 2 * 2;
  return b * L.g.n_kv_heads;
}

void KiviPolicy::Flush(Layer& L, const LayerStore& store, ThreadPool* pool) {
  const int64_t j0 = L.n_groups, target = GroupsAfter(store.n_rows());
  if (target <= j0) return;
  const int D = L.g.k_dim;
  // Every head's arrays sized for the new groups first; then each (group, head) task writes only
  // its own bytes (packed layers: group j is half j % 2 of slot j / 2, so two tasks may share a
  // slot but never a byte).
  for (Head& H : L.heads) {
    if (L.packed) {
      H.slots.resize(static_cast<size_t>((target + 1) / 2 * L.slot_bytes), 0);
      continue;
    }
    H.kcodes.resize(static_cast<size_t>(target * KeyCodeBytes(L)));
    H.kscale.resize(static_cast<size_t>(target * 2 * D));
    if (L.mla) continue;
    H.vcodes.resize(static_cast<size_t>(target * ValCodeBytes(L)));
    H.vscale.resize(static_cast<size_t>(target * kGroup * L.n_vg * 2));
  }
  const int n_h = L.g.n_kv_heads;
  ParallelForOrInline(pool, (target - j0) * n_h, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) {
      const int h = static_cast<int>(t % n_h);
      QuantizeGroup(L, store, h, j0 + t / n_h, &L.heads[h]);
    }
  });
  L.n_groups = target;
}

void KiviPolicy::QuantizeGroup(const Layer& L, const LayerStore& store, int h, int64_t j,
                               Head* head) const {
  const int D = L.g.k_dim, DV = L.g.v_dim;
  const int64_t u0 = j * kGroup;
  thread_local std::vector<float> x;
  thread_local std::vector<uint8_t> codes;
  thread_local std::vector<uint16_t> lo, step;
  x.resize(static_cast<size_t>(kGroup) * std::max(D, DV));
  codes.resize(x.size());
  lo.resize(D);
  step.resize(D);
  uint8_t col[kGroup];
  Head& H = *head;
  // Keys (MLA: the latent row): per channel over the group's 32 tokens.
  for (int t = 0; t < kGroup; ++t) {
    const uint16_t* k = store.key_row(h, u0 + t);
    for (int c = 0; c < D; ++c) x[t * D + c] = Bf16ToF32(k[c]);
  }
  for (int c = 0; c < D; ++c) {
    const KiviQuantParams p = KiviQuantize(x.data() + c, kGroup, D, bits_, col);
    lo[c] = p.lo;
    step[c] = p.step;
    for (int t = 0; t < kGroup; ++t) codes[t * D + c] = col[t];
  }
  // Packed layers: group j is half j % 2 of slot j / 2 (time group j % 2 of its keys, rows
  // 32 (j % 2) ... of its values).
  const int half = static_cast<int>(j % 2);
  const geodesia::SlotLayout SL =
      L.packed ? geodesia::GetSlotLayout(bits_, D, kGroup) : geodesia::SlotLayout{};
  uint8_t* slot = nullptr;
  if (L.packed) {
    slot = H.slots.data() + (j / 2) * L.slot_bytes;
    KiviPack(codes.data(), int64_t{kGroup} * D, bits_,
             slot + SL.k_codes + half * KeyCodeBytes(L));
    std::memcpy(slot + SL.k_lo + int64_t{half} * D * 2, lo.data(), D * 2);
    std::memcpy(slot + SL.k_step + int64_t{half} * D * 2, step.data(), D * 2);
  } else {
    KiviPack(codes.data(), int64_t{kGroup} * D, bits_, H.kcodes.data() + j * KeyCodeBytes(L));
    std::copy(lo.begin(), lo.end(), H.kscale.begin() + j * 2 * D);
    std::copy(step.begin(), step.end(), H.kscale.begin() + j * 2 * D + D);
  }
  if (L.mla) return;
  // Values: per token over groups of 32 channels.
  uint16_t* vscale = L.packed ? nullptr : H.vscale.data() + j * kGroup * L.n_vg * 2;
  for (int t = 0; t < kGroup; ++t) {
    const uint16_t* v = store.val_row(h, u0 + t);
    for (int c = 0; c < DV; ++c) x[t * DV + c] = Bf16ToF32(v[c]);
    for (int cg = 0; cg < L.n_vg; ++cg) {
      const int c0 = cg * kGroup, nc = std::min(kGroup, DV - c0);
      const KiviQuantParams p =
          KiviQuantize(x.data() + t * DV + c0, nc, 1, bits_, codes.data() + t * DV + c0);
      if (L.packed) {
        const int64_t at = (int64_t{half} * kGroup + t) * L.n_vg + cg;
        std::memcpy(slot + SL.v_lo + at * 2, &p.lo, 2);
        std::memcpy(slot + SL.v_step + at * 2, &p.step, 2);
      } else {
        vscale[(t * L.n_vg + cg) * 2] = p.lo;
        vscale[(t * L.n_vg + cg) * 2 + 1] = p.step;
      }
    }
  }
  KiviPack(codes.data(), int64_t{kGroup} * DV, bits_,
           L.packed ? slot + SL.v_codes + half * ValCodeBytes(L)
                    : H.vcodes.data() + j * ValCodeBytes(L));
}

Status KiviPolicy::OnAppended(int layer, const LayerStore& store, const CacheCall& call,
                              CachePlan* plan, ThreadPool* pool) {
  Flush(layers_[layer], store, pool);
  // No read of this call or later needs exact rows of a page that lies entirely before the
  // call's first row and entirely inside the groups quantized once that row was appended (the
  // later rows of the call quantize more groups, but their pages stay until the next call).
  // The first call holds no earlier rows.
  if (call.first == 0 || call.n_rows() == 0) return OkStatus();
  const int64_t upto = std::min(call.first, GroupsAfter(call.first + 1) * kGroup);
  for (int64_t p = 0; (p + 1) * LayerStore::kPageRows <= upto; ++p) {
    for (int h = 0; h < layers_[layer].g.n_kv_heads; ++h) {
      if (store.page_resident(h, p)) plan->release.push_back({h, p});
    }
  }
  return OkStatus();
}

void KiviPolicy::DequantGroup(const Layer& L, int h, int64_t j, float* kt, float* vt) const {
  const Head& H = L.heads[h];
  const int D = L.g.k_dim, DV = L.g.v_dim;
  thread_local std::vector<uint8_t> codes;
  thread_local std::vector<float> lo, step;
  codes.resize(static_cast<size_t>(kGroup) * std::max(D, DV));
  lo.resize(std::max(D, L.n_vg));  // keys: one scale per channel; values: per channel group
  step.resize(lo.size());
  // kt[t, c] = KiviDequant(code, lo_c, step_c) = lo_c + code * step_c, the scales converted once
  // per group rather than once per element (the same values).
  auto keys = [&](const uint8_t* packed, auto scale_lo, auto scale_step) {
    KiviUnpack(packed, int64_t{kGroup} * D, bits_, codes.data());
    for (int c = 0; c < D; ++c) {
      lo[c] = scale_lo(c);
      step[c] = scale_step(c);
    }
    for (int t = 0; t < kGroup; ++t) {
      const uint8_t* ct = codes.data() + t * D;
      float* out = kt + t * D;
      for (int c = 0; c < D; ++c) out[c] = KiviDequant(ct[c], lo[c], step[c]);
    }
  };
  // vt[t, c] = lo_(t, c / 32) + code * step_(t, c / 32).
  auto values = [&](const uint8_t* packed, auto scale_lo, auto scale_step) {
    KiviUnpack(packed, int64_t{kGroup} * DV, bits_, codes.data());
    for (int t = 0; t < kGroup; ++t) {
      for (int cg = 0; cg < L.n_vg; ++cg) {
        lo[cg] = scale_lo(t, cg);
        step[cg] = scale_step(t, cg);
      }
      const uint8_t* ct = codes.data() + t * DV;
      float* out = vt + t * DV;
      for (int c = 0; c < DV; ++c) out[c] = KiviDequant(ct[c], lo[c / kGroup], step[c / kGroup]);
    }
  };
  if (L.packed) {
    const geodesia::SlotLayout SL = geodesia::GetSlotLayout(bits_, D, kGroup);
    const uint8_t* slot = H.slots.data() + (j / 2) * L.slot_bytes;
    const int half = static_cast<int>(j % 2);
    auto f16 = [&](int64_t off, int64_t i) {
      uint16_t v;
      std::memcpy(&v, slot + off + i * 2, 2);
      return F16ToF32(v);
    };
    keys(slot + SL.k_codes + half * KeyCodeBytes(L),
         [&](int c) { return f16(SL.k_lo, int64_t{half} * D + c); },
         [&](int c) { return f16(SL.k_step, int64_t{half} * D + c); });
    if (vt == nullptr) return;
    auto at = [&](int t, int cg) { return (int64_t{half} * kGroup + t) * L.n_vg + cg; };
    values(slot + SL.v_codes + half * ValCodeBytes(L),
           [&](int t, int cg) { return f16(SL.v_lo, at(t, cg)); },
           [&](int t, int cg) { return f16(SL.v_step, at(t, cg)); });
    return;
  }
  const uint16_t* klo = H.kscale.data() + j * 2 * D;
  const uint16_t* kstep = klo + D;
  keys(H.kcodes.data() + j * KeyCodeBytes(L), [&](int c) { return F16ToF32(klo[c]); },
       [&](int c) { return F16ToF32(kstep[c]); });
  if (vt == nullptr) return;
  if (L.mla) {
    for (int t = 0; t < kGroup; ++t) std::copy_n(kt + t * D, DV, vt + t * DV);
    return;
  }
  const uint16_t* vs = H.vscale.data() + j * kGroup * L.n_vg * 2;
  values(H.vcodes.data() + j * ValCodeBytes(L),
         [&](int t, int cg) { return F16ToF32(vs[(t * L.n_vg + cg) * 2]); },
         [&](int t, int cg) { return F16ToF32(vs[(t * L.n_vg + cg) * 2 + 1]); });
}

void KiviPolicy::DequantKey(int layer, int h, int64_t u, float* out) const {
  const Layer& L = layers_[layer];
  STRATA_CHECK(u >= 0 && u < L.n_groups * kGroup);
  std::vector<float> kt(static_cast<size_t>(kGroup) * L.g.k_dim);
  DequantGroup(L, h, u / kGroup, kt.data(), nullptr);
  std::copy_n(kt.data() + (u % kGroup) * L.g.k_dim, L.g.k_dim, out);
}

void KiviPolicy::DequantValue(int layer, int h, int64_t u, float* out) const {
  const Layer& L = layers_[layer];
  STRATA_CHECK(u >= 0 && u < L.n_groups * kGroup);
  std::vector<float> kt(static_cast<size_t>(kGroup) * L.g.k_dim);
  std::vector<float> vt(static_cast<size_t>(kGroup) * L.g.v_dim);
  DequantGroup(L, h, u / kGroup, kt.data(), vt.data());
  std::copy_n(vt.data() + (u % kGroup) * L.g.v_dim, L.g.v_dim, out);
}

Status KiviPolicy::Read(int layer, const LayerStore& store, const float* q, int64_t limit,
                        ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) {
  Layer& L = layers_[layer];
  const LayerGeometry& g = L.g;
  // Groups whose rows all lie before the query; the rest is read exactly.
  const int64_t qg = std::min(L.n_groups, limit / kGroup);
  const int64_t p0 = qg * kGroup / LayerStore::kPageRows;
  if (qg * kGroup < limit && !store.page_resident(0, p0)) {
    return OutOfRange("kivi: a query at position " + std::to_string(limit - 1) +
                      " needs the exact rows [" + std::to_string(qg * kGroup) + ", " +
                      std::to_string(limit) + "), whose page was released when a later call " +
                      "began (KIVI serves queries at or after the running call's first row)");
  }
  std::vector<int64_t> exact;
  for (int64_t u = qg * kGroup; u < limit; ++u) exact.push_back(u);
  ReadRows(store, q, exact.data(), static_cast<int64_t>(exact.size()), pool, st, stats);
  if (qg == 0) return OkStatus();
  if (L.packed) {
    ReadPacked(L, qg, q, pool, st);
    if (stats) {
      stats->rows_attended += qg * kGroup * g.n_kv_heads;
      stats->bytes_read += qg * GroupBytes(layer);
    }
    return OkStatus();
  }

  // The quantized groups dequantized and attended, group by group.
  AttendRowRange<kGroup>(g, q, 0, qg * kGroup, pool, st,
                         [&](int h, int64_t u0, int64_t, float* kt, float* vt) {
                           DequantGroup(L, h, u0 / kGroup, kt, vt);
                         });
  if (stats) {
    stats->rows_attended += qg * kGroup * g.n_kv_heads;
    stats->bytes_read += qg * GroupBytes(layer);
  }
  return OkStatus();
}

bool KiviPolicy::ClaimStagedReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                                  ReadStats* stats, StagedPrefixPlan* plan) {
  const Layer& L = layers_[layer];
  plan->unit = kGroup;
  plan->cap = L.n_groups * kGroup;
  // Read's own refusal (an exact row whose page is gone) is left to Read; the smallest split
  // is the first query's.
  const int64_t b0 = plan->Split(first_limit);
  if (b0 < first_limit && !store.page_resident(0, b0 / LayerStore::kPageRows)) return false;
  const LayerGeometry& g = L.g;
  for (int64_t limit = first_limit; limit < first_limit + m; ++limit) {  // as Read counts
    const int64_t b = plan->Split(limit), qg = b / kGroup;
    stats->rows_attended += limit * g.n_kv_heads;
    stats->bytes_read += (limit - b) * g.bytes_per_token() + qg * GroupBytes(layer);
  }
  return true;
}

void KiviPolicy::StagePrefixRows(int layer, int h, int64_t s0, int64_t sn, float* keys,
                                 float* values) const {
  const Layer& L = layers_[layer];
  const int64_t D = L.g.k_dim, DV = L.g.v_dim;
  STRATA_CHECK(s0 >= 0 && s0 + sn <= L.n_groups * kGroup);
  std::vector<float> kt(kGroup * D), vt(values != nullptr ? kGroup * DV : 0);
  for (int64_t j = s0 / kGroup; j * kGroup < s0 + sn; ++j) {
    DequantGroup(L, h, j, kt.data(), values != nullptr ? vt.data() : nullptr);
    const int64_t a = std::max(s0, j * kGroup), e = std::min(s0 + sn, (j + 1) * kGroup);
    std::copy(kt.begin() + (a - j * kGroup) * D, kt.begin() + (e - j * kGroup) * D,
              keys + (a - s0) * D);
    if (values == nullptr) continue;
    std::copy(vt.begin() + (a - j * kGroup) * DV, vt.begin() + (e - j * kGroup) * DV,
              values + (a - s0) * DV);
  }
}

void KiviPolicy::ReadPacked(const Layer& L, int64_t qg, const float* q, ThreadPool* pool,
                            SoftmaxStates* st) const {
  const LayerGeometry& g = L.g;
  const int G = g.group_size();
  const int D = g.k_dim;
  // Slots [0, n_blk), the last one half valid when qg is odd (its second group, if quantized
  // already, lies past the query's causal limit or is not yet complete).
  const int64_t n_blk = (qg + 1) / 2;
  std::vector<int8_t> level(n_blk, static_cast<int8_t>(bits_));
  std::vector<int64_t> offset(n_blk);
  std::vector<int32_t> n_valid(n_blk, 2 * kGroup);
  for (int64_t b = 0; b < n_blk; ++b) offset[b] = b * L.slot_bytes;
  if (qg % 2 == 1) n_valid[n_blk - 1] = kGroup;
  const int li = geodesia::LevelIndex(bits_);
  SoftmaxStateBuffer part(g.n_q_heads, g.v_dim);
  part.states().Reset();
  auto run = [&](int64_t h, int /*worker*/) {
    const uint8_t* base = L.heads[h].slots.data();
    geodesia::PackedHeadView view;
    view.head_dim = D;
    view.group_size = kGroup;
    view.n_blocks = n_blk;
    view.level = level.data();
    view.offset = offset.data();
    view.n_valid = n_valid.data();
    view.seg[li] = &base;
    view.seg_bytes[li] = std::max<int64_t>(1, n_blk * L.slot_bytes);
    SoftmaxStates hs = HeadSlice(part.states(), static_cast<int>(h) * G, G);
    geodesia::PackedAttend(view, q + h * G * D, G, g.scale, nullptr, n_blk, &hs, nullptr, math_);
  };
  ParallelForEach(pool, g.n_kv_heads, run);
  MergeStates(st, part.states());
}

int64_t KiviPolicy::ResidentBytes(int layer, const LayerStore& store) const {
  return store.resident_bytes() + QuantizedBytes(layer);
}

PolicySummary KiviPolicy::Summary(int layer, const LayerStore& store) const {
  PolicySummary s = Policy::Summary(layer, store);
  s.blocks_closed = layers_[layer].n_groups;
  s.compressed = s.blocks_closed > 0;
  if (!s.compressed) {
    s.note = "no group quantized: " + std::to_string(store.n_rows()) + " rows < " +
             std::to_string(kResidual + kGroup) + " (the newest " + std::to_string(kResidual) +
             " or more stay exact)";
  }
  return s;
}

PolicySettings KiviSettings(int bits) {
  PolicySettings p;
  p.policy = "kivi" + std::to_string(bits);
  p.settings = {SettingDecl::Enum("attn-math", "cache", {"cache", "f32", "int8"},
                                  "arithmetic of the packed read: cache = the cache's "
                                  "--attn-math (int8 -> int8, else f32), f32 exact, int8 integer "
                                  "dot products on the codes (kernels/packed_attention.h)")};
  return p;
}

StatusOr<std::unique_ptr<Policy>> MakeKiviPolicy(const PolicySpec& spec, int bits) {
  // No settings: the rate is fixed by the bits (an eval grid passes its --ratio only to the
  // policies that declare it).
  ASSIGN_OR_RETURN(const ResolvedSettings s, ResolveSettings(KiviSettings(bits), spec.settings));
  const geodesia::PackedMath math = s.text("attn-math") == "int8" ? geodesia::PackedMath::kInt8
                                                                  : geodesia::PackedMath::kF32;
  return std::unique_ptr<Policy>(
      new KiviPolicy(bits, math, /*math_from_cache=*/s.text("attn-math") == "cache"));
}

}  // namespace strata::baselines
