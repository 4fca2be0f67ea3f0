#include "kv/baselines/llamacpp_kv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/check.h"
#include "kernels/ops.h"
#include "kv/baselines/dequant_read.h"

namespace strata::baselines {

BlockQ8_0 LlamaQuantQ8_0(const float* x) {
  // core/dtype.cc's FromF32 is ggml's quantize_row_q8_0_ref bit for bit (d = amax / 127 stored
  // as f16, codes round(x / d) half away from zero from the unrounded f32 scale).
  BlockQ8_0 b;
  FromF32(DType::kQ8_0, x, &b, LlamaCppKvPolicy::kBlock);
  return b;
}

BlockQ4_0 LlamaQuantQ4_0(const float* x) {
  // ggml's quantize_row_q4_0_ref. (core/quant_encode.cc's Q4_0 encoder rounds the f16 scale's
  // magnitude up and picks nearest codes, so its bytes differ; this is llama.cpp's rule.)
  float amax = 0.f, mx = 0.f;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      mx = x[j];
    }
  }
  float d = mx / -8;
  // A scale beyond f16 (|max| > 8 * 65520) is clamped to 65504 and the codes saturate (ggml would
  // store Inf); below that the bytes are ggml's.
  if (!(std::fabs(d) < 65520.f)) d = std::copysign(65504.f, d);
  const float id = d != 0.f ? 1.f / d : 0.f;
  BlockQ4_0 b;
  b.d = F32ToF16(d);
  // min(15, (int8)(x id + 8.5)): x id + 8.5 lies in [0.5, 16.5] for an unclamped scale; the
  // clamp before the cast only matters for a clamped one and gives the same codes otherwise.
  auto code = [&](float v) {
    const float t = std::min(std::max(v * id + 8.5f, 0.f), 15.f);
    return static_cast<uint8_t>(static_cast<int8_t>(t));
  };
  for (int j = 0; j < 16; ++j) {
    b.qs[j] = static_cast<uint8_t>(code(x[j]) | (code(x[16 + j]) << 4));
  }
  return b;
}

int LargestPow2Divisor(int n) {
  STRATA_CHECK(n >= 1);
  return n & -n;
}

namespace {

template <typename T>
void HadamardBlocksT(T* x, int n, int block) {
  if (block <= 1) return;
  STRATA_CHECK(n % block == 0 && (block & (block - 1)) == 0);
  const T norm = T(1) / std::sqrt(static_cast<T>(block));
  for (int b0 = 0; b0 < n; b0 += block) {
    T* y = x + b0;
    // Sylvester order: H_2s = [[H_s, H_s], [H_s, -H_s]] (ggml_gen_hadamard's matrix).
    for (int s = 1; s < block; s *= 2) {
      for (int i = 0; i < block; i += 2 * s) {
        for (int j = i; j < i + s; ++j) {
          const T a = y[j], c = y[j + s];
          y[j] = a + c;
          y[j + s] = a - c;
        }
      }
    }
    for (int i = 0; i < block; ++i) y[i] *= norm;
  }
}

}  // namespace

void HadamardBlocks(float* x, int n, int block) { HadamardBlocksT(x, n, block); }
void HadamardBlocks(double* x, int n, int block) { HadamardBlocksT(x, n, block); }

std::string LlamaCppKvPolicy::describe() const {
  std::string s = name() + (type_ == DType::kQ8_0 ? " (8.5 bits/value" : " (4.5 bits/value");
  if (!rotate_ || layers_.empty()) return s + (rotate_ ? ", rotated)" : ", unrotated)");
  const Layer& L = layers_[0];
  s += ", Walsh-Hadamard blocks K " + std::to_string(L.kb);
  if (!L.mla) s += ", V " + std::to_string(L.vb);
  return s + ")";
}

