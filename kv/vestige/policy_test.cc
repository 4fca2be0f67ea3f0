// § numbers cite docs/reference/vestigekv.md (the reference behaviour).
#include "kv/vestige/policy.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cmath>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/status_testing.h"
#include "kv/cache.h"
#include "kv/cache_testing.h"
#include "kv/registry.h"

namespace strata {
namespace {

LayerGeometry Mla(int heads = 4) {
  LayerGeometry g;
  g.kind = AttnKind::kMla;
  g.n_q_heads = heads;
  g.n_kv_heads = 1;
  g.k_dim = 40;
  g.v_dim = 32;
  g.rope_dim = 8;
  g.rope = false;
  g.scale = 0.3f;
  return g;
}

LayerGeometry Gqa() {
  LayerGeometry g;
  g.kind = AttnKind::kGqa;
  g.n_q_heads = 4;
  g.n_kv_heads = 2;
  g.k_dim = 16;
  g.v_dim = 16;
  g.rope_dim = 16;
  g.scale = 0.25f;
  return g;
}

std::string TempDir() {
  const std::string d = std::filesystem::temp_directory_path() /
                        ("strata_vestige_policy_" + std::to_string(getpid()));
  std::filesystem::create_directories(d);
  return d;
}

std::unique_ptr<KvCache> MakeCache(std::vector<LayerGeometry> layers, const PolicySpec& spec) {
  auto p = MakePolicy(spec);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return nullptr;
  auto c = KvCache::Create(std::move(layers), std::move(p).value());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

VestigePolicy& Vp(KvCache& c) { return dynamic_cast<VestigePolicy&>(c.policy()); }

// A decode step's appends: ends the open call, opens a one-row call and appends one random token
// to every layer (the call stays open for the step's queries); records the bf16 rows of layer 0
// when `log` is given.
void AppendRandom(KvCache* c, Rng& rng, std::vector<std::vector<uint16_t>>* log = nullptr) {
  NextCall(c, 1);
  for (int l = 0; l < c->n_layers(); ++l) {
    const LayerGeometry& g = c->geometry(l);
    std::vector<float> k(g.n_kv_heads * g.k_dim), v(g.n_kv_heads * g.v_dim);
    for (auto& x : k) x = static_cast<float>(rng.Normal());
    for (auto& x : v) x = static_cast<float>(rng.Normal());
    if (log && l == 0) {
      std::vector<uint16_t> r(g.k_dim);
      for (int i = 0; i < g.k_dim; ++i) r[i] = F32ToBf16(k[i]);
      log->push_back(r);
    }
    ASSERT_OK(c->Append(l, k.data(), v.data()));
  }
}

std::vector<float> RandomQuery(Rng& rng, const LayerGeometry& g) {
  std::vector<float> q(g.n_q_heads * g.k_dim);
  for (auto& x : q) x = static_cast<float>(rng.Normal());
  return q;
}

std::vector<float> Attend(KvCache* c, int layer, const std::vector<float>& q, int64_t pos,
                          ThreadPool* pool) {
  const LayerGeometry& g = c->geometry(layer);
  std::vector<float> out(g.n_q_heads * g.v_dim);
  EXPECT_OK(c->Attend(layer, q.data(), pos, pool, out.data()));
  return out;
}

// float64 attention over the listed rows (MLA: value = the row's first v_dim columns).
std::vector<double> MaskedRef(const std::vector<std::vector<uint16_t>>& rows,
                              const LayerGeometry& g, const std::vector<float>& q,
                              const std::vector<int64_t>& set) {
  std::vector<double> out(g.n_q_heads * g.v_dim, 0.0);
  for (int h = 0; h < g.n_q_heads; ++h) {
    std::vector<double> s(set.size());
    double mx = -1e300;
    for (size_t i = 0; i < set.size(); ++i) {
      double a = 0;
      for (int c = 0; c < g.k_dim; ++c)
        a += double{q[h * g.k_dim + c]} * Bf16ToF32(rows[set[i]][c]);
      s[i] = a * g.scale;
      mx = std::max(mx, s[i]);
    }
    double z = 0;
    for (double& x : s) z += (x = std::exp(x - mx));
    for (size_t i = 0; i < set.size(); ++i) {
      for (int c = 0; c < g.v_dim; ++c)
        out[h * g.v_dim + c] += s[i] / z * Bf16ToF32(rows[set[i]][c]);
    }
  }
  return out;
}

// The rows a query at position pos reads without recall: kept rows below its tail, and the tail,
// which starts at min(n_closed, start of pos's block) (a query's own block is read in full).
std::vector<int64_t> ReadSetOf(const VestigePolicy& p, int64_t pos, int64_t block) {
  const int64_t tail = std::min(p.n_closed(0), pos / block * block);
  std::vector<int64_t> set;
  for (int64_t u : p.selector(0).kept()) {
    if (u < tail) set.push_back(u);
  }
  for (int64_t u = tail; u <= pos; ++u) set.push_back(u);
  return set;
}

// Kill switch: ratio 1 (everything kept) is bit-identical to `full` at every position, 1 and 3
// threads, MLA and mixed MLA+GQA; so is any ratio before the first block closes.
TEST(VestigePolicyTest, KillSwitchIsBitExact) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const char* ratio : {"1", "4"}) {
    SCOPED_TRACE(std::string("ratio ") + ratio);
    Rng rng(seed);
    const std::vector<LayerGeometry> layers = {Mla(), Gqa(), Mla(8)};
    auto full = MakeCache(layers, {"full", {}});
    const bool ratio1 = std::string(ratio) == "1";
    auto vest = MakeCache(
        layers, {"vestige", {{"ratio", ratio}, {"block", ratio1 ? "64" : "4096"}, {"kappa", "2"}}});
    ASSERT_TRUE(full && vest);
    ThreadPool pool(3);
    for (int64_t t = 0; t < 300; ++t) {
      Rng r1 = rng;
      AppendRandom(full.get(), rng);
      AppendRandom(vest.get(), r1);
      if (t % 37 != 0 && t != 299) continue;
      for (int l = 0; l < 3; ++l) {
        const std::vector<float> q = RandomQuery(rng, layers[l]);
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
          for (int64_t pos : {t, t / 2}) {
            const auto a = Attend(full.get(), l, q, pos, p), b = Attend(vest.get(), l, q, pos, p);
            ASSERT_EQ(0, std::memcmp(a.data(), b.data(), 4 * a.size()))
                << "layer " << l << " pos " << pos;
          }
        }
      }
    }
    if (ratio1) {
      EXPECT_GT(Vp(*vest).n_closed(0), 0);
    }
    EXPECT_EQ(vest->counters().bytes_read_total, full->counters().bytes_read_total);
  }
}

