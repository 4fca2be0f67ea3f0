// `strata bench capacity`: the resident size of a long Geodesia cache filled block by block; and
// the synthetic layers and rows it shares with `strata bench attention` (cli/bench_attention.cc).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kv/geometry.h"

namespace CLI {
class App;
}

namespace strata::cli {

// One GQA layer: q query heads over kv KV heads of head dim d.
LayerGeometry GqaGeometry(int q, int kv, int d);

// Synthetic rows: keys = a fixed per-(head, channel) offset + a per-block amplitude x noise, so
// blocks differ (as real caches do) and the allocator has something to rank. Values: noise.
// k and v are n_kv_heads x k_dim floats each (an MLA latent row: k only).
class RowSource {
 public:
  RowSource(uint64_t seed, const LayerGeometry& g, int bank = 0);  // bank > 0: cycle that many
  void Row(int64_t pos, float* k, float* v);
  void Query(float* q, int n);

 private:
  Rng rng_;
  LayerGeometry g_;
  std::vector<float> offset_, bank_k_, bank_v_;
};

// Zero / empty fields take the kind's default (RunBenchCapacity resolves them).
struct BenchCapacityOptions {
  std::string kind = "gqa";  // gqa: Geodesia; mla: VestigeKV (cli/bench_capacity_mla.h)
  int64_t tokens = 1000000;
  int layers = 0;    // gqa 28 (Qwen2.5-7B: 28 query heads, 4 KV heads, head dim 128); mla 7
  int q_heads = 0;   // gqa 28; mla 32 (Kimi Linear)
  int kv_heads = 4;  // gqa
  int head_dim = 128;  // gqa
  int d_c = 512;     // mla: latent width
  int d_r = 64;      // mla: branch width
  // gqa: the reference default budget (levels): plain Geodesia keeps no key boxes (only
  // compressed-Quest reads them), so with rd-frac 0 the levels are the whole resident cost and
  // `budget=all` is the same allocation. mla: vestige (its file archive in --archive-dir).
  std::string policy;
  // gqa: tokens between allocator runs during the fill. Until the next run they exist twice in
  // bf16 (LayerStore pages and level-16 slots), 2 x every x 57,344 B at the default shape: 112 MiB
  // at 1024 (4096: 448 MiB, and ~5% less allocator time). Real decoding runs it every token.
  // mla: tokens per prefill call (default 4096, one VestigeKV block).
  int64_t every = 0;
  std::string archive_dir;  // mla: where the file archive goes (default: a temporary folder)
  int threads = 0;
  uint64_t seed = 1;
  std::string json_path;
};
void AddBenchCapacityCommand(CLI::App* bench, BenchCapacityOptions* o);
int RunBenchCapacity(const BenchCapacityOptions& o, std::ostream& out, std::ostream& err);

}  // namespace strata::cli
