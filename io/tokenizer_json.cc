#include "io/tokenizer_json.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "io/json_input.h"
#include "io/pretokenizer_types.h"

namespace strata {

Status AddTokenizerJson(const std::string& path, GgufWriter* w) {
  std::ifstream f(path);
  if (!f) return NotFound("cannot open tokenizer description '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  ASSIGN_OR_RETURN(nlohmann::json j,
                   ParseUntrustedJson(ss.str(), "tokenizer description '" + path + "'"));
  if (!j.is_object()) {
    return DataLoss("tokenizer description '" + path + "' is not a JSON object");
  }
  auto bad = [&](const std::string& field, const std::string& why) {
    return InvalidArgument("tokenizer description '" + path + "': \"" + field + "\" " + why);
  };
  if (!j.contains("model") || !j["model"].is_string()) return bad("model", "must be a string");
  if (!j.contains("tokens") || !j["tokens"].is_array() || j["tokens"].empty()) {
    return bad("tokens", "must be a non-empty array of strings");
  }
  std::vector<std::string> tokens;
  for (const auto& t : j["tokens"]) {
    if (!t.is_string()) return bad("tokens", "must contain only strings");
    tokens.push_back(t.get<std::string>());
  }
  const size_t n = tokens.size();
  w->Set("tokenizer.ggml.model", GgufValue::String(j["model"].get<std::string>()));
  w->Set("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
  if (j.contains("scores")) {
    std::vector<float> scores;
    for (const auto& s : j["scores"]) {
      if (!s.is_number()) return bad("scores", "must contain only numbers");
      scores.push_back(s.get<float>());
    }
    if (scores.size() != n) return bad("scores", "has " + std::to_string(scores.size()) + " entries for " + std::to_string(n) + " tokens");
    w->Set("tokenizer.ggml.scores", GgufValue::F32Array(scores));
  }
  if (j.contains("token_types")) {
    std::vector<int32_t> types;
    for (const auto& s : j["token_types"]) {
      if (!s.is_number_integer()) return bad("token_types", "must contain only integers");
      types.push_back(s.get<int32_t>());
    }
    if (types.size() != n) return bad("token_types", "has " + std::to_string(types.size()) + " entries for " + std::to_string(n) + " tokens");
    w->Set("tokenizer.ggml.token_type", GgufValue::I32Array(types));
  }
  if (j.contains("merges")) {
    std::vector<std::string> merges;
    for (const auto& s : j["merges"]) {
      if (!s.is_string()) return bad("merges", "must contain only strings");
      merges.push_back(s.get<std::string>());
    }
    w->Set("tokenizer.ggml.merges", GgufValue::StringArray(merges));
  }
  auto id = [&](const char* field, const char* key) -> Status {
    if (!j.contains(field) || j[field].is_null()) return OkStatus();
    if (!j[field].is_number_integer()) return bad(field, "must be an integer");
    const int64_t v = j[field].get<int64_t>();
    if (v < -1 || v >= static_cast<int64_t>(n)) {
      return bad(field, "= " + std::to_string(v) + " is not a token id (or -1: none)");
    }
    // -1 (none) is written as u32 0xFFFFFFFF (LLAMA_TOKEN_NULL's bits), never dropped: an absent
    // key takes the "llama" default (eos 2), which on the testbeds is the needle value <v0>. A
    // signed -1 would be clearer but llama.cpp refuses a special-token key that is not u32; it
    // loads this one (warning, and using its own default id; Strata reads it back as none).
    w->Set(key, GgufValue::U32(static_cast<uint32_t>(v >= 0 ? v : 0xFFFFFFFFll)));
    return OkStatus();
  };
  RETURN_IF_ERROR(id("bos_token_id", "tokenizer.ggml.bos_token_id"));
  RETURN_IF_ERROR(id("eos_token_id", "tokenizer.ggml.eos_token_id"));
  RETURN_IF_ERROR(id("unknown_token_id", "tokenizer.ggml.unknown_token_id"));
  for (const char* b : {"add_bos_token", "add_space_prefix"}) {
    if (j.contains(b)) {
      if (!j[b].is_boolean()) return bad(b, "must be true or false");
      w->Set(std::string("tokenizer.ggml.") + b, GgufValue::Bool(j[b].get<bool>()));
    }
  }
  return OkStatus();
}

}  // namespace strata

// ---- HF tokenizer.json -> tokenizer.ggml.* (convert_hf_to_gguf.py + gguf-py SpecialVocab) ----

namespace strata {
namespace {

// llama.cpp's gguf.TokenType values.
constexpr int32_t kTypeNormal = 1, kTypeControl = 3, kTypeUserDefined = 4, kTypeUnused = 5;

StatusOr<nlohmann::json> ReadJsonFile(const std::string& path, bool* exists) {
  std::ifstream f(path);
  *exists = f.good();
  if (!*exists) return nlohmann::json();
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseUntrustedJson(ss.str(), "'" + path + "'");
}

// Python's truthiness of a JSON value (the SpecialVocab code tests "if not special_bos").
bool Truthy(const nlohmann::json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string() || v.is_object() || v.is_array()) return !v.empty();
  return true;
}

// base.py does_token_look_special: added tokens that models forget to mark special.
bool LooksSpecial(const std::string& t) {
  auto wraps = [&](const char* a, const char* b) {
    const size_t na = std::strlen(a), nb = std::strlen(b);
    return t.size() >= na + nb && t.compare(0, na, a) == 0 && t.compare(t.size() - nb, nb, b) == 0;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wraps("<|", "|>") ||
         wraps("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || wraps("<unused", ">");
}

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size()) {
    s.replace(p, from.size(), to);
  }
  return s;
}

// An insertion-ordered map, as the Python dicts of SpecialVocab.
template <typename V>
struct Ordered {
  std::vector<std::pair<std::string, V>> items;
  V* Find(const std::string& k) {
    for (auto& [key, v] : items) {
      if (key == k) return &v;
    }
    return nullptr;
  }
  void Put(const std::string& k, V v) {
    if (V* p = Find(k)) {
      *p = std::move(v);
    } else {
      items.emplace_back(k, std::move(v));
    }
  }
};

}  // namespace

StatusOr<HfTokenizerConversion> AddHfTokenizerJson(const std::string& dir, GgufWriter* w) {
  const std::string tok_path = dir + "/tokenizer.json";
  bool exists = false;
  ASSIGN_OR_RETURN(nlohmann::json tok, ReadJsonFile(tok_path, &exists));
  if (!exists) return NotFound("cannot open '" + tok_path + "'");
  auto bad = [&](const std::string& why) { return InvalidArgument("'" + tok_path + "': " + why); };
  if (!tok.is_object() || !tok.contains("model") || !tok["model"].is_object()) {
    return bad("no \"model\" object");
  }
  const nlohmann::json& model = tok["model"];
  const std::string type = model.value("type", std::string());
  if (type != "BPE") {
    return Unimplemented("'" + tok_path + "': model type \"" + type +
                         "\": strata convert writes byte-level BPE (gpt2) tokenizers only "
                         "(llama.cpp converts Unigram and SentencePiece models from the "
                         "SentencePiece .model file, which GGUF keys \"llama\"/\"t5\" describe)");
  }
  auto pre = PreTypeOfTokenizerJson(tok);
  if (!pre.ok()) {
    return Unimplemented("'" + tok_path + "': not a byte-level BPE tokenizer Strata can convert: " +
                         pre.status().message());
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return bad("model.vocab is not an object of token -> id");
  }

  // Id -> text: the model vocabulary, then the added tokens (transformers' get_vocab()).
  std::map<int64_t, std::string> by_id;
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0) {
      return bad("model.vocab[\"" + text + "\"] is not a token id");
    }
    by_id[id.get<int64_t>()] = text;
  }
  struct Added {
    int64_t id;
    std::string content;
    bool special, normalized;
  };
  std::vector<Added> added;
  const nlohmann::json added_json = tok.value("added_tokens", nlohmann::json::array());
  if (!added_json.is_array()) return bad("added_tokens is not an array");
  for (size_t i = 0; i < added_json.size(); ++i) {
    const auto& a = added_json[i];
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        a["id"].get<int64_t>() < 0 || !a.contains("content") || !a["content"].is_string()) {
      return bad("added_tokens[" + std::to_string(i) + "] needs an \"id\" and a \"content\"");
    }
    added.push_back({a["id"].get<int64_t>(), a["content"].get<std::string>(),
                     a.value("special", false), a.value("normalized", true)});
    by_id[added.back().id] = added.back().content;
  }
  if (by_id.empty()) return bad("the vocabulary is empty");

  bool has_tc = false, has_cfg = false;
  ASSIGN_OR_RETURN(nlohmann::json tc, ReadJsonFile(dir + "/tokenizer_config.json", &has_tc));
  ASSIGN_OR_RETURN(nlohmann::json cfg, ReadJsonFile(dir + "/config.json", &has_cfg));
  for (const auto& [present, j, name] : {std::tuple(has_tc, &tc, "tokenizer_config.json"),
                                         std::tuple(has_cfg, &cfg, "config.json")}) {
    if (present && !j->is_object()) {
      return InvalidArgument("'" + dir + "/" + name + "' is not a JSON object");
    }
  }

  // vocab_size: config.json's (as hparams), else the vocabulary's.
  const int64_t max_id = by_id.rbegin()->first;
  int64_t n_vocab = max_id + 1;
  if (has_cfg) {
    const nlohmann::json* vs = nullptr;
    if (cfg.contains("vocab_size")) {
      vs = &cfg["vocab_size"];
    } else if (cfg.contains("text_config") && cfg["text_config"].is_object() &&
               cfg["text_config"].contains("vocab_size")) {
      vs = &cfg["text_config"]["vocab_size"];
    }
    if (vs != nullptr) {
      if (!vs->is_number_integer() || vs->get<int64_t>() <= 0) {
        return InvalidArgument("'" + dir + "/config.json': vocab_size " + vs->dump() +
                               " is not a positive integer");
      }
      n_vocab = vs->get<int64_t>();
    }
  }
  if (max_id >= n_vocab) {
    return InvalidArgument("'" + tok_path + "': token id " + std::to_string(max_id) +
                           " is beyond config.json's vocab_size " + std::to_string(n_vocab));
  }
  if (n_vocab > std::numeric_limits<int32_t>::max()) return bad("vocabulary too large");

  std::map<std::string, const Added*> added_by_content;  // get_added_vocab(): content -> token
  for (const Added& a : added) added_by_content.emplace(a.content, &a);
  std::map<int64_t, const Added*> added_by_id;
  for (const Added& a : added) added_by_id[a.id] = &a;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  tokens.reserve(n_vocab);
  types.reserve(n_vocab);
  for (int64_t i = 0; i < n_vocab; ++i) {
    const auto it = by_id.find(i);
    if (it == by_id.end()) {
      tokens.push_back("[PAD" + std::to_string(i) + "]");
      types.push_back(kTypeUnused);
      continue;
    }
    std::string token = it->second;
    const auto ad = added_by_content.find(token);
    if (ad != added_by_content.end()) {
      // llama.cpp re-encodes non-normalized added tokens (decode(encode(t))); for byte-level BPE
      // that gives the same text back, so the content is kept as it is.
      const Added* a = added_by_id.count(i) ? added_by_id[i] : ad->second;
      if (a->special || LooksSpecial(token)) {
        types.push_back(kTypeControl);
      } else {
        token = ReplaceAll(token, "\xE2\x96\x81", " ");  // pre-normalize user-defined spaces
        types.push_back(kTypeUserDefined);
      }
    } else {
      types.push_back(kTypeNormal);
    }
    tokens.push_back(std::move(token));
  }

  std::vector<std::string> merges;
  if (model.contains("merges") && model["merges"].is_array()) {
    const auto& m = model["merges"];
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i].is_string()) {
        merges.push_back(m[i].get<std::string>());
      } else if (m[i].is_array() && m[i].size() == 2 && m[i][0].is_string() &&
                 m[i][1].is_string()) {
        // transformers >= 4.45 pairs; a space inside a part is written as U+0120 (' ' + 256).
        merges.push_back(ReplaceAll(m[i][0].get<std::string>(), " ", "\xC4\xA0") + " " +
                         ReplaceAll(m[i][1].get<std::string>(), " ", "\xC4\xA0"));
      } else {
        return bad("model.merges[" + std::to_string(i) + "] is neither \"a b\" nor [a, b]");
      }
    }
  }
  if (merges.empty()) return bad("model.merges is empty (a byte-level BPE needs its merges)");

  // ---- SpecialVocab ----
  std::vector<std::string> special_types = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
  Ordered<int64_t> special_ids;
  Ordered<bool> add_special;
  Status id_error = OkStatus();
  auto set_special = [&](const std::string& typ, const nlohmann::json& tid, const char* from) {
    if (!tid.is_number_integer()) return;
    const int64_t v = tid.get<int64_t>();
    if (v < 0 || v >= n_vocab) {
      if (id_error.ok()) {
        id_error = InvalidArgument(std::string(from) + ": " + typ + " token id " +
                                   std::to_string(v) + " is not in the vocabulary of " +
                                   std::to_string(n_vocab));
      }
      return;
    }
    if (special_ids.Find(typ) == nullptr) special_ids.Put(typ, v);
  };
  const bool tc_truthy = has_tc && Truthy(tc);
  auto tcget = [&](const std::string& k) {
    return has_tc && tc.contains(k) ? tc[k] : nlohmann::json();
  };
  nlohmann::json special_bos = tcget("bos_token"), special_cls = tcget("cls_token");
  nlohmann::json special_eos = tcget("eos_token"), special_sep = tcget("sep_token");
  if (!Truthy(special_bos) && Truthy(special_cls) && tc_truthy) {
    tc["bos_token"] = special_bos = special_cls;
  }
  if (!Truthy(special_eos) && Truthy(special_sep) && tc_truthy) {
    tc["eos_token"] = special_eos = special_sep;
  }
  const nlohmann::json post = tok.value("post_processor", nlohmann::json());
  if (Truthy(post) && post.is_object()) {
    std::vector<nlohmann::json> processors;
    if (post.contains("processors") && post["processors"].is_array()) {
      for (const auto& p : post["processors"]) processors.push_back(p);
    } else {
      processors.push_back(post);
    }
    auto special_token_id = [](const nlohmann::json& item) {
      if (item.is_object() && item.contains("SpecialToken") && item["SpecialToken"].is_object() &&
          item["SpecialToken"].contains("id")) {
        return item["SpecialToken"]["id"];
      }
      return nlohmann::json();
    };
    for (const auto& proc : processors) {
      if (!proc.is_object()) continue;
      const std::string ptype = proc.value("type", std::string());
      if (ptype == "RobertaProcessing") {
        add_special.Put("bos", true);
        add_special.Put("eos", true);
        add_special.Put("sep", true);
        if (!Truthy(special_cls) && tc_truthy) {
          special_cls = proc.contains("cls") && proc["cls"].is_array() && !proc["cls"].empty()
                            ? proc["cls"][0] : special_bos;
          tc["cls_token"] = special_cls;
        }
        if (!Truthy(special_sep) && tc_truthy) {
          special_sep = proc.contains("sep") && proc["sep"].is_array() && !proc["sep"].empty()
                            ? proc["sep"][0] : special_eos;
          tc["sep_token"] = special_sep;
        }
        continue;
      }
      if (ptype != "TemplateProcessing") continue;
      const nlohmann::json single = proc.value("single", nlohmann::json::array());
      const nlohmann::json pair = proc.value("pair", nlohmann::json::array());
      nlohmann::json first, last;  // the single template's leading / trailing special tokens
      if (single.is_array() && single.size() > 1) first = special_token_id(single.front());
      if (Truthy(first)) {
        const bool known = first == special_bos || first == special_cls;
        if (!tc_truthy) {
          special_bos = first;
        } else if (!known) {
          if (!Truthy(special_bos)) tc["bos_token"] = special_bos = first;
          if (!Truthy(special_cls)) tc["cls_token"] = special_cls = first;
        }
        add_special.Put("bos", first == special_bos || first == special_cls);
      }
      if (single.is_array() && single.size() > 1) last = special_token_id(single.back());
      if (Truthy(last)) {
        if (!tc_truthy) {
          special_eos = last;
        } else if (last != special_eos) {
          // The template ends in another token than eos: the old eos becomes eot (or eom).
          if (std::find(special_types.begin(), special_types.end(), "eot") == special_types.end()) {
            special_types.push_back("eot");
            tc["eot_token"] = special_eos;
          } else if (std::find(special_types.begin(), special_types.end(), "eom") ==
                     special_types.end()) {
            special_types.push_back("eom");
            tc["eom_token"] = special_eos;
          }
          tc["eos_token"] = special_eos = last;
        }
        add_special.Put("eos", last == special_eos);
      }
      // The pair template decides add_sep: "A [sep|eos] [sep|eos] B" between the single
      // template's leading and trailing tokens.
      if (!pair.is_array() || pair.empty()) continue;
      size_t begin = Truthy(first) && special_token_id(pair.front()) == first ? 1 : 0;
      size_t end = Truthy(last) && special_token_id(pair.back()) == last ? pair.size() - 1
                                                                          : pair.size();
      if (begin >= end) continue;
      auto sequence_id = [&](size_t i) {
        const auto& item = pair[i];
        return item.is_object() && item.contains("Sequence") && item["Sequence"].is_object()
                   ? item["Sequence"].value("id", std::string())
                   : std::string();
      };
      if (sequence_id(begin) != "A" || sequence_id(end - 1) != "B" || end - begin <= 2) continue;
      const size_t mid = begin + 1, mid_end = end - 1;  // the items between A and B
      bool add_sep = false;
      const nlohmann::json entry = special_token_id(pair[mid]);
      if (Truthy(entry) && (entry == special_sep || entry == special_eos) && !Truthy(last)) {
        add_sep = true;
      }
      if (mid_end - mid == 2) {
        const nlohmann::json entry2 = special_token_id(pair[mid + 1]);
        if (Truthy(entry2) && (entry2 == special_sep || entry2 == special_eos)) add_sep = true;
      }
      add_special.Put("sep", add_sep);
      if (add_sep && !Truthy(special_sep) && tc_truthy) tc["sep_token"] = special_eos;
    }
  }
  nlohmann::json chat_template;  // null: none
  if (tc_truthy) {
    nlohmann::json alt;
    std::ifstream jinja(dir + "/chat_template.jinja");
    if (jinja.good()) {
      std::stringstream ss;
      ss << jinja.rdbuf();
      alt = ss.str();
    } else {
      bool has_ct = false;
      ASSIGN_OR_RETURN(nlohmann::json ct, ReadJsonFile(dir + "/chat_template.json", &has_ct));
      if (has_ct && ct.is_object() && ct.contains("chat_template")) alt = ct["chat_template"];
    }
    chat_template = tc.contains("chat_template") ? tc["chat_template"] : alt;
    if (!chat_template.is_null() && !chat_template.is_string() && !chat_template.is_array()) {
      chat_template = nullptr;  // SpecialVocab ignores a bad type (with a warning)
    }
    for (const std::string& typ : special_types) {
      const nlohmann::json add_entry = tcget("add_" + typ + "_token");
      if (add_entry.is_boolean()) add_special.Put(typ, add_entry.get<bool>());
      const nlohmann::json entry = tcget(typ + "_token");
      std::string content;
      if (entry.is_string()) {
        content = entry.get<std::string>();
      } else if (entry.is_object() && entry.contains("content") && entry["content"].is_string()) {
        content = entry["content"].get<std::string>();
      } else {
        continue;
      }
      for (const Added& a : added) {  // the first added token with that content
        if (a.content == content) {
          set_special(typ, a.id, "tokenizer_config.json");
          break;
        }
      }
    }
  }
  if (has_cfg) {
    for (const std::string& typ : special_types) {
      nlohmann::json id =
          cfg.contains(typ + "_token_id") ? cfg[typ + "_token_id"] : nlohmann::json();
      if (id.is_null() && cfg.contains("text_config") && cfg["text_config"].is_object() &&
          cfg["text_config"].contains(typ + "_token_id")) {
        id = cfg["text_config"][typ + "_token_id"];
      }
      set_special(typ, id, "config.json");
    }
  }
  RETURN_IF_ERROR(id_error);

  w->Set("tokenizer.ggml.model", GgufValue::String("gpt2"));
  w->Set("tokenizer.ggml.pre", GgufValue::String(*pre));
  w->Set("tokenizer.ggml.tokens", GgufValue::StringArray(tokens));
  w->Set("tokenizer.ggml.token_type", GgufValue::I32Array(types));
  w->Set("tokenizer.ggml.merges", GgufValue::StringArray(merges));
  static const std::map<std::string, std::string> kIdKey = {
      {"bos", "bos_token_id"},       {"eos", "eos_token_id"},     {"unk", "unknown_token_id"},
      {"sep", "seperator_token_id"}, {"pad", "padding_token_id"}, {"mask", "mask_token_id"},
      {"eot", "eot_token_id"},       {"eom", "eom_token_id"}};  // cls: gguf-py has no key
  for (const auto& [typ, id] : special_ids.items) {
    const auto k = kIdKey.find(typ);
    if (k != kIdKey.end()) {
      w->Set("tokenizer.ggml." + k->second, GgufValue::U32(static_cast<uint32_t>(id)));
    }
  }
  for (const auto& [typ, value] : add_special.items) {
    if (typ == "bos" || typ == "eos" || typ == "sep") {
      w->Set("tokenizer.ggml.add_" + typ + "_token", GgufValue::Bool(value));
    }
  }
  if (chat_template.is_string()) {
    w->Set("tokenizer.chat_template", GgufValue::String(chat_template.get<std::string>()));
  } else if (chat_template.is_array()) {
    std::vector<std::string> names;
    for (const auto& choice : chat_template) {
      if (!choice.is_object() || !choice.contains("template") || !choice["template"].is_string()) {
        continue;
      }
      std::string name = choice.value("name", std::string());
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      if (name.empty()) continue;
      const std::string text = choice["template"].get<std::string>();
      if (name == "default") {
        w->Set("tokenizer.chat_template", GgufValue::String(text));
      } else {
        w->Set("tokenizer.chat_template." + name, GgufValue::String(text));
        names.push_back(name);
      }
    }
    if (!names.empty()) w->Set("tokenizer.chat_templates", GgufValue::StringArray(names));
  }
  HfTokenizerConversion out;
  out.model = "gpt2";
  out.pre = *pre;
  out.n_tokens = static_cast<int32_t>(tokens.size());
  out.n_merges = static_cast<int32_t>(merges.size());
  return out;
}

}  // namespace strata
