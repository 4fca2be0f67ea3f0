// llama.cpp's quantized KV cache (q8_0, q4_0): `-ctk q8_0 -ctv q8_0` (or
// q4_0), with llama.cpp's Walsh-Hadamard rotation of K and V (on by default, as in llama.cpp
// b10056 and later) or without it (`rotate=0`).
//
// What llama.cpp stores (src/llama-kv-cache.cpp, ggml's quantize_row_q8_0_ref /
// quantize_row_q4_0_ref): every K and V row, the current token's included, is written to the
// cache quantized before attention reads it; there is no exact recent window. A row is cut into
// blocks of 32 values:
//   q8_0  f16 d = amax / 127, 32 int8 q = round(x / d) (half away from zero): 34 bytes per 32
//         values = 8.5 bits per value; x^ = d q;
//   q4_0  f16 d = max / -8 (max: the signed value of largest magnitude), q = min(15,
//         (int8)(x / d + 8.5)), packed q[i] | q[i + 16] << 4 in 16 bytes: 18 bytes per 32 values
//         = 4.5 bits per value; x^ = (q - 8) d.
// As in llama.cpp, the blocks cut a token's row of all KV heads (head h's values at h * head dim;
// with a head dim that is a multiple of 32 each head has its own blocks, else a block may span two
// heads). A row whose width is not a multiple of 32 (llama.cpp refuses such a cache; e.g. an MLA
// latent row of 80) has its last block zero-padded, and that block's bytes count whole.
//
// The rotation (llama.cpp: attn_rot_k / attn_rot_v, ggml_gen_hadamard): an orthonormal
// Walsh-Hadamard matrix H of size n (Sylvester order, entries +-1/sqrt(n), H = H^T, H H = I, no
// random signs), applied block-diagonally to each head's row in blocks of n before quantizing:
//   K: n = the largest power of two dividing the head dim (llama.cpp: the same, for head dims that
//      are multiples of 64; 128 at head dim 128);
//   V: n = min(64, the largest power of two dividing the head dim) (llama.cpp uses 64 for V);
//   MLA (one latent row, key and value): the key rule over gcd(k_dim, v_dim), so that the value,
//      the row's first v_dim columns, is whole blocks.
// llama.cpp leaves head dims that are not multiples of 64 unrotated; here they are rotated in the
// blocks above (e.g. 32 at head dim 32), so that the setting means the same on small models.
// Attention is invariant under the rotation: a read rotates the query once per head (q.k =
// (Hq).(Hk)), attends the dequantized rotated rows, and un-rotates the weighted sum of values once
// per head (sum a_i v_i = H^T sum a_i (H v_i)).
//
// Reads: every row below the query's limit, dequantized (f32 products and sums; llama.cpp's CPU
// kernel also rounds the query to q8_0 for the K dot products, which is not mirrored). Bytes read
// per read = the blocks' bytes of every row read. Resident = the store's pages still allocated +
// the blocks; pages that lie entirely before the running call are released when a call begins
// (every row of them is held quantized).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/quant.h"
#include "core/status.h"
#include "kv/policy.h"
#include "kv/registry.h"

namespace strata::baselines {

// llama.cpp's reference block quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref) of one
// block of 32 values.
BlockQ8_0 LlamaQuantQ8_0(const float* x);
BlockQ4_0 LlamaQuantQ4_0(const float* x);

// The largest power of two dividing n (n >= 1).
int LargestPow2Divisor(int n);
// In place: x <- H x over each of the n / block consecutive blocks (block a power of two
// dividing n; 1 is the identity). H is symmetric and orthonormal, so it also un-rotates.
void HadamardBlocks(float* x, int n, int block);
void HadamardBlocks(double* x, int n, int block);

class LlamaCppKvPolicy final : public Policy {
 public:
  StatusOr<std::unique_ptr<Policy>> Clone() const override {
    return std::unique_ptr<Policy>(new LlamaCppKvPolicy(*this));
  }
  static constexpr int kBlock = 32;

