// The `strata` command tree: CLI11 parsing, dispatch, and the error and exit-code conventions.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <exception>

#include "cli/bench_geodesia.h"
#include "cli/commands.h"
#include "cli/common.h"

namespace strata::cli {

namespace {

// Names of the commands registered under `app`, in registration order (so a new command needs
// no second list here).
std::vector<std::string> SubcommandNames(CLI::App* app) {
  std::vector<std::string> names;
  for (CLI::App* s : app->get_subcommands([](CLI::App*) { return true; })) {
    names.push_back(s->get_name());
  }
  return names;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool IsKnown(const std::vector<std::string>& names, const std::string& s) {
  return std::find(names.begin(), names.end(), s) != names.end();
}

}  // namespace

int RunStrata(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app("strata: long-context LLM decoding on a KV cache compressed by training-free "
               "policies",
               "strata");
  app.require_subcommand(1);
  app.footer("Examples:\n"
             "  strata demo                      # the main job (models/nope-mla.gguf)\n"
             "  strata inspect model.gguf\n"
             "  strata generate -m model.gguf -p \"The quick brown fox\" -n 64\n"
             "  strata synth --preset 125m --dtype f16 -o /tmp/l125.gguf\n"
             "  strata bench decode -m /tmp/l125.gguf --ctx 0,4096,16384 --threads 1,2\n"
             "  strata policies                  # every cache policy and its settings\n"
             "Run `strata COMMAND --help` for a command's flags.\n");
  DemoOptions demo;
  AddDemoCommand(&app, &demo);
  InspectOptions inspect;
  GenerateOptions generate;
  SynthCliOptions synth;
  BenchDecodeOptions bench_decode;
  AddInspectCommand(&app, &inspect);
  AddGenerateCommand(&app, &generate);
  AddSynthCommand(&app, &synth);
  ConvertOptions convert;
  LogitsOptions logits;
  AddConvertCommand(&app, &convert);
  AddLogitsCommand(&app, &logits);
  CLI::App* bench =
      app.add_subcommand("bench", "Benchmarks, with ratios measured in the same process");
  bench->require_subcommand(1);
  AddBenchDecodeCommand(bench, &bench_decode);
  BenchCapacityOptions bench_capacity;
  AddBenchCapacityCommand(bench, &bench_capacity);
  std::shared_ptr<EvalCliOptions> eval = AddEvalCommand(&app);
  BenchAttentionOptions bench_attention;
  AddBenchAttentionCommand(bench, &bench_attention);
  PoliciesOptions policies;
  AddPoliciesCommand(&app, &policies);

  const std::vector<std::string> commands = SubcommandNames(&app);
  const std::vector<std::string> bench_commands = SubcommandNames(bench);

  auto usage_error = [&](const std::string& msg) {
    err << "error: " << msg << "\nRun `strata --help` for usage.\n";
    return kExitUsage;
  };
  if (args.empty()) {
    err << app.help();
    return usage_error("no command given (commands: " + Join(commands) + ")");
  }
  if (args[0].empty() || args[0][0] != '-') {
    if (!IsKnown(commands, args[0])) {
      return usage_error("unknown command '" + args[0] + "' (commands: " + Join(commands) + ")");
    }
    if (args[0] == "bench" && args.size() >= 2 && !args[1].empty() && args[1][0] != '-' &&
        !IsKnown(bench_commands, args[1])) {
      return usage_error("unknown benchmark '" + args[1] + "' (bench commands: " +
                         Join(bench_commands) + ")");
    }
  }

  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e, out, err);  // --help
    return usage_error(e.what());
  }

  try {
    if (app.got_subcommand("demo")) return RunDemo(demo, out, err);
    if (app.got_subcommand("inspect")) return RunInspect(inspect, out, err);
    if (app.got_subcommand("generate")) return RunGenerate(generate, out, err);
    if (app.got_subcommand("synth")) return RunSynth(synth, out, err);
    if (app.got_subcommand("convert")) return RunConvert(convert, out, err);
    if (app.got_subcommand("logits")) return RunLogits(logits, out, err);
    if (bench->got_subcommand("decode")) return RunBenchDecode(bench_decode, out, err);
    if (bench->got_subcommand("capacity")) return RunBenchCapacity(bench_capacity, out, err);
    if (app.got_subcommand("eval")) return RunEval(*eval, out, err);
    if (app.got_subcommand("policies")) return RunPolicies(policies, out, err);
    if (bench->got_subcommand("attention")) return RunBenchAttention(bench_attention, out, err);
  } catch (const std::exception& e) {
    err << "error: internal: " << e.what() << "\n";
    return 1;
  }
  return usage_error("no command given (commands: " + Join(commands) + ")");
}

}  // namespace strata::cli
