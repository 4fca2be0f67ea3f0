// The conformance suite: every registered policy (kv/registry.h) through the same checks of the
// cache/policy contract (kv/policy.h), on a GQA and an MLA layer. A new policy is covered by
// registering it; the suite fails until its kill switch (or the reason it has none) and its
// compressing settings are listed below.
//
//   binding       a policy either binds to a layer kind or refuses with an error naming itself;
//   causality     rows appended after position p (inside the same call, and in later calls)
//                 change no bit of any read at a position <= p, across chunked prefills, two
//                 compression points and decode steps;
//   accounting    no read attends a row twice or a row it cannot see; every read touches bytes;
//                 the policy's resident bytes include what the store still holds;
//   determinism   the same sequence twice gives the same bits;
//   kill switch   the policy's "off" setting reads like `full` (bit for bit, or within the stated
//                 tolerance where its exact form is another kernel);
//   errors        a normal run recovers from nothing; bad settings are errors naming the key;
//   fork          KvCache::Fork after a compression point: each fork answers its continuation
//                 bit for bit as a fresh replay of the whole sequence, and the original is not
//                 disturbed by its forks (every registered policy can be forked; vestige's
//                 archive=file placement is refused, with an error naming it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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

LayerGeometry Gqa() {
  LayerGeometry g;
  g.kind = AttnKind::kGqa;
  g.n_q_heads = 4;
  g.n_kv_heads = 2;
  g.k_dim = 64;
  g.v_dim = 64;
  g.rope = true;
  g.scale = 0.125f;
  return g;
}

LayerGeometry Mla() {
  LayerGeometry g;
  g.kind = AttnKind::kMla;
  g.n_q_heads = 4;
  g.n_kv_heads = 1;
  g.k_dim = 72;
  g.v_dim = 64;
  g.rope_dim = 8;
  g.rope = false;
  g.scale = 0.11f;
  return g;
}

// Settings under which each policy compresses a 330-row sequence, and its kill switch.
struct Entry {
  std::map<std::string, std::string> active;
  // The settings that turn compression off; empty `off_why` means none exists, and why.
  std::map<std::string, std::string> off;
  std::string no_off_why;
  double off_tol = 0;  // 0: bit for bit; else max |diff| / max |full|
};

const std::map<std::string, Entry>& Table() {
  static const std::map<std::string, Entry> t = {
      {"full", {{}, {}, "", 0}},
      {"vestige",
       {{{"ratio", "4"}, {"block", "64"}, {"kappa", "2"}},
        {{"ratio", "1"}, {"block", "64"}, {"kappa", "2"}}, "", 0}},
      {"fullrow",
       {{{"ratio", "4"}, {"block", "64"}, {"kappa", "2"}},
        {{"ratio", "1"}, {"block", "64"}, {"kappa", "2"}}, "", 0}},
      // Geodesia at 16 bits reads every block exactly through the packed kernel (another
      // summation order than AttendStream): f32 rounding, 2e-5 of the output scale.
      {"geodesia", {{{"bits", "3"}}, {{"bits", "16"}}, "", 2e-5}},
      {"cquest", {{}, {{"quest-keep", "1"}}, "", 2e-5}},
      {"streaming",
       {{{"ratio", "4"}}, {}, "a sliding window: past sinks + m rows, the oldest row falls out "
        "with every new one, at any ratio", 0}},
      {"h2o", {{{"ratio", "4"}}, {{"ratio", "1"}}, "", 0}},
      {"h2o-recent", {{{"ratio", "4"}}, {{"ratio", "1"}}, "", 0}},
      {"snapkv", {{{"ratio", "4"}}, {{"ratio", "1"}}, "", 0}},
      {"quest", {{{"ratio", "4"}}, {{"ratio", "1"}}, "", 0}},
      {"random", {{{"ratio", "4"}}, {{"ratio", "1"}}, "", 0}},
      {"kivi2", {{}, {}, "the rate is set by its bits: every complete group is quantized", 0}},
      {"kivi4", {{}, {}, "the rate is set by its bits: every complete group is quantized", 0}},
      {"q8_0", {{}, {}, "llama.cpp's cache: every row is quantized at any setting", 0}},
      {"q4_0", {{}, {}, "llama.cpp's cache: every row is quantized at any setting", 0}},
      {"turboquant",
       {{}, {}, "every row before the running prefill chunk is coded at any setting", 0}},
      {"coldfp4", {{}, {}, "every full page but the first is demoted to FP4 at any setting", 0}},
  };
  return t;
}

