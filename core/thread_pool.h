// ThreadPool: a fixed set of workers and a blocking ParallelFor with static, deterministic chunking.
//
// Why our own pool and not OpenMP: the split of work into chunks depends only on (n, n_threads),
// never on scheduling, so results that sum across chunks are reproducible; it works unchanged under
// ASan/TSan; and the caller thread takes chunk 0 so a 1-thread pool has no handoff cost at all.
// Decode issues ~100 short ParallelFor calls per token, so workers and the caller spin briefly
// (kSpinIters pause loops, a few tens of microseconds) before blocking on a condition variable:
// back-to-back jobs are picked up without a futex round trip, idle workers still sleep.
// The chunk *boundaries* are static, but chunks are *claimed* dynamically (the caller and the
// workers take the next unclaimed chunk): when a worker is not scheduled (a loaded machine), the
// caller runs its chunk instead of waiting a scheduler time slice for it. Which thread runs a
// chunk never changes what the chunk computes, so results stay bit-identical for any
// interleaving; a chunk index runs exactly once per call, so per-chunk scratch indexed by it is
// never shared.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
 public:
  // n_threads <= 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(int n_threads = 1);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(begin, end, chunk) over [0, n) split into size() contiguous chunks (chunk k gets
  // [k*n/T, (k+1)*n/T)). Blocks until all chunks are done. Not reentrant.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

  // Same, with chunk boundaries rounded to multiples of `grain` (the last chunk takes the rest).
  void ParallelForGrain(int64_t n, int64_t grain,
                        const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  static constexpr int kSpinIters = 20000;
  void WorkerLoop();
  // Claims and runs chunks of generation `gen` until none is left (or the job moved on).
  void RunChunks(uint64_t gen);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  // Job description: written by the caller before generation_ is bumped (release), read by
  // workers after they see the new generation (acquire).
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  // (low 32 bits of the generation) << 32 | the next unclaimed chunk.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int> pending_{0};  // chunks of the current job not yet finished
  std::atomic<bool> stop_{false};
};

// Chunk k of T over [0, n) with grain g: [begin, end).
void ChunkRange(int64_t n, int64_t grain, int k, int T, int64_t* begin, int64_t* end);

// "Pool or run inline", the one copy: pool->ParallelForGrain(n, grain, fn), or, without a pool,
// fn(0, n, 0) on the caller (nothing for n <= 0). The pool itself runs inline as chunk 0 for one
// thread or n <= grain, so a chunk's work, and hence every result, is the same on every path.
void ParallelForOrInline(ThreadPool* pool, int64_t n, int64_t grain,
                         const std::function<void(int64_t, int64_t, int)>& fn);

// The same per item: f(i, chunk) for i in [0, n), chunk < the pool's size (0 without a pool).
template <typename F>
void ParallelForEach(ThreadPool* pool, int64_t n, F&& f) {
  ParallelForOrInline(pool, n, 1, [&](int64_t b, int64_t e, int k) {
    for (int64_t i = b; i < e; ++i) f(i, k);
  });
}

}  // namespace strata
