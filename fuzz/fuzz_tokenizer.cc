// libFuzzer target: an HF tokenizer.json loaded as `strata tokenize --tokenizer-json` loads it
// (Tokenizer::FromHfJson, with a tokenizer_config.json beside it when the input has one), then
// text taken from the input encoded and decoded. The input packs up to three parts separated by
// kFileSeparator (fuzz/fuzz_util.h): tokenizer.json, the text, and tokenizer_config.json.
//
// Checked beyond "no crash, no sanitizer report":
// - Encode (with and without BOS, with and without special-token parsing) gives only ids of the
//   vocabulary (Tokenizer::CheckId); eog_ids() is sorted and in the vocabulary.
// - On a byte-level BPE pipeline that keeps every byte (no normalizer, ByteLevel pre-tokenizer
//   without add_prefix_space, optionally after Isolated Split steps; BPE without unk_token,
//   subword prefix or suffix, covering all 256 byte characters; ByteLevel decoder; added tokens
//   without lstrip/rstrip), the round trip io/tokenizer.h documents for a tokenizer.json:
//   Decode(Encode(x)) == x with each invalid UTF-8 sequence read as U+FFFD
//   (ReplaceInvalidUtf8), and the streamed DecodeToken pieces concatenate to the same text.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "io/hf_tokenizer.h"
#include "io/json_input.h"
#include "io/tokenizer.h"

namespace {

using nlohmann::json;

volatile uint64_t g_sink = 0;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_tokenizer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

bool IsNullOr(const json& j, const char* key, const json& allowed) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() || *it == allowed;
}

bool IsLosslessByteLevelPre(const json& p) {
  if (!p.is_object()) return false;
  const auto type = p.find("type");
  if (type == p.end() || !type->is_string()) return false;
  if (*type == "ByteLevel") {
    // HF's default is add_prefix_space true: only an explicit false keeps the text as it is.
    const auto aps = p.find("add_prefix_space");
    return aps != p.end() && *aps == false;
  }
  if (*type != "Sequence") return false;
  const auto steps = p.find("pretokenizers");
  if (steps == p.end() || !steps->is_array() || steps->empty()) return false;
  for (size_t i = 0; i < steps->size(); ++i) {
    const json& s = (*steps)[i];
    if (i + 1 == steps->size()) return IsLosslessByteLevelPre(s) && s["type"] == "ByteLevel";
    if (!s.is_object() || s.value("type", json()) != "Split" ||
        s.value("behavior", json()) != "Isolated" || !IsNullOr(s, "invert", false)) {
      return false;
    }
  }
  return false;
}