// After a random sequence of closes (random ratio, block, kappa, sinks, ram and file archive):
// kept ∪ archived ∪ tail = all rows, pairwise disjoint; every row is byte-identical to what was
// appended (served from RAM, the restored buffer or the file); reads equal a float64 masked
// reference over kept ∪ tail; with the file archive, RAM is released and the output matches the
// RAM placement to f32 rounding.
TEST(VestigePolicyTest, PartitionImmutabilityAndMaskedReads) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const std::string dir = TempDir();
  for (int trial = 0; trial < 4; ++trial) {
    const std::string block = std::to_string(64 * (1 + rng.Below(2)));
    const std::string kappa = std::to_string(1 + rng.Below(8));
    const std::string ratio = std::to_string(2 + rng.Below(7));
    const std::string sinks = std::to_string(rng.Below(5));
    SCOPED_TRACE("block " + block + " kappa " + kappa + " ratio " + ratio + " sinks " + sinks);
    const LayerGeometry g = Mla();
    PolicySpec ram{"vestige",
                   {{"block", block},
                    {"kappa", kappa},
                    {"ratio", ratio},
                    {"sinks", sinks},
                    {"recall", "off"}}};
    PolicySpec file = ram;
    file.settings["archive"] = "file:" + dir;
    auto a = MakeCache({g}, ram), b = MakeCache({g}, file);
    ASSERT_TRUE(a && b);
    std::vector<std::vector<uint16_t>> rows;
    const int64_t n = 200 + rng.Below(500);
    int64_t last_closed = 0;
    for (int64_t t = 0; t < n; ++t) {
      Rng r1 = rng;
      AppendRandom(a.get(), rng, &rows);
      AppendRandom(b.get(), r1);
      VestigePolicy& pa = Vp(*a);
      if (pa.n_closed(0) == last_closed && t != n - 1) continue;
      last_closed = pa.n_closed(0);
      ASSERT_EQ(pa.selector(0).kept(), Vp(*b).selector(0).kept());
      // Partition of [0, n_rows).
      std::vector<int> seen(t + 1, 0);
      for (int64_t u : pa.selector(0).kept()) seen[u]++;
      for (int64_t u : pa.selector(0).archived()) seen[u]++;
      for (int64_t u = pa.n_closed(0); u <= t; ++u) seen[u]++;
      for (int64_t u = 0; u <= t; ++u) ASSERT_EQ(seen[u], 1) << "row " << u;
      // Immutability, through both placements.
      std::vector<uint16_t> out(g.k_dim);
      for (int64_t u = 0; u <= t; ++u) {
        ASSERT_TRUE(pa.ReadRow(0, a->store(0), u, out.data()).ok());
        ASSERT_EQ(0, std::memcmp(out.data(), rows[u].data(), 2 * g.k_dim));
        ASSERT_TRUE(Vp(*b).ReadRow(0, b->store(0), u, out.data()).ok());
        ASSERT_EQ(0, std::memcmp(out.data(), rows[u].data(), 2 * g.k_dim)) << "file row " << u;
      }
      // Reads: the decode query (limit = t + 1).
      const std::vector<float> q = RandomQuery(rng, g);
      const std::vector<int64_t> set = ReadSetOf(pa, t, std::stoll(block));
      const auto ref = MaskedRef(rows, g, q, set);
      const auto oa = Attend(a.get(), 0, q, t, nullptr), ob = Attend(b.get(), 0, q, t, nullptr);
      for (size_t i = 0; i < ref.size(); ++i) {
        // f32 accumulation over <= 700 O(1) rows: 2e-5.
        ASSERT_NEAR(oa[i], ref[i], 2e-5);
        ASSERT_NEAR(ob[i], ref[i], 2e-5);
      }
      EXPECT_EQ(pa.last_read(0).rows_attended, static_cast<int64_t>(set.size()));
      EXPECT_EQ(pa.last_read(0).rows_archived, static_cast<int64_t>(t + 1 - set.size()));
    }
    ASSERT_TRUE(Vp(*b).archive_status().ok()) << Vp(*b).archive_status().ToString();
    // A page holding a row of the open call is released only when the next call starts (the
    // call's queries may still read it): start one, with no rows (seed 9717148597991973646 ended
    // on the row that closed page 9, and the check failed in 2 of 40 seeds before this).
    NextCall(b.get(), 0);
    // Every closed page left RAM; the kept rows are held once, in the attended tier.
    for (int64_t pg = 0; pg < Vp(*b).n_closed(0) / LayerStore::kPageRows; ++pg) {
      EXPECT_FALSE(b->store(0).page_resident(0, pg)) << "page " << pg;
    }
    const VestigeResidency rb = Vp(*b).Residency(0, b->store(0));
    int64_t kept_released = 0;
    for (int64_t u : Vp(*b).selector(0).kept()) {
      kept_released += !b->store(0).page_resident(0, u / LayerStore::kPageRows);
    }
    const int64_t per_row = 2 * int64_t{g.k_dim} + 8;  // the row and its position
    EXPECT_GE(rb.restored_bytes, kept_released * per_row);
    // The tier's chunks hold at most twice its rows (kv/vestige/row_chunks.h), plus the table.
    EXPECT_LE(rb.restored_bytes,
              static_cast<int64_t>(Vp(*b).selector(0).kept().size()) * 2 * per_row + 64);
    EXPECT_EQ(rb.store_bytes + rb.released_bytes, a->store(0).resident_bytes());
    // The file placement trades the archived rows for the attended tier, whose chunks may hold up
    // to 255 unused rows (kv/vestige/row_chunks.h) and 8 bytes of position per kept row: at
    // ratio 2 that can exceed what it saves on a few hundred rows.
    const int64_t tier_slack =
        int64_t{RowChunks::kChunkRows} * 2 * g.k_dim +
        8 * static_cast<int64_t>(Vp(*b).selector(0).kept().size());
    EXPECT_LE(b->ResidentBytes(), a->ResidentBytes() + tier_slack);
    const std::string path = Vp(*b).archive_path(0);
    EXPECT_TRUE(std::filesystem::exists(path));
    b.reset();
    EXPECT_FALSE(std::filesystem::exists(path));  // the archive lives as long as the cache
  }
}

