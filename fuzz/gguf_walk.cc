#include "fuzz/gguf_walk.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/tokenizer.h"
#include "model/config.h"

namespace strata::fuzz {

namespace {

// Keeps a computed value alive so the optimiser cannot drop the read that produced it.
volatile uint64_t g_sink = 0;

void Touch(const TensorView& t, uint64_t n_bytes) {
  if (n_bytes == 0) return;
  const auto* p = static_cast<const uint8_t*>(t.data);
  g_sink = g_sink + p[0] + p[n_bytes - 1];
}

void WalkTokenizer(const Tokenizer& tok, std::string_view text) {
  const std::string texts[] = {"", "Hello world", " leading and  double  spaces\n\ttabs",
                               "caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x98\x80 \xff\xfe", "<s></s><unk>",
                               std::string(text)};
  for (const std::string& s : texts) {
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok.Encode(s, /*with_bos=*/true, special);
      for (int32_t id : ids) {
        // Encode must only produce ids of the vocabulary.
        if (!tok.CheckId(id).ok()) {
          std::fprintf(stderr, "Encode produced id %d outside the vocabulary of %d\n", id,
                       tok.vocab_size());
          std::abort();
        }
      }
      g_sink = g_sink + tok.Decode(ids).size();
    }
  }
  // Ids the caller may pass: every id of a small vocabulary, the edges, and out-of-range ones.
  const int32_t n = tok.vocab_size();
  std::vector<int32_t> ids = {-1, n, n + 1, 0, n - 1};
  for (int32_t i = 0; i < n && i < 300; ++i) ids.push_back(i);
  g_sink = g_sink + tok.Decode(ids).size();
  for (int32_t id : ids) {
    g_sink = g_sink + tok.DecodeToken(id).size() + static_cast<int>(tok.token_type(id));
    if (tok.CheckId(id).ok()) g_sink = g_sink + tok.TokenId(tok.token_text(id));
  }
  g_sink = g_sink + tok.unk_id() + tok.pad_id() + tok.bos_id() + tok.eos_id();
}

}  // namespace

void WalkGguf(const GgufFile& f, std::string_view text) {
  for (const auto& [key, v] : f.metadata()) {
    g_sink = g_sink + v.DebugString().size();
    if (v.IsInteger()) g_sink = g_sink + static_cast<uint64_t>(v.AsInt());
    g_sink = g_sink + f.GetString(key).ok() + f.GetInt(key).ok() + f.GetFloat(key).ok() +
             f.GetBool(key).ok() + f.GetStringArray(key).ok() + f.GetIntArray(key).ok() +
             f.GetFloatArray(key).ok();
    g_sink = g_sink + f.GetIntOr(key, 0).ok() + f.GetBoolOr(key, false).ok() +
             f.GetStringOr(key, "").ok() + f.GetFloatOr(key, 0).ok() +
             f.GetIntIn(key, 0, 1 << 20).ok() + f.GetIntInOr(key, 1, -5, 5).ok();
    // Walk arrays element by element (the packed and string stores).
    for (size_t j = 0; j < v.size() && j < 64; ++j) g_sink = g_sink + v.at(j).DebugString().size();
  }
  for (const GgufTensorInfo& info : f.tensors()) {
    auto t = f.Tensor(info.name);
    if (!t.ok()) continue;
    Touch(*t, info.n_bytes);
    g_sink = g_sink + t->ShapeString().size();
  }
  auto cfg = ModelConfig::FromGguf(f);
  if (cfg.ok()) g_sink = g_sink + cfg->Summary().size();
  if (!f.Has("tokenizer.ggml.model")) return;
  auto tok = Tokenizer::FromGguf(f);
  if (tok.ok()) WalkTokenizer(**tok, text);
}

}  // namespace strata::fuzz
