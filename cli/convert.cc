// `strata convert` (HF safetensors + config.json [+ strata_tokenizer.json or tokenizer.json]
// -> GGUF) and
// `strata logits` (every position's logits of a token-id file, as raw f32, for parity checks; with
// --dump-kv also the engine's bf16 KV cache after the run).
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/quant.h"
#include "io/hf.h"
#include "io/tokenizer_json.h"
#include "kv/cache.h"
#include "model/model.h"
#include "model/quantize.h"

namespace strata::cli {

namespace {
// Writes every layer's rows as stored (see kLogitsDumpKvHelp for the layout). The caller checked
// that the policy is `full`; a released page is still reported as an error, never read.
Status WriteKvDump(const KvCache& cache, const std::string& path, int64_t* bytes_written) {
  std::ofstream f(path, std::ios::binary);
  if (!f) return IoError("cannot open --dump-kv file '" + path + "' for writing");
  std::vector<char> row;
  int64_t total = 0;
  for (int l = 0; l < cache.n_layers(); ++l) {
    const LayerStore& s = cache.store(l);
    const LayerGeometry& g = s.geometry();
    const bool mla = g.kind == AttnKind::kMla;
    const int64_t width = mla ? g.k_dim : int64_t{g.n_kv_heads} * (g.k_dim + g.v_dim);
    row.resize(2 * width);
    for (int64_t u = 0; u < s.n_rows(); ++u) {
      for (int h = 0; h < g.n_kv_heads; ++h) {
        if (!s.page_resident(h, u / LayerStore::kPageRows)) {
          return InvalidArgument("--dump-kv: layer " + std::to_string(l) + " row " +
                                    std::to_string(u) + " is no longer resident");
        }
      }
      int64_t j = 0;
      auto put = [&](const uint16_t* src, int64_t n) {
        for (int64_t i = 0; i < n; ++i, ++j) {  // little-endian whatever the host
          row[2 * j] = static_cast<char>(src[i] & 0xff);
          row[2 * j + 1] = static_cast<char>(src[i] >> 8);
        }
      };
      for (int h = 0; h < g.n_kv_heads; ++h) put(s.key_row(h, u), g.k_dim);
      if (!mla) {
        for (int h = 0; h < g.n_kv_heads; ++h) put(s.val_row(h, u), g.v_dim);
      }
      f.write(row.data(), static_cast<std::streamsize>(row.size()));
      total += static_cast<int64_t>(row.size());
    }
  }
  f.flush();
  if (!f.good()) return IoError("cannot write --dump-kv file '" + path + "'");
  *bytes_written = total;
  return OkStatus();
}
}  // namespace

const char* const kLogitsDumpKvHelp =
    "After the run, write the engine's KV cache (needs --policy full) as raw little-endian bf16 "
    "(u16), no header: layer 0, then layer 1, ...; per layer n_tokens rows (token order), each "
    "row exactly as the cache stores it. MLA (deepseek2) row: k_dim = kv_lora_rank + "
    "qk_rope_dim values [c_hat ; r] = [RMSNorm'ed latent ; decoupled key branch (rotated unless "
    "NoPE)]; the value is the row's first kv_lora_rank values, not repeated. GQA/MHA (llama, "
    "qwen2) row: n_kv_heads * (head_dim_k + head_dim_v) values [K head 0, ..., K head G-1, "
    "V head 0, ..., V head G-1], K after RoPE in the engine's dim order (an HF llama/qwen2 "
    "conversion permutes q/k rows: engine dim 2i+s of a head = HF dim s*head_dim/2 + i). File "
    "size = sum over layers of n_tokens * row width * 2 bytes";

void AddConvertCommand(CLI::App* app, ConvertOptions* o) {
  CLI::App* cmd = app->add_subcommand(
      "convert", "Convert an HF checkpoint directory (config.json + *.safetensors) to GGUF");
  cmd->add_option("dir", o->dir, "HF checkpoint directory")->required();
  cmd->add_option("-o,--out", o->out_path, "Output .gguf file")->required();
  cmd->add_option("--dtype", o->dtype,
                  "Storage of weight matrices: f32, f16, bf16, or a llama.cpp file type (q8_0, "
                  "q4_k_m, q6_k, ...; see `strata quantize --help`)")
      ->capture_default_str();
  cmd->add_flag("--overwrite", o->overwrite,
                "Replace an existing output file (without it an existing output is refused, so "
                "that no model file is lost by accident)");
}

int RunConvert(const ConvertOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  auto ft = ParseWeightFileType(o.dtype);
  if (!ft.ok()) return fail(ft.status().message());
  const bool quantize = IsQuantized(ft->base);
  {
    // The output may not be one of the files the conversion reads.
    std::vector<std::string> inputs = {o.dir};
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(o.dir, ec)) {
      inputs.push_back(e.path().string());
    }
    if (Status st = CheckModelOutput(o.out_path, inputs, o.overwrite); !st.ok()) {
      return fail(st.message());
    }
  }
  HfConvertOptions co;
  co.out_dtype = quantize ? DType::kF32 : ft->base;  // quantized types: built in f32 first
  auto w = ConvertHfDirectory(o.dir, co);
  if (!w.ok()) return fail("cannot convert '" + o.dir + "': " + w.status().ToString());
  const std::string tok = o.dir + "/" + kTokenizerJsonName;
  const bool has_tok = std::filesystem::exists(tok);
  std::string tok_desc = "none";
  if (has_tok) {
    if (Status st = AddTokenizerJson(tok, &*w); !st.ok()) return fail(st.ToString());
    tok_desc = kTokenizerJsonName;
  } else if (std::filesystem::exists(o.dir + "/tokenizer.json")) {
    // A real HF tokenizer: written as llama.cpp's convert_hf_to_gguf.py writes it.
    auto conv = AddHfTokenizerJson(o.dir, &*w);
    if (!conv.ok()) return fail("cannot convert the tokenizer: " + conv.status().ToString());
    tok_desc = "tokenizer.json (" + conv->model + ", pre=" + conv->pre + ")";
  } else {
    // llama.cpp refuses a file without tokenizer.ggml.model; "none" is its word for no vocabulary
    // (it then makes vocab_size dummy tokens), and Strata reads it as no tokenizer.
    w->Set("tokenizer.ggml.model", GgufValue::String("none"));
  }
  // Written beside the output under a temporary name and renamed over it only once it loads, so
  // a failed run leaves neither a partial output nor the temporary file.
  const std::string tmp = ModelOutputTemp(o.out_path);
  if (quantize) {
    QuantizeFileOptions qo;
    qo.type = *ft;
    qo.threads = HardwareThreads();
    err << "convert: quantizing to " << ft->name << " ...\n";
    if (auto rep = WriteQuantized(*w, tmp, qo); !rep.ok()) {
      RemoveModelOutputTemp(tmp);
      return fail(rep.status().ToString());
    }
  } else if (Status st = w->WriteFile(tmp); !st.ok()) {
    RemoveModelOutputTemp(tmp);
    return fail(st.ToString());
  }
  // Read the result back through the engine's own loader: a conversion that the engine cannot
  // load is an error here, not at the first generate.
  auto m = Model::Load(tmp);
  if (!m.ok()) {
    RemoveModelOutputTemp(tmp);
    return fail("converted file does not load: " + m.status().ToString());
  }
  if (Status st = CommitModelOutput(tmp, o.out_path, o.overwrite); !st.ok()) {
    return fail(st.message());
  }
  out << "wrote " << o.out_path << ": " << (*m)->config().Summary() << "; "
      << FormatBytes(static_cast<double>((*m)->total_weight_bytes())) << " of weights ("
      << o.dtype << "), tokenizer: " << tok_desc << "\n";
  return kExitOk;
}

