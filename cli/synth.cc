// `strata synth`: writes a random-weight model (GGUF file or HF safetensors directory).
#include "model/synth.h"

#include <CLI/CLI.hpp>
#include <filesystem>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/quant.h"
#include "io/gguf.h"
#include "io/hf.h"
#include "model/quantize.h"

namespace strata::cli {

namespace {

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

}  // namespace

void AddSynthCommand(CLI::App* app, SynthCliOptions* o) {
  CLI::App* cmd = app->add_subcommand("synth", "Write a random-weight test model");
  cmd->add_option(
      "--arch", o->arch,
      "Architecture: llama, qwen2, deepseek2, kimi-linear or gemma3 (default: the preset's, llama "
      "for tiny)");
  cmd->add_flag("--nope", o->nope, "deepseek2: NoPE branch (cached and used unrotated)");
  cmd->add_option("--preset", o->preset,
                  "Shape: tiny (tests), 125m (llama-shaped), 150m (deepseek2-shaped MLA + MoE), "
                  "48b-shape (kimi-linear: Kimi Linear 48B-A3B's layer geometry, 4 layers, 16 "
                  "experts)")
      ->capture_default_str();
  cmd->add_option("--dims", o->dims,
                  "Overrides as key=value,...: d_model, layers, heads, kv_heads, head_dim, ff, "
                  "vocab, q_lora, kv_lora, nope_dim, rope_dim, v_dim, experts, experts_used, "
                  "shared_experts, ff_expert, dense_layers, gating, kda_dim, conv, mla_every, "
                  "window, swa_period (gemma3: sliding window, every swa_period-th layer global), "
                  "tied, seed");
  cmd->add_option("--dtype", o->dtype,
                  "Matrix storage: f32, f16, bf16, or a llama.cpp file type (q8_0, q4_k_m, "
                  "q6_k, ...; see `strata quantize --help`; GGUF only)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Weight seed")->capture_default_str();
  cmd->add_option("--format", o->format, "gguf (a file) or safetensors (a directory)")
      ->capture_default_str();
  cmd->add_option("-o,--out", o->out_path, "Output: a .gguf file, or a directory for safetensors")
      ->required();
}

int RunSynth(const SynthCliOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  if (o.format != "gguf" && o.format != "safetensors") {
    return fail("--format '" + o.format + "' is not one of gguf, safetensors");
  }
  if (o.out_path.empty()) return fail("-o: an output path is required");
  SynthOptions s;
  if (Status st = s.ApplyPreset(o.preset); !st.ok()) return fail("--preset: " + st.message());
  const Arch preset_arch = s.arch;
  if (!o.arch.empty()) {
    auto a = ParseArch(o.arch);
    if (!a.ok()) return fail("--arch: " + a.status().message());
    auto family = [](Arch x) { return x == Arch::kQwen2 ? Arch::kLlama : x; };
    if (o.preset != "tiny" && family(*a) != family(preset_arch)) {
      return fail("--arch " + o.arch + " does not fit --preset " + o.preset + " (a " +
                  ArchName(preset_arch) + " shape)");
    }
    s.SetArch(*a, o.preset);
  }
  if (o.nope && s.arch != Arch::kDeepseek2) {
    return fail("--nope applies to deepseek2 only, not " + std::string(ArchName(s.arch)));
  }
  s.nope = o.nope;
  s.seed = o.seed;
  if (Status st = s.ApplyDims(o.dims); !st.ok()) return fail(st.message());
  auto ft = ParseWeightFileType(o.dtype);
  if (!ft.ok()) return fail(ft.status().message());
  if (IsQuantized(ft->base)) {
    if (o.format == "safetensors") {
      return fail("--dtype " + o.dtype + " needs --format gguf (safetensors holds f32, f16 or "
                  "bf16)");
    }
    s.dtype = DType::kF32;  // built in f32, then quantized with the file type's mix
    s.file_type = ft->name;
  } else {
    s.dtype = ft->base;
  }
  if (Status st = s.Validate(); !st.ok()) return fail(st.message());

  err << "synth: writing a " << ArchName(s.arch) << " " << o.preset << " model (" << o.format
      << ", " << o.dtype << ") to " << o.out_path << " ...\n";
  namespace fs = std::filesystem;
  std::error_code ec;
  Table t({"file", "tensors", "parameters", "bytes"});
  int64_t total_params = 0, total_bytes = 0;
  if (o.format == "gguf") {
    if (Status st = SynthGguf(s, o.out_path); !st.ok()) return fail(st.ToString());
    auto f = GgufFile::Open(o.out_path);
    if (!f.ok()) return fail("re-reading '" + o.out_path + "': " + f.status().ToString());
    for (const auto& ti : (*f)->tensors()) total_params += Numel(ti.shape);
    total_bytes = static_cast<int64_t>((*f)->file_size());
    t.AddRow({o.out_path, std::to_string((*f)->tensors().size()), std::to_string(total_params),
              std::to_string(total_bytes)});
  } else {
    if (Status st = SynthHf(s, o.out_path); !st.ok()) return fail(st.ToString());
    const std::string st_path = (fs::path(o.out_path) / "model.safetensors").string();
    auto f = SafetensorsFile::Open(st_path);
    if (!f.ok()) return fail("re-reading '" + st_path + "': " + f.status().ToString());
    const auto names = (*f)->TensorNames();
    for (const auto& n : names) {
      auto tv = (*f)->Tensor(n);
      if (tv.ok()) total_params += tv->numel();
    }
    for (const auto& e : fs::directory_iterator(o.out_path, ec)) {
      if (!e.is_regular_file(ec)) continue;
      const int64_t b = static_cast<int64_t>(e.file_size(ec));
      total_bytes += b;
      const bool is_st = e.path().filename() == "model.safetensors";
      t.AddRow({e.path().string(), is_st ? std::to_string(names.size()) : "-",
                is_st ? std::to_string(total_params) : "-", std::to_string(b)});
    }
  }
  t.Print(out);
  out << "wrote " << o.out_path << ": " << total_params << " parameters ("
      << FormatFixed(total_params / 1e6, 2) << " M), " << total_bytes << " bytes ("
      << FormatBytes(total_bytes) << ")\n";
  return kExitOk;
}

}  // namespace strata::cli
