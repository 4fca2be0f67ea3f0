// Test-only: where the test references live outside the repository's tracked files (the shared
// fixtures, the Python virtual environment scripts/setup.sh makes, the real models it fetches), and
// the rule every test that needs them follows: skip on a developer machine without them, fail
// under CI (the CI variable set), where scripts/setup.sh must have provided them.
// Include from *_test.cc only: it reads STRATA_SOURCE_DIR, which only the test binaries define.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace strata::testing_refs {

// $STRATA_FIXTURES, else ../shared/fixtures beside the checkout (the real tokenizer.json files).
inline std::string FixturesDir() {
  const char* env = std::getenv("STRATA_FIXTURES");
  return env != nullptr && *env != '\0' ? std::string(env)
                                        : std::string(STRATA_SOURCE_DIR) + "/../shared/fixtures";
}

// The virtual environment's python ($STRATA_VENV/bin/python, default .venv/ in the checkout), or
// "" when it or `module` (e.g. "openai") is absent.
inline std::string VenvPython(const std::string& module) {
  const char* env = std::getenv("STRATA_VENV");
  const std::string venv =
      env != nullptr && *env != '\0' ? std::string(env) : std::string(STRATA_SOURCE_DIR) + "/.venv";
  const std::string python = venv + "/bin/python";
  if (!std::filesystem::exists(python)) return "";
  const std::string cmd = "'" + python + "' -c 'import " + module + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0 ? python : "";
}

// The folder scripts/fetch_models.sh places the real GGUFs in: $STRATA_MODELS, else
// $XDG_CACHE_HOME/strata/models, else ~/.cache/strata/models.
inline std::string ModelsDir() {
  if (const char* env = std::getenv("STRATA_MODELS"); env != nullptr && *env != '\0') return env;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/strata/models";
  }
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "/root") + "/.cache/strata/models";
}

inline bool UnderCi() { return std::getenv("CI") != nullptr; }

}  // namespace strata::testing_refs

// In a TEST body: skip (developer machine) or fail (CI) when `missing` is true.
#define STRATA_NEED_REF(missing, what)                                                   \
  if (missing) {                                                                         \
    if (::strata::testing_refs::UnderCi()) {                                             \
      FAIL() << what << " is absent under CI: scripts/setup.sh must provide it";         \
    }                                                                                    \
    GTEST_SKIP() << what << " is absent: run scripts/setup.sh";                          \
  }
