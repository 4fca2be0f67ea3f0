// `strata bench capacity --kind mla`: where a VestigeKV cache's bytes are, on a small fill.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/bench_capacity_mla.h"
#include "cli/cli_testing.h"
#include "core/dtype.h"

namespace strata::cli {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("strata_capacity_test_" + std::to_string(getpid()) + "_" + name))
      .string();
}

nlohmann::json RunCapacity(const std::string& policy, const std::string& extra_dir = "") {
  const std::string json = TempPath("cap.json");
  std::vector<std::string> args = {"bench",    "capacity", "--kind",    "mla",  "--tokens",
                                   "20480",    "--layers", "2",         "--threads", "1",
                                   "--policy", policy,     "--json",    json};
  if (!extra_dir.empty()) {
    args.push_back("--archive-dir");
    args.push_back(extra_dir);
  }
  const CliResult r = Strata(args);
  EXPECT_EQ(r.code, 0) << r.err;
  std::ifstream f(json);
  nlohmann::json j = nlohmann::json::parse(f);
  std::filesystem::remove(json);
  return j;
}

TEST(BenchCapacityMlaTest, FileArchiveHoldsTheTailTheKeptRowsAndTheIndex) {
  const int64_t row = 2 * (512 + 64);
  for (const std::string policy : {"vestige:recall=off", "vestige"}) {
    SCOPED_TRACE(policy);
    const nlohmann::json j = RunCapacity(policy);
    const int64_t T = j["tokens"];
    ASSERT_EQ(T, 20481);  // the fill and one decode step
    // The parts add up to the engine's resident bytes.
    const int64_t parts = j["store_bytes"].get<int64_t>() +
                          j["attended_tier_bytes"].get<int64_t>() +
                          j["index_bytes"].get<int64_t>() + j["metadata_bytes"].get<int64_t>() +
                          j["buffer_bytes"].get<int64_t>();
    EXPECT_EQ(j["resident_bytes"].get<int64_t>(), parts);
    // Every closed page left RAM: the store holds the unclosed tail's pages only (20,481 rows,
    // blocks of 4,096: 5 closed, 1 row of tail per layer).
    EXPECT_EQ(j["rows_tail"].get<int64_t>(), 2 * 1);
    EXPECT_EQ(j["store_bytes"].get<int64_t>(), 2 * 64 * row);
    // The kept rows (1/32 of the closed rows and the 4 sinks, which the top-m may include), once
    // each.
    EXPECT_GE(j["rows_kept"].get<int64_t>(), 2 * (20480 / 32));
    EXPECT_LE(j["rows_kept"].get<int64_t>(), 2 * (20480 / 32 + 4));
    // (in chunks of 256 rows: at most one chunk of slack per layer, kv/vestige/row_chunks.h).
    const int64_t slack = 2 * 256 * row;
    EXPECT_GE(j["attended_tier_bytes"].get<int64_t>(), j["rows_kept"].get<int64_t>() * (row + 8));
    EXPECT_LE(j["attended_tier_bytes"].get<int64_t>(),
              j["rows_kept"].get<int64_t>() * (row + 8) + slack);
    // The archive file holds every closed row.
    EXPECT_GE(j["archive_file_bytes"].get<int64_t>(), 2 * 20480 * row);
    // Resident is what the method needs, within 10% (the index's growth slack, the tier's
    // positions) and the tier's chunk slack.
    const double need = j["need_bytes"].get<double>();
    EXPECT_LE(j["resident_bytes"].get<double>(), 1.10 * need + slack);
    EXPECT_GE(j["resident_bytes"].get<double>(), need);
    EXPECT_LT(j["resident_bytes"].get<double>(), 0.35 * j["full_bytes"].get<double>());
  }
  const nlohmann::json full = RunCapacity("full");
  EXPECT_EQ(full["resident_bytes"].get<int64_t>(), full["store_bytes"].get<int64_t>());
  EXPECT_GE(full["resident_bytes"].get<int64_t>(), full["full_bytes"].get<int64_t>());
}

TEST(BenchCapacityMlaTest, RowsArePureFunctionsOfTheirPosition) {
  const LayerGeometry g = MlaGeometry(4, 64, 16);
  const MlaRowSource a(7, g), b(7, g);
  std::vector<float> x(g.k_dim), y(g.k_dim);
  for (int64_t pos : {0, 1, 4095, 123456789}) {
    a.Row(1, pos, x.data());
    b.Row(1, pos, y.data());
    EXPECT_EQ(x, y);
    b.Row(0, pos, y.data());
    EXPECT_NE(x, y);  // layers differ
  }
}

TEST(BenchCapacityMlaTest, ThreadsAreCappedAtTheHardwareThreads) {
  const CliResult r = Strata({"bench", "capacity", "--kind", "mla", "--tokens", "64", "--layers",
                              "1", "--threads", "10000"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: --threads 10000 is more than the"), std::string::npos) << r.err;
  const CliResult a = Strata({"bench", "attention", "--kind", "mla", "--ctx", "64", "--policy",
                              "full", "--threads", "10000"});
  EXPECT_EQ(a.code, 0) << a.err;
  EXPECT_NE(a.err.find("warning: --threads 10000 is more than the"), std::string::npos) << a.err;
  EXPECT_EQ(Strata({"bench", "capacity", "--kind", "mla", "--threads", "-1"}).code, 2);
}

TEST(BenchCapacityMlaTest, BadOptionsAreErrors) {
  CliResult r = Strata({"bench", "capacity", "--kind", "mlaa"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--kind must be gqa or mla, got 'mlaa'"), std::string::npos) << r.err;
  for (const char* kind : {"mla", "gqa"}) {
    r = Strata({"bench", "capacity", "--kind", kind, "--tokens", "99999999999999"});
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("--tokens must be in [1, 2147483648], got 99999999999999"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(Strata({"bench", "capacity", "--kind", kind, "--tokens", "0"}).code, 2);
  }
  r = Strata({"bench", "capacity", "--kind", "mla", "--every", "100"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--every must be a multiple of 64"), std::string::npos) << r.err;
  r = Strata({"bench", "capacity", "--kind", "mla", "--d-r", "3"});
  EXPECT_EQ(r.code, 2);
  r = Strata({"bench", "capacity", "--kind", "mla", "--policy", "geodesia", "--tokens", "64"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("geodesia"), std::string::npos) << r.err;
  r = Strata({"bench", "capacity", "--kind", "mla", "--archive-dir", "/nonexistent/dir",
              "--tokens", "64"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("/nonexistent/dir"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata::cli
