#include "core/thread_pool.h"

#include <algorithm>

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
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::WorkerLoop(int idx) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n, grain;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      grain = job_grain_;
    }
    int64_t b, e;
    ChunkRange(n, grain, idx, n_threads_, &b, &e);
    if (b < e) (*job)(b, e, idx);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  int64_t b, e;
  ChunkRange(n, grain, 0, n_threads_, &b, &e);
  if (b < e) fn(b, e, 0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace strata
