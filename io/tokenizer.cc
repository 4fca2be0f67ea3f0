// Tokenizer: SentencePiece-style BPE over scores ("llama", llama.cpp's llm_tokenizer_spm) and the
// HF tokenizer.json pipeline (io/hf_tokenizer.h) for GGUF "gpt2" and tokenizer.json files.
#include "io/tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <list>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/check.h"
#include "core/utf8.h"
#include "io/gguf.h"
#include "io/hf_tokenizer.h"
#include "io/json_input.h"
#include "io/pretokenizer_types.h"
#include "io/regex_split.h"

namespace strata {
namespace {

constexpr const char kSpmSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's word marker

// One code point of the input with its byte span. Invalid UTF-8 yields one-byte units with
// cp = kInvalidCodePoint so the bytes survive pre-tokenization unchanged.
struct CodeUnit {
  uint32_t cp;
  size_t begin, len;
};

std::vector<CodeUnit> DecodeUtf8(const std::string& s) {
  std::vector<CodeUnit> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const Utf8Char c = DecodeUtf8At(s, i);
    out.push_back({c.cp, i, c.len});
    i += c.len;
  }
  return out;
}

// A symbol of the merge loop: a byte span [begin, begin+n) of the working string, linked to its
// live neighbours. n == 0 once merged into its left neighbour.
struct Symbol {
  int prev, next;
  size_t begin, n;
};

void LinkSymbols(std::vector<Symbol>* symbols) {
  const int count = static_cast<int>(symbols->size());
  for (int i = 0; i < count; ++i) {
    (*symbols)[i].prev = i - 1;
    (*symbols)[i].next = i + 1 < count ? i + 1 : -1;
  }
}

void MergeInto(std::vector<Symbol>* symbols, int left, int right) {
  Symbol& l = (*symbols)[left];
  Symbol& r = (*symbols)[right];
  l.n += r.n;
  r.n = 0;
  l.next = r.next;
  if (r.next >= 0) (*symbols)[r.next].prev = left;
}

// Transparent hash so that lookups by string_view do not allocate.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};

// Parses "<0xNN>" into NN, or -1.
int ParseByteToken(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = t[k];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return -1;
    }
    v = v * 16 + d;
  }
  return v;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const uint8_t c = static_cast<uint8_t>(ch);
    if (c < 0x20 || c == 0x7F || c == '"' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    } else {
      out.push_back(ch);
    }
  }
  return out + "\"";
}

}  // namespace

struct Tokenizer::Impl {
  Kind kind = Kind::kSentencePiece;
  std::vector<std::string> tokens;
  std::vector<float> scores;     // [n_vocab]
  std::vector<TokenType> types;  // [n_vocab]
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id;
  std::array<int32_t, 256> byte_token{};  // SPM: id of <0xNN> (or of the raw byte), -1 if none
  std::vector<int32_t> special_ids;       // SPM: control/unknown/user-defined, longest text first
  // "gpt2" and tokenizer.json: the pipeline that encodes and decodes (SPM: null).
  std::shared_ptr<const HfTokenizer> hf;
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = false;
  bool add_space_prefix = false;
  std::string pre;

  int32_t Find(std::string_view s) const {
    if (hf && kind == Kind::kTokenizerJson) return hf->TokenId(s);  // the pipeline has the texts
    const auto it = token_to_id.find(s);
    return it == token_to_id.end() ? -1 : it->second;
  }
  // The text of a valid id (tokenizer.json: from the pipeline).
  const std::string& Text(int32_t id) const {
    return kind == Kind::kTokenizerJson ? hf->token_text(id) : tokens[id];
  }

  void EncodeSpm(const std::string& raw, bool prefix_space, std::vector<int32_t>* out) const;
  // Appends the printed text of `id`; false when it prints nothing.
  void AppendPiece(int32_t id, std::string* out) const;
};

// ---- SentencePiece (llm_tokenizer_spm) ----

