// `strata bench attention --kind gqa` (attention-gqa) and `strata bench capacity`: per-step attention time and bytes read of
// cache policies against the full bf16 cache in one run, and the resident size of a long Geodesia
// cache filled block by block.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace CLI {
class App;
}

namespace strata::cli {

struct BenchGqaAttentionOptions {
  std::string kind = "gqa";
  int64_t ctx = 16384;
  int q_heads = 32;
  int kv_heads = 8;
  int head_dim = 128;
  // Comma-separated; NAME[@BITS][:key=value:key=value], e.g. geodesia@2.5:rd-frac=0.03.
  std::string policy = "full,geodesia@5,geodesia@2.5,cquest";
  int steps = 8;
  int warmup = 2;
  int threads = 0;  // 0: hardware concurrency
  uint64_t seed = 1;
  std::string json_path;
};
void AddBenchGqaAttentionCommand(CLI::App* bench, BenchGqaAttentionOptions* o);
int RunBenchGqaAttention(const BenchGqaAttentionOptions& o, std::ostream& out, std::ostream& err);

struct BenchCapacityOptions {
  int64_t tokens = 1000000;
  int layers = 28;  // Qwen2.5-7B: 28 layers, 28 query heads, 4 KV heads, head dim 128
  int q_heads = 28;
  int kv_heads = 4;
  int head_dim = 128;
  // The spec's default budget (levels): plain Geodesia keeps no key boxes (only compressed-Quest
  // reads them), so with rd-frac 0 the levels are the whole resident cost and `budget=all` is the
  // same allocation.
  std::string policy = "geodesia@2";
  // Tokens between allocator runs during the fill. Until the next run they exist twice in bf16
  // (LayerStore pages and level-16 slots), 2 x every x 57,344 B at the default shape: 112 MiB here
  // (4096: 448 MiB, and ~5% less allocator time). Real decoding runs it every token.
  int64_t every = 1024;
  int threads = 0;
  uint64_t seed = 1;
  std::string json_path;
};
void AddBenchCapacityCommand(CLI::App* bench, BenchCapacityOptions* o);
int RunBenchCapacity(const BenchCapacityOptions& o, std::ostream& out, std::ostream& err);

}  // namespace strata::cli
