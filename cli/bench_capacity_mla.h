// `strata bench capacity --kind mla`: a long MLA cache of Kimi Linear's geometry filled block by
// block through a policy (VestigeKV with its file archive, or `full`), one decode step over it,
// and where its bytes are: tail, attended tier, recall index, metadata, buffers, archive file,
// peak RSS. The synthetic rows are a pure function of (seed, layer, position), so an archive left
// by a killed run can be checked row by row (cli/bench_capacity_mla_test.cc).
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "kv/geometry.h"

namespace strata::cli {

struct BenchCapacityOptions;

// Kimi Linear's MLA layer: 32 query heads over one latent row [c (512) ; r (64)], NoPE.
LayerGeometry MlaGeometry(int q_heads, int d_c, int d_r);

// MLA rows with the structure VestigeKV ranks: a latent part whose energy decays over its
// channels (so a rank-64 index holds most of it), and a branch that drifts smoothly with the
// position plus sparse high-frequency spikes (the rows sigma = ||r - lowpass(r)|| singles out).
// Row(layer, pos) depends only on the seed, the layer and the position.
class MlaRowSource {
 public:
  MlaRowSource(uint64_t seed, const LayerGeometry& g);
  void Row(int layer, int64_t pos, float* row) const;  // row: [k_dim]
  void Query(uint64_t salt, float* q) const;            // q: [n_q_heads, k_dim]

 private:
  LayerGeometry g_;
  uint64_t seed_;
  int bank_rows_ = 0;
  std::vector<float> bank_;   // [bank_rows, k_dim] unit noise
  std::vector<float> scale_;  // [d_c] latent channel scales
};

int RunBenchCapacityMla(const BenchCapacityOptions& o, std::ostream& out, std::ostream& err);

}  // namespace strata::cli
