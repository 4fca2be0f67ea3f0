// Geodesia-KV packed block format (see geodesia_format.h).
#include "kernels/geodesia_format.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace strata::geodesia {

SlotLayout GetSlotLayout(int level, int head_dim, int group_size) {
  const int64_t D = head_dim, P = kBlockTokens, g = group_size;
  SlotLayout s;
  if (level == 16) {
    s.k_rows = 0;
    s.v_rows = P * D * 2;
    s.bytes = 2 * P * D * 2;
  } else if (level == 1) {
    s.k_rows = 0;
    s.v_rows = D * 2;
    s.bytes = 2 * D * 2;
  } else {
    STRATA_CHECK_MSG(level == 8 || level == 4 || level == 2, "level %d", level);
    const int64_t codes = P * D * level / 8;
    const int64_t kgroups = P / g, vgroups = D / g;
    s.k_codes = 0;
    s.v_codes = codes;
    s.k_lo = 2 * codes;
    s.k_step = s.k_lo + kgroups * D * 2;
    s.v_lo = s.k_step + kgroups * D * 2;
    s.v_step = s.v_lo + P * vgroups * 2;
    s.bytes = s.v_step + P * vgroups * 2;
    s.scale_bytes = s.bytes - 2 * codes;
  }
  return s;
}

int64_t SlotBytes(int level, int head_dim, int group_size) {
  return GetSlotLayout(level, head_dim, group_size).bytes;
}

void ReconstructBlock(const PackedHeadView& view, int64_t b, double* k, double* v) {
  const int D = view.head_dim, g = view.group_size, P = kBlockTokens;
  const int level = view.level[b];
  const int nv = view.n_valid[b];
  const SlotLayout L = GetSlotLayout(level, D, g);
  const uint8_t* slot = view.slot(b);
  std::fill(k, k + P * D, 0.0);
  std::fill(v, v + P * D, 0.0);
  if (level == 16) {
    const uint16_t* kr = reinterpret_cast<const uint16_t*>(slot + L.k_rows);
    const uint16_t* vr = reinterpret_cast<const uint16_t*>(slot + L.v_rows);
    for (int64_t i = 0; i < int64_t{nv} * D; ++i) {
      k[i] = Bf16ToF32(kr[i]);
      v[i] = Bf16ToF32(vr[i]);
    }
  } else if (level == 1) {
    const uint16_t* kc = reinterpret_cast<const uint16_t*>(slot + L.k_rows);
    const uint16_t* vc = reinterpret_cast<const uint16_t*>(slot + L.v_rows);
    for (int t = 0; t < nv; ++t) {
      for (int c = 0; c < D; ++c) {
        k[t * D + c] = F16ToF32(kc[c]);
        v[t * D + c] = F16ToF32(vc[c]);
      }
    }
  } else {
    std::vector<uint8_t> kc(P * D), vc(P * D);
    UnpackCodes(slot + L.k_codes, int64_t{P} * D, level, kc.data());
    UnpackCodes(slot + L.v_codes, int64_t{P} * D, level, vc.data());
    const uint16_t* klo = reinterpret_cast<const uint16_t*>(slot + L.k_lo);
    const uint16_t* kst = reinterpret_cast<const uint16_t*>(slot + L.k_step);
    const uint16_t* vlo = reinterpret_cast<const uint16_t*>(slot + L.v_lo);
    const uint16_t* vst = reinterpret_cast<const uint16_t*>(slot + L.v_step);
    const int GV = D / g;
    // The f16 scales converted once (the same values as per element).
    std::vector<float> ks(P / g * D), kl(ks.size()), vs(P * GV), vl(vs.size());
    for (size_t i = 0; i < ks.size(); ++i) ks[i] = F16ToF32(kst[i]), kl[i] = F16ToF32(klo[i]);
    for (size_t i = 0; i < vs.size(); ++i) vs[i] = F16ToF32(vst[i]), vl[i] = F16ToF32(vlo[i]);
    for (int t = 0; t < nv; ++t) {
      const float* kst_t = ks.data() + (t / g) * D;
      const float* klo_t = kl.data() + (t / g) * D;
      for (int c = 0; c < D; ++c) {
        k[t * D + c] = kc[t * D + c] * static_cast<double>(kst_t[c]) + klo_t[c];
        const int vi = t * GV + c / g;
        v[t * D + c] = vc[t * D + c] * static_cast<double>(vs[vi]) + vl[vi];
      }
    }
  }
}

int64_t PackedBytes(int64_t n_codes, int bits) { return n_codes * bits / 8; }

void PackCodes(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  STRATA_CHECK(bits == 2 || bits == 4 || bits == 8);
  const int per = 8 / bits;
  STRATA_CHECK(n % per == 0);
  const int64_t nb = n / per;
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t byte = 0;
    for (int j = 0; j < per; ++j) {
      const uint8_t c = codes[i * per + j];
      STRATA_CHECK(c < (1u << bits));
      byte |= static_cast<uint8_t>(c << (j * bits));
    }
    out[i] = byte;
  }
}

void UnpackCodes(const uint8_t* packed, int64_t n, int bits, uint8_t* codes) {
  STRATA_CHECK(bits == 2 || bits == 4 || bits == 8);
  const int per = 8 / bits;
  STRATA_CHECK(n % per == 0);
  const uint8_t mask = static_cast<uint8_t>((1u << bits) - 1);
  for (int64_t i = 0; i < n / per; ++i) {
    for (int j = 0; j < per; ++j) codes[i * per + j] = (packed[i] >> (j * bits)) & mask;
  }
}

}  // namespace strata::geodesia
