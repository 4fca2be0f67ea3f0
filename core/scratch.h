// Per-thread work memory for the transient arrays of one forward call: a prefill chunk's
// activations, the MoE expert groups, the GEMM's packed operands.
//
// Why: the CLI maps every block of 64 KiB or more on its own (cli/main.cc, so that memory a
// policy releases leaves the process at once), and a prefill chunk allocated its arrays afresh
// for every layer and chunk. Each array was then mapped, faulted in page by page, zeroed and
// unmapped again: a 5.8k-token deepseek2 prefill (synth --preset 150m, 2 threads) took 708k page
// faults and ran at 192 tokens/s, against 21k faults and 281 tokens/s with the pages kept.
//
// A ScratchScope hands out zeroed, 64-byte aligned arrays from its thread's arena and gives them
// all back when it ends. Scopes nest in stack order (a callee's scope ends before its caller's).
// The arena keeps its blocks for the thread's lifetime, so a thread holds at most the largest
// set of arrays it ever had live at once (a prefill chunk's working set; llama.cpp keeps a
// compute buffer for the same reason). Arrays stay valid until their scope ends and may be read
// and written by other threads meanwhile (a thread pool's workers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace strata {

class ScratchScope {
 public:
  ScratchScope();
  ~ScratchScope();
  ScratchScope(const ScratchScope&) = delete;
  ScratchScope& operator=(const ScratchScope&) = delete;

  // n zeroed elements (an empty span for n = 0).
  std::span<float> Floats(size_t n) { return {static_cast<float*>(Bytes(n * sizeof(float))), n}; }
  // n elements left as they are (the caller writes every one before reading it): for arrays
  // of megabytes that are filled anyway, where zeroing would cost as much as filling.
  std::span<float> FloatsUnset(size_t n) {
    return {static_cast<float*>(Bytes(n * sizeof(float), false)), n};
  }
  std::span<double> DoublesUnset(size_t n) {
    return {static_cast<double*>(Bytes(n * sizeof(double), false)), n};
  }
  std::span<uint8_t> U8(size_t n) { return {static_cast<uint8_t*>(Bytes(n)), n}; }
  std::span<int32_t> Ints(size_t n) {
    return {static_cast<int32_t*>(Bytes(n * sizeof(int32_t))), n};
  }

 private:
  void* Bytes(size_t bytes, bool zero = true);
  size_t block_;  // the arena's position when the scope began
  size_t used_;
};

// Bytes this thread's arena holds (its blocks, in use or not).
size_t ScratchBytesHeld();

}  // namespace strata