Status LlamaCppKvPolicy::Bind(const std::vector<LayerGeometry>& layers) {
  layers_.clear();
  layers_.resize(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    Layer& L = layers_[l];
    L.g = layers[l];
    L.mla = L.g.kind == AttnKind::kMla;
    if (L.g.k_dim < 1 || L.g.v_dim < 1 || (L.mla && L.g.v_dim > L.g.k_dim)) {
      return InvalidArgument("policy '" + name() + "': layer " + std::to_string(l) +
                             " has head dims k " + std::to_string(L.g.k_dim) + ", v " +
                             std::to_string(L.g.v_dim));
    }
    L.nbk = RowBlocks(L.g.n_kv_heads, L.g.k_dim);
    L.nbv = L.mla ? 0 : RowBlocks(L.g.n_kv_heads, L.g.v_dim);
    if (rotate_) {
      if (L.mla) {
        L.kb = LargestPow2Divisor(std::gcd(L.g.k_dim, L.g.v_dim));
        L.vb = L.kb;
      } else {
        L.kb = LargestPow2Divisor(L.g.k_dim);
        L.vb = std::min(64, LargestPow2Divisor(L.g.v_dim));
      }
    }
    L.k.clear();
    L.v.clear();
  }
  return OkStatus();
}

int64_t LlamaCppKvPolicy::RowBytes(const LayerGeometry& g) const {
  const bool mla = g.kind == AttnKind::kMla;
  return (RowBlocks(g.n_kv_heads, g.k_dim) + (mla ? 0 : RowBlocks(g.n_kv_heads, g.v_dim))) *
         block_bytes();
}

void LlamaCppKvPolicy::QuantizeRow(const float* x, int64_t n, int64_t nb, uint8_t* out) const {
  float buf[kBlock];
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t c0 = b * kBlock, nc = std::min<int64_t>(kBlock, n - c0);
    const float* src = x + c0;
    if (nc < kBlock) {
      std::fill(buf, buf + kBlock, 0.f);
      std::copy_n(src, nc, buf);
      src = buf;
    }
    if (type_ == DType::kQ8_0) {
      const BlockQ8_0 q = LlamaQuantQ8_0(src);
      std::memcpy(out + b * sizeof(q), &q, sizeof(q));
    } else {
      const BlockQ4_0 q = LlamaQuantQ4_0(src);
      std::memcpy(out + b * sizeof(q), &q, sizeof(q));
    }
  }
}

void LlamaCppKvPolicy::DequantSlice(const uint8_t* blocks, int64_t off, int n, float* out) const {
  if (off % kBlock == 0 && n % kBlock == 0) {
    DequantizeRow(type_, blocks + off / kBlock * block_bytes(), out, n);
    return;
  }
  float buf[kBlock];
  for (int64_t b = off / kBlock; b * kBlock < off + n; ++b) {
    DequantizeRow(type_, blocks + b * block_bytes(), buf, kBlock);
    const int64_t a = std::max(off, b * kBlock), e = std::min(off + n, (b + 1) * kBlock);
    std::copy(buf + (a - b * kBlock), buf + (e - b * kBlock), out + (a - off));
  }
}