// With a large ratio, most pages of a long sequence leave RAM under the file placement, and the
// file-backed archive serves kept rows of released pages after later rebalances.
TEST(VestigePolicyTest, FileArchiveReleasesPages) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const LayerGeometry g = Mla();
  auto c = MakeCache({g}, {"vestige",
                           {{"block", "256"},
                            {"kappa", "4"},
                            {"ratio", "64"},
                            {"recall", "off"},
                            {"archive", "file:" + TempDir()}}});
  ASSERT_TRUE(c);
  std::vector<std::vector<uint16_t>> rows;
  for (int t = 0; t < 2048; ++t) AppendRandom(c.get(), rng, &rows);
  EndOpenCall(c.get());  // the last close's pages are released at the end of its call
  VestigePolicy& p = Vp(*c);
  const VestigeResidency r = p.Residency(0, c->store(0));
  EXPECT_GT(r.released_bytes, 0);
  EXPECT_GT(r.file_bytes, r.released_bytes);
  EXPECT_EQ(r.store_bytes + r.released_bytes, 2048 * 2 * g.k_dim);
  // The compact attended tier: every closed page left RAM, whatever its kept rows; what stays is
  // the unclosed tail's pages, the kept rows (once), the metadata.
  const int64_t row_bytes = 2 * int64_t{g.k_dim};
  const int64_t tail = 2048 - p.n_closed(0);
  EXPECT_EQ(r.store_bytes, (tail + 63) / 64 * 64 * row_bytes);
  // The kept rows, in chunks that hold at most twice them (row_chunks.h), and their positions.
  const int64_t n_kept = static_cast<int64_t>(p.selector(0).kept().size());
  EXPECT_GE(r.restored_bytes, n_kept * (row_bytes + 8));
  EXPECT_LE(r.restored_bytes, n_kept * (2 * row_bytes + 8) + 64);
  EXPECT_EQ(c->ResidentBytes(), r.store_bytes + r.restored_bytes + r.metadata_bytes);
  EXPECT_LT(r.store_bytes + r.restored_bytes, 2048 * row_bytes / 16);  // 36 of 2048 rows
  // The next decode step: its kept rows come from the attended tier, with no read of the file.
  AppendRandom(c.get(), rng, &rows);
  const std::vector<float> q = RandomQuery(rng, g);
  const std::vector<int64_t> set = ReadSetOf(p, 2048, 256);
  const auto ref = MaskedRef(rows, g, q, set);
  const auto out = Attend(c.get(), 0, q, 2048, nullptr);
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-5);
  int64_t off_ram = 0;
  for (int64_t u : set) off_ram += !c->store(0).page_resident(0, u / LayerStore::kPageRows);
  EXPECT_EQ(off_ram, static_cast<int64_t>(p.selector(0).kept().size()));
  EXPECT_EQ(p.last_read(0).rows_from_file, off_ram);
  EXPECT_EQ(p.last_read(0).file_reads, 0);
  // A query at an old position reads its own block in full: those rows are read from the file,
  // one pread each (except the block's kept rows).
  const std::vector<int64_t> old_set = ReadSetOf(p, 2047, 256);
  const auto old_ref = MaskedRef(rows, g, q, old_set);
  const auto old_out = Attend(c.get(), 0, q, 2047, nullptr);
  for (size_t i = 0; i < old_ref.size(); ++i) ASSERT_NEAR(old_out[i], old_ref[i], 2e-5);
  int64_t block_kept = 0;
  for (int64_t u : p.selector(0).kept()) block_kept += u >= 1792;
  EXPECT_EQ(p.last_read(0).file_reads, 256 - block_kept);
}

// A recall hook that fetches a random subset of the archive (plus, to test the disjointness
// guard's dedup, duplicates): the read equals the float64 reference over kept ∪ tail ∪ fetched,
// each row once, in RAM and file placements; counters report the fetch and the scan bytes.
class RandomFetch final : public VestigeRecallHook {
 public:
  explicit RandomFetch(uint64_t seed) : rng_(seed) {}
  void Fetch(int layer, const LayerStore& store, const float* q, int64_t limit,
             const std::vector<int64_t>& attended, const SoftmaxStates& st,
             const std::vector<int64_t>& archived, ThreadPool* pool, std::vector<int64_t>* fetched,
             bool* fallback) override {
    last.clear();
    for (int64_t u : archived) {
      if (rng_.Below(5) == 0) {
        fetched->push_back(u);
        fetched->push_back(u);
        last.push_back(u);
      }
    }
    *fallback = dense;
  }
  int64_t ScanBytesPerArchivedRow(int layer) const override { return 260; }
  std::vector<int64_t> last;
  bool dense = false;

 private:
  Rng rng_;
};

TEST(VestigePolicyTest, FetchedRowsMergeIntoOneExactSoftmax) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const LayerGeometry g = Mla();
  for (const std::string& archive : {std::string("ram"), "file:" + TempDir()}) {
    SCOPED_TRACE(archive);
    auto p = VestigeConfig::FromSpec({"vestige",
                                      {{"block", "64"},
                                       {"kappa", "2"},
                                       {"ratio", "8"},
                                       {"recall", "off"},
                                       {"archive", archive}}},
                                     false);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto pol = std::make_unique<VestigePolicy>(p.value());
    auto hook = std::make_unique<RandomFetch>(rng.Next());
    RandomFetch* h = hook.get();
    pol->SetRecallHook(std::move(hook));
    auto made = KvCache::Create({g}, std::move(pol));
    ASSERT_TRUE(made.ok());
    KvCache* c = made->get();
    std::vector<std::vector<uint16_t>> rows;
    ThreadPool pool(2);
    for (int t = 0; t < 400; ++t) {
      AppendRandom(c, rng, &rows);
      if (t < 130 || t % 25) continue;
      VestigePolicy& vp = Vp(*c);
      const std::vector<float> q = RandomQuery(rng, g);
      const auto out = Attend(c, 0, q, t, &pool);
      const std::vector<int64_t> base = ReadSetOf(vp, t, 64);
      std::set<int64_t> set(base.begin(), base.end());
      for (int64_t u : h->last)
        ASSERT_TRUE(set.insert(u).second) << "fetched row " << u << " twice";
      const auto ref = MaskedRef(rows, g, q, std::vector<int64_t>(set.begin(), set.end()));
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(out[i], ref[i], 2e-5);
      const VestigeReadInfo& info = vp.last_read(0);
      EXPECT_EQ(info.rows_fetched, static_cast<int64_t>(h->last.size()));
      EXPECT_EQ(info.rows_attended, static_cast<int64_t>(set.size()));
      // One pread per fetched row of a released page (kept rows come from the attended tier).
      int64_t released_fetched = 0;
      for (int64_t u : h->last) {
        released_fetched += !c->store(0).page_resident(0, u / LayerStore::kPageRows);
      }
      EXPECT_EQ(info.file_reads, released_fetched);
      if (archive != "ram" && t > 300) EXPECT_GT(released_fetched, 0);
      EXPECT_EQ(info.bytes_read,
                info.rows_attended * g.bytes_per_token() + info.rows_archived * 260);
    }
    // A dense fallback in RAM placement is the full policy's read, bit for bit.
    if (archive == "ram") {
      h->dense = true;
      auto full = MakeCache({g}, {"full", {}});
      NextCall(full.get(), static_cast<int64_t>(rows.size()), CallKind::kPrefill);
      for (const auto& r : rows) {
        std::vector<float> k(g.k_dim);
        for (int i = 0; i < g.k_dim; ++i) k[i] = Bf16ToF32(r[i]);
        ASSERT_OK(full->Append(0, k.data(), nullptr));
      }
      const std::vector<float> q = RandomQuery(rng, g);
      const int64_t pos = static_cast<int64_t>(rows.size()) - 1;
      const auto a = Attend(full.get(), 0, q, pos, &pool), b = Attend(c, 0, q, pos, &pool);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 4 * a.size()));
      EXPECT_TRUE(Vp(*c).last_read(0).fallback);
      EXPECT_EQ(Vp(*c).fallbacks(), 1);
    }
  }
}

