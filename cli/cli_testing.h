// Test helper: runs a `strata` command line in-process (RunStrata) and keeps its exit code and
// both streams.
#pragma once

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

}  // namespace strata::cli
