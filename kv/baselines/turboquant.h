// TurboQuant-class KV cache (`turboquant`), as vLLM ships it (--kv-cache-dtype turboquant_*):
// a random-sign Walsh-Hadamard rotation of every K and V row per KV head, then a Lloyd-Max
// scalar codebook for the unit Gaussian on every rotated coordinate.
//
// What a row stores (per KV head, K and V alike): its L2 norm as f16 (2 bytes) and one b-bit
// code per value, packed LSB-first (ceil(dim * b / 8) bytes). Encoding row x of width D:
//   y = H (S x): S a fixed ±1 diagonal (one per head dim from a fixed seed, shared by every
//     layer and head), H the orthonormal Sylvester Hadamard matrix applied block-diagonally in
//     blocks of the largest power of two dividing D (the whole row when D is a power of two;
//     e.g. blocks of 16 at D = 80, 32 at D = 96);
//   z_i = y_i sqrt(D) / ||x|| (||z|| = sqrt(D): after the rotation each z_i is ~N(0, 1));
//   code_i = the nearest centroid of the b-bit Lloyd-Max codebook of N(0, 1)
//     (LloydMaxGaussian, computed once in float64);
//   x^ = S H^T (c * f16(||x||) / sqrt(D)), or with norm correction (vLLM's `_nc` presets)
//     S H^T (c * f16(||x||) / ||c||): the code vector re-normalised to the row's norm.
// b = 8 is a uniform int8 code instead of a 256-level Lloyd-Max codebook (vLLM's k8v4 stores
// FP8 keys): y is coded round(y / d) in [-127, 127] with d = f16(max |y_i| / 127), and the f16
// d takes the norm's 2 bytes. So a row of D values takes 2 + ceil(D b / 8) bytes: 34 bytes at
// D = 64, b = 4 (4.25 bits per value), 26 at b = 3, 66 at b = 8.
//
// Settings: key-bits, value-bits in {2, 3, 4, 8}; preset names vLLM's presets: k8v4 (8 / 4, no
// norm correction), 4bit (4 / 4, nc), k3v4 (3 / 4, nc), 3bit (3 / 3, nc); default 4bit;
// key-bits / value-bits / norm-correction given override the preset's. MLA layers hold one
// latent row (key and value): it is coded at key-bits, the rotation blocks dividing both k_dim
// and v_dim, and the value is its first v_dim columns.
//
// What stays exact (vLLM's integration: a prefill chunk attends its own K/V uncompressed, then
// stores them coded; a decode step writes its row to the coded cache before attention reads it;
// no recent-token window; the first and last 2 attention layers of dense models are left
// uncompressed): a query reads rows [0, E) coded and [E, limit) exact from the store, with
// E = max(0, B - recent), B = the running prefill call's first row, or a decode call's end
// (recent defaults to 0, as vLLM). boundary-layers = n leaves the first and last n layers
// (at most half of them) exact; default 0 (vLLM's is 2 for dense models).
//
// Reads: the query rotated once per head (q.k = (H S q).(H S k)), the coded rows dequantized in
// the rotated space, the weighted sum of their values un-rotated once per head (S H^T); exact
// rows through ReadRows. Every row is coded when appended; pages entirely before min(E, the
// call's first row) are released. Resident = the store's pages still held + every row's codes
// and norms. Bytes read per read = coded rows x their bytes + exact rows x the store's bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "kv/policy.h"
#include "kv/registry.h"

namespace strata::baselines {

// The Lloyd-Max quantizer of N(0, 1) with `levels` centroids (ascending), by Lloyd's iteration
// on the Gaussian pdf / cdf in float64 until no centroid moves by more than 1e-10. Cached per
// level count.
const std::vector<double>& LloydMaxGaussian(int levels);
// Its mean squared error E[(Z - Q(Z))^2] for Z ~ N(0, 1) (float64 integration).
double LloydMaxDistortion(int levels);

// The random-sign Walsh-Hadamard rotation of one head dim: x <- H (S x) (Rotate) and its
// inverse x <- S H x (Unrotate); H block-diagonal in blocks of LargestPow2Divisor(block_of).
class SignedHadamard {
 public:
  SignedHadamard() = default;
  // dim: the row width; block: a power of two dividing dim; the signs from a fixed seed.
  SignedHadamard(int dim, int block);
  int dim() const { return static_cast<int>(sign_.size()); }
  int block() const { return block_; }
  float sign(int i) const { return sign_[i]; }
  void Rotate(float* x) const;
  void Unrotate(float* x) const;  // the first n <= dim columns: n a multiple of the block
  void Unrotate(float* x, int n) const;
  void Rotate(double* x) const;
  void Unrotate(double* x) const;