// The default recall rank follows the row width: the largest multiple of 8 (at most 64 and d_c)
// whose index row 2 r + 4 + 2 d_r is at most a quarter of the 2 (d_c + d_r)-byte row, at least 8.
TEST(VestigePolicyTest, DefaultRecallRankFollowsTheRowWidth) {
  auto geometry = [](int d_c, int d_r) {
    LayerGeometry g = Mla();
    g.k_dim = d_c + d_r;
    g.rope_dim = d_r;
    return g;
  };
  EXPECT_EQ(DefaultRecallRank(geometry(512, 64)), 64);  // Kimi Linear: 260 of 1,152 bytes
  EXPECT_EQ(DefaultRecallRank(geometry(64, 16)), 8);    // the 80-wide testbed: 52 of 160
  EXPECT_EQ(DefaultRecallRank(geometry(128, 16)), 16);  // 288-byte row: 2 x 16 + 36 = 68 <= 72
  EXPECT_EQ(DefaultRecallRank(geometry(256, 32)), 32);  // 576-byte row: 2 x 32 + 68 = 132 <= 144
  for (const auto& [d_c, d_r] : std::vector<std::pair<int, int>>{
           {512, 64}, {256, 32}, {128, 16}, {96, 32}, {64, 16}, {32, 8}, {1024, 64}}) {
    const int r = DefaultRecallRank(geometry(d_c, d_r));
    SCOPED_TRACE(std::to_string(d_c) + " + " + std::to_string(d_r) + ": rank " + std::to_string(r));
    EXPECT_EQ(r % 8, 0);
    EXPECT_GE(r, 8);
    EXPECT_LE(r, std::min(64, d_c));
    // The largest such rank: the next one up breaks the quarter (or the caps).
    if (r > 8) EXPECT_LE(4 * (2 * r + 4 + 2 * d_r), 2 * (d_c + d_r));
    if (r + 8 <= std::min(64, d_c)) EXPECT_GT(4 * (2 * (r + 8) + 4 + 2 * d_r), 2 * (d_c + d_r));
  }
}

// Accounting: bytes read = attended rows x row bytes + archived rows x scan bytes (recall on),
// and fewer bytes than full with recall off. With the default recall tier on random data the
// provisional/calibrated scan may fire widely or fall back to dense (exact); the counters must
// then say so rather than claim a saving.
TEST(VestigePolicyTest, ByteAccountingWithRecallOnAndOff) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  LayerGeometry g = Mla();
  for (const char* recall : {"off", "on"}) {
    SCOPED_TRACE(std::string("recall ") + recall);
    Rng rng(seed);
    auto full = MakeCache({g}, {"full", {}});
    auto vest = MakeCache({g}, {"vestige",
                                {{"block", "256"},
                                 {"kappa", "4"},
                                 {"ratio", "8"},
                                 {"calibration", "decode"},
                                 {"recall", recall}}});
    ASSERT_TRUE(full && vest);
    VestigePolicy& p = Vp(*vest);
    ASSERT_EQ(p.recall_hook() != nullptr, std::string(recall) == "on");
    for (int t = 0; t < 1100; ++t) {
      Rng r1 = rng;
      AppendRandom(full.get(), rng);
      AppendRandom(vest.get(), r1);
    }
    const int64_t scan = p.recall_hook() ? p.recall_hook()->ScanBytesPerArchivedRow(0) : 0;
    if (p.recall_hook()) {
      EXPECT_EQ(scan, 2 * 8 + 4 + 2 * 8);  // rank 8 (DefaultRecallRank of a 40-value row), d_r 8
    }
    for (int s = 0; s < 20; ++s) {
      const std::vector<float> q = RandomQuery(rng, g);
      Attend(full.get(), 0, q, 1099, nullptr);
      Attend(vest.get(), 0, q, 1099, nullptr);
      const VestigeReadInfo& info = p.last_read(0);
      EXPECT_EQ(info.bytes_read,
                info.rows_attended * g.bytes_per_token() + info.rows_archived * scan);
      EXPECT_EQ(info.rows_archived, static_cast<int64_t>(p.selector(0).archived().size()));
    }
    if (std::string(recall) == "off") {
      EXPECT_LT(vest->counters().bytes_read_total, full->counters().bytes_read_total);
    } else {
      EXPECT_TRUE(p.recall_hook()->status().ok()) << p.recall_hook()->status().ToString();
    }
  }
}

TEST(VestigePolicyTest, InvalidSettingsAreClearErrors) {
  struct Bad {
    std::map<std::string, std::string> s;
    std::string needle;
  };
  const std::vector<Bad> bads = {
      {{{"ratio", "0.5"}}, "--ratio"},
      {{{"ratio", "x"}}, "--ratio"},
      {{{"kappa", "0"}}, "--kappa"},
      {{{"kappa", "2048"}}, "--kappa"},
      {{{"block", "100"}}, "--block"},
      {{{"block", "32"}}, "--block"},
      {{{"block", "64"}, {"kappa", "32"}}, "--kappa"},
      {{{"sinks", "-1"}}, "--sinks"},
      {{{"archive", "disk"}}, "--archive"},
      {{{"archive", "file:/nonexistent/dir/x"}}, "--archive"},
      {{{"recall", "maybe"}}, "--recall"},
      {{{"calibration", "both"}}, "calibration"},
      {{{"rank", "12"}}, "rank"},
  };
  for (const Bad& b : bads) {
    for (const char* name : {"vestige", "fullrow"}) {
      auto p = MakePolicy({name, b.s});
      ASSERT_FALSE(p.ok()) << b.needle;
      EXPECT_NE(p.status().message().find(b.needle), std::string::npos) << p.status().ToString();
    }
  }
  // A model with no MLA layer.
  auto p = MakePolicy({"vestige", {}});
  ASSERT_TRUE(p.ok());
  auto c = KvCache::Create({Gqa(), Gqa()}, std::move(p).value());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("MLA"), std::string::npos) << c.status().ToString();
  // Effective values are exposed for the CLI.
  auto ok = VestigeConfig::FromSpec({"vestige", {{"ratio", "32"}}}, false);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->block(), 4096);
  EXPECT_EQ(ok->kappa(), 16);
  EXPECT_EQ(ok->cutoff_period(), 256.0);
  EXPECT_NE(ok->ToString().find("cutoff period 256"), std::string::npos) << ok->ToString();
}