void Tokenizer::Impl::EncodeSpm(const std::string& raw, bool prefix_space,
                                std::vector<int32_t>* out) const {
  std::string text;
  text.reserve(raw.size() * 2 + 3);
  if (prefix_space) text += kSpmSpace;
  for (const char c : raw) {
    if (c == ' ') {
      text += kSpmSpace;
    } else {
      text.push_back(c);
    }
  }
  if (text.empty()) return;

  // One symbol per UTF-8 character. llama.cpp splits by the lead byte's length alone; splitting
  // on validated characters is the same for valid UTF-8 and keeps a stray byte from swallowing
  // the following U+2581 (which would then decode as the marker instead of a space).
  std::vector<Symbol> symbols;
  for (const CodeUnit& u : DecodeUtf8(text)) symbols.push_back({0, 0, u.begin, u.len});
  LinkSymbols(&symbols);

  struct Bigram {
    int left, right;
    float score;
    size_t size;
  };
  // Highest score first; ties: leftmost first.
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t size = symbols[left].n + symbols[right].n;
    const int32_t id = Find(std::string_view(text).substr(symbols[left].begin, size));
    if (id < 0) return;
    queue.push({left, right, scores[id], size});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    const Symbol& l = symbols[b.left];
    const Symbol& r = symbols[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
    MergeInto(&symbols, b.left, b.right);
    try_add(symbols[b.left].prev, b.left);
    try_add(b.left, symbols[b.left].next);
  }

  for (int i = 0; i != -1; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const std::string piece = text.substr(s.begin, s.n);
    const int32_t id = Find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    // Not in the vocabulary (only unmerged characters reach here): byte fallback, else unk.
    for (const char c : piece) {
      const int32_t b = byte_token[static_cast<uint8_t>(c)];
      if (b >= 0) {
        out->push_back(b);
      } else if (unk >= 0) {
        out->push_back(unk);
      }
    }
  }
}

void Tokenizer::Impl::AppendPiece(int32_t id, std::string* out) const {
  if (id < 0 || id >= static_cast<int32_t>(types.size())) return;
  if (hf) {  // control, unknown and unused tokens print nothing; the rest through the decoder
    const TokenType t = types[id];
    if (t != TokenType::kControl && t != TokenType::kUnknown && t != TokenType::kUnused) {
      *out += hf->DecodeToken(id);
    }
    return;
  }
  const std::string& text = tokens[id];
  switch (types[id]) {
    case TokenType::kControl:
    case TokenType::kUnknown:
    case TokenType::kUnused:
      return;
    case TokenType::kUserDefined:
      *out += text;
      return;
    case TokenType::kByte: {
      const int b = ParseByteToken(text);
      if (b >= 0) {
        out->push_back(static_cast<char>(b));
      } else {
        *out += text;
      }
      return;
    }
    default:
      break;
  }
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 3, kSpmSpace) == 0) {
      out->push_back(' ');
      i += 3;
    } else {
      out->push_back(text[i++]);
    }
  }
}