 private:
  std::vector<float> sign_;
  int block_ = 1;
};

// One row's codec at b bits (2, 3, 4: Lloyd-Max; 8: uniform int8), dim values.
struct TurboRowCodec {
  int dim = 0;
  int bits = 4;
  bool norm_correction = false;
  int64_t bytes() const { return 2 + (int64_t{dim} * bits + 7) / 8; }
  // x: the rotated row (y); writes bytes() bytes: f16 norm (or int8 step), then packed codes.
  void Encode(const float* y, float norm, uint8_t* out) const;
  // The dequantized rotated row: [dim].
  void Decode(const uint8_t* in, float* y) const;
};

// LSB-first packing of n codes of b bits (1..8).
void PackBits(const uint8_t* codes, int64_t n, int bits, uint8_t* out);
void UnpackBits(const uint8_t* packed, int64_t n, int bits, uint8_t* codes);

struct TurboQuantConfig {
  int key_bits = 4;
  int value_bits = 4;
  bool norm_correction = true;
  int64_t recent = 0;
  int boundary_layers = 0;
  std::string preset = "4bit";
};

class TurboQuantPolicy final : public Policy {
 public:
  StatusOr<std::unique_ptr<Policy>> Clone() const override {
    return std::unique_ptr<Policy>(new TurboQuantPolicy(*this));
  }
  explicit TurboQuantPolicy(const TurboQuantConfig& c) : c_(c) {}
  std::string name() const override { return "turboquant"; }
  std::string describe() const override;
  Status Bind(const std::vector<LayerGeometry>& layers) override;
  Status OnAppended(int layer, const LayerStore& store, const CacheCall& call, CachePlan* plan,
                    ThreadPool* pool) override;
  Status Read(int layer, const LayerStore& store, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override;
  // A prefill chunk's reads: rows [0, E) coded (un-rotated, StagePrefixRows), then exact rows.
  bool ClaimStagedReads(int layer, const LayerStore& store, int64_t first_limit, int m,
                        ReadStats* stats, StagedPrefixPlan* plan) override;
  void StagePrefixRows(int layer, int h, int64_t s0, int64_t sn, float* keys,
                       float* values) const override;
  int64_t ResidentBytes(int layer, const LayerStore& store) const override;
  int64_t PeakResidentBytes(int layer, const LayerGeometry& g, int64_t n_rows) const override;
  PolicySummary Summary(int layer, const LayerStore& store) const override;

  const TurboQuantConfig& config() const { return c_; }
  // Bytes of one token's coded row, all KV heads (keys + values; MLA: the latent row).
  int64_t RowBytes(int layer) const;
  int64_t coded_rows(int layer) const { return layers_[layer].n_rows; }
  bool exact_layer(int layer) const { return layers_[layer].exact; }
  // First row a read of the running call takes exactly from the store (E above).
  int64_t exact_from(int layer) const { return layers_[layer].exact_from; }
  const SignedHadamard& key_rotation(int layer) const { return layers_[layer].rk; }
  const SignedHadamard& value_rotation(int layer) const { return layers_[layer].rv; }
  // Row u of KV head h as the running call's reads attend it (un-rotated f32): the dequantized
  // row when u < exact_from, else the store's row. keys [k_dim], values [v_dim] (may be null).
  void RowAsRead(int layer, const LayerStore& store, int h, int64_t u, float* key,
                 float* value) const;

 private:
  struct Layer {
    LayerGeometry g;
    bool mla = false;
    bool exact = false;  // a boundary layer: never coded
    TurboRowCodec ck, cv;
    SignedHadamard rk, rv;
    int64_t n_rows = 0;
    int64_t exact_from = 0;
    std::vector<uint8_t> k, v;  // token u, head h at (u * n_kv_heads + h) * codec bytes
  };
  // Dequantized rotated rows [u0, u0 + n) of head h: keys [n, k_dim], values [n, v_dim].
  void DecodeRows(const Layer& L, int h, int64_t u0, int64_t n, float* kt, float* vt) const;

  TurboQuantConfig c_;
  std::vector<Layer> layers_;
};

PolicySettings TurboQuantSettings();
// The settings resolved against the preset (errors name the setting).
StatusOr<TurboQuantConfig> TurboQuantConfigFrom(const PolicySpec& spec);
StatusOr<std::unique_ptr<Policy>> MakeTurboQuantPolicy(const PolicySpec& spec);

}  // namespace strata::baselines