// Deterministic rows: row u of a layer, +bump on every value.
void RowAt(const LayerGeometry& g, uint64_t seed, int64_t u, float bump, std::vector<float>* k,
           std::vector<float>* v) {
  Rng rng(seed * 1000003u + static_cast<uint64_t>(u));
  k->resize(static_cast<size_t>(g.n_kv_heads) * g.k_dim);
  v->resize(static_cast<size_t>(g.n_kv_heads) * g.v_dim);
  for (auto& x : *k) x = static_cast<float>(rng.Normal()) + bump;
  for (auto& x : *v) x = static_cast<float>(rng.Normal()) + bump;
}

struct Read {
  int64_t pos = 0;
  std::vector<float> out;
  ReadStats stats;
};

// Drives a cache as Model::ForwardChunk does: every call appends its rows (row u is
// RowAt(row_seed, u), +10 after `perturb_after`), then observes (prefill) and reads every query
// (queries from one stream seeded by q_seed) in position order; every read is recorded.
class Driver {
 public:
  Driver(KvCache* c, uint64_t row_seed, uint64_t q_seed, int64_t perturb_after = -1)
      : c_(c), row_seed_(row_seed), perturb_after_(perturb_after), qrng_(q_seed) {}

  Status Call(int64_t n, CallKind kind) {
    const LayerGeometry& g = c_->geometry(0);
    q_.resize(static_cast<size_t>(g.n_q_heads) * g.k_dim);
    const int64_t p0 = c_->n_tokens();
    RETURN_IF_ERROR(c_->BeginCall(n, kind));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t u = p0 + i;
      RowAt(g, row_seed_, u, perturb_after_ >= 0 && u > perturb_after_ ? 10.f : 0.f, &k_, &v_);
      RETURN_IF_ERROR(c_->Append(0, k_.data(), v_.data()));
    }
    for (int64_t i = 0; i < n; ++i) {
      for (auto& x : q_) x = static_cast<float>(qrng_.Normal());
      Read r;
      r.pos = p0 + i;
      r.out.resize(static_cast<size_t>(g.n_q_heads) * g.v_dim);
      if (kind == CallKind::kPrefill) RETURN_IF_ERROR(c_->ObserveQuery(0, r.pos, q_.data()));
      const int64_t before_rows = c_->counters().rows_attended_total;
      const int64_t before_bytes = c_->counters().bytes_read_total;
      RETURN_IF_ERROR(c_->Attend(0, q_.data(), r.pos, nullptr, r.out.data()));
      r.stats.rows_attended = c_->counters().rows_attended_total - before_rows;
      r.stats.bytes_read = c_->counters().bytes_read_total - before_bytes;
      reads.push_back(std::move(r));
    }
    return c_->EndCall();
  }
  // A prefill of n rows in calls of `chunk`, then its compression point.
  Status Prefill(int64_t n, int64_t chunk) {
    c_->BeginPrefill(c_->n_tokens(), c_->n_tokens() + n);
    for (int64_t b = 0; b < n; b += chunk) {
      RETURN_IF_ERROR(Call(std::min(chunk, n - b), CallKind::kPrefill));
    }
    return c_->EndPrefill(nullptr);
  }
  Status Decode(int steps) {
    for (int step = 0; step < steps; ++step) RETURN_IF_ERROR(Call(1, CallKind::kDecode));
    return OkStatus();
  }

  std::vector<Read> reads;

 private:
  KvCache* c_;
  uint64_t row_seed_;
  int64_t perturb_after_;
  Rng qrng_;
  std::vector<float> k_, v_, q_;
};

// The sequence every check runs: a prefill of [0, 200) in chunks of 64, the compression point, a
// second prefill of [200, 330) in chunks of 50, the compression point, then 12 decode steps; every
// prompt query is observed and read, in the order Model::ForwardChunk uses. Rows after
// `perturb_after` get +10. Returns every read, or the first error.
StatusOr<std::vector<Read>> RunSequence(KvCache* c, uint64_t seed, int64_t perturb_after = -1) {
  Driver d(c, seed, seed ^ 0x5eed, perturb_after);
  RETURN_IF_ERROR(d.Prefill(200, 64));
  RETURN_IF_ERROR(d.Prefill(130, 50));
  RETURN_IF_ERROR(d.Decode(12));
  return std::move(d.reads);
}

StatusOr<std::unique_ptr<KvCache>> Make(const LayerGeometry& g, const std::string& name,
                                        const std::map<std::string, std::string>& settings) {
  ASSIGN_OR_RETURN(auto p, MakePolicy(PolicySpec{name, settings}));
  return KvCache::Create({g}, std::move(p));
}

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST(ConformanceTable, ListsEveryRegisteredPolicy) {
  std::vector<std::string> registered;
  for (const PolicyInfo& p : Policies()) {
    registered.push_back(p.name);
    EXPECT_TRUE(Table().count(p.name))
        << "policy '" << p.name << "' is registered but kv/conformance_test.cc does not list "
        << "its compressing settings and kill switch";
  }
  for (const auto& [name, e] : Table()) {
    EXPECT_NE(std::find(registered.begin(), registered.end(), name), registered.end())
        << name << " is listed but not registered";
    EXPECT_TRUE(!e.off.empty() || !e.no_off_why.empty() || name == "full") << name;
  }
}