// ---- Construction ----

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromData(TokenizerData data) {
  auto impl = std::make_shared<Impl>();
  if (data.model == "llama") {
    impl->kind = Kind::kSentencePiece;
  } else if (data.model == "gpt2") {
    impl->kind = Kind::kBytePairGpt2;
  } else {
    return Unimplemented("tokenizer.ggml.model = " + Quote(data.model) +
                         " is not supported (expected \"llama\" or \"gpt2\")");
  }
  const size_t n = data.tokens.size();
  if (n == 0) return InvalidArgument("tokenizer.ggml.tokens is empty");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return InvalidArgument("tokenizer.ggml.tokens has " + std::to_string(n) +
                           " entries, more than int32 ids can address");
  }
  const int32_t n_vocab = static_cast<int32_t>(n);
  if (!data.scores.empty() && data.scores.size() != n) {
    return InvalidArgument("tokenizer.ggml.scores has " + std::to_string(data.scores.size()) +
                           " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }
  if (!data.token_types.empty() && data.token_types.size() != n) {
    return InvalidArgument("tokenizer.ggml.token_type has " +
                           std::to_string(data.token_types.size()) +
                           " entries but tokenizer.ggml.tokens has " + std::to_string(n));
  }
  const std::pair<const char*, int32_t> specials[] = {
      {"tokenizer.ggml.bos_token_id", data.bos},
      {"tokenizer.ggml.eos_token_id", data.eos},
      {"tokenizer.ggml.unknown_token_id", data.unk},
      {"tokenizer.ggml.padding_token_id", data.pad},
      {"tokenizer.ggml.eot_token_id", data.eot},
      {"tokenizer.ggml.eom_token_id", data.eom},
      {"tokenizer.ggml.fim_pad_token_id", data.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", data.fim_rep},
      {"tokenizer.ggml.fim_sep_token_id", data.fim_sep},
  };
  for (const auto& [key, id] : specials) {
    if (id < -1 || id >= n_vocab) {
      return InvalidArgument(std::string(key) + " = " + std::to_string(id) +
                             " is out of range for a vocabulary of " + std::to_string(n) +
                             " tokens");
    }
  }

  impl->scores = data.scores.empty() ? std::vector<float>(n, 0.0f) : std::move(data.scores);
  impl->types.resize(n, TokenType::kNormal);
  if (!data.token_types.empty()) {
    for (size_t i = 0; i < n; ++i) {
      const int32_t t = data.token_types[i];
      if (t < 0 || t > 6) {
        return InvalidArgument("tokenizer.ggml.token_type[" + std::to_string(i) +
                               "] = " + std::to_string(t) + " is not a token type (0..6)");
      }
      impl->types[i] = static_cast<TokenType>(t);
    }
  } else {
    // No types stored: infer what decoding needs.
    for (size_t i = 0; i < n; ++i) {
      if (impl->kind == Kind::kSentencePiece && ParseByteToken(data.tokens[i]) >= 0) {
        impl->types[i] = TokenType::kByte;
      }
    }
    for (const int32_t id : {data.bos, data.eos, data.pad, data.eot, data.eom}) {
      if (id >= 0) impl->types[id] = TokenType::kControl;
    }
    if (data.unk >= 0) impl->types[data.unk] = TokenType::kUnknown;
  }

  impl->token_to_id.reserve(n * 2);
  for (int32_t i = 0; i < n_vocab; ++i) impl->token_to_id[data.tokens[i]] = i;  // last wins

  impl->byte_token.fill(-1);
  if (impl->kind == Kind::kSentencePiece) {
    for (int b = 0; b < 256; ++b) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
      int32_t id = impl->Find(buf);
      if (id < 0) id = impl->Find(std::string(1, static_cast<char>(b)));
      impl->byte_token[b] = id;
    }
  }

  if (impl->kind == Kind::kBytePairGpt2) {
    if (data.merges.empty()) {
      // Without merges every byte must be a token of its own.
      for (int b = 0; b < 256; ++b) {
        const std::string& ch = Gpt2ByteChar(static_cast<uint8_t>(b));
        if (impl->Find(ch) < 0) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "0x%02X", b);
          return InvalidArgument(
              std::string("gpt2 tokenizer has no tokenizer.ggml.merges and lacks the token for "
                          "byte ") +
              buf + " (" + Quote(ch) + ")");
        }
      }
    }
    auto regexes = PreTokenizerRegexes(data.pre);
    if (!regexes.ok()) return regexes.status().WithContext("tokenizer.ggml.pre");
    ByteLevelBpeSpec spec;
    spec.tokens = data.tokens;
    spec.merges = std::move(data.merges);
    spec.regexes = std::move(*regexes);
    spec.ignore_merges = PreTokenizerIgnoresMerges(data.pre);
    spec.unk = data.unk;
    for (int32_t i = 0; i < n_vocab; ++i) {
      const TokenType t = impl->types[i];
      if (data.tokens[i].empty()) continue;
      if (t == TokenType::kControl || t == TokenType::kUnknown) {
        spec.added.push_back({i, data.tokens[i], /*special=*/true, false, false, false, false});
      } else if (t == TokenType::kUserDefined) {
        spec.added.push_back({i, data.tokens[i], /*special=*/false, false, false, false, false});
      }
    }
    ASSIGN_OR_RETURN(impl->hf, HfTokenizer::FromByteLevelBpe(std::move(spec)));
  }

  for (int32_t i = 0; i < n_vocab; ++i) {
    const TokenType t = impl->types[i];
    if ((t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUserDefined) &&
        !data.tokens[i].empty()) {
      impl->special_ids.push_back(i);
    }
  }
  std::stable_sort(impl->special_ids.begin(), impl->special_ids.end(), [&](int32_t a, int32_t b) {
    return data.tokens[a].size() > data.tokens[b].size();
  });

  impl->bos = data.bos;
  impl->eos = data.eos;
  impl->unk = data.unk;
  impl->pad = data.pad;
  impl->add_bos = data.add_bos;
  impl->add_space_prefix = impl->kind == Kind::kSentencePiece && data.add_space_prefix;
  impl->pre = std::move(data.pre);
  impl->tokens = std::move(data.tokens);

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->kind_ = impl->kind;
  tok->vocab_size_ = n_vocab;
  tok->bos_ = impl->bos;
  tok->eos_ = impl->eos;
  tok->add_bos_ = impl->add_bos;
  tok->impl_ = std::move(impl);
  tok->InitSpecialTokens(data);
  return tok;
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& f) {
  TokenizerData d;
  ASSIGN_OR_RETURN(d.model, f.GetString("tokenizer.ggml.model"));
  ASSIGN_OR_RETURN(d.tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  if (f.Has("tokenizer.ggml.scores")) {
    ASSIGN_OR_RETURN(d.scores, f.GetFloatArray("tokenizer.ggml.scores"));
  }
  if (f.Has("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(std::vector<int64_t> types, f.GetIntArray("tokenizer.ggml.token_type"));
    d.token_types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < INT32_MIN || types[i] > INT32_MAX) {
        return InvalidArgument("tokenizer.ggml.token_type[" + std::to_string(i) +
                               "] = " + std::to_string(types[i]) + " is not a token type");
      }
      d.token_types.push_back(static_cast<int32_t>(types[i]));
    }
  }
  if (f.Has("tokenizer.ggml.merges")) {
    ASSIGN_OR_RETURN(d.merges, f.GetStringArray("tokenizer.ggml.merges"));
  }
  const bool spm = d.model == "llama";
  const int64_t n = static_cast<int64_t>(d.tokens.size());
  struct IdKey {
    const char* key;
    int32_t* dst;
    int64_t def;
  };
  // llama.cpp's defaults for "llama" when the keys are absent (and the ids exist).
  const IdKey ids[] = {
      {"tokenizer.ggml.bos_token_id", &d.bos, spm && n > 1 ? 1 : -1},
      {"tokenizer.ggml.eos_token_id", &d.eos, spm && n > 2 ? 2 : -1},
      {"tokenizer.ggml.unknown_token_id", &d.unk, spm && n > 0 ? 0 : -1},
      {"tokenizer.ggml.padding_token_id", &d.pad, -1},
      {"tokenizer.ggml.eot_token_id", &d.eot, -1},
      {"tokenizer.ggml.eom_token_id", &d.eom, -1},
      {"tokenizer.ggml.fim_pad_token_id", &d.fim_pad, -1},
      {"tokenizer.ggml.fim_rep_token_id", &d.fim_rep, -1},
      {"tokenizer.ggml.fim_sep_token_id", &d.fim_sep, -1},
  };
  for (const IdKey& k : ids) {
    int64_t v = k.def;
    if (f.Has(k.key)) {
      ASSIGN_OR_RETURN(v, f.GetInt(k.key));
      // "No such token": a signed -1 (older Strata files) or u32 0xFFFFFFFF, the bits of
      // llama.cpp's LLAMA_TOKEN_NULL, which Strata writes now because llama.cpp reads ids as u32
      // only (it refuses an i32 key; an out-of-range u32 makes it warn and use its default).
      if (v == 0xFFFFFFFFll && f.Find(k.key)->type == GgufType::kU32) v = -1;
    }
    if (v < -1 || v >= n) {
      return InvalidArgument(std::string(k.key) + " = " + std::to_string(v) +
                             " is out of range for a vocabulary of " + std::to_string(n) +
                             " tokens");
    }
    *k.dst = static_cast<int32_t>(v);
  }
  if (f.Has("tokenizer.ggml.pre")) {
    ASSIGN_OR_RETURN(d.pre, f.GetString("tokenizer.ggml.pre"));
  }
  if (f.Has("tokenizer.ggml.add_bos_token")) {
    ASSIGN_OR_RETURN(d.add_bos, f.GetBool("tokenizer.ggml.add_bos_token"));
  } else {
    // llama.cpp's defaults: SentencePiece adds BOS; byte-level BPE only for some pre types.
    d.add_bos = spm || PreTokenizerAddsBosByDefault(d.pre);
  }
  if (f.Has("tokenizer.ggml.add_space_prefix")) {
    ASSIGN_OR_RETURN(d.add_space_prefix, f.GetBool("tokenizer.ggml.add_space_prefix"));
  } else {
    d.add_space_prefix = spm;
  }
  if (f.Has("tokenizer.chat_template")) {
    ASSIGN_OR_RETURN(d.chat_template, f.GetString("tokenizer.chat_template"));
  }
  return FromData(std::move(d));
}

