// Faults injected into real runs of the commands: an archive the file cannot give back and a
// Geodesia demotion that fails both reach the user as a message naming the layer and the cause and
// a non-zero exit, never as a dropped row, silent figures or an abort. A decorator (installed
// through the registry's test hook) forwards every event to the real policy and damages it at one
// chosen point of the run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "cli/cli_testing.h"
#include "kv/geodesia/policy.h"
#include "kv/registry.h"
#include "kv/vestige/policy.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;

// Forwards every event to `inner`; `at_compress` / `at_decode` run once, before the inner
// policy's first OnCompress / first decode call (layer 0's BeginCall of kind kDecode).
class Decorator final : public Policy {
 public:
  Decorator(std::unique_ptr<Policy> inner, std::function<void(Policy&)> at_compress,
            std::function<void(Policy&)> at_decode)
      : inner_(std::move(inner)),
        at_compress_(std::move(at_compress)),
        at_decode_(std::move(at_decode)) {}
  std::string name() const override { return inner_->name(); }
  std::string describe() const override { return inner_->describe(); }
  Status Bind(const std::vector<LayerGeometry>& layers) override { return inner_->Bind(layers); }
  Status BeginCall(int layer, const LayerStore& s, const CacheCall& c, CachePlan* p) override {
    if (layer == 0 && c.kind == CallKind::kDecode && at_decode_) {
      at_decode_(*inner_);
      at_decode_ = nullptr;
    }
    return inner_->BeginCall(layer, s, c, p);
  }
  Status OnAppend(int layer, const LayerStore& s) override { return inner_->OnAppend(layer, s); }
  Status OnAppended(int layer, const LayerStore& s, const CacheCall& c, CachePlan* p,
                    ThreadPool* pool) override {
    return inner_->OnAppended(layer, s, c, p, pool);
  }
  Status EndCall(int layer, const LayerStore& s, const CacheCall& c, CachePlan* p) override {
    return inner_->EndCall(layer, s, c, p);
  }
  int64_t observation_queries(int64_t n) const override { return inner_->observation_queries(n); }
  int64_t observation_stride(int64_t n) const override { return inner_->observation_stride(n); }
  bool observation_needs_weights() const override { return inner_->observation_needs_weights(); }
  Status OnPrefillStats(int layer, const LayerStore& s, const PrefillObservation& o) override {
    return inner_->OnPrefillStats(layer, s, o);
  }
  Status OnCompress(int layer, const LayerStore& s, CachePlan* p, ThreadPool* pool) override {
    if (at_compress_) {
      at_compress_(*inner_);
      at_compress_ = nullptr;
    }
    return inner_->OnCompress(layer, s, p, pool);
  }
  Status Read(int layer, const LayerStore& s, const float* q, int64_t limit, ThreadPool* pool,
              SoftmaxStates* st, ReadStats* stats) override {
    return inner_->Read(layer, s, q, limit, pool, st, stats);
  }
  int64_t ResidentBytes(int layer, const LayerStore& s) const override {
    return inner_->ResidentBytes(layer, s);
  }
  Status recovered_error() const override { return inner_->recovered_error(); }
  PolicySummary Summary(int layer, const LayerStore& s) const override {
    return inner_->Summary(layer, s);
  }

 private:
  std::unique_ptr<Policy> inner_;
  std::function<void(Policy&)> at_compress_, at_decode_;
};


// Installs a decorator around every policy the registry builds, for one scope.
class ScopedWrapper {
 public:
  ScopedWrapper(std::function<void(Policy&)> at_compress, std::function<void(Policy&)> at_decode) {
    SetPolicyWrapperForTesting([=](std::unique_ptr<Policy> p) -> std::unique_ptr<Policy> {
      return std::make_unique<Decorator>(std::move(p), at_compress, at_decode);
    });
  }
  ~ScopedWrapper() { SetPolicyWrapperForTesting(nullptr); }
};

std::string Model(const char* name) {
  return std::string(STRATA_SOURCE_DIR) + "/models/" + name;
}

// A prompt of n characters (the testbeds' vocabulary is one token per character).
std::string Prompt(int n) {
  std::string p;
  const std::string words = "the quick brown fox jumps over the lazy dog ";
  while (static_cast<int>(p.size()) < n) p += words;
  return p.substr(0, n);
}

// Overwrites every archived record of the vestige archive files with junk (the 48-byte header
// and each record's first 16 bytes stay): every row then fails its checksum.
void DamageArchives(Policy& p) {
  auto& v = dynamic_cast<VestigePolicy&>(p);
  for (int l = 0; l < v.n_layers(); ++l) {
    if (!v.is_mla(l)) continue;
    const std::string path = v.archive_path(l);
    if (path.empty()) continue;
    const auto size = static_cast<long>(fs::file_size(path));
    std::FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr) << path;
    std::fseek(f, 64, SEEK_SET);
    const std::vector<char> junk(static_cast<size_t>(std::max(0L, size - 64)), 0x5a);
    std::fwrite(junk.data(), 1, junk.size(), f);
    std::fclose(f);
  }
}

TEST(CliFaultTest, UnreadableArchiveStopsGenerateWithTheCause) {
  const std::string dir = fs::temp_directory_path() / ("strata_fault_" + std::to_string(getpid()));
  fs::create_directories(dir);
  // Damaged at the first decode step (a prompt's pages are written at its compression point):
  // the step cannot read the archived rows it needs, and the run must stop, not answer from the
  // rows it could read.
  ScopedWrapper wrap(nullptr, DamageArchives);
  const CliResult r = Strata({"generate", "-m", Model("nope-mla.gguf"), "--policy",
                           "vestige@256:block=256:kappa=4:archive=file:" + dir, "-p", Prompt(700),
                           "-n", "4", "--threads", "1"});
  EXPECT_NE(r.code, 0) << r.out << r.err;
  for (const char* part : {"error: decode: DATA_LOSS: policy 'vestige': layer ", "read: query at",
                           "archived row", "cannot be read back: archive '", "checksum mismatch"}) {
    EXPECT_NE(r.err.find(part), std::string::npos) << part << " in\n" << r.err;
  }
  fs::remove_all(dir);
}

TEST(CliFaultTest, FailedDemotionStopsEvalWithTheCause) {
  ScopedWrapper wrap(nullptr, [](Policy& p) {
    dynamic_cast<GeodesiaPolicy&>(p).FailNextDemotionForTesting(
        Internal("block payload could not be re-encoded"));
  });
  const CliResult r = Strata({"generate", "-m", Model("gqa.gguf"), "--policy", "geodesia@2", "-p",
                           Prompt(700), "-n", "4", "--threads", "1"});
  EXPECT_NE(r.code, 0) << r.out << r.err;
  for (const char* part : {"error: decode: INTERNAL: policy 'geodesia': layer 0, read: query at",
                           "demotion of block", "of KV head",
                           "block payload could not be re-encoded"}) {
    EXPECT_NE(r.err.find(part), std::string::npos) << part << " in\n" << r.err;
  }
}

}  // namespace
}  // namespace strata::cli