TEST_P(Conformance, ContractHolds) {
  const std::string name = GetParam();
  const Entry& e = Table().at(name);
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(name + ", seed " + std::to_string(seed));
  int bound = 0;
  for (const LayerGeometry& g : {Gqa(), Mla()}) {
    const std::string kind = g.kind == AttnKind::kMla ? "mla" : "gqa";
    SCOPED_TRACE(kind);
    auto a = Make(g, name, e.active);
    if (!a.ok()) {
      // Binding: a refusal is an InvalidArgument that names the policy.
      EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument) << a.status().ToString();
      EXPECT_NE(a.status().message().find("policy '" + name + "'"), std::string::npos)
          << a.status().ToString();
      continue;
    }
    ++bound;
    auto reads = RunSequence(a->get(), seed);
    ASSERT_OK(reads);
    // Accounting.
    for (const Read& r : *reads) {
      ASSERT_GT(r.stats.bytes_read, 0) << "pos " << r.pos;
      ASSERT_LE(r.stats.rows_attended, (r.pos + 1) * g.n_kv_heads) << "pos " << r.pos;
      for (float x : r.out) ASSERT_TRUE(std::isfinite(x)) << "pos " << r.pos;
    }
    EXPECT_GE((*a)->ResidentBytes(), (*a)->store(0).resident_bytes());
    EXPECT_OK((*a)->policy().recovered_error());
    // Determinism.
    auto again = Make(g, name, e.active);
    ASSERT_OK(again);
    auto reads2 = RunSequence(again->get(), seed);
    ASSERT_OK(reads2);
    ASSERT_EQ(reads->size(), reads2->size());
    for (size_t i = 0; i < reads->size(); ++i) {
      ASSERT_EQ((*reads)[i].out, (*reads2)[i].out) << "read " << i;
    }
    // Causality: inside the first prefill, inside the second, and in the decode steps.
    for (int64_t p : {int64_t{150}, int64_t{230}, int64_t{333}}) {
      auto b = Make(g, name, e.active);
      ASSERT_OK(b);
      auto perturbed = RunSequence(b->get(), seed, p);
      ASSERT_OK(perturbed);
      for (size_t i = 0; i < reads->size(); ++i) {
        if ((*reads)[i].pos > p) continue;
        ASSERT_EQ((*reads)[i].out, (*perturbed)[i].out)
            << "a row after " << p << " changed the read at " << (*reads)[i].pos;
      }
    }
    // Kill switch.
    if (e.off.empty() && name != "full") continue;
    auto full = Make(g, "full", {});
    auto off = Make(g, name, e.off);
    ASSERT_OK(full);
    ASSERT_OK(off);
    auto rf = RunSequence(full->get(), seed);
    auto ro = RunSequence(off->get(), seed);
    ASSERT_OK(rf);
    ASSERT_OK(ro);
    for (size_t i = 0; i < rf->size(); ++i) {
      const std::vector<float>& x = (*rf)[i].out;
      const std::vector<float>& y = (*ro)[i].out;
      if (e.off_tol == 0) {
        ASSERT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float)))
            << "read at " << (*rf)[i].pos << " differs from full";
      } else {
        float mx = 0;
        for (float v : x) mx = std::max(mx, std::abs(v));
        for (size_t j = 0; j < x.size(); ++j) {
          ASSERT_NEAR(x[j], y[j], e.off_tol * mx) << "read at " << (*rf)[i].pos;
        }
      }
    }
  }
  EXPECT_GT(bound, 0) << name << " binds to neither a GQA nor an MLA layer";
}

// The shared context of the fork checks: two prefills with their compression points (as
// RunSequence) and 3 decode steps.
Status RunContext(KvCache* c, uint64_t seed) {
  Driver d(c, seed, seed ^ 0x5eed);
  RETURN_IF_ERROR(d.Prefill(200, 64));
  RETURN_IF_ERROR(d.Prefill(130, 50));
  return d.Decode(3);
}

// One continuation after the context (a question: its own prefill and compression point, then
// decode steps), its rows and queries drawn from `which`. Returns its reads.
StatusOr<std::vector<Read>> RunContinuation(KvCache* c, uint64_t seed, uint64_t which) {
  Driver d(c, seed + 7919 * which, (seed ^ 0xf0f0) + which);
  RETURN_IF_ERROR(d.Prefill(70, 30));
  RETURN_IF_ERROR(d.Decode(9));
  return std::move(d.reads);
}

