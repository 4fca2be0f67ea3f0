// libFuzzer target: a Hugging Face model directory through conversion. The input packs up to
// three files separated by kFileSeparator (fuzz/fuzz_util.h): config.json, model.safetensors and,
// when present, strata_tokenizer.json. They are written to a scratch directory, converted like
// `strata inspect DIR` does (ConvertHfDirectory to F32, the tokenizer keys added, the GGUF image
// re-read) and the result is walked like a GGUF input.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "fuzz/gguf_walk.h"
#include "io/gguf.h"
#include "io/hf.h"
#include "io/tokenizer_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = strata::fuzz::ScratchDir();
  const std::vector<std::string_view> parts = strata::fuzz::SplitParts(data, size, 3);
  strata::fuzz::WriteFileOrDie(dir + "/config.json", parts[0]);
  strata::fuzz::WriteFileOrDie(dir + "/model.safetensors", parts.size() > 1 ? parts[1] : "");
  const std::string tok = dir + "/" + strata::kTokenizerJsonName;
  if (parts.size() > 2) {
    strata::fuzz::WriteFileOrDie(tok, parts[2]);
  } else {
    unlink(tok.c_str());
  }
  strata::HfConvertOptions opts;
  opts.out_dtype = strata::DType::kF32;
  auto w = strata::ConvertHfDirectory(dir, opts);
  if (!w.ok()) return 0;
  if (parts.size() > 2 && !strata::AddTokenizerJson(tok, &*w).ok()) return 0;
  auto f = strata::GgufFile::FromBuffer(w->ToBytes(), dir);
  if (!f.ok()) return 0;
  strata::fuzz::WalkGguf(**f, parts[0].substr(0, 64));
  return 0;
}
