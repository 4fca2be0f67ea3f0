// The llama.cpp pre-tokenizer types (llama-vocab.cpp, llm_tokenizer_bpe) as PCRE2 regexes, and
// the tokenizer.json fingerprints that name them. The patterns are data: llama.cpp's, or, where
// it adapted them to its regex engine, the model tokenizer's own (see the header).
#include "io/pretokenizer_types.h"

#include <nlohmann/json.hpp>

#include "core/utf8.h"

namespace strata {
namespace {

// --- Patterns (PCRE2, applied with UTF + UCP) ---
// Non-ASCII characters are written as \x{..} escapes: the patterns hold compatibility
// characters (U+1FD3, U+212A, ...) that an editor's NFC pass would silently replace.

// GPT-2's pattern without its final |\s+: llama.cpp's form. The two split alike: where
// \s+(?!\S) fails the gap left is one whitespace character, which Isolated keeps as a piece.
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
#define STRATA_CONTRACTIONS R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]))"
constexpr const char* kLlama3 =
    STRATA_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2 =
    STRATA_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen35 =
    STRATA_CONTRACTIONS
    R"(|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Mistral Tekken's own pattern (llama.cpp rewrites \p{Lu}.. with lookaheads: its classes
// collapse every letter category to one).
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// o200k (GPT-4o, Llama 4) as in its tokenizer.json.
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    STRATA_CONTRACTIONS
    R"(?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    STRATA_CONTRACTIONS
    R"(?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Kimi K2 (tokenization_kimi.py). Its classes [\p{Lu}..\p{M}&&[^\p{Han}]] become one character
// that is not Han followed by the class; \p{Script=Han} is the spelling PCRE2 and JavaScript
// (the reference tokenizer) both accept. llama.cpp runs a hand-written splitter for it.
#define STRATA_UPPER_NOT_HAN R"((?:(?!\p{Script=Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]))"
#define STRATA_LOWER_NOT_HAN R"((?:(?!\p{Script=Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}]))"
constexpr const char* kKimiK2 =
    R"(\p{Script=Han}+|[^\r\n\p{L}\p{N}]?)" STRATA_UPPER_NOT_HAN "*" STRATA_LOWER_NOT_HAN
    "+" STRATA_CONTRACTIONS R"(?|[^\r\n\p{L}\p{N}]?)" STRATA_UPPER_NOT_HAN "+"
    STRATA_LOWER_NOT_HAN "*" STRATA_CONTRACTIONS
    R"(?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kBloom =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{964}\x{6D4}\x{60C})]+)";
// DeepSeek LLM's letter class, spelled out by code point ranges in its tokenizer.json.
constexpr const char* kDeepseekLlmLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-)"
    R"(\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386})"
    R"(\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F})"
    R"(\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA})"
    R"(\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-)"
    R"(\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59})"
    R"(\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-)"
    R"(\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC})"
    R"(\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-)"
    R"(\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-)"
    R"(\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-)"
    R"(\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
    R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943}]+)";
// CJK ideographs, U+0800..U+4E00 (sic: everything between Samaritan and CJK) and Hangul.
constexpr const char* kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
constexpr const char* kDeepseekV3Words =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+)re"
    R"re(| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
#undef STRATA_CONTRACTIONS
#undef STRATA_UPPER_NOT_HAN
#undef STRATA_LOWER_NOT_HAN

struct PreType {
  std::vector<const char*> names;  // llama.cpp's names that select this behaviour
  std::vector<const char*> regexes;
  bool ignore_merges;
};

// One entry per distinct behaviour; names as llama.cpp's llama_vocab::impl::load accepts them.
const std::vector<PreType>& Table() {
  static const std::vector<PreType> table = {
      {{"default"},
       {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"},
       false},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano"},
       {kLlama3},
       true},
      {{"dbrx", "smaug-bpe", "glm4", "chatglm-bpe"}, {kLlama3}, false},
      {{"deepseek-llm"},
       {R"([\r\n])", kDeepseekLlmLetters,
        R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)",
        R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"},
       false},
      {{"deepseek-coder"},
       {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"},
       false},
      {{"deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        kDeepseekV3Words},
       false},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}, false},
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
        "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo",
        "jais", "trillion", "granite-docling", "exaone4"},
       {kGpt2},
       false},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
        "mellum2"},
       {R"(\p{N})", kGpt2},
       false},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez", "hunyuan",
        "solar-open"},
       {kQwen2},
       false},
      {{"qwen35"}, {kQwen35}, false},
      {{"tekken"}, {kTekken}, true},
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kGpt4o}, false},
      {{"kimi-k2"}, {kKimiK2}, false},
      {{"bloom", "poro-chat", "gpt3-finnish"}, {kBloom}, false},
      {{"viking"}, {kBloom, R"(\p{N})"}, false},
  };
  return table;
}

