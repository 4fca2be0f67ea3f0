// `strata bench serve` (cli/bench_serve.cc): the serving benchmark. Load mode: K concurrent
// streaming clients (serve/loadgen.h) against a running server (--url) or an in-process one
// (-m). Capacity mode (--capacity): how many sequences of a given context fit a KV budget per
// policy, from caches filled as a server's sequence is (prefill calls, the compression point, one
// decode step) and measured by the policies' own ResidentBytes, which is what the scheduler
// admits by.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/cache.h"
#include "kv/geometry.h"

namespace strata::cli {

// The cache layers of a named shape: "tiny", "125m", "150m" (the `strata synth` presets' cache
// geometry), "qwen2.5-7b" (28 layers, 28 query / 4 KV heads, head dim 128, as `bench capacity`),
// "kimi-linear" (7 MLA layers, 32 query heads, rows [512 ; 64], as `bench capacity --kind mla`).
StatusOr<std::vector<LayerGeometry>> NamedCacheGeometry(const std::string& name);

// One sequence of `ctx` tokens as a server holds it after its first decoded token: ctx - 1
// synthetic rows appended in prefill calls of 512 (as the scheduler's chunked Prefill), the
// compression point, then one decode call (append + a query per layer). `policy` is
// NAME[:key=value...]; vestige and fullrow get archive=file in `archive_dir` unless the spec
// names an archive. peak: the largest ResidentBytes seen (after each call's appends).
struct FilledSequence {
  std::unique_ptr<KvCache> cache;
  int64_t peak_bytes = 0;
  double fill_s = 0;
};
StatusOr<FilledSequence> FillSequence(const std::vector<LayerGeometry>& layers,
                                      const std::string& policy, int64_t ctx, uint64_t seed,
                                      ThreadPool* pool, const std::string& archive_dir);

// Sequences of `resident` bytes each that a budget holds: floor(budget / resident).
int64_t FitCapacity(int64_t budget, int64_t resident);
// The most sequences the scheduler runs at once when each arrives with a prompt reserve of
// `reserve` bytes (Scheduler::PromptReserve) and holds `resident` bytes once prefilled: the N-th
// is admitted when N - 1 resident sequences and its reserve fit (0 when the reserve alone does not).
int64_t AdmittedCapacity(int64_t budget, int64_t reserve, int64_t resident);

}  // namespace strata::cli