// The file archive with the recall tier: pages leave RAM, the scan runs on its branch sidecar and
// the index/calibration read rows back from the file; every read equals the same policy with the
// RAM archive (same selection, same index, same fetched rows) and RAM really shrinks.
TEST(VestigePolicyTest, FileArchiveWithRecallMatchesRamArchive) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const LayerGeometry g = Mla();
  std::map<std::string, std::string> base = {{"block", "256"}, {"kappa", "4"}, {"ratio", "128"},
                                             {"recall", "on"}, {"calibration", "decode"}};
  auto ram_spec = base, file_spec = base;
  ram_spec["archive"] = "ram";
  file_spec["archive"] = "file:" + TempDir();
  auto a = MakeCache({g}, {"vestige", ram_spec});
  auto b = MakeCache({g}, {"vestige", file_spec});
  ASSERT_TRUE(a && b);
  Rng ra(seed), rb(seed);
  std::vector<std::vector<uint16_t>> rows_a, rows_b;
  for (int t = 0; t < 1536; ++t) {
    AppendRandom(a.get(), ra, &rows_a);
    AppendRandom(b.get(), rb, &rows_b);
  }
  EXPECT_GT(Vp(*b).Residency(0, b->store(0)).released_bytes, 0);
  Rng rq(seed + 1);
  int64_t fetched_total = 0;
  for (int step = 0; step < 24; ++step) {
    const std::vector<float> q = RandomQuery(rq, g);
    const auto oa = Attend(a.get(), 0, q, 1535, nullptr);
    const auto ob = Attend(b.get(), 0, q, 1535, nullptr);
    ASSERT_EQ(Vp(*a).last_read(0).rows_fetched, Vp(*b).last_read(0).rows_fetched) << step;
    fetched_total += Vp(*b).last_read(0).rows_fetched;
    // Same rows, same kernel tasks: only the memory the file rows are read from differs.
    ASSERT_EQ(0, std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float))) << step;
  }
  EXPECT_GT(fetched_total, 0);  // archived rows were recalled (from the file in b)
  EXPECT_TRUE(Vp(*b).archive_status().ok());
}

// ---- File archive vs RAM archive, bit for bit, through chunked prefill and decode. ----
//
// The file placement must change where rows live, never what a read computes: every read of a
// cache with `archive=file:DIR` equals the same read with `archive=ram` bit for bit (same
// selection, same recall index and calibration, same fetched rows, same kernel tasks).

// One read's result and the policy's accounting of it.
struct ReadTrace {
  std::vector<float> out;
  int64_t rows_fetched = 0;
  bool fallback = false;
};

// The random rows and queries of a run, per layer; draws depend only on the seed, so two caches
// fed from streams with the same seed see the same tokens.
//
// peaked: each query head is, at random, either peaked on the layer's first row (a sink, always
// kept: low entropy, its target attended) or diffuse (near-uniform: high entropy, its target
// mostly archived). That is the structure the recall tier's entropy gate is fitted on (§3.4:
// the gate opens above the 3% quantile of the hard rows' entropies and switches itself off when
// more than 60% of all rows lie above it); i.i.d. normal queries give it none, so it stays off.
class Stream {
 public:
  explicit Stream(uint64_t seed, bool peaked = false) : rng_(seed), peaked_(peaked) {}
  // Scales the branch (the last rope_dim columns, what sigma is computed from) of later rows.
  void set_branch_scale(float s) { branch_scale_ = s; }
  std::vector<float> Row(int layer, const LayerGeometry& g) {
    std::vector<float> r = Draw(g.k_dim, 1.f);
    for (int c = g.k_dim - g.rope_dim; c < g.k_dim; ++c) r[c] *= branch_scale_;
    if (static_cast<int>(first_.size()) <= layer) first_.resize(layer + 1);
    if (first_[layer].empty()) first_[layer] = r;
    return r;
  }
  std::vector<float> Query(int layer, const LayerGeometry& g) {
    if (!peaked_) return Draw(g.n_q_heads * g.k_dim, 1.f);
    std::vector<float> q(g.n_q_heads * g.k_dim);
    for (int h = 0; h < g.n_q_heads; ++h) {
      const bool peak = rng_.Below(2) == 0;
      for (int c = 0; c < g.k_dim; ++c) {
        const float noise = static_cast<float>(rng_.Normal());
        q[h * g.k_dim + c] = peak ? 2.f * first_[layer][c] + 0.1f * noise : 0.05f * noise;
      }
    }
    return q;
  }

 private:
  std::vector<float> Draw(int n, float scale) {
    std::vector<float> x(n);
    for (float& v : x) v = scale * static_cast<float>(rng_.Normal());
    return x;
  }
  Rng rng_;
  bool peaked_;
  float branch_scale_ = 1.f;
  std::vector<std::vector<float>> first_;  // [layer] the layer's first row
};

// Reads one query through the cache; records the output and the policy's accounting.
ReadTrace TraceRead(KvCache* c, int layer, const std::vector<float>& q, int64_t pos,
                    ThreadPool* pool) {
  ReadTrace t;
  t.out = Attend(c, layer, q, pos, pool);
  const VestigeReadInfo& info = Vp(*c).last_read(layer);
  t.rows_fetched = info.rows_fetched;
  t.fallback = info.fallback;
  return t;
}

// A chunked prefill of n tokens as the model runs it (model/model.cc Prefill, deepseek2
// ForwardChunk): one call per chunk; per layer the chunk's rows are appended first (a block may
// close), then each of the chunk's queries is observed and read; the file archive releases pages
// at the end of the call. Prompt queries inside a block that their own chunk just closed read
// that whole block; `in_block` counts those reads that served rows from outside the store.
struct InBlockReads {
  int64_t kill_switch = 0;  // nothing archived below the tail (block 0): the full policy's read
  int64_t masked = 0;       // kept rows below the tail, then the tail
};
std::vector<ReadTrace> ChunkedPrefill(KvCache* c, Stream& s, int64_t n, int64_t chunk,
                                      ThreadPool* pool, InBlockReads* in_block = nullptr) {
  std::vector<ReadTrace> trace;
  const int64_t first = c->n_tokens();
  EndOpenCall(c);
  c->BeginPrefill(first, first + n);
  for (int64_t b = 0; b < n; b += chunk) {
    const int64_t m = std::min(chunk, n - b);
    EXPECT_OK(c->BeginCall(m, CallKind::kPrefill));
    for (int l = 0; l < c->n_layers(); ++l) {
      const LayerGeometry& g = c->geometry(l);
      for (int64_t i = 0; i < m; ++i) EXPECT_OK(c->Append(l, s.Row(l, g).data(), nullptr));
      for (int64_t i = 0; i < m; ++i) {
        const int64_t pos = first + b + i;
        const std::vector<float> q = s.Query(l, g);
        EXPECT_OK(c->ObserveQuery(l, pos, q.data()));
        trace.push_back(TraceRead(c, l, q, pos, pool));
        const VestigeReadInfo& info = Vp(*c).last_read(l);
        if (in_block && pos < Vp(*c).n_closed(l) && info.rows_from_file > 0) {
          ++(info.rows_archived == 0 ? in_block->kill_switch : in_block->masked);
        }
      }
    }
    EXPECT_OK(c->EndCall());
  }
  EXPECT_OK(c->EndPrefill(pool));
  return trace;
}

