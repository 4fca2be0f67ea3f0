// The arithmetic of attention dot products (--attn-math).
//
//   f32   exact path: queries and cache rows widened to f32, f32 FMAs (what the bit-exactness
//         tests and the 1e-4-vs-float64 kernel tests use).
//   bf16  the query is rounded to bf16 once per read (after the softmax scale); q.k is a sum of
//         exact bf16 x bf16 products accumulated in f32 (AVX512_BF16 `vdpbf16ps` where the CPU has
//         it, the same arithmetic widened to f32 FMAs elsewhere); the value side stays f32.
//   int8  integer dot products on quantized codes where a kernel has them (the packed caches);
//         kernels over bf16 rows use their bf16 path under it.
//   auto  the fastest of the above that meets the accuracy contract on this CPU (the default of
//         the command line; each kernel resolves it, see Bf16RowsMath).
// Each kernel resolves the value it is given (kAuto included) to the arithmetic it runs, with a
// function next to these (Bf16RowsMath for kernels over bf16 rows): auto is a per-kernel choice,
// the fastest form measured to meet the contract, and int8 falls back to bf16 where a kernel has
// no integer form.
#pragma once

#include <string>

#include "core/status.h"

namespace strata {

enum class AttnMath : int { kF32 = 0, kBF16 = 1, kInt8 = 2, kAuto = 3 };

// "f32" | "bf16" | "int8" | "auto" (case-insensitive); anything else is InvalidArgument naming it.
StatusOr<AttnMath> ParseAttnMath(const std::string& text);
const char* AttnMathName(AttnMath m);
// The help text of --attn-math (shared by every command that builds caches).
extern const char* const kAttnMathHelp;

// CPU features (run time: cpuid, and XCR0 for the OS's AVX / AVX-512 register state).
struct DotFeatures {
  bool avx512_bf16 = false;  // vdpbf16ps usable
  bool avx512_vnni = false;  // vpdpbusd on 512-bit vectors
  bool avx_vnni = false;     // vpdpbusd on 256-bit vectors (VEX)
  // vdpbf16ps at about the instruction rate of an f32 FMA, so twice its products: AMD family
  // 0x1A (Zen 5; measured 7.0 vs 7.6 G instructions/s on one core, 12 independent zmm
  // accumulators). Intel's Sapphire/Emerald Rapids and older AMD parts: not assumed (the MLA
  // kernel measured 0.68-0.72x of f32 on the ones seen).
  bool bf16_dot_full_rate = false;
  std::string vendor;  // cpuid leaf 0 ("AuthenticAMD", "GenuineIntel"), empty off x86
  int family = 0, model = 0;
};
const DotFeatures& CpuDotFeatures();
// One line for benchmark headers, so each figure names the CPU it came from and what auto does
// there: "cpu: AuthenticAMD family 0x1a model 0x02; avx512_bf16 (full rate) avx512_vnni;
// --attn-math auto: bf16 for MLA rows, f32 for GQA rows".
std::string CpuDotSummary();

// The arithmetic of kernels over bf16 rows (AttendStream): f32 or bf16. int8 -> bf16 (no integer
// form over bf16 rows). auto -> bf16 only for MLA latent rows (`latent_rows`: values inside the
// keys, every query head reading each row) on a CPU with vdpbf16ps at full rate
// (DotFeatures::bf16_dot_full_rate) and the native path allowed; else f32. Why: the model-level
// contract (KL <= 1e-4 nats/token) holds for bf16 on the deepseek2 models and the testbeds but
// not on the synthetic llama / qwen2 (model/attn_math_model_test.cc), and absorbed MLA is
// compute-bound where a GQA read is memory-bound: on AMD Zen 5 `bench attention --kind mla`
// measured bf16 1.44-1.54x of f32 at 32k rows, GQA full 0.97x; on the Intel and older AMD hosts
// seen, vdpbf16ps lost to widened FMAs (MLA 0.68-0.72x; kernels/attention.cc's version log), and
// the portable form costs what f32 does.
AttnMath Bf16RowsMath(AttnMath m, bool latent_rows = false);
// Whether `m` (resolved) permits arithmetic `level` (f32 < bf16 < int8).
inline bool AtLeast(AttnMath m, AttnMath level) {
  return static_cast<int>(m) >= static_cast<int>(level) && m != AttnMath::kAuto;
}

// The process-wide default of caches built without an explicit choice (Model::NewCache): f32
// until the command line sets it from --attn-math (auto there by default).
AttnMath DefaultAttnMath();
void SetDefaultAttnMath(AttnMath m);

namespace attn_math_internal {
// Tests: false makes the bf16 kernels take their portable (widened-FMA) form even where the CPU
// has vdpbf16ps, so both forms are checked on one machine. Returns the previous value.
bool SetNativeBf16ForTest(bool allowed);
bool NativeBf16Dot();  // CPU has it and tests did not turn it off
}  // namespace attn_math_internal

}  // namespace strata