void ExpectSameReads(const std::vector<Read>& a, const std::vector<Read>& b,
                     const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].pos, b[i].pos) << what;
    ASSERT_EQ(a[i].out.size(), b[i].out.size()) << what;
    ASSERT_EQ(0, std::memcmp(a[i].out.data(), b[i].out.data(), a[i].out.size() * sizeof(float)))
        << what << ": read at " << a[i].pos << " differs";
    ASSERT_EQ(a[i].stats.rows_attended, b[i].stats.rows_attended) << what << " at " << a[i].pos;
    ASSERT_EQ(a[i].stats.bytes_read, b[i].stats.bytes_read) << what << " at " << a[i].pos;
  }
}

// KvCache::Fork after a compression point: each fork answers its continuation bit for bit as a
// fresh cache that replays the context and that continuation, and the original, continued after
// its forks have moved on, still answers as a fresh replay of its own sequence (no shared state).
TEST_P(Conformance, ForkAnswersAsTheOriginal) {
  const std::string name = GetParam();
  const Entry& e = Table().at(name);
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(name + ", seed " + std::to_string(seed));
  int bound = 0;
  for (const LayerGeometry& g : {Gqa(), Mla()}) {
    SCOPED_TRACE(g.kind == AttnKind::kMla ? "mla" : "gqa");
    auto a = Make(g, name, e.active);
    if (!a.ok()) continue;  // binding refusals: ContractHolds
    ++bound;
    ASSERT_OK(RunContext(a->get(), seed));
    auto f1 = (*a)->Fork();
    ASSERT_OK(f1);
    auto f2 = (*a)->Fork();
    ASSERT_OK(f2);
    EXPECT_EQ((*f1)->n_tokens(), (*a)->n_tokens());
    EXPECT_EQ((*f1)->ResidentBytes(), (*a)->ResidentBytes());
    EXPECT_EQ((*f1)->counters().bytes_read_total, (*a)->counters().bytes_read_total);
    // Two different continuations, one per fork, against fresh replays.
    std::vector<Read> fresh_reads[2];
    std::unique_ptr<KvCache> fresh[2];
    for (int w = 0; w < 2; ++w) {
      auto r = Make(g, name, e.active);
      ASSERT_OK(r);
      ASSERT_OK(RunContext(r->get(), seed));
      auto cont = RunContinuation(r->get(), seed, w + 1);
      ASSERT_OK(cont);
      fresh_reads[w] = std::move(*cont);
      fresh[w] = std::move(*r);
    }
    KvCache* forks[2] = {f1->get(), f2->get()};
    for (int w = 0; w < 2; ++w) {
      auto cont = RunContinuation(forks[w], seed, w + 1);
      ASSERT_OK(cont);
      ExpectSameReads(*cont, fresh_reads[w], "fork " + std::to_string(w + 1));
      EXPECT_EQ(forks[w]->ResidentBytes(), fresh[w]->ResidentBytes());
      EXPECT_EQ(forks[w]->counters().bytes_read_total, fresh[w]->counters().bytes_read_total);
      EXPECT_EQ(forks[w]->counters().calls, fresh[w]->counters().calls);
    }
    ASSERT_NE(0, std::memcmp(fresh_reads[0].back().out.data(), fresh_reads[1].back().out.data(),
                             fresh_reads[0].back().out.size() * sizeof(float)))
        << "the two continuations should differ";
    // Independence: the original, after both forks moved on, answers the second continuation as
    // its fresh replay (and then as a replay of the first would not).
    auto orig = RunContinuation(a->get(), seed, 2);
    ASSERT_OK(orig);
    ExpectSameReads(*orig, fresh_reads[1], "the original after its forks");
    // A fork of a fork, and Fork inside a call is refused.
    auto f3 = (*f1)->Fork();
    ASSERT_OK(f3);
    ASSERT_OK((*f3)->BeginCall(1, CallKind::kDecode));
    auto inside = (*f3)->Fork();
    EXPECT_FALSE(inside.ok());
  }
  EXPECT_GT(bound, 0);
}

// The one configuration that cannot be forked: vestige's archive file (append-only, one per
// cache) is refused with an error naming the policy and the setting.
TEST(ConformanceFork, VestigeFileArchiveRefusesToFork) {
  const std::string dir = ::testing::TempDir();
  auto c = Make(Mla(), "vestige",
                {{"ratio", "4"}, {"block", "64"}, {"kappa", "2"}, {"archive", "file:" + dir}});
  ASSERT_OK(c);
  ASSERT_OK(RunContext(c->get(), TestSeed()));
  auto f = (*c)->Fork();
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("policy 'vestige' cannot be forked"), std::string::npos)
      << f.status().ToString();
  EXPECT_NE(f.status().message().find("archive=file"), std::string::npos) << f.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, Conformance,
                         ::testing::ValuesIn(strata::policy_testing::RegisteredPolicyNames()),
                         strata::policy_testing::PolicyParamName);

}  // namespace
}  // namespace strata