// `steps` decode steps: one new row per layer, then the step's query at the last position.
std::vector<ReadTrace> DecodeSteps(KvCache* c, Stream& s, int steps, ThreadPool* pool) {
  std::vector<ReadTrace> trace;
  EndOpenCall(c);
  for (int step = 0; step < steps; ++step) {
    const int64_t pos = c->n_tokens();
    EXPECT_OK(c->BeginCall(1, CallKind::kDecode));
    for (int l = 0; l < c->n_layers(); ++l) {
      const LayerGeometry& g = c->geometry(l);
      EXPECT_OK(c->Append(l, s.Row(l, g).data(), nullptr));
      trace.push_back(TraceRead(c, l, s.Query(l, g), pos, pool));
    }
    EXPECT_OK(c->EndCall());
  }
  return trace;
}

void ExpectSameTrace(const std::vector<ReadTrace>& ram, const std::vector<ReadTrace>& file,
                     const char* what) {
  ASSERT_EQ(ram.size(), file.size()) << what;
  for (size_t r = 0; r < ram.size(); ++r) {
    ASSERT_EQ(ram[r].out.size(), file[r].out.size()) << what << " read " << r;
    // Bit for bit: same rows, same kernel tasks, only the memory the bytes live in differs.
    ASSERT_EQ(0, std::memcmp(ram[r].out.data(), file[r].out.data(),
                             ram[r].out.size() * sizeof(float)))
        << what << " read " << r;
    ASSERT_EQ(ram[r].rows_fetched, file[r].rows_fetched) << what << " read " << r;
    ASSERT_EQ(ram[r].fallback, file[r].fallback) << what << " read " << r;
  }
}

std::map<std::string, std::string> WithArchive(std::map<std::string, std::string> s,
                                               const std::string& archive) {
  s["archive"] = archive;
  return s;
}

// Crash 1 (kv/store.cc "page N was released"): a chunked prefill whose chunk closes a block while
// its earlier queries, inside that block, are still to be read. Block 0's query reads nothing
// archived below its tail, so it took the kill switch, which read every row from the store,
// including pages already released to the file. With recall off and on (default prefix
// calibration; 1 and 2 threads): every prefill read and several decode steps equal the RAM
// archive bit for bit.
TEST(VestigePolicyTest, FileArchiveChunkedPrefillMatchesRamBitExact) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<LayerGeometry> layers = {Mla(), Mla(8)};
  const std::vector<std::pair<const char*, int>> configs = {{"off", 1}, {"on", 1}, {"on", 2}};
  for (const auto& [recall, threads] : configs) {
    SCOPED_TRACE(std::string("recall ") + recall + ", threads " + std::to_string(threads));
    // Ratio 256 keeps ~1 row per 256 (plus the sinks): most pages of a closing block hold no kept
    // row and are released at once. Chunks of 96 rows close blocks 256 rows apart at varying
    // offsets inside the chunk.
    const std::map<std::string, std::string> base = {
        {"block", "256"}, {"kappa", "4"}, {"ratio", "256"}, {"recall", recall}};
    auto ram = MakeCache(layers, {"vestige", WithArchive(base, "ram")});
    auto file = MakeCache(layers, {"vestige", WithArchive(base, "file:" + TempDir())});
    ASSERT_TRUE(ram && file);
    ThreadPool pool(threads);
    Stream sa(seed), sb(seed);
    InBlockReads in_block;
    const auto pa = ChunkedPrefill(ram.get(), sa, 1100, 96, &pool);
    const auto pb = ChunkedPrefill(file.get(), sb, 1100, 96, &pool, &in_block);
    ExpectSameTrace(pa, pb, "prefill");
    // The crash path cannot arise: a prefill's pages leave the store at its compression point,
    // so no prompt query reads its own block from the file; they were released all the same.
    EXPECT_EQ(in_block.kill_switch, 0);
    EXPECT_GT(Vp(*file).Residency(0, file->store(0)).released_bytes, 0);
    EXPECT_EQ(Vp(*file).Residency(0, file->store(0)).staged_bytes, 0);
    ExpectSameTrace(DecodeSteps(ram.get(), sa, 6, &pool), DecodeSteps(file.get(), sb, 6, &pool),
                    "decode");
    EXPECT_TRUE(Vp(*file).archive_status().ok()) << Vp(*file).archive_status().ToString();
    if (std::string(recall) == "on") {
      EXPECT_TRUE(Vp(*file).recall_hook()->status().ok())
          << Vp(*file).recall_hook()->status().ToString();
    }
  }
}

// Prompt queries before the first compression point read every row (prefill attention is dense,
// docs/reference/vestigekv.md §4): a chunked prefill whose chunks close blocks equals the kill
// switch (ratio 1, == full) bit for bit, with recall on and off and with the file archive, whose
// pages stay in the store until the compression point. After it, a second prompt (a chat turn,
// an eval's question) reads the selection: it no longer equals the kill switch.
TEST(VestigePolicyTest, PromptReadsAreDenseUntilTheCompressionPoint) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<LayerGeometry> layers = {Mla(), Mla(8)};
  for (const char* recall : {"off", "on"}) {
    for (const char* archive : {"ram", "file"}) {
      SCOPED_TRACE(std::string("recall ") + recall + ", archive " + archive);
      std::map<std::string, std::string> base = {
          {"block", "256"}, {"kappa", "4"}, {"ratio", "8"}, {"recall", recall}};
      base["archive"] = std::string(archive) == "ram" ? "ram" : "file:" + TempDir();
      std::map<std::string, std::string> all = base;
      all["ratio"] = "1";
      all["archive"] = "ram";
      auto v = MakeCache(layers, {"vestige", base});
      auto k = MakeCache(layers, {"vestige", all});
      ASSERT_TRUE(v && k);
      ThreadPool pool(2);
      Stream sv(seed), sk(seed);
      // 1100 rows in chunks of 96: blocks close at 256, 512, 768 and 1024, inside chunks.
      ExpectSameTrace(ChunkedPrefill(k.get(), sk, 1100, 96, &pool),
                      ChunkedPrefill(v.get(), sv, 1100, 96, &pool), "first prompt");
      EXPECT_EQ(Vp(*v).n_closed(0), 1024);
      EXPECT_FALSE(Vp(*v).selector(0).archived().empty());
      if (std::string(archive) == "file") {
        // Released at the compression point, never staged back for a prompt query.
        EXPECT_GT(Vp(*v).Residency(0, v->store(0)).released_bytes, 0);
        EXPECT_EQ(Vp(*v).Residency(0, v->store(0)).staged_bytes, 0);
      }
      const auto tk = ChunkedPrefill(k.get(), sk, 200, 100, &pool);
      const auto tv = ChunkedPrefill(v.get(), sv, 200, 100, &pool);
      ASSERT_EQ(tk.size(), tv.size());
      int differ = 0;
      for (size_t r = 0; r < tk.size(); ++r) {
        differ += std::memcmp(tk[r].out.data(), tv[r].out.data(),
                              tk[r].out.size() * sizeof(float)) != 0;
      }
      EXPECT_GT(differ, 0) << "the second prompt read every row";
      const VestigeReadInfo& last = Vp(*v).last_read(0);
      EXPECT_GT(last.rows_archived, 0);
      EXPECT_LT(last.rows_attended, 1300);
      EXPECT_TRUE(Vp(*v).archive_status().ok()) << Vp(*v).archive_status().ToString();
    }
  }
}

