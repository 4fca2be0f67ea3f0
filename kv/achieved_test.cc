#include "kv/achieved.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/status_testing.h"
#include "kv/cache.h"
#include "kv/registry.h"

namespace strata {
namespace {

// Figures of a policy that changed something (compressed = true) against a full cache of 1000
// resident bytes and 1000 bytes read.
AchievedCompression Figures(int64_t resident, int64_t read) {
  AchievedCompression a;
  a.resident_bytes = resident;
  a.full_resident_bytes = 1000;
  a.bytes_read = read;
  a.full_bytes_read = 1000;
  a.reads = 4;
  a.policy = PolicySummary();  // compressed = true, not the reference
  a.policy.rows_visible = 100;
  return a;
}

TEST(CheckAchieved, ABudgetMissedByMoreThanTheMarginIsWarned) {
  AchievedCompression a = Figures(300, 300);
  a.policy.budget_bits = 2;
  a.policy.budget_values = 1000;
  a.policy.budget_bits_used = 4900;  // 4.9 bits per value
  CompressionCheck c = CheckAchieved("geodesia@2", a);
  EXPECT_TRUE(c.compressed);
  EXPECT_NE(c.warning.find("geodesia@2: its budget was 2 bits per value, it achieved 4.90 (more "
                           "than 0.5 off"),
            std::string::npos)
      << c.warning;
  // Within the margin, either way: nothing to say.
  a.policy.budget_bits_used = 2000 + 1000 * (kBudgetMarginBits - 0.01);
  EXPECT_EQ(CheckAchieved("geodesia@2", a).warning, "");
  a.policy.budget_bits_used = 2000 - 1000 * (kBudgetMarginBits - 0.01);
  EXPECT_EQ(CheckAchieved("geodesia@2", a).warning, "");
  // Under the budget by more than the margin is a miss too.
  a.policy.budget_bits_used = 1000;
  EXPECT_NE(CheckAchieved("geodesia@2", a).warning.find("it achieved 1.00"), std::string::npos);
  // 16 bits (every block exact, cquest's default) and no values yet: no budget to check.
  a.policy.budget_bits = 16;
  a.policy.budget_bits_used = 30000;
  EXPECT_EQ(CheckAchieved("cquest", a).warning, "");
  a.policy.budget_bits = 2;
  a.policy.budget_values = 0;
  EXPECT_EQ(CheckAchieved("geodesia@2", a).warning, "");
}

TEST(CheckAchieved, NormalCaseSaysNothing) {
  const CompressionCheck c = CheckAchieved("h2o@32", Figures(1000, 40));
  EXPECT_TRUE(c.compressed);
  EXPECT_EQ(c.warning, "");
  const CompressionCheck q = CheckAchieved("kivi2", Figures(300, 300));
  EXPECT_TRUE(q.compressed);
  EXPECT_EQ(q.warning, "");
}

TEST(CheckAchieved, CompressedNothingNamesTheReason) {
  AchievedCompression a = Figures(1000, 1000);
  a.policy.compressed = false;
  a.policy.note = "no block closed: 512 rows < block 4096";
  const CompressionCheck c = CheckAchieved("vestige:recall=off@32", a);
  EXPECT_FALSE(c.compressed);
  EXPECT_EQ(c.warning,
            "vestige:recall=off@32: compressed nothing on this run (no block closed: 512 rows < "
            "block 4096)");
  // A policy that says it compressed nothing is not "compressed" even if its bytes are lower
  // (e.g. it dropped a table): the label would still promise what did not happen.
  a.resident_bytes = 900;
  EXPECT_FALSE(CheckAchieved("x", a).compressed);
}

TEST(CheckAchieved, HoldsAndReadsMoreThanFull) {
  const CompressionCheck c = CheckAchieved("vestige@32", Figures(1980, 1034));
  EXPECT_FALSE(c.compressed);
  EXPECT_EQ(c.warning, "vestige@32: holds 1.98x and reads 1.03x the bytes of the full cache");
}

TEST(CheckAchieved, MoreOnOneAxisSaysWhatItStillSaves) {
  const CompressionCheck h = CheckAchieved("h2o@32", Figures(1050, 40));
  EXPECT_TRUE(h.compressed);
  EXPECT_EQ(h.warning, "h2o@32: holds 1.05x the bytes of the full cache (it reads 0.04x)");
  const CompressionCheck r = CheckAchieved("p", Figures(500, 1200));
  EXPECT_TRUE(r.compressed);
  EXPECT_EQ(r.warning, "p: reads 1.20x the bytes of the full cache (it holds 0.50x)");
}

TEST(CheckAchieved, SavedNothingWhenEqualToFull) {
  const CompressionCheck c = CheckAchieved("q", Figures(1000, 1000));
  EXPECT_FALSE(c.compressed);
  EXPECT_EQ(c.warning, "q: saved nothing on this run: it holds and reads what the full cache does");
}

TEST(CheckAchieved, BothWarningsTogether) {
  AchievedCompression a = Figures(2000, 1000);
  a.policy.compressed = false;
  a.policy.note = "no block closed: 300 rows < block 4096";
  EXPECT_EQ(CheckAchieved("vestige@32", a).warning,
            "vestige@32: compressed nothing on this run (no block closed: 300 rows < block "
            "4096); holds 2.00x the bytes of the full cache");
}

TEST(CheckAchieved, NoReadsMeasuredJudgesResidentOnly) {
  AchievedCompression a = Figures(800, 0);
  a.reads = 0;
  a.full_bytes_read = 0;
  const CompressionCheck c = CheckAchieved("kivi4", a);
  EXPECT_TRUE(c.compressed);
  EXPECT_EQ(c.warning, "");
  a.resident_bytes = 1000;
  EXPECT_FALSE(CheckAchieved("kivi4", a).compressed);
}

TEST(CheckAchieved, TheReferenceIsNeverWarnedAbout) {
  AchievedCompression a = Figures(1000, 1000);
  a.policy.reference = true;
  a.policy.compressed = false;
  const CompressionCheck c = CheckAchieved("full", a);
  EXPECT_FALSE(c.compressed);
  EXPECT_EQ(c.warning, "");
}

TEST(PolicySummary, AddSumsLayersAndKeepsDistinctNotes) {
  PolicySummary sum = PolicySummary::Identity();
  PolicySummary mla;  // a row layer: 10 of 100 rows kept, 1 block, compressed
  mla.rows_visible = 100;
  mla.rows_kept = 10;
  mla.blocks_closed = 1;
  PolicySummary gqa;  // a layer the policy reads in full (no row selection, no blocks)
  gqa.rows_visible = 200;
  gqa.compressed = false;
  gqa.note = "not a row layer";
  sum.Add(mla);
  sum.Add(gqa);
  sum.Add(gqa);
  EXPECT_EQ(sum.rows_visible, 500);
  EXPECT_EQ(sum.rows_kept, 10 + 200 + 200);
  EXPECT_EQ(sum.blocks_closed, 1);
  EXPECT_TRUE(sum.compressed);
  EXPECT_FALSE(sum.reference);
  EXPECT_EQ(sum.note, "not a row layer");
  PolicySummary none = PolicySummary::Identity();
  none.Add(gqa);
  EXPECT_EQ(none.rows_kept, -1);
  EXPECT_EQ(none.blocks_closed, -1);
  EXPECT_FALSE(none.compressed);
  PolicySummary other = gqa;
  other.note = "second reason";
  none.Add(other);
  EXPECT_EQ(none.note, "not a row layer; second reason");
}

// End to end on real caches: the counters the check reads are the engine's own.
LayerGeometry Mla() {
  LayerGeometry g;
  g.kind = AttnKind::kMla;
  g.n_q_heads = 4;
  g.n_kv_heads = 1;
  g.k_dim = 40;
  g.v_dim = 32;
  g.rope_dim = 8;
  g.rope = false;
  g.scale = 0.3f;
  return g;
}

std::unique_ptr<KvCache> RunCache(const PolicySpec& spec, int64_t rows, int64_t queries) {
  auto p = MakePolicy(spec);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return nullptr;
  auto c = KvCache::Create({Mla(), Mla()}, std::move(p).value());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return nullptr;
  KvCache& cache = **c;
  Rng rng(7);
  const LayerGeometry g = Mla();
  auto append = [&] {
    for (int l = 0; l < cache.n_layers(); ++l) {
      std::vector<float> k(g.k_dim);
      for (auto& x : k) x = static_cast<float>(rng.Normal());
      EXPECT_OK(cache.Append(l, k.data(), nullptr));
    }
  };
  EXPECT_OK(cache.BeginCall(rows, CallKind::kPrefill));
  for (int64_t i = 0; i < rows; ++i) append();
  EXPECT_OK(cache.EndCall());
  EXPECT_OK(cache.Compress());
  std::vector<float> q(g.n_q_heads * g.k_dim), out(g.n_q_heads * g.v_dim);
  for (int64_t s = 0; s < queries; ++s) {
    EXPECT_OK(cache.BeginCall(1, CallKind::kDecode));
    append();
    for (auto& x : q) x = static_cast<float>(rng.Normal());
    for (int l = 0; l < cache.n_layers(); ++l) {
      EXPECT_OK(cache.Attend(l, q.data(), cache.n_tokens() - 1, nullptr, out.data()));
    }
    EXPECT_OK(cache.EndCall());
  }
  return std::move(c).value();
}

TEST(MeasureAchieved, FullIsItsOwnReference) {
  auto c = RunCache({"full", {}}, 300, 3);
  ASSERT_NE(c, nullptr);
  const AchievedCompression a = MeasureAchieved(*c);
  EXPECT_EQ(a.bytes_read, a.full_bytes_read);
  EXPECT_EQ(a.rows_read, a.rows_visible_read);
  EXPECT_EQ(a.resident_bytes, a.full_resident_bytes);
  EXPECT_EQ(a.reads, 6);
  EXPECT_TRUE(a.policy.reference);
  EXPECT_EQ(CheckAchieved("full", a).warning, "");
}

TEST(MeasureAchieved, VestigeWithNoClosedBlockWarns) {
  // The default block (4096) is longer than the 300-row prefix: nothing closes, the read is full.
  auto c = RunCache({"vestige", {{"recall", "off"}, {"ratio", "32"}}}, 300, 3);
  ASSERT_NE(c, nullptr);
  const AchievedCompression a = MeasureAchieved(*c);
  EXPECT_EQ(a.bytes_read, a.full_bytes_read);
  EXPECT_EQ(a.policy.blocks_closed, 0);
  EXPECT_EQ(a.policy.rows_kept, a.policy.rows_visible);
  EXPECT_FALSE(a.policy.compressed);
  const CompressionCheck check = CheckAchieved("vestige:recall=off@32", a);
  EXPECT_FALSE(check.compressed);
  EXPECT_EQ(check.warning,
            "vestige:recall=off@32: compressed nothing on this run (no block closed: 303 rows < "
            "block 4096)");
}

TEST(MeasureAchieved, VestigeWithClosedBlocksCompresses) {
  auto c = RunCache(
      {"vestige", {{"recall", "off"}, {"ratio", "8"}, {"block", "64"}, {"kappa", "2"}}}, 300, 3);
  ASSERT_NE(c, nullptr);
  const AchievedCompression a = MeasureAchieved(*c);
  EXPECT_EQ(a.policy.blocks_closed, 2 * 4);  // 4 blocks of 64 in each of the 2 layers
  EXPECT_LT(a.policy.rows_kept, a.policy.rows_visible);
  EXPECT_LT(a.bytes_read, a.full_bytes_read);
  EXPECT_LT(a.rows_read, a.rows_visible_read);
  const CompressionCheck check = CheckAchieved("vestige:recall=off@8", a);
  EXPECT_TRUE(check.compressed);
  // The RAM archive keeps every row and adds sigma and the tables: it holds more than full.
  EXPECT_GT(a.resident_bytes, a.full_resident_bytes);
  EXPECT_NE(check.warning.find("holds"), std::string::npos) << check.warning;
}

// Every registered policy fills its summary from its own state: before any compression point it
// says it compressed nothing and why; after one (with a budget that must bite) it says it did.
LayerGeometry Gqa() {
  LayerGeometry g;
  g.kind = AttnKind::kGqa;
  g.n_q_heads = 4;
  g.n_kv_heads = 2;
  g.k_dim = 64;
  g.v_dim = 64;
  g.rope_dim = 64;
  g.scale = 0.125f;
  return g;
}

// Settings each policy accepts that make its budget bite on a 600-row cache.
std::map<std::string, std::string> BitingSettings(const std::string& name) {
  if (name == "vestige" || name == "fullrow") {
    // Recall off: on these 40-wide rows the recall index with its fetches reads more than full
    // does (its own warning, checked below).
    return {{"ratio", "8"}, {"block", "64"}, {"kappa", "2"}, {"recall", "off"}};
  }
  if (name == "geodesia") return {{"bits", "2"}};
  if (name == "streaming" || name == "h2o" || name == "h2o-recent" || name == "snapkv" ||
      name == "random" || name == "quest") {
    return {{"ratio", "8"}};
  }
  return {};
}

TEST(PolicySummary, EveryRegisteredPolicySaysWhetherItCompressed) {
  for (const PolicyInfo& info : Policies()) {
    SCOPED_TRACE(info.name);
    std::unique_ptr<KvCache> cache;
    for (const LayerGeometry& g : {Gqa(), Mla()}) {  // the first geometry the policy binds to
      auto p = MakePolicy({info.name, BitingSettings(info.name)});
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      auto c = KvCache::Create({g, g}, std::move(p).value());
      if (c.ok()) {
        cache = std::move(c).value();
        break;
      }
    }
    ASSERT_NE(cache, nullptr) << "binds to neither GQA nor MLA";
    const LayerGeometry g = cache->geometry(0);
    Rng rng(11);
    std::vector<float> k(g.n_kv_heads * g.k_dim), v(g.n_kv_heads * g.v_dim);
    std::vector<float> q(g.n_q_heads * g.k_dim), out(g.n_q_heads * g.v_dim);
    auto append = [&] {
      for (int l = 0; l < cache->n_layers(); ++l) {
        for (auto& x : k) x = static_cast<float>(rng.Normal());
        for (auto& x : v) x = static_cast<float>(rng.Normal());
        EXPECT_OK(cache->Append(l, k.data(), v.data()));
      }
    };
    auto append_call = [&](int n) {
      EXPECT_OK(cache->BeginCall(n, CallKind::kPrefill));
      for (int i = 0; i < n; ++i) append();
      EXPECT_OK(cache->EndCall());
    };
    auto step = [&] {
      EXPECT_OK(cache->BeginCall(1, CallKind::kDecode));
      append();
      for (auto& x : q) x = static_cast<float>(rng.Normal());
      for (int l = 0; l < cache->n_layers(); ++l) {
        EXPECT_OK(cache->Attend(l, q.data(), cache->n_tokens() - 1, nullptr, out.data()));
      }
      EXPECT_OK(cache->EndCall());
    };
    append_call(40);
    step();
    const PolicySummary before = cache->Summary();
    EXPECT_EQ(before.rows_visible, 41 * g.n_kv_heads * 2);
    EXPECT_EQ(before.reference, info.name == "full");
    const AchievedCompression a0 = MeasureAchieved(*cache);
    // llama.cpp's q8_0 / q4_0 and TurboQuant quantize every row as it is written (no exact
    // window, no compression point): compressed from the first read.
    if (info.name == "q8_0" || info.name == "q4_0" || info.name == "turboquant") {
      EXPECT_TRUE(before.compressed);
      EXPECT_LT(a0.bytes_read, a0.full_bytes_read);
    } else {
      EXPECT_FALSE(before.compressed);
      if (!before.reference) {
        EXPECT_FALSE(before.note.empty());
      }
      EXPECT_EQ(a0.bytes_read, a0.full_bytes_read);  // nothing compressed: a full read
    }

    append_call(560);
    ASSERT_OK(cache->Compress());
    for (int i = 0; i < 3; ++i) step();
    const PolicySummary after = cache->Summary();
    EXPECT_EQ(after.rows_visible, 604 * g.n_kv_heads * 2);
    EXPECT_LE(after.rows_kept, after.rows_visible);
    if (after.reference) {
      EXPECT_FALSE(after.compressed);
      continue;
    }
    EXPECT_TRUE(after.compressed) << after.note;
    EXPECT_TRUE(after.note.empty()) << after.note;
    if (after.rows_kept >= 0) {
      EXPECT_LT(after.rows_kept, after.rows_visible);
    }
    const CompressionCheck check = CheckAchieved(info.name, MeasureAchieved(*cache));
    EXPECT_TRUE(check.compressed) << check.warning;
  }
}

TEST(MeasureAchieved, VestigeRecallIndexAsWideAsTheRowReadsMoreThanFull) {
  auto c = RunCache({"vestige", {{"ratio", "8"}, {"block", "64"}, {"kappa", "2"}}}, 600, 3);
  ASSERT_NE(c, nullptr);
  const AchievedCompression a = MeasureAchieved(*c);
  EXPECT_TRUE(a.policy.compressed);  // rows were archived...
  EXPECT_GT(a.bytes_read, a.full_bytes_read);  // ...but the index scan costs more than they save
  const CompressionCheck check = CheckAchieved("vestige@8", a);
  EXPECT_FALSE(check.compressed);
  EXPECT_EQ(check.warning.rfind("vestige@8: holds ", 0), 0u) << check.warning;
  EXPECT_NE(check.warning.find("x and reads "), std::string::npos) << check.warning;
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// A policy that recovered from an error with an exact fallback is named in the warning, even when
// it compressed as asked.
TEST(CheckAchieved, RecoveredErrorIsReported) {
  AchievedCompression a;
  a.resident_bytes = 10;
  a.full_resident_bytes = 100;
  a.bytes_read = 5;
  a.full_bytes_read = 50;
  a.reads = 1;
  a.policy = PolicySummary();
  a.recovered = "layer 0: archive write failed, archived rows stay in RAM: disk full";
  const CompressionCheck c = CheckAchieved("vestige@32", a);
  EXPECT_TRUE(c.compressed);
  EXPECT_EQ(c.warning,
            "vestige@32: recovered from an error with an exact fallback: layer 0: archive write "
            "failed, archived rows stay in RAM: disk full");
  AchievedCompression sum;
  sum.Add(a);
  sum.Add(AchievedCompression());
  EXPECT_EQ(sum.recovered, a.recovered);
}

}  // namespace
}  // namespace strata
