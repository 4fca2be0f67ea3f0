#include "kv/baselines/kivi.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/dtype.h"
#include "kernels/ops.h"
#include "kv/baselines/common.h"

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

void KiviPack(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  STRATA_CHECK(bits == 2 || bits == 4 || bits == 8);
  const int per = 8 / bits;
  const int64_t nb = (n * bits + 7) / 8;
  std::fill(out, out + nb, 0);
  for (int64_t i = 0; i < n; ++i) {
    out[i / per] |= static_cast<uint8_t>((codes[i] & ((1 << bits) - 1)) << ((i % per) * bits));
  }
}

void KiviUnpack(const uint8_t* packed, int64_t n, int bits, uint8_t* codes) {
  STRATA_CHECK(bits == 2 || bits == 4 || bits == 8);
  const int per = 8 / bits;
  const int mask = (1 << bits) - 1;
  for (int64_t i = 0; i < n; ++i) {
    codes[i] = static_cast<uint8_t>((packed[i / per] >> ((i % per) * bits)) & mask);
  }
}

Status KiviPolicy::Bind(const std::vector<LayerGeometry>& layers) {
  layers_.clear();
  layers_.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    Layer& L = layers_[l];
    L.g = layers[l];
    L.mla = L.g.kind == AttnKind::kMla;
    L.n_vg = (L.g.v_dim + kGroup - 1) / kGroup;
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

void KiviPolicy::Flush(Layer& L, const LayerStore& store) {
  const int64_t target = GroupsAfter(store.n_rows());
  const int D = L.g.k_dim, DV = L.g.v_dim;
  std::vector<float> x(static_cast<size_t>(kGroup) * std::max(D, DV));
  std::vector<uint8_t> codes(x.size()), col(kGroup);
  for (; L.n_groups < target; ++L.n_groups) {
    const int64_t u0 = L.n_groups * kGroup;
    for (int h = 0; h < L.g.n_kv_heads; ++h) {
      Head& H = L.heads[h];
      // Keys (MLA: the latent row): per channel over the group's 32 tokens.
      for (int t = 0; t < kGroup; ++t) {
        const uint16_t* k = store.key_row(h, u0 + t);
        for (int c = 0; c < D; ++c) x[t * D + c] = Bf16ToF32(k[c]);
      }
      std::vector<uint16_t> lo(D), step(D);
      for (int c = 0; c < D; ++c) {
        const KiviQuantParams p = KiviQuantize(x.data() + c, kGroup, D, bits_, col.data());
        lo[c] = p.lo;
        step[c] = p.step;
        for (int t = 0; t < kGroup; ++t) codes[t * D + c] = col[t];
      }
      const size_t kb = H.kcodes.size();
      H.kcodes.resize(kb + KeyCodeBytes(L));
      KiviPack(codes.data(), int64_t{kGroup} * D, bits_, H.kcodes.data() + kb);
      H.kscale.insert(H.kscale.end(), lo.begin(), lo.end());
      H.kscale.insert(H.kscale.end(), step.begin(), step.end());
      if (L.mla) continue;
      // Values: per token over groups of 32 channels.
      for (int t = 0; t < kGroup; ++t) {
        const uint16_t* v = store.val_row(h, u0 + t);
        for (int c = 0; c < DV; ++c) x[t * DV + c] = Bf16ToF32(v[c]);
        for (int cg = 0; cg < L.n_vg; ++cg) {
          const int c0 = cg * kGroup, nc = std::min(kGroup, DV - c0);
          const KiviQuantParams p =
              KiviQuantize(x.data() + t * DV + c0, nc, 1, bits_, codes.data() + t * DV + c0);
          H.vscale.push_back(p.lo);
          H.vscale.push_back(p.step);
        }
      }
      const size_t vb = H.vcodes.size();
      H.vcodes.resize(vb + ValCodeBytes(L));
      KiviPack(codes.data(), int64_t{kGroup} * DV, bits_, H.vcodes.data() + vb);
    }
  }
}

Status KiviPolicy::OnAppend(int layer, const LayerStore& store) {
  Flush(layers_[layer], store);
  return OkStatus();
}

Status KiviPolicy::OnAppended(int layer, const LayerStore& store, const CacheCall& call,
                              CachePlan* plan) {
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
  codes.resize(static_cast<size_t>(kGroup) * std::max(D, DV));
  KiviUnpack(H.kcodes.data() + j * KeyCodeBytes(L), int64_t{kGroup} * D, bits_, codes.data());
  const uint16_t* lo = H.kscale.data() + j * 2 * D;
  const uint16_t* step = lo + D;
  for (int t = 0; t < kGroup; ++t) {
    for (int c = 0; c < D; ++c) {
      kt[t * D + c] = KiviDequant(codes[t * D + c], F16ToF32(lo[c]), F16ToF32(step[c]));
    }
  }
  if (vt == nullptr) return;
  if (L.mla) {
    for (int t = 0; t < kGroup; ++t) std::copy_n(kt + t * D, DV, vt + t * DV);
    return;
  }
  KiviUnpack(H.vcodes.data() + j * ValCodeBytes(L), int64_t{kGroup} * DV, bits_, codes.data());
  const uint16_t* vs = H.vscale.data() + j * kGroup * L.n_vg * 2;
  for (int t = 0; t < kGroup; ++t) {
    for (int c = 0; c < DV; ++c) {
      const uint16_t* p = vs + (t * L.n_vg + c / kGroup) * 2;
      vt[t * DV + c] = KiviDequant(codes[t * DV + c], F16ToF32(p[0]), F16ToF32(p[1]));
    }
  }
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

  const int G = g.group_size();
  const int D = g.k_dim, DV = g.v_dim;
  const int64_t n_tasks = qg * g.n_kv_heads;
  const int T = pool ? pool->size() : 1;
  std::vector<SoftmaxStateBuffer> part;
  part.reserve(T);
  for (int i = 0; i < T; ++i) part.emplace_back(g.n_q_heads, DV);
  auto run = [&](int64_t b, int64_t e, int k) {
    SoftmaxStates& ps = part[k].states();
    std::vector<float> kt(static_cast<size_t>(kGroup) * D), vt(static_cast<size_t>(kGroup) * DV);
    float s[kGroup];
    for (int64_t t = b; t < e; ++t) {
      const int h = static_cast<int>(t / qg);
      const int64_t j = t % qg;
      DequantGroup(L, h, j, kt.data(), vt.data());
      for (int r = 0; r < G; ++r) {
        const int hq = h * G + r;
        const float* qh = q + static_cast<int64_t>(hq) * D;
        float tmax = -std::numeric_limits<float>::infinity();
        for (int i = 0; i < kGroup; ++i) {
          s[i] = g.scale * Dot(qh, kt.data() + i * D, D);
          tmax = std::max(tmax, s[i]);
        }
        float* o = ps.o + static_cast<int64_t>(hq) * DV;
        if (tmax > ps.m[hq]) {
          if (ps.m[hq] != -std::numeric_limits<float>::infinity()) {
            const float f = std::exp(ps.m[hq] - tmax);
            ps.d[hq] *= f;
            for (int c = 0; c < DV; ++c) o[c] *= f;
          }
          ps.m[hq] = tmax;
        }
        for (int i = 0; i < kGroup; ++i) {
          const float p = std::exp(s[i] - ps.m[hq]);
          ps.d[hq] += p;
          Axpy(p, vt.data() + i * DV, o, DV);
        }
      }
    }
  };
  ParallelForOrInline(pool, n_tasks, 1, run);
  for (int i = 0; i < T; ++i) MergeStates(st, part[i].states());
  if (stats) {
    stats->rows_attended += qg * kGroup * g.n_kv_heads;
    stats->bytes_read += qg * GroupBytes(layer);
  }
  return OkStatus();
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
  return p;
}

StatusOr<std::unique_ptr<Policy>> MakeKiviPolicy(const PolicySpec& spec, int bits) {
  // No settings: the rate is fixed by the bits (an eval grid passes its --ratio only to the
  // policies that declare it).
  RETURN_IF_ERROR(ResolveSettings(KiviSettings(bits), spec.settings).status());
  return std::unique_ptr<Policy>(new KiviPolicy(bits));
}

}  // namespace strata::baselines
