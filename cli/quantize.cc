// `strata quantize IN.gguf OUT.gguf --type Q4_K_M`: rewrites a GGUF file with its weight matrices
// in a llama.cpp file type (the per-tensor mix of model/quantize.h), progress per tensor on stderr.
#include "model/quantize.h"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/gguf.h"
#include "model/model.h"

namespace strata::cli {

namespace {
std::string TypesHelp() {
  std::string s = "File type (llama.cpp's names, any case):";
  for (const FileTypeInfo& t : FileTypes()) s += std::string("\n  ") + t.name + ": " + t.what;
  return s;
}

std::string Mib(int64_t b) { return FormatFixed(b / 1048576.0, 2) + " MiB"; }
}  // namespace

void AddQuantizeCommand(CLI::App* app, QuantizeOptions* o) {
  CLI::App* cmd = app->add_subcommand(
      "quantize",
      "Quantize a GGUF model's weight matrices to a llama.cpp file type (Q4_K_M, Q8_0, ...)");
  cmd->add_option("in", o->in_path, "Input .gguf (F32, F16 or BF16 weights)")->required();
  cmd->add_option("out", o->out_path, "Output .gguf")->required();
  cmd->add_option("type", o->type_positional,
                  "File type as a third argument, as llama-quantize takes it (same as --type)");
  cmd->add_option("--type", o->type, TypesHelp());
  cmd->add_option("-t,--threads", o->threads,
                  "Worker threads (default: the hardware threads; more are capped to them)");
  cmd->add_flag("--overwrite", o->overwrite,
                "Replace an existing output file. Without it an existing output is refused, so "
                "that no model file is lost by accident (llama-quantize overwrites silently); "
                "the input itself is never accepted as the output, in any spelling");
  cmd->add_flag("--allow-requantize", o->allow_requantize,
                "Accept an input whose matrices are already quantized (they are dequantized and "
                "quantized again, losing precision twice)");
}

int RunQuantize(const QuantizeOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  std::string type = o.type;
  if (!o.type_positional.empty()) {
    if (!type.empty() && type != o.type_positional) {
      return fail("two file types given: '" + o.type_positional + "' and --type '" + type + "'");
    }
    type = o.type_positional;
  }
  if (type.empty()) return fail("no file type given: pass --type (e.g. --type Q4_K_M)");
  auto ft = ParseFileType(type);
  if (!ft.ok()) return fail("--type " + ft.status().message());
  if (o.threads < 0) return fail("--threads " + std::to_string(o.threads) + " must be >= 1");
  const int threads =
      o.threads == 0 ? HardwareThreads() : CapThreads("--threads", o.threads, err);
  if (Status st = CheckModelOutput(o.out_path, {o.in_path}, o.overwrite); !st.ok()) {
    return fail(st.message());
  }
  auto in = GgufFile::Open(o.in_path);
  if (!in.ok()) return fail("cannot read '" + o.in_path + "': " + in.status().ToString());

  QuantizeFileOptions qo;
  qo.type = *ft;
  qo.threads = threads;
  qo.allow_requantize = o.allow_requantize;
  qo.progress = [&](const QuantizeProgress& p) {
    char head[32];
    std::snprintf(head, sizeof head, "[%4d/%4d] ", p.index, p.count);
    err << head << *p.name << ": ";
    if (p.converted) {
      err << DTypeName(p.from) << " -> " << DTypeName(p.to) << ", " << Mib(p.bytes_in) << " -> "
          << Mib(p.bytes_out) << "\n";
    } else {
      err << DTypeName(p.from) << ", copied (" << Mib(p.bytes_in) << ")\n";
    }
  };
  err << "quantize: " << o.in_path << " -> " << o.out_path << " as " << ft->name << " ("
      << threads << " thread" << (threads == 1 ? "" : "s") << ")\n";
  // Written beside the output under a temporary name and renamed over it only once it loads, so
  // a failed run leaves neither a partial output nor the temporary file.
  const std::string tmp = ModelOutputTemp(o.out_path);
  auto rep = QuantizeGguf(**in, tmp, qo);
  if (!rep.ok()) {
    RemoveModelOutputTemp(tmp);
    return fail(rep.status().ToString());
  }
  // Read the result back through the engine's loader: a file the engine cannot load is an error
  // here, not at the first generate.
  if (auto m = Model::Load(tmp); !m.ok()) {
    RemoveModelOutputTemp(tmp);
    return fail("quantized file does not load: " + m.status().ToString());
  }
  if (Status st = CommitModelOutput(tmp, o.out_path, o.overwrite); !st.ok()) {
    return fail(st.message());
  }
  const double bpw = rep->n_weights > 0 ? 8.0 * rep->bytes_out / rep->n_weights : 0;
  out << "wrote " << o.out_path << " (" << ft->name << "): " << rep->n_quantized << " of "
      << rep->n_tensors << " tensors quantized";
  if (rep->n_fallback > 0) {
    out << " (" << rep->n_fallback << " with a fallback type: rows not a whole number of blocks)";
  }
  out << "; " << Mib(rep->bytes_in) << " -> " << Mib(rep->bytes_out) << ", "
      << FormatFixed(bpw, 2) << " bits per weight, in " << FormatFixed(rep->seconds, 1) << " s\n";
  return kExitOk;
}

}  // namespace strata::cli
