// `strata inspect FILE`: architecture, metadata, tokenizer, tensors and KV cache geometry.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/model.h"

namespace strata::cli {

namespace {

const char* KindName(AttnKind k) { return k == AttnKind::kMla ? "MLA" : "GQA"; }

bool SameGeometry(const LayerGeometry& a, const LayerGeometry& b) {
  return a.kind == b.kind && a.n_q_heads == b.n_q_heads && a.n_kv_heads == b.n_kv_heads &&
         a.k_dim == b.k_dim && a.v_dim == b.v_dim && a.rope_dim == b.rope_dim && a.rope == b.rope &&
         a.scale == b.scale;
}

}  // namespace

void AddInspectCommand(CLI::App* app, InspectOptions* o) {
  CLI::App* cmd = app->add_subcommand(
      "inspect", "Print a model's architecture, tokenizer, tensors and KV cache geometry");
  cmd->add_option("FILE", o->path, "Model: a .gguf file or a Hugging Face directory")->required();
  cmd->add_option("--json", o->json_path, "Also write the report as JSON to this file");
}

int RunInspect(const InspectOptions& o, std::ostream& out, std::ostream& err) {
  auto loaded = Model::Load(o.path);
  if (!loaded.ok()) {
    err << "error: cannot load model '" << o.path << "': " << loaded.status().ToString() << "\n";
    return kExitUsage;
  }
  const Model& m = **loaded;
  const ModelConfig& c = m.config();
  const GgufFile& f = m.file();
  nlohmann::json j;

  out << "model: " << o.path << "\n" << c.Summary() << "\n\n";
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

  out << "\nGGUF v" << f.version() << ", " << f.metadata().size() << " metadata keys, "
      << f.tensors().size() << " tensors\n";
  j["gguf_version"] = f.version();
  j["metadata_count"] = f.metadata().size();

  const Tokenizer* tok = m.tokenizer();
  if (tok) {
    const char* kind =
        tok->kind() == Tokenizer::Kind::kSentencePiece ? "sentencepiece (llama)" : "bpe (gpt2)";
    out << "tokenizer: " << kind << ", vocab " << tok->vocab_size() << ", bos " << tok->bos_id()
        << ", eos " << tok->eos_id() << "\n";
    j["tokenizer"] = {{"kind", kind},
                      {"vocab_size", tok->vocab_size()},
                      {"bos", tok->bos_id()},
                      {"eos", tok->eos_id()}};
  } else {
    out << "tokenizer: none (no tokenizer.ggml.* metadata)\n";
    j["tokenizer"] = nullptr;
  }

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
  const std::vector<LayerGeometry> layers = m.CacheLayers();
  out << "\nKV cache (full, bf16):\n";
  Table kt({"layers", "kind", "q_heads", "kv_heads", "k_dim", "v_dim", "rope_dim", "rope",
            "bytes/token"});
  nlohmann::json jl = nlohmann::json::array();
  int64_t total = 0;
  for (size_t l = 0; l < layers.size();) {
    size_t e = l + 1;
    while (e < layers.size() && SameGeometry(layers[l], layers[e])) ++e;
    const LayerGeometry& g = layers[l];
    const std::string span =
        e - l == 1 ? std::to_string(l) : std::to_string(l) + "-" + std::to_string(e - 1);
    kt.AddRow({span, KindName(g.kind), std::to_string(g.n_q_heads), std::to_string(g.n_kv_heads),
               std::to_string(g.k_dim), std::to_string(g.v_dim), std::to_string(g.rope_dim),
               g.rope ? "yes" : "no (NoPE)", std::to_string(g.bytes_per_token())});
    l = e;
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerGeometry& g = layers[l];
    total += g.bytes_per_token();
    jl.push_back({{"layer", l},
                  {"kind", KindName(g.kind)},
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
  out << "KV bytes per token (all layers): " << total << " (" << FormatBytes(total) << ")\n";
  Table ctx({"context", "KV bytes"});
  for (int64_t n : {4096, 32768, 131072}) {
    ctx.AddRow({std::to_string(n), FormatBytes(static_cast<double>(total) * n)});
  }
  ctx.Print(out);
  j["kv_layers"] = jl;
  j["kv_bytes_per_token"] = total;

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
