// `strata inspect FILE`: architecture, metadata, tokenizer, tensors and KV cache geometry.
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/chat_template.h"
#include "io/tokenizer_json.h"
#include "model/model.h"
#include "model/quantize.h"

namespace strata::cli {

namespace {

const char* KindName(AttnKind k) { return k == AttnKind::kMla ? "MLA" : "GQA"; }

bool SameGeometry(const LayerGeometry& a, const LayerGeometry& b) {
  return a.kind == b.kind && a.n_q_heads == b.n_q_heads && a.n_kv_heads == b.n_kv_heads &&
         a.k_dim == b.k_dim && a.v_dim == b.v_dim && a.rope_dim == b.rope_dim && a.rope == b.rope &&
         a.scale == b.scale && a.window == b.window;
}

// The model's numbers of cache layers [b, e): "0-3", or "1,3" where the cache skips layers
// (kimi-linear caches its MLA layers only); consecutive numbers join into a range.
std::string LayerSpan(const std::vector<LayerGeometry>& layers, size_t b, size_t e) {
  auto number = [&](size_t i) { return layers[i].model_layer >= 0 ? layers[i].model_layer
                                                                   : static_cast<int>(i); };
  std::string out;
  for (size_t i = b; i < e;) {
    size_t j = i + 1;
    while (j < e && number(j) == number(j - 1) + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(number(i));
    if (j - i > 1) out += "-" + std::to_string(number(j - 1));
    i = j;
  }
  return out;
}

// A metadata value for the listing: scalars in full (strings up to 80 characters, escaped),
// arrays summarised as their element type and count with the first few elements.
std::string ValueText(const GgufValue& v) {
  auto str = [](const std::string& s) {
    std::string e;
    for (char c : s.substr(0, 80)) {
      if (c == '\n') e += "\\n";
      else if (c == '\t') e += "\\t";
      else if (static_cast<unsigned char>(c) < 0x20) e += '?';
      else e += c;
    }
    return "\"" + e + (s.size() > 80 ? "\"... (" + std::to_string(s.size()) + " chars)" : "\"");
  };
  if (v.type == GgufType::kString) return str(v.s);
  if (v.type != GgufType::kArray) return v.DebugString();
  std::string t = std::string("[") + GgufTypeName(v.array_type) + " x " +
                  std::to_string(v.size()) + "]";
  const size_t shown = std::min<size_t>(v.size(), 5);
  for (size_t i = 0; i < shown; ++i) {
    const GgufValue e = v.at(i);
    t += (i ? ", " : " ") + (e.type == GgufType::kString ? str(e.s) : e.DebugString());
  }
  if (shown < v.size()) t += ", ...";
  return t;
}

// A token id with its text: `2 "</s>"`, or "none" for -1.
std::string TokenWithText(const Tokenizer& tok, int32_t id) {
  if (id < 0) return "none";
  if (!tok.CheckId(id).ok()) return std::to_string(id) + " (out of the vocabulary)";
  return std::to_string(id) + " " + ValueText(GgufValue::String(tok.token_text(id)));
}

// What a Hugging Face directory holds (config.json's architecture, the safetensors files, the
// tokenizer files), printed before the converted model is described.
void DescribeHfDirectory(const std::string& dir, std::ostream& out, nlohmann::json* j) {
  namespace fs = std::filesystem;
  nlohmann::json hf;
  std::string arch = "?", model_type = "?", dtype = "?";
  std::ifstream cf(dir + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(cf, nullptr, /*allow_exceptions=*/false);
  if (cfg.is_object()) {
    if (cfg.contains("architectures") && cfg["architectures"].is_array() &&
        !cfg["architectures"].empty() && cfg["architectures"][0].is_string()) {
      arch = cfg["architectures"][0].get<std::string>();
    }
    if (cfg.contains("model_type") && cfg["model_type"].is_string()) {
      model_type = cfg["model_type"].get<std::string>();
    }
    if (cfg.contains("torch_dtype") && cfg["torch_dtype"].is_string()) {
      dtype = cfg["torch_dtype"].get<std::string>();
    }
  }
  std::vector<std::pair<std::string, uintmax_t>> shards;
  std::vector<std::string> tokenizers;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 12 && name.substr(name.size() - 12) == ".safetensors") {
      shards.emplace_back(name, e.file_size(ec));
    }
    if (name == kTokenizerJsonName || name == "tokenizer.json" || name == "tokenizer.model" ||
        name == "tokenizer_config.json") {
      tokenizers.push_back(name);
    }
  }
  std::sort(shards.begin(), shards.end());
  std::sort(tokenizers.begin(), tokenizers.end());
  uintmax_t bytes = 0;
  for (const auto& [n, b] : shards) bytes += b;
  out << "format: Hugging Face directory: config.json (" << arch << ", model_type " << model_type
      << ", torch_dtype " << dtype << "), " << shards.size() << " safetensors file"
      << (shards.size() == 1 ? "" : "s") << " (" << FormatBytes(static_cast<double>(bytes))
      << ")";
  for (const auto& [n, b] : shards) out << (&n == &shards.front().first ? ": " : ", ") << n;
  out << "; tokenizer files: ";
  if (tokenizers.empty()) out << "none";
  for (size_t i = 0; i < tokenizers.size(); ++i) out << (i ? ", " : "") << tokenizers[i];
  out << (std::find(tokenizers.begin(), tokenizers.end(), kTokenizerJsonName) == tokenizers.end()
              ? " (only " + std::string(kTokenizerJsonName) + " is read)"
              : "")
      << "\nconverted in memory to the GGUF layout (llama.cpp key and tensor names, F32 weights): "
         "the metadata and tensors below are the converted image's\n";
  hf["architecture"] = arch;
  hf["model_type"] = model_type;
  hf["torch_dtype"] = dtype;
  hf["safetensors_files"] = nlohmann::json::array();
  for (const auto& [n, b] : shards) hf["safetensors_files"].push_back({{"name", n}, {"bytes", b}});
  hf["tokenizer_files"] = tokenizers;
  (*j)["hf_directory"] = hf;
}

}  // namespace

void AddInspectCommand(CLI::App* app, InspectOptions* o) {
  CLI::App* cmd = app->add_subcommand(
      "inspect", "Print a model's architecture, tokenizer, tensors and KV cache geometry");
  cmd->add_option("FILE", o->path, "Model: a .gguf file or a Hugging Face directory")->required();
  cmd->add_option("--kv-type", o->kv_type,
                  "KV storage the cache figures are for (as generate/logits --kv-type): bf16, "
                  "f16 or f32")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "Also write the report as JSON to this file");
}