Status LlamaCppKvPolicy::OnAppended(int layer, const LayerStore& store, const CacheCall& call,
                                    CachePlan* plan, ThreadPool* pool) {
  Layer& L = layers_[layer];
  const int64_t r0 = L.n_rows, r1 = store.n_rows();
  if (r1 > r0) {
    const int n_h = L.g.n_kv_heads;
    const int D = L.g.k_dim, DV = L.g.v_dim;
    L.k.resize(static_cast<size_t>(r1 * KeyRowBytes(L)));
    if (!L.mla) L.v.resize(static_cast<size_t>(r1 * ValRowBytes(L)));
    // Each row's task writes only its own bytes: the same bytes on any number of threads. The
    // heads are rotated one by one, then the row of all heads is quantized.
    ParallelForOrInline(pool, r1 - r0, 8, [&](int64_t b, int64_t e, int) {
      std::vector<float> x(static_cast<size_t>(n_h) * std::max(D, DV));
      for (int64_t u = r0 + b; u < r0 + e; ++u) {
        for (int h = 0; h < n_h; ++h) {
          const uint16_t* k = store.key_row(h, u);
          float* xh = x.data() + static_cast<int64_t>(h) * D;
          for (int c = 0; c < D; ++c) xh[c] = Bf16ToF32(k[c]);
          HadamardBlocks(xh, D, L.kb);
        }
        QuantizeRow(x.data(), int64_t{n_h} * D, L.nbk, L.k.data() + u * KeyRowBytes(L));
        if (L.mla) continue;
        for (int h = 0; h < n_h; ++h) {
          const uint16_t* v = store.val_row(h, u);
          float* xh = x.data() + static_cast<int64_t>(h) * DV;
          for (int c = 0; c < DV; ++c) xh[c] = Bf16ToF32(v[c]);
          HadamardBlocks(xh, DV, L.vb);
        }
        QuantizeRow(x.data(), int64_t{n_h} * DV, L.nbv, L.v.data() + u * ValRowBytes(L));
      }
    });
    L.n_rows = r1;
  }
  // Every row is held quantized: the pages that lie entirely before the call's first row are read
  // by no later query (the call's own pages stay until the next call). The first call holds no
  // earlier rows.
  if (call.first == 0 || call.n_rows() == 0) return OkStatus();
  for (int64_t p = 0; (p + 1) * LayerStore::kPageRows <= call.first; ++p) {
    for (int h = 0; h < L.g.n_kv_heads; ++h) {
      if (store.page_resident(h, p)) plan->release.push_back({h, p});
    }
  }
  return OkStatus();
}

const uint8_t* LlamaCppKvPolicy::key_blocks(int layer, int64_t u) const {
  const Layer& L = layers_[layer];
  STRATA_CHECK(u >= 0 && u < L.n_rows);
  return L.k.data() + u * KeyRowBytes(L);
}

const uint8_t* LlamaCppKvPolicy::value_blocks(int layer, int64_t u) const {
  const Layer& L = layers_[layer];
  STRATA_CHECK(!L.mla && u >= 0 && u < L.n_rows);
  return L.v.data() + u * ValRowBytes(L);
}

void LlamaCppKvPolicy::DequantKeyRotated(int layer, int h, int64_t u, float* out) const {
  const Layer& L = layers_[layer];
  DequantSlice(key_blocks(layer, u), int64_t{h} * L.g.k_dim, L.g.k_dim, out);
}

void LlamaCppKvPolicy::DequantValueRotated(int layer, int h, int64_t u, float* out) const {
  const Layer& L = layers_[layer];
  if (L.mla) {
    std::vector<float> k(L.g.k_dim);
    DequantKeyRotated(layer, h, u, k.data());
    std::copy_n(k.data(), L.g.v_dim, out);
    return;
  }
  DequantSlice(value_blocks(layer, u), int64_t{h} * L.g.v_dim, L.g.v_dim, out);
}

Status LlamaCppKvPolicy::Read(int layer, const LayerStore& store, const float* q, int64_t limit,
                              ThreadPool* pool, SoftmaxStates* st, ReadStats* stats) {
  const Layer& L = layers_[layer];
  const LayerGeometry& g = L.g;
  if (limit > L.n_rows) {
    return Internal(name() + ": a read of rows [0, " + std::to_string(limit) + ") of layer " +
                    std::to_string(layer) + " before they were quantized (" +
                    std::to_string(L.n_rows) + " rows held)");
  }
  const int D = g.k_dim, DV = g.v_dim;
  // The query rotated once per head: q.k = (Hq).(Hk).
  std::vector<float> qr(q, q + static_cast<int64_t>(g.n_q_heads) * D);
  if (L.kb > 1) {
    for (int hq = 0; hq < g.n_q_heads; ++hq) HadamardBlocks(qr.data() + hq * D, D, L.kb);
  }
  AttendRowRange(g, qr.data(), 0, limit, pool, st,
                 [&](int h, int64_t u0, int64_t n, float* kt, float* vt) {
                   for (int64_t i = 0; i < n; ++i) {
                     DequantSlice(L.k.data() + (u0 + i) * KeyRowBytes(L), int64_t{h} * D, D,
                                  kt + i * D);
                     if (L.mla) {
                       std::copy_n(kt + i * D, DV, vt + i * DV);
                     } else {
                       DequantSlice(L.v.data() + (u0 + i) * ValRowBytes(L), int64_t{h} * DV, DV,
                                    vt + i * DV);
                     }
                   }
                 });
  // The weighted sum of rotated values un-rotated once per head: H^T = H.
  if (L.vb > 1) {
    for (int hq = 0; hq < g.n_q_heads; ++hq) HadamardBlocks(st->o + hq * DV, DV, L.vb);
  }
  if (stats) {
    stats->rows_attended += limit * g.n_kv_heads;
    stats->bytes_read += limit * RowBytes(g);
  }
  return OkStatus();
}

