// `strata bench serve`: the load generator through the command line (an in-process server on a
// tiny model), its flag errors, and the capacity mode's figures against the caches' accounting.
#include "cli/bench_serve.h"

#include <gtest/gtest.h>

#include <cmath>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/cli_testing.h"
#include "cli/common.h"
#include "core/status_testing.h"
#include "kv/store.h"
#include "model/model.h"
#include "serve/scheduler.h"

namespace strata::cli {
namespace {

bool Has(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

class BenchServeTest : public TinyModelSuite<BenchServeTest> {
 public:
  static constexpr const char* kDirPrefix = "strata_bench_serve_";
};

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f, nullptr, false);
}

TEST_F(BenchServeTest, LoadLevelsAgainstAnInProcessServer) {
  const std::string json = Path("load.json");
  const CliResult r = Strata({"bench", "serve", "-m", Path("tiny.gguf"), "--streams", "1,3",
                              "--ctx", "24,40", "--max-tokens", "16", "--threads", "1",
                              "--requests-per-stream", "2", "--prefill-chunk", "8,128",
                              "--json", json});
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_TRUE(Has(r.out, "TTFT p50/p90/p99 ms")) << r.out;
  EXPECT_TRUE(Has(r.err, "[prefill chunk 8, ctx 40, 3 streams] 6 requests of 24 prompt + 16 "
                         "tokens"))
      << r.err;
  const nlohmann::json j = ReadJson(json);
  ASSERT_EQ(j["mode"], "load");
  ASSERT_EQ(j["levels"].size(), 8u);  // every level once per --prefill-chunk value
  for (size_t i = 0; i < j["levels"].size(); ++i) {
    EXPECT_EQ(j["levels"][i]["prefill_chunk"].get<int64_t>(), i < 4 ? 8 : 128);
  }
  for (const auto& l : j["levels"]) {
    const int64_t k = l["streams"], ctx = l["ctx"];
    EXPECT_EQ(l["requests"].get<int64_t>(), 2 * k);
    EXPECT_EQ(l["ok"].get<int64_t>(), 2 * k);
    EXPECT_EQ(l["completion_tokens"].get<int64_t>(), 2 * k * 16);
    EXPECT_EQ(l["streamed_tokens"].get<int64_t>(), 2 * k * 16);
    EXPECT_EQ(l["prompt_tokens"].get<int64_t>(), 2 * k * (ctx - 16));
    for (const char* p : {"ttft_seconds", "itl_seconds"}) {
      EXPECT_LE(l[p]["p50"].get<double>(), l[p]["p90"].get<double>());
      EXPECT_LE(l[p]["p90"].get<double>(), l[p]["p99"].get<double>());
      EXPECT_LE(l[p]["p99"].get<double>(), l[p]["max"].get<double>());
    }
    EXPECT_EQ(l["ttft_seconds"]["n"].get<int64_t>(), 2 * k);
    // One stream always has a decode rate: the client's window, or the server's timings when
    // the tiny model's chunks reached the client in one read.
    if (k == 1) {
      EXPECT_GT(l["decode_tok_s"].get<double>(), 0) << l.dump();
      EXPECT_NE(l["decode_source"], "none") << l.dump();
      EXPECT_EQ(l["server_decode_tokens"].get<int64_t>(), 2 * 15);
    }
  }
}

TEST_F(BenchServeTest, BadFlagsAreClearErrors) {
  const std::string m = Path("tiny.gguf");
  const std::pair<std::vector<std::string>, const char*> cases[] = {
      {{"bench", "serve"}, "give either -m MODEL"},
      {{"bench", "serve", "-m", m, "--url", "http://127.0.0.1:1"}, "give either -m MODEL"},
      {{"bench", "serve", "--url", "http://192.168.1.5:8080"},
       "host '192.168.1.5' is not a loopback address"},
      {{"bench", "serve", "--url", "http://127.0.0.1:8080/v1"}, "a path is not allowed"},
      {{"bench", "serve", "--url", "http://127.0.0.1:8080", "--prefill-chunk", "64"},
       "--prefill-chunk configures the in-process server"},
      {{"bench", "serve", "-m", m, "--prefill-chunk", "0"},
       "--prefill-chunk values must be in [1, 1048576], got 0"},
      {{"bench", "serve", "--url", "http://127.0.0.1:8080", "--parallel", "4"},
       "configure the in-process server"},
      {{"bench", "serve", "-m", m, "--streams", "0"}, "--streams values must be in [1, 1024]"},
      {{"bench", "serve", "-m", m, "--streams", "1,x"}, "--streams"},
      {{"bench", "serve", "-m", m, "--ctx", "10", "--max-tokens", "16"}, "--ctx 10 leaves no prompt"},
      {{"bench", "serve", "-m", m, "--max-tokens", "0"}, "--max-tokens must be >= 1"},
      {{"bench", "serve", "-m", m, "--duration", "0"}, "--duration must be > 0"},
      {{"bench", "serve", "-m", m, "--requests-per-stream", "0"}, "--requests-per-stream"},
      {{"bench", "serve", "-m", m, "--policy", "full,kivi4"}, "takes one policy"},
      {{"bench", "serve", "-m", m, "--kv-budget", "lots"}, "--kv-budget"},
      {{"bench", "serve", "-m", m, "--geometry", "125m"}, "--geometry is for --capacity"},
      {{"bench", "serve", "-m", Path("missing.gguf")}, "cannot load model"},
      {{"bench", "serve", "--capacity", "--url", "http://127.0.0.1:1"}, "--url does not apply"},
      {{"bench", "serve", "--capacity", "--geometry", "nosuch"}, "unknown geometry 'nosuch'"},
      {{"bench", "serve", "--capacity", "--policy", "nosuch"}, "--policy nosuch"},
      {{"bench", "serve", "--capacity", "--ctx", "1"}, "--ctx values must be in [2"},
      {{"bench", "serve", "--capacity", "--samples", "0"}, "--samples must be in [1, 64]"},
      {{"bench", "serve", "--capacity", "--kv-budget", "0"}, "--kv-budget '0' must be at least 1 byte"},
      {{"bench", "serve", "--capacity", "-m", m, "--geometry", "tiny"}, "not both"},
      {{"bench", "serve", "--strems", "4"}, "did you mean --streams"},
  };
  for (const auto& [args, says] : cases) {
    const CliResult r = Strata(args);
    EXPECT_NE(r.code, 0) << args.back();
    EXPECT_TRUE(Has(r.err, says)) << args.back() << " -> " << r.err;
  }
}

TEST_F(BenchServeTest, RefusedRequestsFailTheRun) {
  const CliResult r = Strata({"bench", "serve", "-m", Path("tiny.gguf"), "--streams", "2",
                              "--ctx", "24", "--max-tokens", "8", "--threads", "1", "--policy",
                              "vestige"});  // an MLA policy on a GQA model: every request a 400
  EXPECT_EQ(r.code, kExitUsage) << r.out;  // the in-process server refuses it as its default
  EXPECT_TRUE(Has(r.err, "--policy vestige")) << r.err;
}

// The tiny geometry's full cache, computed from its shape alone: every layer holds ceil(ctx / 64)
// pages of 64 rows of K and V for each KV head, in bf16.
int64_t TinyFullBytes(int64_t ctx) {
  const auto layers = NamedCacheGeometry("tiny");
  int64_t b = 0;
  for (const LayerGeometry& g : *layers) {
    const int64_t pages = (ctx + LayerStore::kPageRows - 1) / LayerStore::kPageRows;
    b += pages * LayerStore::kPageRows * g.n_kv_heads * (g.k_dim + g.v_dim) * 2;
  }
  return b;
}

TEST_F(BenchServeTest, NamedGeometriesAreTheModelsCaches) {
  auto tiny = NamedCacheGeometry("tiny");
  ASSERT_OK(tiny);
  auto m = Model::Load(Path("tiny.gguf"));
  ASSERT_OK(m);
  const auto real = (*m)->CacheLayers();
  ASSERT_EQ(tiny->size(), real.size());
  for (size_t l = 0; l < real.size(); ++l) {
    EXPECT_EQ((*tiny)[l].kind, real[l].kind);
    EXPECT_EQ((*tiny)[l].n_q_heads, real[l].n_q_heads);
    EXPECT_EQ((*tiny)[l].n_kv_heads, real[l].n_kv_heads);
    EXPECT_EQ((*tiny)[l].k_dim, real[l].k_dim);
    EXPECT_EQ((*tiny)[l].v_dim, real[l].v_dim);
  }
  auto g125 = NamedCacheGeometry("125m");
  ASSERT_OK(g125);
  ASSERT_EQ(g125->size(), 12u);
  EXPECT_EQ((*g125)[0].n_kv_heads, 4);
  EXPECT_EQ((*g125)[0].k_dim, 64);
  auto g150 = NamedCacheGeometry("150m");
  ASSERT_OK(g150);
  EXPECT_EQ((*g150)[0].kind, AttnKind::kMla);
  EXPECT_EQ((*g150)[0].k_dim, 512 + 64);
}

TEST_F(BenchServeTest, CapacityFiguresAreTheCachesAccounting) {
  const std::string json = Path("cap.json");
  const int64_t ctx = 1000, budget = 1 << 20;
  const CliResult r =
      Strata({"bench", "serve", "--capacity", "--geometry", "tiny", "--ctx", std::to_string(ctx),
              "--kv-budget", "1MiB", "--policy", "full,kivi4,kivi2,geodesia:bits=2,vestige",
              "--samples", "2", "--threads", "1", "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(Has(r.out, "not run: vestige on tiny")) << r.out;  // an MLA policy, a GQA cache
  EXPECT_TRUE(Has(r.out, "geodesia:bits=2 fits")) << r.out;
  const nlohmann::json j = ReadJson(json);
  ASSERT_EQ(j["rows"].size(), 4u);
  std::map<std::string, nlohmann::json> by;
  for (const auto& row : j["rows"]) by[row["policy"]] = row;
  // full: its per-sequence bytes computed independently, and its capacity the budget's floor.
  const int64_t full = TinyFullBytes(ctx);
  EXPECT_EQ(by["full"]["resident_bytes_per_seq"].get<int64_t>(), full);
  EXPECT_EQ(by["full"]["fit"].get<int64_t>(), budget / full);
  // bf16 rows, rounded up to whole 64-row pages: 16 x 1024 / 1000 bits per value.
  EXPECT_NEAR(by["full"]["bits_per_value"].get<double>(), 16.0 * 1024 / 1000, 1e-9);
  for (const auto& [name, row] : by) {
    const int64_t b = row["resident_bytes_per_seq"];
    EXPECT_EQ(row["fit"].get<int64_t>(), budget / b) << name;
    // The scheduler's rule: N - 1 resident sequences and one prompt's full-rate reserve.
    const int64_t reserve = row["prompt_reserve_bytes"];
    const int64_t n = row["admitted"];
    EXPECT_LE((n - 1) * b + reserve, budget) << name;
    EXPECT_GT(n * b + reserve, budget) << name;
    EXPECT_DOUBLE_EQ(row["fit_ratio_to_full"].get<double>(),
                     static_cast<double>(row["fit"].get<int64_t>()) / (budget / full))
        << name;
  }
  // Compression makes sequences smaller: kivi2 < kivi4 < full, geodesia 2-bit < full / 2 (at
  // this short context its exact window and sink blocks are a large part of the cache).
  EXPECT_LT(by["kivi2"]["resident_bytes_per_seq"].get<int64_t>(),
            by["kivi4"]["resident_bytes_per_seq"].get<int64_t>());
  EXPECT_LT(by["kivi4"]["resident_bytes_per_seq"].get<int64_t>(), full);
  EXPECT_LT(by["geodesia:bits=2"]["resident_bytes_per_seq"].get<int64_t>(), full / 2);
}

// The capacity is a count of real caches: `fit` sequences filled side by side hold at most the
// budget by their own ResidentBytes, and for the policies whose size does not depend on the rows
// one more does not fit.
TEST_F(BenchServeTest, FitSequencesReallyFitTheBudget) {
  auto layers = NamedCacheGeometry("tiny");
  ASSERT_OK(layers);
  ThreadPool pool(1);
  const int64_t ctx = 700, budget = 256 << 10;
  for (const std::string policy : {"full", "kivi4", "geodesia:bits=2"}) {
    SCOPED_TRACE(policy);
    auto first = FillSequence(*layers, policy, ctx, 1, &pool, "/tmp");
    ASSERT_OK(first);
    ASSERT_EQ(first->cache->n_tokens(), ctx);
    const int64_t per = first->cache->ResidentBytes();
    const int64_t fit = FitCapacity(budget, per);
    ASSERT_GE(fit, 1);
    std::vector<FilledSequence> seqs;
    int64_t total = 0;
    for (int64_t i = 0; i <= fit; ++i) {
      auto f = FillSequence(*layers, policy, ctx, 100 + i, &pool, "/tmp");
      ASSERT_OK(f);
      total += f->cache->ResidentBytes();
      if (i + 1 == fit) {
        EXPECT_LE(total, budget + (policy == "geodesia:bits=2" ? per / 8 : 0));
      }
      seqs.push_back(std::move(f).value());
    }
    if (policy != "geodesia:bits=2") {
      EXPECT_EQ(total, (fit + 1) * per);  // the same bytes whatever the rows
      EXPECT_GT(total, budget);
    }
    // The scheduler's reserve is the policy's declared peak for the prompt's rows: at least the
    // full rate of the prompt's pages, 2x that for Geodesia (it holds the prompt twice until the
    // compression point), and at least the peak the fill measured.
    const int64_t page = LayerStore::kPageRows;
    const int64_t rows = (ctx - 1 + page - 1) / page * page;
    const int64_t full_pages = rows * first->cache->FullBytesPerToken();
    const int64_t reserve = serve::Scheduler::PromptReserve(*first->cache, ctx - 1);
    EXPECT_EQ(reserve, first->cache->PeakResidentBytes(ctx - 1));
    EXPECT_GE(reserve, policy.rfind("geodesia", 0) == 0 ? 2 * full_pages : full_pages);
    EXPECT_GE(reserve, first->peak_bytes);
  }
}

}  // namespace
}  // namespace strata::cli
