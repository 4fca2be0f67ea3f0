// `strata tokenize`: a text's token ids and pieces under a model's tokenizer, printed as
// llama.cpp's llama-tokenize prints them (or as a list of ids, of pieces, or JSON).
#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/gguf.h"
#include "io/tokenizer.h"
#include "model/model.h"

namespace strata::cli {

namespace {

// What a token prints as: its decoded bytes (byte tokens as the raw byte, the word marker as a
// space), and a control token as its text, as llama-tokenize shows them (token_to_piece with
// special rendering on), so "<|im_start|>" is visible rather than an empty piece.
std::string PieceOf(const Tokenizer& tok, int32_t id) {
  return tok.DecodeToken(id, /*render_special=*/true);
}

// A Python-style string literal: 'text' with \\, \', \n, \r, \t escaped and any other byte
// below 0x20, DEL, or not part of valid UTF-8 as \xNN (a byte token's lone byte).
std::string PyQuote(const std::string& s) {
  std::string q = "'";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    auto hex = [&](unsigned char b) {
      static const char* d = "0123456789abcdef";
      q += "\\x";
      q += d[b >> 4];
      q += d[b & 15];
    };
    if (c == '\\' || c == '\'') {
      q += '\\';
      q += static_cast<char>(c);
    } else if (c == '\n') {
      q += "\\n";
    } else if (c == '\r') {
      q += "\\r";
    } else if (c == '\t') {
      q += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      hex(c);
    } else if (c < 0x80) {
      q += static_cast<char>(c);
    } else {
      // A whole, well-formed UTF-8 sequence is copied; a stray byte is escaped.
      const int len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                      : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
      bool ok = len > 0 && i + len <= s.size();
      for (int k = 1; ok && k < len; ++k) {
        ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
      }
      if (!ok) {
        hex(c);
      } else {
        q.append(s, i, len);
        i += len;
        continue;
      }
    }
    ++i;
  }
  return q + "'";
}

// The tokenizer of -m: a .gguf file's tokenizer.ggml.* keys alone (the weights are not read,
// so a vocabulary-only GGUF works too), or an HF directory's through the model loader.
StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    ASSIGN_OR_RETURN(std::unique_ptr<Model> m, Model::Load(path));
    if (m->tokenizer() == nullptr) {
      return InvalidArgument("model '" + path + "' has no tokenizer");
    }
    // The model owns its tokenizer; rebuild an owned copy from the same GGUF metadata.
    return Tokenizer::FromGguf(m->file());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(path));
  const GgufValue* model = f->Find("tokenizer.ggml.model");
  if (model == nullptr) {
    return InvalidArgument("'" + path + "' has no tokenizer (no tokenizer.ggml.model key)");
  }
  if (model->type == GgufType::kString && model->s == "none") {
    return InvalidArgument("'" + path + "' has no tokenizer (tokenizer.ggml.model is \"none\")");
  }
  return Tokenizer::FromGguf(*f);
}

}  // namespace

void AddTokenizeCommand(CLI::App* app, TokenizeOptions* o) {
  CLI::App* cmd = app->add_subcommand(
      "tokenize", "Show the tokens of a text (id -> 'piece' per line, as llama-tokenize)");
  cmd->add_option("-m,--model", o->model, "Model whose tokenizer to use (.gguf or HF directory)");
  cmd->add_option("--tokenizer", o->tokenizer_json,
                  "An HF tokenizer.json to use instead of -m (a tokenizer_config.json beside it "
                  "supplies the BOS/EOS settings)");
  cmd->add_option_function<std::string>(
      "-p,--prompt",
      [o](const std::string& text) {
        o->prompt = text;
        o->has_prompt = true;
      },
      "Text to tokenize");
  cmd->add_option("-f,--file", o->prompt_file,
                  "Read the text to tokenize from this file; - reads standard input");
  cmd->add_flag("--ids", o->ids, "Print only the ids, as a Python-style list: [1, 2, 3]");
  cmd->add_flag("--pieces", o->pieces,
                "Print only the pieces, as a Python-style list: ['Hello', ' world']");
  cmd->add_flag("--json", o->json, "Print a JSON object: ids, pieces, count");
  cmd->add_flag("--special", o->special,
                "Parse control tokens written in the text (<|im_start|>, <s>, ...) as their ids");
  cmd->add_flag("--no-bos", o->no_bos, "Do not prepend BOS even if the tokenizer adds one");
}

int RunTokenize(const TokenizeOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  if (o.model.empty() == o.tokenizer_json.empty()) {
    return fail("give the tokenizer with -m MODEL or --tokenizer tokenizer.json (one of them)");
  }
  if (!o.has_prompt && o.prompt_file.empty()) {
    return fail("no text to tokenize: give -p TEXT or -f FILE");
  }
  if (o.has_prompt && !o.prompt_file.empty()) {
    return fail("-p and -f both give the text; use one");
  }
  if (int(o.ids) + int(o.pieces) + int(o.json) > 1) {
    return fail("--ids, --pieces and --json are different outputs; give one");
  }
  std::string text = o.prompt;
  if (!o.prompt_file.empty()) {
    auto t = ReadPromptFile("-f", o.prompt_file, o.in);
    if (!t.ok()) return fail(t.status().message());
    text = std::move(*t);
  }
  auto tok_or = o.model.empty() ? Tokenizer::FromHfJson(o.tokenizer_json) : LoadTokenizer(o.model);
  if (!tok_or.ok()) {
    return fail((o.model.empty() ? "--tokenizer " + o.tokenizer_json : "-m " + o.model) + ": " +
                tok_or.status().ToString());
  }
  const Tokenizer& tok = **tok_or;

  const std::vector<int32_t> ids = tok.Encode(text, /*with_bos=*/!o.no_bos, o.special);
  std::vector<std::string> pieces;
  for (const int32_t id : ids) pieces.push_back(PieceOf(tok, id));

  if (o.json) {
    nlohmann::json j = {{"ids", ids}, {"pieces", pieces}, {"count", ids.size()}};
    out << DumpJson(j);
  } else if (o.ids || o.pieces) {
    out << "[";
    for (size_t i = 0; i < ids.size(); ++i) {
      out << (i ? ", " : "") << (o.ids ? std::to_string(ids[i]) : PyQuote(pieces[i]));
    }
    out << "]\n";
  } else {
    for (size_t i = 0; i < ids.size(); ++i) {
      char id[16];
      std::snprintf(id, sizeof(id), "%6d", ids[i]);
      out << id << " -> '" << pieces[i] << "'\n";
    }
  }
  return kExitOk;
}

}  // namespace strata::cli