// Crash 2 (kv/store.cc "row N of a released page"): with the recall tier on, the gate's entropy
// over a step's attended set (kept ∪ tail) read every attended row from the store. With the file
// archive attended rows live elsewhere too: kept rows of released pages (moved back by a
// rebalance) in the policy's restored buffer, and at the decode step that closes a block the tail
// is that block, whose fully archived pages are already in the file. Prefix calibration fits a
// finite gate threshold here, so every decode step computes that entropy. Prefill and decode
// equal the RAM archive bit for bit.
TEST(VestigePolicyTest, FileArchiveRecallGateReadsRestoredRowsBitExact) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<LayerGeometry> layers = {Mla(), Mla(8)};
  const std::map<std::string, std::string> base = {
      {"block", "128"}, {"kappa", "4"}, {"ratio", "64"}, {"recall", "on"}};
  auto ram = MakeCache(layers, {"vestige", WithArchive(base, "ram")});
  auto file = MakeCache(layers, {"vestige", WithArchive(base, "file:" + TempDir())});
  ASSERT_TRUE(ram && file);
  ThreadPool pool(1);  // two threads are covered above; this test is about the rows read
  Stream sa(seed, /*peaked=*/true), sb(seed, /*peaked=*/true);
  ExpectSameTrace(ChunkedPrefill(ram.get(), sa, 1536, 200, &pool),
                  ChunkedPrefill(file.get(), sb, 1536, 200, &pool), "prefill");
  // Decode across block closes, step by step; both caches agree at every step. Decode rows get a
  // near-zero branch (low sigma), so each close grows the kept set with the best archived rows of
  // earlier blocks, and those whose page was already released move to the restored buffer, where
  // they stay. The steps that ran the crash path are counted: gate on while kept rows live in the
  // restored buffer (they are in the attended set whose entropy the gate needs).
  sa.set_branch_scale(1e-3f);
  sb.set_branch_scale(1e-3f);
  int64_t gated_restored_reads = 0;
  for (int step = 0; step < 2048 && (step < 256 || gated_restored_reads < 64); ++step) {
    SCOPED_TRACE("decode step " + std::to_string(step));
    ExpectSameTrace(DecodeSteps(ram.get(), sa, 1, &pool), DecodeSteps(file.get(), sb, 1, &pool),
                    "decode");
    for (int l = 0; l < file->n_layers(); ++l) {
      const RecallTier* t = Vp(*file).recall_tier(l);
      ASSERT_NE(t, nullptr) << "layer " << l << ": "
                            << Vp(*file).recall_hook()->status().ToString();
      gated_restored_reads +=
          t->needs_entropy() && Vp(*file).Residency(l, file->store(l)).restored_bytes > 0;
    }
  }
  for (int l = 0; l < file->n_layers(); ++l) {
    // The same tier decisions in both placements.
    const RecallCounters& a = Vp(*ram).recall_tier(l)->counters();
    const RecallCounters& b = Vp(*file).recall_tier(l)->counters();
    EXPECT_EQ(a.scans, b.scans);
    EXPECT_EQ(a.fired, b.fired);
    EXPECT_EQ(a.fetched, b.fetched);
    EXPECT_EQ(a.fallbacks, b.fallbacks);
    EXPECT_EQ(a.gated_heads, b.gated_heads);
    EXPECT_EQ(a.calibrations, b.calibrations);
    EXPECT_GT(b.fetched, 0);  // archived rows were recalled, from the file
  }
  EXPECT_GT(gated_restored_reads, 0);
  EXPECT_TRUE(Vp(*file).archive_status().ok()) << Vp(*file).archive_status().ToString();
  EXPECT_TRUE(Vp(*file).recall_hook()->status().ok())
      << Vp(*file).recall_hook()->status().ToString();
}

// Determinism: two identical runs give identical kept sets and identical outputs.
TEST(VestigePolicyTest, Deterministic) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<std::vector<float>> outs[2];
  std::vector<int64_t> kept[2];
  for (int run = 0; run < 2; ++run) {
    Rng rng(seed);
    auto c = MakeCache(
        {Mla()},
        {"vestige", {{"block", "128"}, {"kappa", "3"}, {"ratio", "5"}, {"calibration", "decode"}}});
    ThreadPool pool(run + 1);
    for (int t = 0; t < 600; ++t) {
      AppendRandom(c.get(), rng);
      if (t % 50 == 49) outs[run].push_back(Attend(c.get(), 0, RandomQuery(rng, Mla()), t, &pool));
    }
    kept[run] = Vp(*c).selector(0).kept();
  }
  EXPECT_EQ(kept[0], kept[1]);
  ASSERT_EQ(outs[0].size(), outs[1].size());
  for (size_t i = 0; i < outs[0].size(); ++i) {
    for (size_t j = 0; j < outs[0][i].size(); ++j) ASSERT_NEAR(outs[0][i][j], outs[1][i][j], 1e-6);
  }
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Overwrites every byte of `path` after its first `keep` bytes (the header) with 0x5a: every
// archived record then fails its checksum.
void CorruptFile(const std::string& path, int64_t keep) {
  const int64_t size = static_cast<int64_t>(std::filesystem::file_size(path));
  ASSERT_GT(size, keep);
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fseek(f, keep, SEEK_SET), 0);
  const std::vector<char> junk(static_cast<size_t>(size - keep), 0x5a);
  ASSERT_EQ(std::fwrite(junk.data(), 1, junk.size(), f), junk.size());
  std::fclose(f);
}