// ---- tokenizer.json ----

namespace {

StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return NotFound("cannot open " + path);
  const std::streamoff size = f.tellg();
  if (size < 0) return IoError("cannot read " + path);
  std::string text(static_cast<size_t>(size), '\0');
  f.seekg(0);
  if (!f.read(text.data(), size)) return IoError("cannot read " + path);
  return text;
}

// tokenizer_config.json's bos_token & co: a string, an AddedToken object {"content": ...} or
// null/absent (nullopt).
StatusOr<std::optional<std::string>> ConfigToken(const nlohmann::json& cfg, const char* key,
                                                 const std::string& what) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    const auto c = it->find("content");
    if (c != it->end() && c->is_string()) return std::optional<std::string>(c->get<std::string>());
  }
  return InvalidArgument(what + ": " + key + ": expected a string or an AddedToken object " +
                         "with a \"content\" string, got " + BriefJson(*it));
}

StatusOr<std::optional<bool>> ConfigBool(const nlohmann::json& cfg, const char* key,
                                         const std::string& what) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) {
    return InvalidArgument(what + ": " + key + ": expected a boolean, got " + BriefJson(*it));
  }
  return std::optional<bool>(it->get<bool>());
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHfJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  ASSIGN_OR_RETURN(std::shared_ptr<HfTokenizer> hf, HfTokenizer::FromJsonText(text, path));
  text.clear();
  text.shrink_to_fit();
  auto impl = std::make_shared<Impl>();
  impl->kind = Kind::kTokenizerJson;
  const int32_t n = hf->vocab_size();
  if (n <= 0) return InvalidArgument(path + ": the vocabulary is empty");
  // Token texts and the text -> id map stay in the pipeline (token_text and TokenId ask it).
  impl->types.assign(n, TokenType::kNormal);
  for (int32_t i = 0; i < n; ++i) {
    TokenType& t = impl->types[i];
    if (hf->IsSpecial(i)) {
      t = TokenType::kControl;
    } else if (hf->IsAdded(i)) {
      t = TokenType::kUserDefined;
    } else if (i == hf->unk_id()) {
      t = TokenType::kUnknown;
    } else if (hf->IsByteToken(i)) {
      t = TokenType::kByte;
    } else if (hf->token_text(i).empty()) {
      t = TokenType::kUnused;  // an id no token has
    }
  }
  impl->unk = hf->unk_id();
  const std::vector<int32_t>& prefix = hf->prefix_special_ids();
  impl->bos = prefix.size() == 1 ? prefix[0] : -1;
  TokenizerData special;  // what InitSpecialTokens needs: eos and the chat template

  const std::filesystem::path cfg_path =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(cfg_path, ec)) {
    const std::string what = cfg_path.string();
    ASSIGN_OR_RETURN(std::string cfg_text, ReadTextFile(what));
    ASSIGN_OR_RETURN(nlohmann::json cfg, ParseUntrustedJson(cfg_text, what));
    if (!cfg.is_object()) {
      return InvalidArgument(what + ": expected a JSON object, got " + BriefJson(cfg));
    }
    struct Special {
      const char* key;
      int32_t* dst;
    };
    for (const Special& sp : {Special{"bos_token", &impl->bos}, Special{"eos_token", &impl->eos},
                              Special{"pad_token", &impl->pad}, Special{"unk_token", &impl->unk}}) {
      ASSIGN_OR_RETURN(std::optional<std::string> tok, ConfigToken(cfg, sp.key, what));
      if (!tok) continue;
      const int32_t id = hf->TokenId(*tok);  // impl->hf is not set yet
      if (id < 0) {
        return InvalidArgument(what + ": " + sp.key + " = " + Quote(*tok) +
                               " is not a token of " + path);
      }
      *sp.dst = id;
    }
    ASSIGN_OR_RETURN(std::optional<bool> add_bos, ConfigBool(cfg, "add_bos_token", what));
    ASSIGN_OR_RETURN(std::optional<bool> add_eos, ConfigBool(cfg, "add_eos_token", what));
    if (add_bos || add_eos) {
      // transformers' update_post_processor: the template becomes "[bos] $A [eos]"; a flag left
      // out keeps what the tokenizer.json's post-processor did.
      const bool bos_on = add_bos ? *add_bos : !hf->prefix_special_ids().empty();
      const bool eos_on = add_eos ? *add_eos : !hf->suffix_special_ids().empty();
      if (bos_on && impl->bos < 0) {
        return InvalidArgument(what + ": add_bos_token is true but there is no bos_token");
      }
      if (eos_on && impl->eos < 0) {
        return InvalidArgument(what + ": add_eos_token is true but there is no eos_token");
      }
      hf->SetSpecialTemplate(bos_on ? std::vector<int32_t>{impl->bos} : std::vector<int32_t>{},
                             eos_on ? std::vector<int32_t>{impl->eos} : std::vector<int32_t>{});
    }
    const auto ct = cfg.find("chat_template");
    if (ct != cfg.end() && !ct->is_null()) {
      if (ct->is_string()) {
        special.chat_template = ct->get<std::string>();
      } else if (ct->is_array()) {
        for (size_t i = 0; i < ct->size(); ++i) {
          const nlohmann::json& e = (*ct)[i];
          if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
              !e.contains("template") || !e["template"].is_string()) {
            return InvalidArgument(what + ": chat_template[" + std::to_string(i) +
                                   "]: expected {\"name\": string, \"template\": string}, got " +
                                   BriefJson(e));
          }
          if (e["name"].get<std::string>() == "default") {
            special.chat_template = e["template"].get<std::string>();
          }
        }
      } else {
        return InvalidArgument(what + ": chat_template: expected a string or a list of " +
                               "{name, template}, got " + BriefJson(*ct));
      }
    }
  }
  impl->add_bos = !hf->prefix_special_ids().empty();
  impl->hf = std::move(hf);

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->kind_ = impl->kind;
  tok->vocab_size_ = n;
  tok->bos_ = impl->bos;
  tok->eos_ = impl->eos;
  tok->add_bos_ = impl->add_bos;
  special.eos = impl->eos;
  tok->impl_ = std::move(impl);
  tok->InitSpecialTokens(special);
  return tok;
}