  // type: DType::kQ8_0 or DType::kQ4_0.
  LlamaCppKvPolicy(DType type, bool rotate) : type_(type), rotate_(rotate) {}
  std::string name() const override { return type_ == DType::kQ8_0 ? "q8_0" : "q4_0"; }
  std::string describe() const override;
  Status Bind(const std::vector<LayerGeometry>& layers) override;
  Status OnAppended(int layer, const LayerStore& store, const CacheCall& call, CachePlan* plan,
                    ThreadPool* pool) override;
  Status Read(int layer, const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override;
  // A prefill chunk's reads, staged: every row is held quantized, so the whole prefix is the
  // dequantized, un-rotated rows (StagePrefixRows), attended in f32 as Read attends them.
  bool ClaimStagedReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                        ReadStats* stats, StagedPrefixPlan* plan) override;
  void StagePrefixRows(int layer, int h, int64_t s0, int64_t sn, float* keys,
                       float* values) const override;
  int64_t ResidentBytes(int layer, const LayerStore& store) const override;
  // The store's pages for n_rows (a call's own pages stay until the next call) + n_rows rows of
  // blocks.
  int64_t PeakResidentBytes(int layer, const LayerGeometry& g, int64_t n_rows) const override {
    return FullPageBytes(g, n_rows) + n_rows * RowBytes(g);
  }
  PolicySummary Summary(int layer, const LayerStore& store) const override;

  DType type() const { return type_; }
  bool rotate() const { return rotate_; }
  int64_t block_bytes() const { return type_ == DType::kQ8_0 ? 34 : 18; }
  // Bytes of one token's blocks in a layer of geometry g, all KV heads (MLA: the latent row only).
  int64_t RowBytes(const LayerGeometry& g) const;
  // Blocks of one token's key (value) row of all KV heads: ceil(n_kv_heads * dim / 32).
  static int64_t RowBlocks(int n_kv_heads, int dim) {
    return (int64_t{n_kv_heads} * dim + kBlock - 1) / kBlock;
  }
  // Rows held quantized (all rows appended so far, once OnAppended ran).
  int64_t quantized_rows(int layer) const { return layers_[layer].n_rows; }
  // Rotation block sizes of a bound layer (1: not rotated).
  int key_rotation(int layer) const { return layers_[layer].kb; }
  int value_rotation(int layer) const { return layers_[layer].vb; }
  // The stored blocks of token u, all KV heads: keys (MLA: the latent row), values (GQA only).
  const uint8_t* key_blocks(int layer, int64_t u) const;
  const uint8_t* value_blocks(int layer, int64_t u) const;
  // Dequantized row u of KV head h in the rotated space (as stored): [k_dim] / [v_dim].
  void DequantKeyRotated(int layer, int h, int64_t u, float* out) const;
  void DequantValueRotated(int layer, int h, int64_t u, float* out) const;

 private:
  struct Layer {
    LayerGeometry g;
    bool mla = false;
    int64_t nbk = 0, nbv = 0;  // blocks per token's key / value row (all KV heads)
    int kb = 1, vb = 1;        // rotation blocks (1: none)
    int64_t n_rows = 0;
    // Token u's key blocks at u * nbk * block_bytes, value blocks likewise.
    std::vector<uint8_t> k, v;
  };
  // Quantizes n values (rotated already) into nb blocks at out (zero-padded last block).
  void QuantizeRow(const float* x, int64_t n, int64_t nb, uint8_t* out) const;
  // Values [off, off + n) of a row's blocks, dequantized.
  void DequantSlice(const uint8_t* blocks, int64_t off, int n, float* out) const;
  int64_t KeyRowBytes(const Layer& L) const { return int64_t{L.nbk} * block_bytes(); }
  int64_t ValRowBytes(const Layer& L) const { return int64_t{L.nbv} * block_bytes(); }

  DType type_;
  bool rotate_;
  std::vector<Layer> layers_;
};

// q8_0 / q4_0: one setting, rotate (bool, default on).
PolicySettings LlamaCppKvSettings(DType type);
StatusOr<std::unique_ptr<Policy>> MakeLlamaCppKvPolicy(const PolicySpec& spec, DType type);

}  // namespace strata::baselines
