#include "core/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STRATA_PAUSE() _mm_pause()
#else
#define STRATA_PAUSE() std::this_thread::yield()
#endif

namespace strata {

void ChunkRange(int64_t n, int64_t grain, int k, int T, int64_t* begin, int64_t* end) {
  const int64_t units = (n + grain - 1) / grain;
  int64_t b = units * k / T * grain;
  int64_t e = units * (k + 1) / T * grain;
  *begin = std::min(b, n);
  *end = std::min(e, n);
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::RunChunks(uint64_t gen) {
  const uint64_t tag = (gen & 0xffffffffull) << 32;
  for (;;) {
    uint64_t s = claim_.load(std::memory_order_acquire);
    int k;
    for (;;) {
      if ((s & ~0xffffffffull) != tag) return;  // a later job: this one is done
      k = static_cast<int>(s & 0xffffffffull);
      if (k >= n_threads_) return;
      if (claim_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        break;
      }
    }
    // The job cannot change while a claimed chunk is unfinished (the caller waits for it).
    int64_t b, e;
    ChunkRange(job_n_, job_grain_, k, n_threads_, &b, &e);
    if (b < e) (*job_)(b, e, k);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int i = 0; i < kSpinIters && g == seen && !stop_.load(std::memory_order_relaxed); ++i) {
      STRATA_PAUSE();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] {
        return stop_.load(std::memory_order_acquire) ||
               generation_.load(std::memory_order_acquire) != seen;
      });
      if (stop_.load(std::memory_order_acquire)) return;
      g = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = g;
    RunChunks(g);
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  ParallelForGrain(n, 1, fn);
}

void ThreadPool::ParallelForGrain(int64_t n, int64_t grain,
                                  const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  pending_.store(n_threads_, std::memory_order_relaxed);
  const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;
  claim_.store((gen & 0xffffffffull) << 32, std::memory_order_release);
  {
    // Under the mutex so a worker between its predicate check and its wait cannot miss it.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.store(gen, std::memory_order_release);
  }
  start_cv_.notify_all();
  RunChunks(gen);
  for (int i = 0; i < kSpinIters && pending_.load(std::memory_order_acquire) != 0; ++i) {
    STRATA_PAUSE();
  }
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
}

void ParallelForOrInline(ThreadPool* pool, int64_t n, int64_t grain,
                         const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (pool == nullptr) {
    fn(0, n, 0);
    return;
  }
  pool->ParallelForGrain(n, grain, fn);
}

}  // namespace strata