// ---- Queries ----

int32_t Tokenizer::unk_id() const { return impl_->unk; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return TokenType::kUndefined;
  return impl_->types[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  STRATA_CHECK_MSG(id >= 0 && id < vocab_size_, "token id %d out of range [0, %d)", id,
                   vocab_size_);
  return impl_->Text(id);
}

int32_t Tokenizer::TokenId(const std::string& text) const { return impl_->Find(text); }

Status Tokenizer::CheckId(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    return InvalidArgument("token id " + std::to_string(id) + " is out of range [0, " +
                           std::to_string(vocab_size()) + ")");
  }
  return OkStatus();
}

// ---- Encode / Decode ----

std::vector<int32_t> Tokenizer::Encode(const std::string& text, bool with_bos) const {
  return Encode(text, with_bos, /*parse_special=*/false);
}

std::vector<int32_t> Tokenizer::Encode(const std::string& text, bool with_bos,
                                       bool parse_special) const {
  const Impl& im = *impl_;
  if (im.kind == Kind::kTokenizerJson) return im.hf->Encode(text, with_bos, parse_special);
  if (im.hf) {  // GGUF "gpt2": BOS from add_bos, the rest by the pipeline
    std::vector<int32_t> out;
    if (with_bos && im.add_bos && im.bos >= 0) out.push_back(im.bos);
    // Invalid UTF-8 becomes U+FFFD per maximal bad sequence before the regexes, as llama.cpp
    // does (and as a tokenizer.json is given text), so the ids are llama.cpp's.
    const std::vector<int32_t> ids = im.hf->Encode(ReplaceInvalidUtf8(text), false, parse_special);
    out.insert(out.end(), ids.begin(), ids.end());
    return out;
  }
  // Fragments: raw text spans, or a matched special token (llama.cpp's tokenizer_st_partition:
  // special tokens are tried longest first, each splitting every remaining raw fragment).
  struct Fragment {
    int32_t token;  // -1: raw text [begin, begin+len)
    size_t begin, len;
  };
  std::list<Fragment> frags;
  if (!text.empty()) frags.push_back({-1, 0, text.size()});
  for (const int32_t sid : im.special_ids) {
    const TokenType t = im.types[sid];
    if (!parse_special && t != TokenType::kUserDefined) continue;
    const std::string& st = im.tokens[sid];
    for (auto it = frags.begin(); it != frags.end(); ++it) {
      if (it->token >= 0) continue;
      size_t pos = it->begin;
      const size_t end = it->begin + it->len;
      const std::string_view upto_end(text.data(), end);  // search this fragment only
      while (true) {
        const size_t hit = upto_end.find(st, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) frags.insert(it, Fragment{-1, pos, hit - pos});
        frags.insert(it, Fragment{sid, hit, st.size()});
        pos = hit + st.size();
      }
      if (pos == it->begin) continue;  // no match in this fragment
      if (pos < end) {
        it->begin = pos;
        it->len = end - pos;
      } else {
        it = std::prev(frags.erase(it));
      }
    }
  }

  std::vector<int32_t> out;
  if (with_bos && im.add_bos && im.bos >= 0) out.push_back(im.bos);
  bool prev_special = true;  // SPM: the space prefix goes before text that starts a segment
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    const std::string raw = text.substr(f.begin, f.len);
    im.EncodeSpm(raw, im.add_space_prefix && prev_special, &out);
    prev_special = false;
  }
  return out;
}

