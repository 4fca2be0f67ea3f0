// libFuzzer target: a GGUF image (parse, every metadata getter, tensor views, model config,
// tokenizer build, tokenize/detokenize). The input is the whole file.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "fuzz/gguf_walk.h"
#include "io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  auto f = strata::GgufFile::FromBuffer(std::move(bytes), "fuzz.gguf");
  if (!f.ok()) return 0;
  // Text for the tokenizer: the file's last bytes (mutations reach them without breaking the
  // header; for most inputs they are tensor data, i.e. arbitrary bytes).
  const size_t n = size < 64 ? size : 64;
  strata::fuzz::WalkGguf(**f, std::string_view(reinterpret_cast<const char*>(data + size - n), n));
  return 0;
}
