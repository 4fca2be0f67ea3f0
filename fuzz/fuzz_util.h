// Helpers shared by the libFuzzer targets: fuzz bytes as a file path (memfd), a scratch directory
// and splitting one input into several files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::fuzz {

// An anonymous in-memory file (memfd) holding the bytes of one input. The readers under test open
// files by path, so path() names it through /proc/self/fd: no disk I/O per execution, nothing left
// behind when the fuzzer is killed.
class MemFile {
 public:
  MemFile();
  ~MemFile();
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  // Replaces the file's contents (truncates first, so a shorter input leaves no stale tail).
  void Set(const uint8_t* data, size_t size);
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A directory made once per process (mkdtemp under $TMPDIR or /tmp), removed at a normal exit
// (libFuzzer's own exits skip destructors, so scripts/fuzz.sh points TMPDIR at a folder it clears).
const std::string& ScratchDir();

// Writes `bytes` to `path` (replacing it); aborts when the write fails, since a harness that
// silently fuzzed nothing would report coverage it never had.
void WriteFileOrDie(const std::string& path, std::string_view bytes);

// The separator between the files packed in one HF-directory input (see fuzz_hf_dir.cc): a line
// no JSON file or safetensors header of the corpus contains.
inline constexpr std::string_view kFileSeparator = "\n--strata-fuzz-file--\n";

// Splits `data` at each kFileSeparator (at most `max_parts` parts; the last part keeps the rest).
std::vector<std::string_view> SplitParts(const uint8_t* data, size_t size, size_t max_parts);

}  // namespace strata::fuzz