std::vector<std::string> Tokenizer::SplitGpt2Words(const std::string& text) {
  static const RegexSplitter* const kGpt2 = [] {
    auto r = RegexSplitter::Compile(
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+");
    STRATA_CHECK_MSG(r.ok(), "%s", r.status().ToString().c_str());
    return new RegexSplitter(std::move(r).value());
  }();
  std::vector<std::string> words;
  kGpt2->Split(text, SplitBehavior::kIsolated, false, &words);
  return words;
}

std::string Tokenizer::DecodeToken(int32_t id) const {
  std::string s;
  impl_->AppendPiece(id, &s);
  return s;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  return Decode(ids, /*render_special=*/false);
}

// ---- Special tokens: rendering and end of generation ----

namespace {

// Token texts llama.cpp treats as end of generation whatever the metadata says (llama-vocab.cpp,
// special_eog_ids), and the texts it takes as the FIM pad / repo / file-separator tokens when
// their keys are absent (those end generation too).
constexpr const char* kEogTexts[] = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",  // DeepSeek
    "[e~[",
};
constexpr const char* kFimPadTexts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"};
constexpr const char* kFimRepTexts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                        "<reponame>"};
constexpr const char* kFimSepTexts[] = {"<|file_sep|>"};

}  // namespace

void Tokenizer::InitSpecialTokens(const TokenizerData& data) {
  chat_template_ = data.chat_template;
  const Impl& im = *impl_;
  std::vector<int32_t> eog;
  // A FIM id given by its key wins; otherwise the first listed text the vocabulary has.
  auto fim = [&](int32_t given, const auto& texts) -> int32_t {
    if (given >= 0) return given;
    for (const char* t : texts) {
      if (const int32_t id = im.Find(t); id >= 0) return id;
    }
    return -1;
  };
  for (const int32_t id : {fim(data.fim_pad, kFimPadTexts), fim(data.fim_rep, kFimRepTexts),
                           fim(data.fim_sep, kFimSepTexts), data.eos, data.eot, data.eom}) {
    if (id >= 0) eog.push_back(id);
  }
  for (const char* t : kEogTexts) {
    if (const int32_t id = im.Find(t); id >= 0) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  // llama.cpp's two exceptions: in the gpt-oss (harmony) and Solar Open vocabularies <|end|>
  // closes a message, not the generation; with Gemma 4's <|tool_response> present, </s> is
  // ordinary.
  auto has = [&](const char* t) {
    const int32_t id = im.Find(t);
    return id >= 0 && std::binary_search(eog.begin(), eog.end(), id);
  };
  auto drop = [&](const char* t) {
    const int32_t id = im.Find(t);
    eog.erase(std::remove(eog.begin(), eog.end(), id), eog.end());
  };
  if (has("<|end|>") && ((has("<|return|>") && (has("<|call|>") || has("<|calls|>"))) ||
                         ((has("<|call|>") || has("<|calls|>")) && has("<|flush|>")))) {
    drop("<|end|>");
  }
  if (has("<|tool_response>") && has("</s>")) drop("</s>");
  eog_ids_ = std::move(eog);
}

bool Tokenizer::IsEog(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

std::string Tokenizer::DecodeToken(int32_t id, bool render_special) const {
  const TokenType t = token_type(id);
  if (render_special && (t == TokenType::kControl || t == TokenType::kUnknown)) {
    return impl_->Text(id);
  }
  return DecodeToken(id);
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool render_special) const {
  if (impl_->hf) {
    // Control, unknown and unused tokens print nothing unless rendered (as llama.cpp); the
    // pipeline decodes the rest together (byte runs, word markers and stripping need the whole
    // sequence).
    std::vector<int32_t> kept;
    kept.reserve(ids.size());
    for (const int32_t id : ids) {
      if (id < 0 || id >= vocab_size_) continue;
      const TokenType t = impl_->types[id];
      const bool special = t == TokenType::kControl || t == TokenType::kUnknown;
      if (t != TokenType::kUnused && (render_special || !special)) kept.push_back(id);
    }
    return impl_->hf->Decode(kept, /*skip_special_tokens=*/!render_special);
  }
  std::string out;
  bool strip = impl_->add_space_prefix;
  for (const int32_t id : ids) {
    const TokenType t = token_type(id);
    if (render_special && (t == TokenType::kControl || t == TokenType::kUnknown)) {
      out += impl_->Text(id);
      // Encode gave the text after a special token the space prefix again.
      strip = impl_->add_space_prefix;
      continue;
    }
    const size_t before = out.size();
    impl_->AppendPiece(id, &out);
    if (strip && out.size() > before) {
      if (out[before] == ' ') out.erase(before, 1);
      strip = false;
    }
  }
  return out;
}

}  // namespace strata
