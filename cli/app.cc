// The `strata` command tree: CLI11 parsing, dispatch, and the error and exit-code conventions.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <exception>
#include <iostream>

#include <unistd.h>

#include "cli/bench_geodesia.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "kernels/attn_math.h"

#ifndef STRATA_VERSION
#define STRATA_VERSION "unknown"
#endif

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

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// The message for arguments CLI11 did not expect, in the order they were given (the parser gets
// them reversed), naming the command and, for a misspelt flag, the closest flags it has.
std::string ExtrasMessage(CLI::App* app, const std::vector<std::string>& args) {
  CLI::App* cmd = app;
  std::string path = "strata";
  for (;;) {
    const auto subs = cmd->get_subcommands();  // the parsed ones
    if (subs.empty()) break;
    cmd = subs.front();
    path += " " + cmd->get_name();
  }
  std::vector<std::string> flags;  // "--threads", "-m"
  for (const CLI::Option* opt : cmd->get_options()) {
    for (const auto& l : opt->get_lnames()) flags.push_back("--" + l);
    for (const auto& s : opt->get_snames()) flags.push_back("-" + s);
  }
  for (const std::string& a : args) {
    if (a.size() < 2 || a[0] != '-' || std::isdigit(static_cast<unsigned char>(a[1]))) continue;
    const std::string name = a.substr(0, a.find('='));
    if (IsKnown(flags, name) || name == "--help" || name == "-h") continue;
    std::vector<std::string> close;
    size_t best = 3;  // suggest within two edits (or a flag the name is a prefix of)
    for (const std::string& f : flags) {
      if (f.size() < 3) continue;
      const size_t d = f.rfind(name, 0) == 0 ? 1 : EditDistance(name, f);
      if (d < best) {
        best = d;
        close = {f};
      } else if (d == best && d < 3) {
        close.push_back(f);
      }
    }
    std::string msg = "unknown flag '" + name + "' for `" + path + "`";
    if (!close.empty()) {
      msg += " (did you mean ";
      for (size_t i = 0; i < close.size() && i < 3; ++i) msg += (i ? " or " : "") + close[i];
      msg += "?)";
    }
    return msg + "; `" + path + " --help` lists its flags";
  }
  // No unknown flag: a positional argument the command does not take.
  std::string extras;
  for (const std::string& a : cmd->remaining()) extras = a + (extras.empty() ? "" : " " + extras);
  return "unexpected argument(s) '" + extras + "' for `" + path + "`; `" + path +
         " --help` lists its flags";
}

}  // namespace

int RunStrata(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunStrata(args, std::cin, out, err);
}