bool LlamaCppKvPolicy::ClaimStagedReads(int layer, const LayerStore& store, int64_t first_limit,
                                        int m, ReadStats* stats, StagedPrefixPlan* plan) {
  const Layer& L = layers_[layer];
  if (first_limit + m - 1 > L.n_rows) return false;  // Read refuses these
  plan->unit = 1;
  plan->cap = L.n_rows;
  for (int64_t limit = first_limit; limit < first_limit + m; ++limit) {  // as Read counts
    stats->rows_attended += limit * L.g.n_kv_heads;
    stats->bytes_read += limit * RowBytes(L.g);
  }
  return true;
}

void LlamaCppKvPolicy::StagePrefixRows(int layer, int h, int64_t s0, int64_t sn, float* keys,
                                       float* values) const {
  const Layer& L = layers_[layer];
  const int D = L.g.k_dim, DV = L.g.v_dim;
  STRATA_CHECK(s0 >= 0 && s0 + sn <= L.n_rows);
  // Un-rotated rows H^T x^: q.(H^T k^) = (Hq).k^, what Read computes, up to f32 rounding.
  for (int64_t i = 0; i < sn; ++i) {
    float* k = keys + i * D;
    DequantSlice(L.k.data() + (s0 + i) * KeyRowBytes(L), int64_t{h} * D, D, k);
    HadamardBlocks(k, D, L.kb);
    if (values == nullptr) continue;
    float* v = values + i * DV;
    if (L.mla) {
      std::copy_n(k, DV, v);  // the rotation's blocks divide v_dim: the same un-rotated columns
    } else {
      DequantSlice(L.v.data() + (s0 + i) * ValRowBytes(L), int64_t{h} * DV, DV, v);
      HadamardBlocks(v, DV, L.vb);
    }
  }
}

int64_t LlamaCppKvPolicy::ResidentBytes(int layer, const LayerStore& store) const {
  return store.resident_bytes() + layers_[layer].n_rows * RowBytes(layers_[layer].g);
}

PolicySummary LlamaCppKvPolicy::Summary(int layer, const LayerStore& store) const {
  PolicySummary s = Policy::Summary(layer, store);
  s.compressed = layers_[layer].n_rows > 0;
  if (!s.compressed) s.note = "no row appended yet";
  return s;
}

PolicySettings LlamaCppKvSettings(DType type) {
  PolicySettings p;
  p.policy = type == DType::kQ8_0 ? "q8_0" : "q4_0";
  p.settings = {SettingDecl::Bool(
      "rotate", true,
      "Walsh-Hadamard rotation of every K and V row before quantizing, as llama.cpp b10056+ "
      "(K blocks: the largest power of two dividing the head dim; V: at most 64); off: the "
      "plain cache")};
  return p;
}

StatusOr<std::unique_ptr<Policy>> MakeLlamaCppKvPolicy(const PolicySpec& spec, DType type) {
  ASSIGN_OR_RETURN(const ResolvedSettings s,
                   ResolveSettings(LlamaCppKvSettings(type), spec.settings));
  return std::unique_ptr<Policy>(new LlamaCppKvPolicy(type, s.Bool("rotate")));
}

}  // namespace strata::baselines
