#include "cli/bench_capture.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli_testing.h"
#include "cli/common.h"
#include "kv/cache.h"
#include "kv/registry.h"

namespace strata::cli {
namespace {

std::string Shipped(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/models/" + name;
}

// The captured rows are the rows the model's own full cache holds after the same prefill and
// decode steps, the captured queries are one per decode step, and a capture is a function of
// its arguments (bit for bit).
TEST(BenchCaptureTest, RowsAndQueriesAreTheModelsOwn) {
  for (const char* name : {"gqa.gguf", "nope-mla.gguf"}) {
    SCOPED_TRACE(name);
    const bool mla = std::string(name) != "gqa.gguf";
    auto model = Model::Load(Shipped(name));
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    ThreadPool pool(1);
    std::ostringstream progress;
    const int64_t ctx = 200;
    const int steps = 5;
    auto c = CaptureLayer(**model, mla, -1, ctx, steps, 3, &pool, progress);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->layer, static_cast<int>((*model)->CacheLayers().size()) - 1);
    EXPECT_EQ(c->format, "kv-tokens");
    EXPECT_GE(c->needle_depth, 1);
    EXPECT_LT(c->needle_depth, ctx);
    ASSERT_EQ(static_cast<int64_t>(c->k.size()), (ctx + steps) * c->k_stride());
    ASSERT_EQ(c->q.size(), static_cast<size_t>(steps) * c->geometry.n_q_heads * c->geometry.k_dim);
    EXPECT_EQ(c->v.empty(), mla);
    auto again = CaptureLayer(**model, mla, -1, ctx, steps, 3, &pool, progress);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->k, c->k);
    EXPECT_EQ(again->v, c->v);
    EXPECT_EQ(again->q, c->q);
    // Another seed is another trial (another needle and filler).
    auto other = CaptureLayer(**model, mla, -1, ctx, steps, 4, &pool, progress);
    ASSERT_TRUE(other.ok());
    EXPECT_NE(other->k, c->k);
    // Appended to a fresh full cache and read with the captured queries, the rows give finite
    // attention that differs between steps (real queries, not a constant).
    auto policy = MakePolicy(PolicySpec{"full"});
    ASSERT_TRUE(policy.ok());
    LayerGeometry g = c->geometry;
    g.model_layer = -1;
    auto cache = KvCache::Create({g}, std::move(*policy));
    ASSERT_TRUE(cache.ok()) << cache.status().ToString();
    ASSERT_TRUE((*cache)->BeginCall(ctx, CallKind::kPrefill).ok());
    for (int64_t t = 0; t < ctx; ++t) {
      ASSERT_TRUE((*cache)->Append(0, c->key_row(t), c->val_row(t)).ok());
    }
    ASSERT_TRUE((*cache)->EndCall().ok());
    std::vector<std::vector<float>> outs;
    for (int s = 0; s < steps; ++s) {
      ASSERT_TRUE((*cache)->BeginCall(1, CallKind::kDecode).ok());
      ASSERT_TRUE((*cache)->Append(0, c->key_row(ctx + s), c->val_row(ctx + s)).ok());
      std::vector<float> out(static_cast<size_t>(g.n_q_heads) * g.v_dim);
      ASSERT_TRUE((*cache)->Attend(0, c->query(s), ctx + s, &pool, out.data()).ok());
      ASSERT_TRUE((*cache)->EndCall().ok());
      for (float x : out) ASSERT_TRUE(std::isfinite(x));
      outs.push_back(out);
    }
    EXPECT_NE(outs[0], outs[steps - 1]);
  }
}

TEST(BenchCaptureTest, ErrorsNameTheProblem) {
  auto model = Model::Load(Shipped("gqa.gguf"));
  ASSERT_TRUE(model.ok());
  ThreadPool pool(1);
  std::ostringstream progress;
  auto no_mla = CaptureLayer(**model, /*mla=*/true, -1, 256, 2, 1, &pool, progress);
  ASSERT_FALSE(no_mla.ok());
  EXPECT_NE(no_mla.status().message().find("no global MLA attention layer"), std::string::npos)
      << no_mla.status().message();
  auto bad_layer = CaptureLayer(**model, false, 9, 256, 2, 1, &pool, progress);
  ASSERT_FALSE(bad_layer.ok());
  EXPECT_NE(bad_layer.status().message().find("--layer 9 is not one of the model's GQA cache "
                                              "layers (0, 1)"),
            std::string::npos)
      << bad_layer.status().message();
  auto short_ctx = CaptureLayer(**model, false, -1, 10, 2, 1, &pool, progress);
  ASSERT_FALSE(short_ctx.ok());
  EXPECT_NE(short_ctx.status().message().find("--ctx must be >= 64"), std::string::npos);
}