// Whether `j` (a tokenizer.json that loaded) is a pipeline whose round trip is lossless.
bool IsLosslessByteLevel(const json& j, const strata::Tokenizer& tok) {
  if (!j.is_object()) return false;
  const auto norm = j.find("normalizer");
  if (norm != j.end() && !norm->is_null()) {
    if (!norm->is_object() || norm->value("type", json()) != "Sequence") return false;
    const auto list = norm->find("normalizers");
    if (list == norm->end() || !list->is_array() || !list->empty()) return false;
  }
  const auto pre = j.find("pre_tokenizer");
  if (pre == j.end() || !IsLosslessByteLevelPre(*pre)) return false;
  const auto dec = j.find("decoder");
  if (dec == j.end() || !dec->is_object() || dec->value("type", json()) != "ByteLevel") {
    return false;
  }
  const auto model = j.find("model");
  if (model == j.end() || !model->is_object() || model->value("type", json()) != "BPE") {
    return false;
  }
  if (!IsNullOr(*model, "unk_token", nullptr) || !IsNullOr(*model, "continuing_subword_prefix", "") ||
      !IsNullOr(*model, "end_of_word_suffix", "")) {
    return false;
  }
  // Model ids used once each, and an added token that shares an id with a model token has its
  // text (else the id would print the other text).
  const auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object()) return false;
  std::set<int64_t> ids;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer() || !ids.insert(it->get<int64_t>()).second) return false;
  }
  const auto added = j.find("added_tokens");
  if (added != j.end() && !added->is_null()) {
    if (!added->is_array()) return false;
    for (const json& a : *added) {
      if (!a.is_object() || !IsNullOr(a, "lstrip", false) || !IsNullOr(a, "rstrip", false)) {
        return false;
      }
      const json id = a.value("id", json());
      const json content = a.value("content", json());
      if (!id.is_number_integer() || !content.is_string()) return false;
      if (ids.count(id.get<int64_t>())) {
        const auto v = vocab->find(content.get<std::string>());
        if (v == vocab->end() || *v != id) return false;
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    if (tok.TokenId(strata::Gpt2ByteChar(static_cast<uint8_t>(b))) < 0) return false;
  }
  return true;
}

std::string Hex(std::string_view s) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    std::snprintf(buf, sizeof(buf), "%02x", c);
    out += buf;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = strata::fuzz::ScratchDir();
  const std::vector<std::string_view> parts = strata::fuzz::SplitParts(data, size, 3);
  const std::string path = dir + "/tokenizer.json";
  const std::string cfg = dir + "/tokenizer_config.json";
  strata::fuzz::WriteFileOrDie(path, parts[0]);
  if (parts.size() > 2) {
    strata::fuzz::WriteFileOrDie(cfg, parts[2]);
  } else {
    unlink(cfg.c_str());
  }
  auto loaded = strata::Tokenizer::FromHfJson(path);
  if (std::getenv("STRATA_FUZZ_VERBOSE")) {
    std::fprintf(stderr, "fuzz_tokenizer: load: %s\n",
                 loaded.ok() ? "ok" : loaded.status().ToString().c_str());
  }
  if (!loaded.ok()) return 0;
  const strata::Tokenizer& tok = **loaded;
  const std::string text(parts.size() > 1 ? parts[1] : std::string_view());
  const int32_t n = tok.vocab_size();

  const std::vector<int32_t>& eog = tok.eog_ids();
  if (!std::is_sorted(eog.begin(), eog.end())) Fail("eog_ids() is not sorted", "");
  for (int32_t id : eog) {
    if (!tok.CheckId(id).ok()) Fail("eog id outside the vocabulary", std::to_string(id));
  }
  for (bool with_bos : {false, true}) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok.Encode(text, with_bos, special);
      for (int32_t id : ids) {
        if (!tok.CheckId(id).ok()) {
          Fail("Encode produced an id outside the vocabulary",
               std::to_string(id) + " of " + std::to_string(n) + ", text " + Hex(text));
        }
      }
      g_sink = g_sink + tok.Decode(ids).size() + tok.Decode(ids, true).size();
      for (int32_t id : ids) {
        g_sink = g_sink + tok.DecodeToken(id).size() + tok.DecodeToken(id, true).size() +
                 tok.IsEog(id);
      }
    }
  }
  // Ids straight from the text bytes, out-of-range ones included (Decode skips them).
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 4 <= text.size() && raw.size() < 64; i += 4) {
    int32_t v;
    std::memcpy(&v, text.data() + i, 4);
    raw.push_back(static_cast<int32_t>(v % (int64_t{n} + 2)));
  }
  g_sink = g_sink + tok.Decode(raw).size() + tok.Decode(raw, true).size();

  auto j = strata::ParseUntrustedJson(parts[0], "tokenizer.json");
  if (!j.ok()) Fail("the tokenizer.json loaded but does not parse on its own", "");
  if (IsLosslessByteLevel(*j, tok)) {
    if (std::getenv("STRATA_FUZZ_VERBOSE")) std::fprintf(stderr, "fuzz_tokenizer: round trip\n");
    const std::vector<int32_t> ids = tok.Encode(text, /*with_bos=*/false, /*parse_special=*/false);
    const std::string want = strata::ReplaceInvalidUtf8(text);
    const std::string back = tok.Decode(ids);
    if (back != want) {
      Fail("Decode(Encode(x)) != x on a lossless byte-level pipeline",
           "text " + Hex(text) + "\nback " + Hex(back));
    }
    std::string streamed;
    for (int32_t id : ids) streamed += tok.DecodeToken(id);
    if (streamed != want) {
      Fail("the DecodeToken pieces do not give the text back on a lossless byte-level pipeline",
           "text " + Hex(text) + "\nstreamed " + Hex(streamed));
    }
  }
  return 0;
}