// An archived row the file cannot give back fails the read with a DataLoss error naming the row
// and the file, through KvCache (with the layer and the query position); it is never left out of
// the softmax, and the cache refuses every later call with the same error.
TEST(VestigePolicyTest, UnreadableArchiveRowFailsTheRead) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const LayerGeometry g = Mla();
  auto p = VestigeConfig::FromSpec(
      {"vestige",
       {{"block", "64"}, {"kappa", "2"}, {"ratio", "256"}, {"recall", "off"},
        {"archive", "file:" + TempDir()}}},
      false);
  ASSERT_OK(p);
  auto pol = std::make_unique<VestigePolicy>(p.value());
  auto hook = std::make_unique<RandomFetch>(rng.Next());
  RandomFetch* h = hook.get();
  pol->SetRecallHook(std::move(hook));
  auto made = KvCache::Create({g}, std::move(pol));
  ASSERT_OK(made);
  KvCache* c = made->get();
  // Ratio 256 keeps ~4 closed rows besides the sinks: most pages are fully archived.
  for (int t = 0; t < 700; ++t) AppendRandom(c, rng);
  EndOpenCall(c);
  const VestigeResidency r = Vp(*c).Residency(0, c->store(0));
  ASSERT_GT(r.released_bytes, 0);
  CorruptFile(Vp(*c).archive_path(0), 64);
  // The next step fetches archived rows of released pages: their bytes are gone.
  AppendRandom(c, rng);
  const std::vector<float> q = RandomQuery(rng, g);
  std::vector<float> out(g.n_q_heads * g.v_dim);
  const Status s = c->Attend(0, q.data(), c->n_tokens() - 1, nullptr, out.data());
  ASSERT_FALSE(h->last.empty());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  const std::string path = Vp(*c).archive_path(0);
  for (const std::string& part : {std::string("policy 'vestige'"), std::string("layer 0"),
                                  std::string("position 700"), std::string("archived row"),
                                  path}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.ToString();
  }
  // The cache is failed: the sequence cannot go on exactly.
  EXPECT_EQ(c->EndCall().message(), s.message());
  EXPECT_EQ(c->BeginCall(1, CallKind::kDecode).message(), s.message());
}

// A failed archive write is an exact fallback, not an error: the pages stay in RAM, every read
// equals the RAM placement, and recovered_error() says what happened (reports print it). The
// write fails as on a full disk: the file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) is the
// archive's header.
TEST(VestigePolicyTest, FailedArchiveWriteKeepsRowsInRamAndIsReported) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const LayerGeometry g = Mla();
  const std::map<std::string, std::string> base = {
      {"block", "64"}, {"kappa", "2"}, {"ratio", "256"}, {"recall", "off"}};
  auto ram = MakeCache({g}, {"vestige", WithArchive(base, "ram")});
  auto file = MakeCache({g}, {"vestige", WithArchive(base, "file:" + TempDir())});
  ASSERT_TRUE(ram && file);
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = static_cast<rlim_t>(std::filesystem::file_size(Vp(*file).archive_path(0)));
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  Rng ra(seed), rb(seed);
  for (int t = 0; t < 700; ++t) {
    AppendRandom(ram.get(), ra);
    AppendRandom(file.get(), rb);
    if (t % 50 != 49) continue;
    const std::vector<float> q = RandomQuery(ra, g);
    RandomQuery(rb, g);
    const auto a = Attend(ram.get(), 0, q, t, nullptr), b = Attend(file.get(), 0, q, t, nullptr);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), 4 * a.size())) << "t " << t;
  }
  EndOpenCall(file.get());
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);
  const VestigeResidency r = Vp(*file).Residency(0, file->store(0));
  EXPECT_EQ(r.released_bytes, 0);
  EXPECT_EQ(r.store_bytes, ram->store(0).resident_bytes());
  const Status rec = file->policy().recovered_error();
  EXPECT_FALSE(rec.ok());
  EXPECT_NE(rec.message().find("archive write failed, archived rows stay in RAM"),
            std::string::npos)
      << rec.ToString();
  EXPECT_TRUE(ram->policy().recovered_error().ok());
}

// The archive file survives kill -9 of the writer at any moment: reopened, it reports its
// committed prefix, whose every row equals what was appended, or a clean DataLoss; never a wrong
// row. The child appends deterministic rows (a function of the position) until it is killed.
TEST(VestigePolicyTest, ArchiveFileSurvivesKill9) {
  const LayerGeometry g = Mla();
  auto row_of = [&](int64_t u, std::vector<float>* k) {
    Rng r(0x5eed + static_cast<uint64_t>(u));
    for (float& x : *k) x = static_cast<float>(r.Normal());
  };
  Rng timing(TestSeed());
  for (int trial = 0; trial < 3; ++trial) {
    const std::string dir = TempDir() + "/kill" + std::to_string(trial);
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the writer: no gtest assertions here, and no exit handlers
      auto p = MakePolicy({"vestige",
                           {{"block", "256"}, {"ratio", "8"}, {"recall", "off"},
                            {"archive", "file:" + dir}}});
      if (!p.ok()) _exit(3);
      auto c = KvCache::Create({g}, std::move(p).value());
      if (!c.ok()) _exit(4);
      std::vector<float> k(g.k_dim);
      for (int64_t u = 0;; ++u) {
        if ((*c)->BeginCall(1, CallKind::kDecode).ok()) {
          row_of(u, &k);
          if (!(*c)->Append(0, k.data(), nullptr).ok()) _exit(5);
          if (!(*c)->EndCall().ok()) _exit(6);
        }
      }
    }
    // Kill once a few records are committed, plus a random delay (mid-write, mid-commit, ...).
    std::string path;
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
      for (const auto& e : std::filesystem::directory_iterator(dir)) path = e.path().string();
      std::error_code ec;
      if (!path.empty() && std::filesystem::file_size(path, ec) > 4 * 6000) break;
      usleep(1000);
    }
    usleep(static_cast<useconds_t>(timing.Below(20000)));
    kill(pid, SIGKILL);
    int wstatus = 0;
    waitpid(pid, &wstatus, 0);
    ASSERT_TRUE(WIFSIGNALED(wstatus)) << "the writer exited by itself: " << wstatus;
    ASSERT_FALSE(path.empty()) << "no archive file was written in 30 s";
    auto f = VestigeArchiveFile::Open(path);
    if (!f.ok()) {
      EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << f.status().ToString();
      continue;
    }
    ASSERT_GT(f->n_records(), 0);
    int64_t checked = 0;
    std::vector<float> k(g.k_dim);
    std::vector<uint16_t> got(g.k_dim);
    for (int64_t page = 0; checked / LayerStore::kPageRows < f->n_records(); ++page) {
      ASSERT_LT(page, 100000);
      if (!f->HasPage(page)) continue;
      for (int64_t u = page * 64; u < (page + 1) * 64; ++u) {
        ASSERT_OK(f->ReadRow(u, got.data()));
        row_of(u, &k);
        for (int i = 0; i < g.k_dim; ++i) ASSERT_EQ(got[i], F32ToBf16(k[i])) << "row " << u;
        ++checked;
      }
    }
    EXPECT_GT(checked, 0);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace strata