// `bench attention` reads a model's rows by default and says where its rows came from; the
// random rows stay available, labelled; options that do not fit the source are errors.
TEST(BenchCaptureTest, BenchAttentionSaysWhereItsRowsComeFrom) {
  const std::string json =
      (std::filesystem::temp_directory_path() / ("strata_bench_rows_" + std::to_string(getpid()) +
                                                 ".json"))
          .string();
  CliResult r = Strata({"bench", "attention", "--kind", "gqa", "-m", Shipped("gqa.gguf"),
                        "--ctx", "256", "--policy", "full,streaming", "--ratio", "4", "--steps",
                        "2", "--warmup", "1", "--threads", "1", "--attn-math", "f32", "--json",
                        json});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("rows: model rows: " + Shipped("gqa.gguf") + ", cache layer 1"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("GQA 4q/2kv heads"), std::string::npos) << r.out;
  {
    std::ifstream f(json);
    const nlohmann::json j = nlohmann::json::parse(f);
    EXPECT_NE(j.at("rows").get<std::string>().find("model rows"), std::string::npos);
    ASSERT_EQ(j.at("results").size(), 2u);
    EXPECT_TRUE(j["results"][0].at("recall_fallbacks").is_null());
  }
  std::filesystem::remove(json);
  CliResult rnd = Strata({"bench", "attention", "--kind", "gqa", "--rows", "random", "--ctx",
                          "128", "--q-heads", "4", "--kv-heads", "2", "--head-dim", "32",
                          "--policy", "full", "--steps", "1", "--threads", "1"});
  ASSERT_EQ(rnd.code, 0) << rnd.err;
  EXPECT_NE(rnd.out.find("rows: random rows and queries (seed 1): no attention structure, the "
                         "worst case for a certified recall"),
            std::string::npos)
      << rnd.out;
  const std::pair<std::vector<std::string>, std::string> bad[] = {
      {{"--rows", "file"}, "--rows must be model or random, got 'file'"},
      {{"--d-c", "64"}, "with --rows model the layer's geometry is the model's"},
      {{"--rows", "random", "-m", Shipped("gqa.gguf")}, "they need --rows model"},
      {{"-m", Shipped("gqa.gguf"), "--layer", "5"}, "--layer 5 is not one of the model's GQA"},
      {{"-m", "/nonexistent/model.gguf"}, "cannot load model '/nonexistent/model.gguf'"},
  };
  for (const auto& [extra, want] : bad) {
    std::vector<std::string> args = {"bench", "attention", "--kind", "gqa", "--ctx", "128"};
    args.insert(args.end(), extra.begin(), extra.end());
    CliResult e = Strata(args);
    EXPECT_EQ(e.code, kExitUsage) << want;
    EXPECT_NE(e.err.find(want), std::string::npos) << e.err;
  }
}

// On a trained model's own rows and queries the recall tier does its job: no step falls back to a
// dense read, every step's fetched rows fit its capacity, and the read is below full's.
TEST(BenchCaptureTest, RecallOnModelRowsNeedsNoFallback) {
  const std::string json =
      (std::filesystem::temp_directory_path() /
       ("strata_bench_recall_" + std::to_string(getpid()) + ".json"))
          .string();
  CliResult r = Strata({"bench", "attention", "--kind", "mla", "-m", Shipped("nope-mla.gguf"),
                        "--ctx", "2100", "--policy", "full,vestige:block=1024:kappa=4",
                        "--steps", "4", "--warmup", "1",
                        "--threads", "1", "--attn-math", "f32", "--json", json});
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream f(json);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::filesystem::remove(json);
  ASSERT_EQ(j.at("results").size(), 2u);
  const nlohmann::json& v = j["results"][1];
  EXPECT_EQ(v.at("recall_fallbacks"), 0) << v;
  EXPECT_GT(v.at("rows_fetched_per_step").get<double>(), 0) << v;  // the tier did recall
  EXPECT_LE(v.at("rows_fetched_per_step").get<double>(), 4096) << v;  // the default capacity
  EXPECT_LT(v.at("read_ratio_vs_full").get<double>(), 1.0) << v;
  EXPECT_EQ(v.at("compressed"), true) << v;
}

}  // namespace
}  // namespace strata::cli