const PreType* FindType(std::string_view pre) {
  if (pre.empty()) pre = "default";
  for (const PreType& t : Table()) {
    for (const char* n : t.names) {
      if (pre == n) return &t;
    }
  }
  return nullptr;
}

std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// --- tokenizer.json fingerprints ---

// A pre_tokenizer flattened into steps, each a canonical text. Regexes are written with \r and
// \n escaped, since tokenizer.json files spell them both ways (a raw CR/LF or a backslash).

// \x{HHHH} escapes (how this file spells non-ASCII) become the characters themselves, as
// tokenizer.json files write them.
std::string CanonicalRegex(const std::string& re) {
  std::string out;
  for (size_t i = 0; i < re.size(); ++i) {
    const char c = re[i];
    if (c == '\\' && re.compare(i, 3, "\\x{") == 0) {
      const size_t close = re.find('}', i + 3);
      if (close != std::string::npos && close > i + 3 && close - i <= 9) {
        const std::string hex = re.substr(i + 3, close - i - 3);
        if (hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos) {
          AppendUtf8(static_cast<uint32_t>(std::stoul(hex, nullptr, 16)), &out);
          i = close;
          continue;
        }
      }
    }
    if (c == '\r') {
      out += "\\r";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string SplitStep(const std::string& regex) {
  return "Split(Isolated, " + CanonicalRegex(regex) + ")";
}
constexpr const char* kByteLevelNoRegex = "ByteLevel(use_regex=false)";
constexpr const char* kByteLevelGpt2 = "ByteLevel(use_regex=true)";

void Flatten(const nlohmann::json& p, std::vector<std::string>* steps) {
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
    steps->push_back("?" + p.dump());
    return;
  }
  const std::string type = p["type"].get<std::string>();
  auto flag = [&](const char* key, bool def) {
    return p.contains(key) && p[key].is_boolean() ? p[key].get<bool>() : def;
  };
  if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
    for (const auto& q : p["pretokenizers"]) Flatten(q, steps);
  } else if (type == "Split") {
    const auto& pat = p.value("pattern", nlohmann::json());
    const std::string behavior = p.value("behavior", std::string("?"));
    std::string what;
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      what = CanonicalRegex(pat["Regex"].get<std::string>());
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      what = "String " + pat["String"].get<std::string>();
    } else {
      what = pat.dump();
    }
    steps->push_back("Split(" + behavior + (flag("invert", false) ? ", inverted" : "") + ", " +
                     what + ")");
  } else if (type == "ByteLevel") {
    std::string s = std::string("ByteLevel(use_regex=") +
                    (flag("use_regex", true) ? "true" : "false");
    if (flag("add_prefix_space", false)) s += ", add_prefix_space=true";
    steps->push_back(s + ")");
  } else if (type == "Digits") {
    steps->push_back(std::string("Digits(individual_digits=") +
                     (flag("individual_digits", false) ? "true" : "false") + ")");
  } else {
    steps->push_back(type);
  }
}

struct Fingerprint {
  const char* pre;
  std::vector<std::string> steps;
};

