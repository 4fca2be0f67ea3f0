#include "kernels/attn_math.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace strata {

const char* const kAttnMathHelp =
    "Attention dot-product arithmetic: f32 (exact path), bf16 (query rounded to bf16, bf16 "
    "products summed in f32; vdpbf16ps where the CPU has it), int8 (integer dot products where a "
    "cache kernel has them, bf16 elsewhere), auto (per kernel, the fastest that meets the accuracy "
    "contract on this CPU: bf16 for MLA latent rows where vdpbf16ps runs at an FMA's rate (AMD "
    "Zen 5), f32 for every other row)";

StatusOr<AttnMath> ParseAttnMath(const std::string& text) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "f32") return AttnMath::kF32;
  if (t == "bf16") return AttnMath::kBF16;
  if (t == "int8") return AttnMath::kInt8;
  if (t == "auto") return AttnMath::kAuto;
  return InvalidArgument("--attn-math '" + text + "' must be f32, bf16, int8 or auto");
}

const char* AttnMathName(AttnMath m) {
  switch (m) {
    case AttnMath::kF32: return "f32";
    case AttnMath::kBF16: return "bf16";
    case AttnMath::kInt8: return "int8";
    case AttnMath::kAuto: return "auto";
  }
  return "?";
}

namespace {

DotFeatures Detect() {
  DotFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  // cpuid and XCR0 directly (not Highway's target mask, which tests narrow on purpose).
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || (c & (1u << 27)) == 0) return f;  // OSXSAVE
  unsigned xlo = 0, xhi = 0;
  __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
  const bool os_avx = (xlo & 0x6u) == 0x6u;            // XMM and YMM state
  const bool os_avx512 = os_avx && (xlo & 0xe0u) == 0xe0u;  // opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const unsigned max_sub = a;
  const bool avx2 = os_avx && (b & (1u << 5)) != 0;
  // AVX512 F (16), DQ (17), BW (30), VL (31): the base the bf16 kernel is compiled for.
  const unsigned base = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
  const bool avx512 = os_avx512 && (b & base) == base;
  f.avx512_vnni = avx512 && (c & (1u << 11)) != 0;  // CPUID.(7,0):ECX[11]
  if (max_sub >= 1 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avx_vnni = avx2 && (a & (1u << 4)) != 0;      // CPUID.(7,1):EAX[4]
    f.avx512_bf16 = avx512 && (a & (1u << 5)) != 0;  // CPUID.(7,1):EAX[5]
  }
  // Vendor (leaf 0: "AuthenticAMD") and family (leaf 1: base + extended when base is 0xF).
  unsigned vb = 0, vc = 0, vd = 0, fam = 0;
  if (__get_cpuid(0, &a, &vb, &vc, &vd) && __get_cpuid(1, &a, &b, &c, &d)) {
    fam = (a >> 8) & 0xFu;
    if (fam == 0xFu) fam += (a >> 20) & 0xFFu;
    const bool amd = vb == 0x68747541u && vd == 0x69746e65u && vc == 0x444d4163u;
    f.bf16_dot_full_rate = f.avx512_bf16 && amd && fam >= 0x1Au;
    char v[13];
    std::memcpy(v, &vb, 4);
    std::memcpy(v + 4, &vd, 4);
    std::memcpy(v + 8, &vc, 4);
    v[12] = 0;
    f.vendor = v;
    f.family = static_cast<int>(fam);
    unsigned mod = (a >> 4) & 0xFu;
    if (((a >> 8) & 0xFu) == 0xFu || ((a >> 8) & 0xFu) == 0x6u) mod |= ((a >> 16) & 0xFu) << 4;
    f.model = static_cast<int>(mod);
  }
#endif
  return f;
}

std::atomic<int> g_default{static_cast<int>(AttnMath::kF32)};
std::atomic<bool> g_native_allowed{true};

}  // namespace

const DotFeatures& CpuDotFeatures() {
  static const DotFeatures f = Detect();
  return f;
}

AttnMath Bf16RowsMath(AttnMath m, bool latent_rows) {
  switch (m) {
    case AttnMath::kBF16:
    case AttnMath::kInt8: return AttnMath::kBF16;
    case AttnMath::kF32: return AttnMath::kF32;
    case AttnMath::kAuto:
      return latent_rows && CpuDotFeatures().bf16_dot_full_rate &&
                     attn_math_internal::NativeBf16Dot()
                 ? AttnMath::kBF16
                 : AttnMath::kF32;
  }
  return AttnMath::kF32;
}

std::string CpuDotSummary() {
  const DotFeatures& f = CpuDotFeatures();
  char id[64];
  std::snprintf(id, sizeof(id), " family 0x%02x model 0x%02x", f.family, f.model);
  std::string s = "cpu: " + (f.vendor.empty() ? std::string("unknown") : f.vendor) + id + ";";
  if (f.avx512_bf16) s += f.bf16_dot_full_rate ? " avx512_bf16 (full rate)" : " avx512_bf16";
  if (f.avx512_vnni) s += " avx512_vnni";
  if (f.avx_vnni) s += " avx_vnni";
  s += "; --attn-math auto: ";
  s += Bf16RowsMath(AttnMath::kAuto, true) == AttnMath::kBF16 ? "bf16 for MLA rows, " : "f32 for MLA rows, ";
  s += "f32 for GQA rows";
  return s;
}

AttnMath DefaultAttnMath() { return static_cast<AttnMath>(g_default.load(std::memory_order_relaxed)); }
void SetDefaultAttnMath(AttnMath m) {
  g_default.store(static_cast<int>(m), std::memory_order_relaxed);
}

namespace attn_math_internal {
bool SetNativeBf16ForTest(bool allowed) { return g_native_allowed.exchange(allowed); }
bool NativeBf16Dot() {
  return CpuDotFeatures().avx512_bf16 && g_native_allowed.load(std::memory_order_relaxed);
}
}  // namespace attn_math_internal

}  // namespace strata