int RunInspect(const InspectOptions& o, std::ostream& out, std::ostream& err) {
  const auto kv_type = ParseKvType(o.kv_type);
  if (!kv_type.ok()) {
    err << "error: " << kv_type.status().message() << "\n";
    return kExitUsage;
  }
  auto loaded = Model::Load(o.path);
  if (!loaded.ok()) {
    err << "error: cannot load model '" << o.path << "': " << loaded.status().ToString() << "\n";
    return kExitUsage;
  }
  const Model& m = **loaded;
  const ModelConfig& c = m.config();
  const GgufFile& f = m.file();
  nlohmann::json j;

  out << "model: " << o.path << "\n";
  struct stat path_st;
  const bool is_dir = stat(o.path.c_str(), &path_st) == 0 && S_ISDIR(path_st.st_mode);
  if (is_dir) {
    DescribeHfDirectory(o.path, out, &j);
  } else {
    out << "format: GGUF v" << f.version() << " file, "
        << FormatBytes(static_cast<double>(f.file_size())) << "\n";
  }
  j["format"] = is_dir ? "hf_directory" : "gguf";
  out << c.Summary() << "\n\n";
  Table cfg({"field", "value"});
  auto field = [&](const std::string& k, const std::string& v) { cfg.AddRow({k, v}); };
  field("architecture", ArchName(c.arch));
  field("name", c.name);
  field("n_layers", std::to_string(c.n_layers));
  field("d_model", std::to_string(c.d_model));
  field("d_ff", std::to_string(c.d_ff));
  field("n_heads", std::to_string(c.n_heads));
  field("n_kv_heads", std::to_string(c.n_kv_heads));
  if (!c.is_mla()) field("head_dim", std::to_string(c.head_dim));
  field("n_vocab", std::to_string(c.n_vocab));
  field("n_ctx_train", std::to_string(c.n_ctx_train));
  field("rope_dim", std::to_string(c.rope_dim));
  field("rope_base", FormatFixed(c.rope_base, 1));
  {
    char eps[32];
    std::snprintf(eps, sizeof(eps), "%g", c.rms_eps);
    field("rms_eps", eps);
  }
  if (c.is_mla()) {
    field("kv_lora_rank (d_c)", std::to_string(c.kv_lora_rank));
    field("qk_rope_dim (d_r)", std::to_string(c.qk_rope_dim));
    field("qk_nope_dim", std::to_string(c.qk_nope_dim));
    field("v_head_dim", std::to_string(c.v_head_dim));
    field("q_lora_rank", std::to_string(c.q_lora_rank));
    field("mla_nope", c.mla_nope ? "true" : "false");
  }
  if (c.arch == Arch::kKimiLinear) {
    std::string kinds;
    for (int l = 0; l < c.n_layers; ++l) kinds += c.is_kda_layer(l) ? 'K' : 'M';
    field("layer kinds (K = KDA, M = MLA)", kinds);
    field("kda_heads x kda_head_dim", std::to_string(c.kda_heads) + " x " +
                                          std::to_string(c.kda_head_dim));
    field("ssm_conv_kernel", std::to_string(c.ssm_conv_kernel));
  }
  if (c.n_experts > 0) {
    field("n_experts", std::to_string(c.n_experts));
    field("n_experts_used", std::to_string(c.n_experts_used));
    field("n_shared_experts", std::to_string(c.n_shared_experts));
    field("d_ff_expert", std::to_string(c.d_ff_expert));
    field("n_leading_dense", std::to_string(c.n_leading_dense));
  }
  cfg.Print(out);
  j["path"] = o.path;
  j["summary"] = c.Summary();
  j["config"] = {{"architecture", ArchName(c.arch)},
                 {"name", c.name},
                 {"n_layers", c.n_layers},
                 {"d_model", c.d_model},
                 {"d_ff", c.d_ff},
                 {"n_heads", c.n_heads},
                 {"n_kv_heads", c.n_kv_heads},
                 {"head_dim", c.head_dim},
                 {"n_vocab", c.n_vocab},
                 {"n_ctx_train", c.n_ctx_train},
                 {"rope_dim", c.rope_dim},
                 {"rope_base", c.rope_base},
                 {"rms_eps", c.rms_eps},
                 {"kv_lora_rank", c.kv_lora_rank},
                 {"qk_rope_dim", c.qk_rope_dim},
                 {"qk_nope_dim", c.qk_nope_dim},
                 {"v_head_dim", c.v_head_dim},
                 {"q_lora_rank", c.q_lora_rank},
                 {"mla_nope", c.mla_nope},
                 {"n_experts", c.n_experts},
                 {"n_experts_used", c.n_experts_used},
                 {"n_shared_experts", c.n_shared_experts},
                 {"d_ff_expert", c.d_ff_expert},
                 {"n_leading_dense", c.n_leading_dense}};

  out << "\n" << (is_dir ? "converted GGUF image" : "GGUF") << " v" << f.version() << ", "
      << f.metadata().size() << " metadata keys, " << f.tensors().size() << " tensors\n";
  j["gguf_version"] = f.version();
  j["metadata_count"] = f.metadata().size();

  // Every metadata key with its type and value (arrays summarised), like gguf-dump.
  out << "\nmetadata:\n";
  // Printed by hand, not as a Table: values are text, left-aligned, whatever they start with.
  size_t kw = 3, tw = 4;
  for (const auto& [key, v] : f.metadata()) {
    kw = std::max(kw, key.size());
    tw = std::max(tw, std::strlen(GgufTypeName(v.array_type)) + 9);
  }
  auto meta_line = [&](const std::string& k, const std::string& t, const std::string& v) {
    out << k << std::string(kw - k.size() + 2, ' ') << t << std::string(tw - t.size() + 2, ' ')
        << v << "\n";
  };
  meta_line("key", "type", "value");
  meta_line(std::string(kw, '-'), std::string(tw, '-'), "-----");
  nlohmann::json jm = nlohmann::json::array();
  for (const auto& [key, v] : f.metadata()) {
    const std::string type = v.type == GgufType::kArray
                                 ? std::string("array of ") + GgufTypeName(v.array_type)
                                 : GgufTypeName(v.type);
    const std::string text = ValueText(v);
    meta_line(key, type, text);
    nlohmann::json e = {{"key", key}, {"type", type}, {"value", text}};
    if (v.type == GgufType::kArray) e["count"] = v.size();
    jm.push_back(e);
  }
  j["metadata"] = jm;

  // File type (general.file_type, else what the tensors hold) and bits per weight.
  {
    std::map<std::string, int64_t> bytes_by_type;
    int64_t n_weights = 0, n_bytes = 0;
    for (const auto& t : f.tensors()) {
      int64_t n = 1;
      for (int64_t x : t.shape) n *= x;
      n_weights += n;
      n_bytes += static_cast<int64_t>(t.n_bytes);
      bytes_by_type[std::string(DTypeName(t.dtype))] += static_cast<int64_t>(t.n_bytes);
    }
    std::string by_type;
    for (const auto& [name, b] : bytes_by_type) {
      by_type += (by_type.empty() ? "" : ", ") + name + " " +
                 FormatFixed(100.0 * b / std::max<int64_t>(1, n_bytes), 1) + "%";
    }
    const GgufValue* ft = f.Find("general.file_type");
    const std::string ft_text =
        ft != nullptr && ft->IsInteger() ? FileTypeIdName(ft->AsInt()) + " (general.file_type " +
                                               std::to_string(ft->AsInt()) + ")"
                                         : "not recorded (no general.file_type)";
    const double bpw = n_weights > 0 ? 8.0 * n_bytes / n_weights : 0;
    out << "\nfile type: " << ft_text << "; tensor bytes by type: " << by_type << "\n";
    out << "bits per weight: " << FormatFixed(bpw, 2) << " (" << n_bytes << " tensor bytes, "
        << n_weights << " weights)\n";
    j["file_type"] = ft != nullptr && ft->IsInteger() ? nlohmann::json(ft->AsInt()) : nullptr;
    j["bits_per_weight"] = bpw;
  }

  const Tokenizer* tok = m.tokenizer();
  const GgufValue* tmpl = f.Find("tokenizer.chat_template");
  const bool has_template = tmpl != nullptr && tmpl->type == GgufType::kString;
  if (tok) {
    const char* kind =
        tok->kind() == Tokenizer::Kind::kSentencePiece ? "sentencepiece (llama)" : "bpe (gpt2)";
    out << "tokenizer: " << kind << ", vocab " << tok->vocab_size() << ", bos "
        << TokenWithText(*tok, tok->bos_id()) << ", eos " << TokenWithText(*tok, tok->eos_id())
        << ", add bos " << (tok->add_bos() ? "yes" : "no") << "\n";
    j["tokenizer"] = {{"kind", kind},
                      {"vocab_size", tok->vocab_size()},
                      {"bos", tok->bos_id()},
                      {"eos", tok->eos_id()},
                      {"bos_text", tok->bos_id() >= 0 && tok->CheckId(tok->bos_id()).ok()
                                       ? nlohmann::json(tok->token_text(tok->bos_id()))
                                       : nullptr},
                      {"eos_text", tok->eos_id() >= 0 && tok->CheckId(tok->eos_id()).ok()
                                       ? nlohmann::json(tok->token_text(tok->eos_id()))
                                       : nullptr}};
  } else {
    out << "tokenizer: none (no tokenizer.ggml.* metadata)\n";
    j["tokenizer"] = nullptr;
  }
  // strata chat and strata serve's /v1/chat/completions render conversations with the built-in
  // renderer the template is recognised as (generate takes its prompt as raw text).
  std::string use;
  if (has_template) {
    auto builtin = ChatTemplate::Detect(tmpl->s);
    use = builtin.ok() ? "recognised as the built-in " + builtin->name() +
                             " template, which strata chat and serve apply"
                       : "not recognised by a built-in renderer: strata chat and serve need "
                         "--chat-template NAME";
  }
  out << "chat template: "
      << (has_template ? "yes (tokenizer.chat_template, " + std::to_string(tmpl->s.size()) +
                             " chars; " + use + ")"
                       : "none (no tokenizer.chat_template)")
      << "\n";
  j["chat_template"] = has_template;

  out << "\ntensors:\n";
  Table tt({"name", "type", "shape", "bytes"});
  nlohmann::json jt = nlohmann::json::array();
  int64_t params = 0;
  for (const auto& t : f.tensors()) {
    int64_t n = 1;
    for (int64_t s : t.shape) n *= s;
    params += n;
    const std::string type(DTypeName(t.dtype));
    tt.AddRow({t.name, type, FormatShape(t.shape), std::to_string(t.n_bytes)});
    jt.push_back({{"name", t.name}, {"type", type}, {"shape", t.shape}, {"bytes", t.n_bytes}});
  }
  tt.Print(out);
  j["tensors"] = jt;
  out << "parameters: " << params << "\n";
  out << "total weight bytes: " << m.total_weight_bytes() << " ("
      << FormatBytes(m.total_weight_bytes()) << ")\n";
  out << "decode weight bytes per token: " << m.decode_weight_bytes() << " ("
      << FormatBytes(m.decode_weight_bytes()) << ")\n";
  j["parameters"] = params;
  j["total_weight_bytes"] = m.total_weight_bytes();
  j["decode_weight_bytes"] = m.decode_weight_bytes();

  // KV cache geometry: consecutive layers with the same geometry share a row.
  std::vector<LayerGeometry> layers = m.CacheLayers();
  for (LayerGeometry& g : layers) g.kv_type = *kv_type;
  out << "\nKV cache (full, " << KvTypeName(*kv_type) << " rows"
      << (*kv_type == DType::kBF16 ? ", the default; --kv-type f32|f16 for research and parity"
                                   : "; --kv-type: the full policy only")
      << "):\n";
  j["kv_type"] = KvTypeName(*kv_type);
  Table kt({"layers", "kind", "attention", "q_heads", "kv_heads", "k_dim", "v_dim", "rope_dim",
            "rope", "bytes/token"});
  nlohmann::json jl = nlohmann::json::array();
  // Global layers hold every token; a sliding-window layer at most its window (the cache keeps
  // the window's pages and releases older ones), whatever the context.
  int64_t total = 0, local_per_token = 0, max_window = 0;
  for (size_t l = 0; l < layers.size();) {
    size_t e = l + 1;
    while (e < layers.size() && SameGeometry(layers[l], layers[e])) ++e;
    const LayerGeometry& g = layers[l];
    kt.AddRow({LayerSpan(layers, l, e), KindName(g.kind),
               g.window > 0 ? "window " + std::to_string(g.window) : std::string("global"),
               std::to_string(g.n_q_heads), std::to_string(g.n_kv_heads),
               std::to_string(g.k_dim), std::to_string(g.v_dim), std::to_string(g.rope_dim),
               g.rope ? "yes" : "no (NoPE)", std::to_string(g.bytes_per_token())});
    l = e;
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerGeometry& g = layers[l];
    if (g.window > 0) {
      local_per_token += g.bytes_per_token();
      max_window = std::max<int64_t>(max_window, g.window);
    } else {
      total += g.bytes_per_token();
    }
    jl.push_back({{"layer", g.model_layer >= 0 ? static_cast<size_t>(g.model_layer) : l},
                  {"kind", KindName(g.kind)},
                  {"window", g.window},
                  {"n_q_heads", g.n_q_heads},
                  {"n_kv_heads", g.n_kv_heads},
                  {"k_dim", g.k_dim},
                  {"v_dim", g.v_dim},
                  {"rope_dim", g.rope_dim},
                  {"rope", g.rope},
                  {"scale", g.scale},
                  {"bytes_per_token", g.bytes_per_token()}});
  }
  kt.Print(out);
  if (local_per_token > 0) {
    out << "KV bytes per token (global layers): " << total << " (" << FormatBytes(total)
        << "); sliding-window layers: " << local_per_token << " per token of their window, at "
        << "most " << FormatBytes(static_cast<double>(local_per_token) * max_window)
        << " whatever the context\n";
  } else {
    out << "KV bytes per token (all layers): " << total << " (" << FormatBytes(total) << ")\n";
  }
  Table ctx({"context", "KV bytes"});
  for (int64_t n : {4096, 32768, 131072}) {
    int64_t local = 0;
    for (const LayerGeometry& g : layers) {
      if (g.window > 0) local += g.bytes_per_token() * std::min<int64_t>(n, g.window);
    }
    ctx.AddRow({std::to_string(n), FormatBytes(static_cast<double>(total) * n + local)});
  }
  ctx.Print(out);
  const RecurrentGeometry rec = m.RecurrentLayers();
  if (rec.n_layers > 0) {
    // The recurrent (KDA) layers: a fixed state per sequence, independent of the context.
    out << "\nRecurrent state (KDA layers; per sequence, independent of the context; f32):\n";
    Table rt({"KDA layers", "state floats/layer", "conv floats/layer", "bytes/sequence"});
    rt.AddRow({std::to_string(rec.n_layers), std::to_string(rec.state_floats),
               std::to_string(rec.conv_floats), std::to_string(rec.bytes_per_sequence()) + " (" +
                                                     FormatBytes(rec.bytes_per_sequence()) + ")"});
    rt.Print(out);
    std::vector<int> kda_layers;
    for (int l = 0; l < c.n_layers; ++l) {
      if (c.is_kda_layer(l)) kda_layers.push_back(l);
    }
    j["recurrent"] = {{"kind", "kda"},
                      {"layers", kda_layers},
                      {"n_layers", rec.n_layers},
                      {"state_floats_per_layer", rec.state_floats},
                      {"conv_floats_per_layer", rec.conv_floats},
                      {"bytes_per_sequence", rec.bytes_per_sequence()}};
  }
  j["kv_layers"] = jl;
  j["kv_bytes_per_token"] = total;  // global layers (every layer when none is local)
  j["kv_window_bytes_per_token"] = local_per_token;

  if (!o.json_path.empty()) {
    Status st = WriteTextFile(o.json_path, DumpJson(j));
    if (!st.ok()) {
      err << "error: --json: " << st.ToString() << "\n";
      return kExitUsage;
    }
    err << "wrote " << o.json_path << "\n";
  }
  return kExitOk;
}

}  // namespace strata::cli
