// Test helper: runs a `strata` command line in-process (RunStrata) and keeps its exit code and
// both streams.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace strata::cli {

struct CliResult {
  int code = -1;
  std::string out, err;
};

inline CliResult Strata(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  CliResult r;
  r.code = RunStrata(args, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// The same with `stdin_text` as the command's standard input (as from a pipe: never a terminal).
inline CliResult Strata(const std::vector<std::string>& args, const std::string& stdin_text) {
  std::istringstream in(stdin_text);
  std::ostringstream out, err;
  CliResult r;
  r.code = RunStrata(args, in, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// A test suite with its own temporary folder holding a synthesized tiny llama (Path("tiny.gguf"),
// `strata synth --arch llama --seed 7`), removed after the suite. Derive as
// `class FooTest : public TinyModelSuite<FooTest>` and give FooTest a `static constexpr const
// char* kDirPrefix`.
template <typename Suite>
class TinyModelSuite : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(std::filesystem::temp_directory_path() /
                           (std::string(Suite::kDirPrefix) + std::to_string(getpid())));
    std::filesystem::create_directories(*dir_);
    CliResult r = Strata({"synth", "--arch", "llama", "--seed", "7", "-o", Path("tiny.gguf")});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(*dir_, ec);
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Path(const std::string& name) { return *dir_ + "/" + name; }
  static inline std::string* dir_ = nullptr;
};

}  // namespace strata::cli
