// The soak and fault test (tools/ref/soak.py) at CI size: the real `strata serve` under 16
// concurrent clients of the official openai package, with clients that vanish mid-stream and
// mid-request, slow clients, oversize and deep bodies, a KV budget met on purpose and SIGTERM
// during load; afterwards every slot is free, RSS within 64 MiB of its start, no archive file
// left and every completed response equal to its solo run. The longer run is in docs/serve.md.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "core/test_refs.h"

namespace strata::serve {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

// Under AddressSanitizer freed memory waits in a quarantine (256 MiB by default) before it is
// reused, and its shadow grows with the heap, so RSS after the load says nothing about leaks:
// the server runs with a 16 MiB quarantine and the bound covers it and the shadow (LeakSanitizer
// checks leaks at the server's exit, which soak.py requires to be 0).
std::string Environment() {
  if (!kAddressSanitizer) return "";
  const char* o = getenv("ASAN_OPTIONS");
  return std::string("ASAN_OPTIONS='") + (o ? std::string(o) + ":" : "") +
         "quarantine_size_mb=16' ";
}

TEST(ServeSoakTest, FaultsUnderLoadLeaveNothingBehindAndAnswersEqualSoloRuns) {
  const std::string python = testing_refs::VenvPython("openai");
  STRATA_NEED_REF(python.empty(), "the openai Python client (.venv)");
  const std::string cmd = Environment() + python + " " + STRATA_SOURCE_DIR + "/tools/ref/soak.py --strata " +
                          STRATA_BIN + " --model " + STRATA_SOURCE_DIR +
                          "/models/nope-mla.gguf --requests 96 --streams 16" +
                          (kAddressSanitizer ? " --rss-bound 128" : "") + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  EXPECT_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0) << out;
  const size_t last = out.rfind("{\"requests\"");
  ASSERT_NE(last, std::string::npos) << out;
  const nlohmann::json j = nlohmann::json::parse(out.substr(last), nullptr, false);
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j["failures"], 0) << out;
  EXPECT_EQ(j["solo_mismatches"], 0) << out;
  EXPECT_GT(j["completed"].get<int>(), 0);
  EXPECT_GT(j["archive_files_before_sigterm"].get<int>(), 0);
  for (const char* fault : {"vanish_mid_stream", "vanish_mid_request", "slow_client",
                            "oversize_body", "deep_body", "budget_stop"}) {
    ASSERT_TRUE(j["faults"].contains(fault)) << fault;
    EXPECT_EQ(j["faults"][fault][0], j["faults"][fault][1]) << fault;
  }
}

}  // namespace
}  // namespace strata::serve