void AddLogitsCommand(CLI::App* app, LogitsOptions* o) {
  CLI::App* cmd = app->add_subcommand(
      "logits", "Write the logits at every position of a token-id sequence (raw f32)");
  cmd->add_option("-m,--model", o->model, "Model (.gguf or HF directory)")->required();
  cmd->add_option("--tokens", o->tokens_path,
                  "Text file of whitespace-separated token ids (used as they are: no BOS added)")
      ->required();
  cmd->add_option("--out", o->out_path, "Output: little-endian f32 [n_tokens, n_vocab]")
      ->required();
  cmd->add_option("--dump-kv", o->dump_kv_path, kLogitsDumpKvHelp)->option_text("FILE");
  cmd->add_option("--chunk", o->chunk, "Prefill chunk size")->capture_default_str();
  cmd->add_option("--policy", o->policy, "KV cache policy")->capture_default_str();
  cmd->add_option("--policy-set", o->policy_settings,
                  "Deprecated (use NAME:key=value in --policy): policy settings key=value,...");
  AddPolicyFlags(cmd, &o->policy_flags);
  cmd->add_option("--kv-type", o->kv_type, kKvTypeHelp)->capture_default_str();
}

int RunLogits(const LogitsOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  if (Status st = CheckAtLeast("--chunk", o.chunk, 1); !st.ok()) return fail(st.message());
  const auto kv_type = ParseKvType(o.kv_type);
  if (!kv_type.ok()) return fail(kv_type.status().message());
  if (!o.dump_kv_path.empty() && *kv_type != DType::kBF16) {
    return fail("--dump-kv writes bf16 rows (the parity check's format); it needs --kv-type bf16, "
                "got --kv-type " + o.kv_type);
  }
  std::ifstream tf(o.tokens_path);
  if (!tf) return fail("cannot open --tokens file '" + o.tokens_path + "'");
  std::vector<int32_t> ids;
  std::string word;
  while (tf >> word) {
    char* end = nullptr;
    const long long v = std::strtoll(word.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX) {
      return fail("--tokens file '" + o.tokens_path + "': '" + word + "' is not a token id");
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return fail("--tokens file '" + o.tokens_path + "' holds no token ids");
  if (!o.dump_kv_path.empty() && o.policy != "full") {
    return fail("--dump-kv needs --policy full (a compressing policy does not keep every row), "
                "got --policy " + o.policy);
  }
  auto policy = MakeCliPolicy(o.policy, o.policy_settings, &o.policy_flags);
  if (!policy.ok()) return fail(policy.status().message());
  auto m = Model::Load(o.model);
  if (!m.ok()) return fail("cannot load model '" + o.model + "' (-m): " + m.status().ToString());
  auto cache = (*m)->NewCache(std::move(policy).value(), *kv_type);
  if (!cache.ok()) return fail(cache.status().ToString());
  std::vector<float> all;
  if (Status st = (*m)->Prefill(ids.data(), static_cast<int64_t>(ids.size()), o.chunk,
                                cache->get(), nullptr, nullptr, &all);
      !st.ok()) {
    return fail(st.ToString());
  }
  std::ofstream of(o.out_path, std::ios::binary);
  of.write(reinterpret_cast<const char*>(all.data()),
           static_cast<std::streamsize>(all.size() * sizeof(float)));
  if (!of.good()) return fail("cannot write --out file '" + o.out_path + "'");
  out << "wrote " << ids.size() << " x " << (*m)->config().n_vocab << " logits to " << o.out_path
      << " (KV cache " << KvTypeName(*kv_type) << ")\n";
  if (!o.dump_kv_path.empty()) {
    int64_t bytes = 0;
    if (Status st = WriteKvDump(**cache, o.dump_kv_path, &bytes); !st.ok()) {
      return fail(st.ToString());
    }
    out << "wrote the KV cache (" << (*cache)->n_layers() << " layers x "
        << (*cache)->n_tokens() << " rows, bf16, " << bytes << " bytes) to " << o.dump_kv_path
        << "\n";
  }
  return kExitOk;
}

}  // namespace strata::cli
