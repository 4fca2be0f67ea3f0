// Every registered policy's declared peak (Policy::PeakResidentBytes, what the server reserves a
// prompt at: serve/scheduler.cc) is an upper bound of the resident bytes it really holds: after
// every appended row and every call of a prefill (in chunks, and in one call), at the compression
// point and through decode steps, ResidentBytes <= PeakResidentBytes(rows held). Checked at a tiny
// size (fixed-size structures dominate) and at realistic layer shapes (the 125m preset's GQA
// layer, the 150m preset's MLA layer), with each policy's defaults and its compressing settings
// from the conformance suite. Geodesia's tighter check (the prompt is held twice, so its bound is
// not slack) is kv/geodesia/policy_test.cc PeakResidentWithinDeclaredFactor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/status_testing.h"
#include "kv/cache.h"
#include "kv/registry.h"
#include "kv/registry_testing.h"

namespace strata {
namespace {

LayerGeometry Gqa(int q, int kv, int d) {
  LayerGeometry g;
  g.kind = AttnKind::kGqa;
  g.n_q_heads = q;
  g.n_kv_heads = kv;
  g.k_dim = d;
  g.v_dim = d;
  g.rope = true;
  g.scale = 1.f / std::sqrt(static_cast<float>(d));
  return g;
}

LayerGeometry Mla(int q, int d_c, int d_r) {
  LayerGeometry g;
  g.kind = AttnKind::kMla;
  g.n_q_heads = q;
  g.n_kv_heads = 1;
  g.k_dim = d_c + d_r;
  g.v_dim = d_c;
  g.rope_dim = d_r;
  g.rope = false;
  g.scale = 1.f / std::sqrt(static_cast<float>(d_c + d_r));
  return g;
}

// Settings per policy beside its defaults: the conformance suite's compressing ones (small
// blocks, so that blocks close at the tiny size), and VestigeKV with its file archive.
std::vector<std::map<std::string, std::string>> Configs(const std::string& name,
                                                        const std::string& dir) {
  std::vector<std::map<std::string, std::string>> c = {{}};
  if (name == "vestige" || name == "fullrow") {
    c.push_back({{"ratio", "4"}, {"block", "64"}, {"kappa", "2"}});
    c.push_back({{"ratio", "8"}, {"block", "256"}, {"kappa", "4"}, {"archive", "file:" + dir}});
  } else if (name == "geodesia") {
    c.push_back({{"bits", "3"}});
    c.push_back({{"bits", "2"}, {"mass", "exact"}});
  } else if (name == "cquest") {
    c.push_back({{"bits", "2"}, {"quest-keep", "0.25"}});
  } else if (name == "q8_0" || name == "q4_0") {
    c.push_back({{"rotate", "0"}});
  } else if (name == "turboquant") {
    c.push_back({{"preset", "k8v4"}, {"recent", "16"}});
  } else if (name != "full" && name != "kivi2" && name != "kivi4" && name != "coldfp4") {
    c.push_back({{"ratio", "4"}});
  }
  return c;
}

struct Measured {
  int64_t worst_over = 0;    // the largest ResidentBytes - PeakResidentBytes(rows) seen (<= 0)
  double peak_vs_full = 0;   // max ResidentBytes / FullResidentBytes
  double peak_vs_bound = 0;  // max ResidentBytes / PeakResidentBytes(rows)
  double bound_vs_full = 0;  // PeakResidentBytes(n) / FullResidentBytes at the end of the prompt
};

// A prefill of n rows in calls of `chunk` (every prompt query observed and read), the
// compression point, then `decode` steps; the bound is checked after every append and call.
StatusOr<Measured> RunPeakSequence(KvCache* c, int64_t n, int64_t chunk, int decode, uint64_t seed,
                                   ThreadPool* pool) {
  const LayerGeometry& g = c->geometry(0);
  Rng rng(seed);
  std::vector<float> k(static_cast<size_t>(g.n_kv_heads) * g.k_dim);
  std::vector<float> v(static_cast<size_t>(g.n_kv_heads) * g.v_dim);
  std::vector<float> q(static_cast<size_t>(g.n_q_heads) * g.k_dim);
  std::vector<float> out(static_cast<size_t>(g.n_q_heads) * g.v_dim);
  Measured m;
  m.worst_over = INT64_MIN;
  auto check = [&] {
    const int64_t r = c->ResidentBytes(), bound = c->PeakResidentBytes(c->n_tokens());
    m.worst_over = std::max(m.worst_over, r - bound);
    m.peak_vs_full = std::max(m.peak_vs_full,
                              static_cast<double>(r) / static_cast<double>(c->FullResidentBytes()));
    m.peak_vs_bound = std::max(m.peak_vs_bound, static_cast<double>(r) / bound);
  };
  auto call = [&](int64_t rows, CallKind kind) -> Status {
    const int64_t p0 = c->n_tokens();
    RETURN_IF_ERROR(c->BeginCall(rows, kind));
    for (int64_t i = 0; i < rows; ++i) {
      for (auto& x : k) x = static_cast<float>(rng.Normal());
      for (auto& x : v) x = static_cast<float>(rng.Normal());
      RETURN_IF_ERROR(c->Append(0, k.data(), v.data()));
      check();
    }
    for (int64_t i = 0; i < rows; ++i) {
      for (auto& x : q) x = static_cast<float>(rng.Normal());
      if (kind == CallKind::kPrefill) RETURN_IF_ERROR(c->ObserveQuery(0, p0 + i, q.data()));
      RETURN_IF_ERROR(c->Attend(0, q.data(), p0 + i, pool, out.data()));
    }
    RETURN_IF_ERROR(c->EndCall());
    check();
    return OkStatus();
  };
  c->BeginPrefill(0, n);
  for (int64_t b = 0; b < n; b += chunk) {
    RETURN_IF_ERROR(call(std::min(chunk, n - b), CallKind::kPrefill));
  }
  m.bound_vs_full =
      static_cast<double>(c->PeakResidentBytes(n)) / static_cast<double>(c->FullResidentBytes());
  RETURN_IF_ERROR(c->EndPrefill(pool));
  check();
  for (int s = 0; s < decode; ++s) RETURN_IF_ERROR(call(1, CallKind::kDecode));
  return m;
}

class PeakResident : public ::testing::TestWithParam<std::string> {};

TEST_P(PeakResident, WithinDeclared) {
  const std::string name = GetParam();
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(name + ", seed " + std::to_string(seed));
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("strata_peak_" + name + "_" + std::to_string(getpid())))
                              .string();
  std::filesystem::create_directories(dir);
  ThreadPool pool(2);
  struct Size {
    const char* label;
    LayerGeometry g;
    int64_t n, chunk;
  };
  const std::vector<Size> sizes = {
      {"tiny gqa", Gqa(4, 2, 64), 300, 64},
      {"tiny mla", Mla(4, 64, 8), 300, 64},
      {"tiny gqa, one call", Gqa(4, 2, 64), 300, 300},
      {"125m gqa", Gqa(12, 4, 64), 2048, 512},
      {"125m gqa, one call", Gqa(12, 4, 64), 1100, 1100},
      {"150m mla", Mla(16, 512, 64), 1100, 256},
  };
  int bound = 0;
  for (const auto& set : Configs(name, dir)) {
    std::string label = name;
    for (const auto& [key, value] : set) label += ":" + key + "=" + value;
    for (const Size& z : sizes) {
      SCOPED_TRACE(label + ", " + z.label);
      auto p = MakePolicy(PolicySpec{name, set});
      ASSERT_OK(p);
      auto c = KvCache::Create({z.g}, std::move(p).value());
      if (!c.ok()) continue;  // a policy for the other layer kind (the conformance suite checks it)
      ++bound;
      auto m = RunPeakSequence(c->get(), z.n, z.chunk, 40, seed, &pool);
      ASSERT_OK(m);
      EXPECT_LE(m->worst_over, 0) << "resident bytes exceeded the declared peak by "
                                  << m->worst_over << " bytes";
      std::printf("[peak] %-40s %-20s measured %.3fx full, %.3f of the bound; bound %.3fx full\n",
                  label.c_str(), z.label, m->peak_vs_full, m->peak_vs_bound, m->bound_vs_full);
    }
  }
  EXPECT_GT(bound, 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, PeakResident,
                         ::testing::ValuesIn(strata::policy_testing::RegisteredPolicyNames()),
                         strata::policy_testing::PolicyParamName);

}  // namespace
}  // namespace strata