int RunStrata(const std::vector<std::string>& args, std::istream& in, std::ostream& out,
              std::ostream& err) {
  CLI::App app("strata: long-context LLM decoding on a KV cache compressed by training-free "
               "policies",
               "strata");
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("strata ") + STRATA_VERSION);
  const std::string examples =
      "Examples:\n"
      "  strata demo                      # the main job (models/nope-mla.gguf)\n"
      "  strata inspect model.gguf\n"
      "  strata generate -m model.gguf -p \"The quick brown fox\" -n 64\n"
      "  strata synth --preset 125m --dtype f16 -o /tmp/l125.gguf\n"
      "  strata bench decode -m /tmp/l125.gguf --ctx 0,4096,16384 --threads 1,2\n"
      "  strata policies                  # every cache policy and its settings\n"
      "  strata tokenize -m model.gguf -p \"Hello world\"\n"
      "  strata chat -m model.gguf --policy vestige\n"
      "Run `strata COMMAND --help` for a command's flags.\n";
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
  QuantizeOptions quantize;
  AddQuantizeCommand(&app, &quantize);
  CLI::App* bench =
      app.add_subcommand("bench", "Benchmarks, with ratios measured in the same process");
  bench->require_subcommand(1);
  AddBenchDecodeCommand(bench, &bench_decode);
  BenchCapacityOptions bench_capacity;
  AddBenchCapacityCommand(bench, &bench_capacity);
  std::shared_ptr<EvalCliOptions> eval = AddEvalCommand(&app);
  BenchAttentionOptions bench_attention;
  AddBenchAttentionCommand(bench, &bench_attention);
  BenchServeOptions bench_serve;
  AddBenchServeCommand(bench, &bench_serve);
  BenchPrefillOptions bench_prefill;
  AddBenchPrefillCommand(bench, &bench_prefill);
  PoliciesOptions policies;
  AddPoliciesCommand(&app, &policies);
  ServeOptions serve;
  AddServeCommand(&app, &serve);
  TokenizeOptions tokenize;
  AddTokenizeCommand(&app, &tokenize);
  ChatOptions chat;
  AddChatCommand(&app, &chat);

  // --attn-math, declared once here: every command that runs attention gets it (the leaves of
  // the command tree, less those that run no model; a command with its own, such as bench
  // attention's list, keeps that). It sets the process default that caches are built with.
  std::string attn_math = "auto";
  // llama.cpp's flags that mean nothing here (NormalizeLlamaCppFlags): accepted by the same
  // commands, each given one noted on stderr after parsing.
  std::string n_gpu_layers, flash_attn;
  bool mlock = false, conversation = false;
  std::vector<std::pair<CLI::Option*, std::string>> no_effect;  // option, what to say
  {
    const std::vector<std::string> no_model = {"tokenize", "policies", "inspect", "synth",
                                               "quantize"};
    std::vector<CLI::App*> todo = {&app};
    while (!todo.empty()) {
      CLI::App* a = todo.back();
      todo.pop_back();
      const auto subs = a->get_subcommands([](CLI::App*) { return true; });
      if (!subs.empty()) {
        todo.insert(todo.end(), subs.begin(), subs.end());
        continue;
      }
      if (a == &app || IsKnown(no_model, a->get_name())) continue;
      if (a->get_name() != "convert") {  // convert runs no inference
        no_effect.push_back(
            {a->add_option("--n-gpu-layers", n_gpu_layers,
                           "Accepted as llama.cpp's -ngl N; no effect (Strata runs on the CPU)"),
             "-ngl/--n-gpu-layers has no effect in Strata (a CPU engine): every layer runs on the "
             "CPU"});
        no_effect.push_back(
            {a->add_option("--flash-attn", flash_attn,
                           "Accepted as llama.cpp's -fa [on|off|auto]; no effect (the attention "
                           "kernels always compute softmax online, tile by tile)")
                 ->expected(0, 1),
             "-fa/--flash-attn has no effect in Strata (a CPU engine): its attention kernels "
             "always compute the softmax online"});
        no_effect.push_back(
            {a->add_flag("--mlock", mlock,
                         "Accepted as llama.cpp's --mlock; no effect (--no-mmap reads the model "
                         "into memory)"),
             "--mlock has no effect in Strata (a CPU engine); --no-mmap reads the model into "
             "memory"});
        no_effect.push_back(
            {a->add_flag("--conversation", conversation,
                         "Accepted as llama.cpp's -cnv; no effect (`strata chat` is the "
                         "conversation command)"),
             "-cnv/--conversation has no effect in Strata; `strata chat` is the conversation "
             "command"});
      }
      if (a->get_option_no_throw("--attn-math") != nullptr) continue;
      a->add_option("--attn-math", attn_math, kAttnMathHelp)->capture_default_str();
    }
  }

  // Set after the commands are added: CLI11 copies a parent's footer into subcommands made
  // later, and every command's --help repeated these examples.
  app.footer(examples);

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
    const std::vector<std::string> normalized = NormalizeLlamaCppFlags(args);
    std::vector<std::string> reversed(normalized.rbegin(), normalized.rend());
    app.parse(reversed);
  } catch (const CLI::ExtrasError& e) {
    return usage_error(ExtrasMessage(&app, args));
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e, out, err);  // --help, --version
    return usage_error(e.what());
  }

  if (!flash_attn.empty() && flash_attn != "on" && flash_attn != "off" && flash_attn != "auto") {
    return usage_error("-fa/--flash-attn takes on, off or auto (or nothing), got '" + flash_attn +
                       "'");
  }
  for (const auto& [opt, note] : no_effect) {
    if (opt->count() > 0) err << "note: " << note << "\n";
  }
  generate.in = &in;
  tokenize.in = &in;

  if (auto m = ParseAttnMath(attn_math); m.ok()) {
    SetDefaultAttnMath(*m);
  } else {
    return usage_error(m.status().message());
  }

  try {
    if (app.got_subcommand("demo")) return RunDemo(demo, out, err);
    if (app.got_subcommand("inspect")) return RunInspect(inspect, out, err);
    if (app.got_subcommand("generate")) return RunGenerate(generate, out, err);
    if (app.got_subcommand("synth")) return RunSynth(synth, out, err);
    if (app.got_subcommand("convert")) return RunConvert(convert, out, err);
    if (app.got_subcommand("logits")) return RunLogits(logits, out, err);
    if (app.got_subcommand("quantize")) return RunQuantize(quantize, out, err);
    if (bench->got_subcommand("decode")) return RunBenchDecode(bench_decode, out, err);
    if (bench->got_subcommand("capacity")) return RunBenchCapacity(bench_capacity, out, err);
    if (app.got_subcommand("eval")) return RunEval(*eval, out, err);
    if (app.got_subcommand("policies")) return RunPolicies(policies, out, err);
    if (app.got_subcommand("serve")) return RunServe(serve, out, err);
    if (app.got_subcommand("tokenize")) return RunTokenize(tokenize, out, err);
    if (app.got_subcommand("chat")) {
      return RunChat(chat, in, /*interactive=*/&in == &std::cin && isatty(STDIN_FILENO), out, err);
    }
    if (bench->got_subcommand("attention")) return RunBenchAttention(bench_attention, out, err);
    if (bench->got_subcommand("serve")) return RunBenchServe(bench_serve, out, err);
    if (bench->got_subcommand("prefill")) return RunBenchPrefill(bench_prefill, out, err);
  } catch (const std::exception& e) {
    err << "error: internal: " << e.what() << "\n";
    return 1;
  }
  return usage_error("no command given (commands: " + Join(commands) + ")");
}

}  // namespace strata::cli