// The pre-tokenizers of the tokenizer.json files behind each type (HF's spelling: (?i:..)
// contractions; convert_hf_to_gguf.py tells them apart by a hash of token ids instead).
const std::vector<Fingerprint>& Fingerprints() {
  static const std::vector<Fingerprint> fps = [] {
    const std::string ci = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
    std::vector<Fingerprint> v = {
        {"llama-bpe",
         {SplitStep(ci + R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
                         R"(\s*[\r\n]+|\s+(?!\S)|\s+)"),
          kByteLevelNoRegex}},
        {"qwen2",
         {SplitStep(ci + R"(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
                         R"(\s*[\r\n]+|\s+(?!\S)|\s+)"),
          kByteLevelNoRegex}},
        {"qwen35",
         {SplitStep(ci + R"(|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+)"
                         R"([\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
          kByteLevelNoRegex}},
        {"gpt-4o",
         {SplitStep(
              R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)" +
              ci + "?" +
              R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)" +
              ci +
              R"(?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"),
          kByteLevelNoRegex}},
        {"tekken", {SplitStep(kTekken), kByteLevelNoRegex}},
        {"kimi-k2", {SplitStep(kKimiK2), kByteLevelNoRegex}},
        {"gpt-2", {kByteLevelGpt2}},
        {"starcoder", {"Digits(individual_digits=true)", kByteLevelGpt2}},
    };
    // Types whose tokenizer.json regexes are exactly llama.cpp's list (plus ByteLevel).
    for (const char* pre : {"deepseek-llm", "deepseek-coder", "deepseek-v3"}) {
      Fingerprint f{pre, {}};
      for (const char* re : FindType(pre)->regexes) f.steps.push_back(SplitStep(re));
      f.steps.push_back(kByteLevelNoRegex);
      v.push_back(std::move(f));
    }
    return v;
  }();
  return fps;
}

}  // namespace

StatusOr<std::vector<std::string>> PreTokenizerRegexes(std::string_view pre) {
  const PreType* t = FindType(pre);
  if (t == nullptr) {
    return InvalidArgument("tokenizer.ggml.pre = \"" + std::string(pre) +
                           "\" is not a pre-tokenizer type Strata implements (supported: " +
                           Join(SupportedPreTokenizers(), ", ") + ")");
  }
  return std::vector<std::string>(t->regexes.begin(), t->regexes.end());
}

bool PreTokenizerIgnoresMerges(std::string_view pre) {
  const PreType* t = FindType(pre);
  return t != nullptr && t->ignore_merges;
}

bool PreTokenizerAddsBosByDefault(std::string_view pre) {
  // llama_vocab::impl::load sets add_bos = true for exactly these names before it reads the key.
  static constexpr std::string_view kNames[] = {
      "llama3", "llama-v3", "llama-bpe", "falcon3",      "falcon-h1", "pixtral",
      "midm-2.0", "lfm2",   "jina-v5-nano", "tekken", "chameleon"};
  for (std::string_view n : kNames) {
    if (n == pre) return true;
  }
  return false;
}

std::vector<std::string> SupportedPreTokenizers() {
  std::vector<std::string> names;
  for (const PreType& t : Table()) names.insert(names.end(), t.names.begin(), t.names.end());
  return names;
}

StatusOr<std::string> PreTypeOfTokenizerJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("tokenizer.json is not a JSON object");
  // The normalizer: GGUF has no key for one, so only those that change nothing for these models
  // pass. NFC (Qwen2/3) is accepted: llama.cpp drops it too, which changes the tokens of text
  // that is not already NFC (decomposed accents), a difference of llama.cpp's conversion.
  const nlohmann::json norm = j.value("normalizer", nlohmann::json());
  const bool norm_ok =
      norm.is_null() ||
      (norm.is_object() && norm.value("type", "") == "Sequence" &&
       norm.value("normalizers", nlohmann::json::array()).empty()) ||
      (norm.is_object() && norm.value("type", "") == "NFC");
  if (!norm_ok) {
    return InvalidArgument("tokenizer.json normalizer " + norm.dump() +
                           " has no GGUF equivalent for a byte-level BPE tokenizer (accepted: "
                           "none, an empty Sequence, NFC)");
  }
  std::vector<std::string> steps;
  const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
  if (!pre.is_null()) Flatten(pre, &steps);
  for (const Fingerprint& f : Fingerprints()) {
    if (f.steps == steps) return std::string(f.pre);
  }
  std::vector<std::string> known;
  for (const Fingerprint& f : Fingerprints()) known.push_back(f.pre);
  return InvalidArgument("tokenizer.json pre_tokenizer [" + Join(steps, "; ") +
                         "] is not one Strata recognises (known: " + Join(known, ", ") + ")");
}

}  // namespace strata
