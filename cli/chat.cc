// `strata chat`: an interactive multi-turn conversation over one KV cache kept across turns,
// rendered with a built-in chat template (io/chat_template.h), each reply streamed to stdout.
#include <CLI/CLI.hpp>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <istream>

#include "cli/commands.h"
#include "cli/common.h"
#include "eval/runner.h"
#include "io/chat_template.h"
#include "kv/achieved.h"
#include "model/model.h"
#include "model/sampler.h"

namespace strata::cli {

namespace {

// Ctrl-C (SIGINT), as llama.cpp's llama-cli takes it: during a reply it stops the reply (checked
// between tokens; the part already printed stays in the conversation and the cache) and returns
// to the prompt; at the prompt, or a second time before the reply has stopped, it quits.
// `g_at_prompt` is set only while chat waits for a line, so the handler can quit there at once
// (a read restarted by SA_RESTART would otherwise wait for Enter).
std::atomic<bool> g_interrupted{false};
std::atomic<bool> g_at_prompt{false};
static_assert(std::atomic<bool>::is_always_lock_free, "used in a signal handler");

extern "C" void OnChatSigint(int) {
  const bool at_prompt = g_at_prompt.load();
  if (at_prompt || g_interrupted.load()) {
    // Async-signal-safe calls only: end the line, leave. 0 at the prompt (a way to quit, like
    // Ctrl-D); 130 (128 + SIGINT) when a reply did not stop in time, as llama-cli exits.
    const char nl = '\n';
    if (write(STDOUT_FILENO, &nl, 1) < 0) {
    }
    _exit(at_prompt ? kExitOk : 128 + SIGINT);
  }
  g_interrupted.store(true);
}

// Installs OnChatSigint for the lifetime of an interactive session on std::cin and restores the
// previous disposition after (in-process tests feed a string stream and keep theirs).
class SigintScope {
 public:
  explicit SigintScope(bool install) {
    g_interrupted.store(false);
    g_at_prompt.store(false);
    if (!install) return;
    struct sigaction sa = {};
    sa.sa_handler = OnChatSigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // a write to stdout in progress is not cut short
    installed_ = sigaction(SIGINT, &sa, &old_) == 0;
  }
  ~SigintScope() {
    g_at_prompt.store(false);
    if (installed_) sigaction(SIGINT, &old_, nullptr);
  }
  SigintScope(const SigintScope&) = delete;
  SigintScope& operator=(const SigintScope&) = delete;

 private:
  bool installed_ = false;
  struct sigaction old_ = {};
};

// The chat commands; any other line that starts with '/' is refused (a message that starts with
// '/' is written with "//").
constexpr const char* kCommandHelp =
    "/reset (start a new conversation and cache), /stats (the cache's statistics)";

// The text the template writes between its generation prompt and an assistant message's content
// (DeepSeek V2: the prompt ends "Assistant:", a reply is rendered "Assistant: " + content), ""
// when there is none or the template renders the turn otherwise.
std::string AssistantLead(const ChatTemplate& t, std::vector<ChatMessage> messages,
                          const std::string& bos, const std::string& eos) {
  static constexpr char kMark[] = "\x01strata-reply\x01";
  const std::string open = t.Render(messages, /*add_generation_prompt=*/true, bos, eos);
  messages.push_back({"assistant", kMark});
  const std::string done = t.Render(messages, /*add_generation_prompt=*/false, bos, eos);
  const size_t at = done.find(kMark);
  if (at == std::string::npos || at < open.size() || done.compare(0, open.size(), open) != 0) {
    return "";
  }
  return done.substr(open.size(), at - open.size());
}

// The template: --chat-template NAME, else the model's tokenizer.chat_template recognised by
// fingerprint.
StatusOr<ChatTemplate> ResolveTemplate(const ChatOptions& o, const Tokenizer& tok) {
  if (!o.chat_template.empty()) {
    auto t = ChatTemplate::ByName(o.chat_template);
    if (!t.ok()) return t.status().WithContext("--chat-template");
    return t;
  }
  std::string names;
  for (const auto& n : ChatTemplate::BuiltinNames()) names += (names.empty() ? "" : ", ") + n;
  if (tok.chat_template().empty() && !tok.HasGemmaTurns()) {
    return InvalidArgument("model '" + o.model +
                           "' has no chat template (tokenizer.chat_template); pass "
                           "--chat-template NAME, one of: " + names);
  }
  return ChatTemplate::ForModel(tok.chat_template(), tok.HasGemmaTurns());
}

// The conversation and the cache that holds it. `cached_text` is the rendered text whose
// tokens are in the cache: the rendering fed so far plus the reply tokens decoded into it. The
// next turn feeds only the new rendering's text after it, as llama.cpp's
// common_chat_format_single does, so the cache is never re-read.
struct Session {
  std::vector<ChatMessage> messages;
  std::unique_ptr<KvCache> cache;
  CacheCounters counters0;  // at the conversation's start (the /stats "vs full" figures)
  std::string cached_text;
  int64_t turns = 0;
  int64_t last_prefill = 0;  // tokens the last message prefilled
};

}  // namespace

void AddChatCommand(CLI::App* app, ChatOptions* o) {
  o->threads = HardwareThreads();
  CLI::App* cmd = app->add_subcommand(
      "chat",
      "Chat with a model: one user message per stdin line, replies streamed; the KV cache is "
      "kept across turns (/reset starts over, /stats shows the cache; Ctrl-C stops a reply, "
      "Ctrl-C at the prompt or Ctrl-D quits)");
  cmd->add_option("-m,--model", o->model, "Model (.gguf or HF directory)")->required();
  cmd->add_option("--system", o->system, "System message that opens the conversation");
  cmd->add_flag_callback(
      "-e,--escape", [o] { o->escape = true; },
      "Process escapes in --system: \\n, \\r, \\t, \\\\, \\\", \\' and \\xNN (the default, as in "
      "llama.cpp)");
  cmd->add_flag_callback("--no-escape", [o] { o->escape = false; },
                         "Take --system as written (no escapes)");
  std::string templates;
  for (const auto& n : ChatTemplate::BuiltinNames()) {
    templates += (templates.empty() ? "" : ", ") + n;
  }
  cmd->add_option("--chat-template", o->chat_template,
                  "Built-in chat template to use instead of the model's (" + templates + ")");
  cmd->add_option("-n,--n-predict", o->n_predict,
                  "Most tokens per reply (the default is strata serve's chat default; -1: until an "
                  "end-of-generation token or the context size; Ctrl-C stops a reply, keeping "
                  "its printed part in the conversation)")
      ->capture_default_str();
  AddSamplerFlags(cmd, &o->sampling);
  cmd->add_option("-t,--threads", o->threads,
                  "Worker threads (default: the hardware threads; more are capped to them)")
      ->capture_default_str();
  cmd->add_option("--chunk", o->chunk,
                  "Prefill chunk size in tokens (MLA models decompress the cached rows once per "
                  "chunk: longer chunks prefill long prompts faster)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx_size,
                  "Context size in tokens for the whole conversation (0: the model's trained "
                  "context length)")
      ->capture_default_str();
  cmd->add_flag("--no-mmap", o->no_mmap, "Read the model into memory instead of mapping it");
  std::string names;
  for (const auto& n : PolicyNames()) names += (names.empty() ? "" : ", ") + n;
  cmd->add_option("--policy", o->policy,
                  "KV cache policy NAME[:key=value...] (`strata policies` lists the settings; "
                  "available: " + names + ")")
      ->capture_default_str();
  AddPolicyFlags(cmd, &o->policy_flags);
  cmd->add_option("--kv-type", o->kv_type, kKvTypeHelp)->capture_default_str();
}

int RunChat(const ChatOptions& o, std::istream& in, bool interactive, std::ostream& out,
            std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  for (const Status& st :
       {CheckAtLeast("-n", o.n_predict, -1), CheckAtLeast("--threads", o.threads, 1),
        CheckAtLeast("--chunk", o.chunk, 1), CheckAtLeast("-c", o.ctx_size, 0)}) {
    if (!st.ok()) return fail(st.message());
  }
  std::string system = o.system;
  if (o.escape) {
    auto t = ProcessEscapes("--system", o.system);
    if (!t.ok()) return fail(t.status().message());
    system = std::move(*t);
  }
  const StatusOr<SamplerOptions> so_or = ResolveSamplerOptions(o.sampling, err);
  if (!so_or.ok()) return fail(so_or.status().message());
  const SamplerOptions& so = *so_or;
  const auto kv_type = ParseKvType(o.kv_type);
  if (!kv_type.ok()) return fail(kv_type.status().message());
  auto spec = CliPolicySpec(o.policy, "", &o.policy_flags);
  if (!spec.ok()) return fail(spec.status().message());
  // Validated once here, so /reset cannot fail on the policy later.
  if (auto p = MakeCliPolicy(*spec); !p.ok()) return fail(p.status().message());

  err << "model: " << o.model << "\n";
  auto loaded = Model::Load(o.model, o.no_mmap ? GgufFile::Load::kMemory : GgufFile::Load::kMmap);
  if (!loaded.ok()) {
    return fail("cannot load model '" + o.model + "' (-m): " + loaded.status().ToString());
  }
  Model& m = **loaded;
  const Tokenizer* tok = m.tokenizer();
  if (!tok) return fail("model '" + o.model + "' has no tokenizer (tokenizer.ggml.* metadata)");
  auto tmpl_or = ResolveTemplate(o, *tok);
  if (!tmpl_or.ok()) return fail(tmpl_or.status().message());
  const ChatTemplate& tmpl = *tmpl_or;
  err << m.config().Summary() << "\n" << "chat template: " << tmpl.name() << "\n";
  // A turn marker the vocabulary splits into several tokens is read by the model as text (the
  // template chosen by --chat-template for another family, or a file whose markers are not
  // control tokens): the conversation still runs, but the model sees no turns.
  for (const std::string& marker : tmpl.TurnMarkers()) {
    const size_t n = tok->Encode(marker, /*with_bos=*/false, /*parse_special=*/true).size();
    if (n != 1) {
      err << "warning: the " << tmpl.name() << " template's turn marker '" << marker
          << "' is not a single token in this model's vocabulary (" << n
          << " tokens): the model reads it as plain text\n";
    }
  }
  auto ctx_or = ResolveCtxSize(o.ctx_size, m.config(), err);
  if (!ctx_or.ok()) return fail(ctx_or.status().message());
  const int64_t ctx = *ctx_or;  // 0: no limit
  const std::string bos_text = tok->bos_id() >= 0 ? tok->token_text(tok->bos_id()) : "";
  const std::string eos_text = tok->eos_id() >= 0 ? tok->token_text(tok->eos_id()) : "";

  const int threads = CapThreads("--threads", o.threads, err);
  ThreadPool pool(threads);
  Sampler sampler(so);
  const int64_t n_vocab = m.config().n_vocab;
  std::vector<float> logits(n_vocab);

  Session s;
  auto reset = [&]() -> Status {
    s.messages.clear();
    if (!system.empty()) s.messages.push_back({"system", system});
    s.cached_text.clear();
    s.turns = 0;
    s.last_prefill = 0;
    s.cache.reset();  // the old cache's memory goes before the new one is made
    ASSIGN_OR_RETURN(std::unique_ptr<Policy> policy, MakeCliPolicy(*spec));
    auto cache = m.NewCache(std::move(policy), *kv_type);
    if (!cache.ok()) return cache.status().WithContext("--policy " + o.policy);
    s.cache = std::move(*cache);
    s.counters0 = s.cache->counters();
    sampler.ResetHistory();
    return OkStatus();
  };
  if (Status st = reset(); !st.ok()) return fail(st.message());
  // A -c the cache could never hold is refused before the first message (the trained length
  // taken by default is not: a short conversation needs little of it).
  if (o.ctx_size > 0) {
    if (Status st = CheckContextFitsMemory("-c", ctx, *s.cache); !st.ok()) {
      return fail(st.message());
    }
  }
  err << "policy: " << s.cache->policy().describe() << "\n"
      << "type a message and Enter; /reset, /stats; Ctrl-C stops a reply; Ctrl-C at the "
         "prompt or Ctrl-D quits\n";

  auto print_stats = [&]() {
    const KvCache& cache = *s.cache;
    const AchievedCompression achieved = MeasureAchieved(cache, s.counters0);
    const int64_t resident = cache.ResidentBytes();
    const int64_t read = cache.counters().last_step.bytes_read;
    Table t({"statistic", "value"});
    t.AddRow({"turns", std::to_string(s.turns)});
    t.AddRow({"tokens in context", std::to_string(cache.n_tokens()) +
                                       (ctx > 0 ? " of " + std::to_string(ctx) : "")});
    t.AddRow({"tokens prefilled, last message", std::to_string(s.last_prefill)});
    t.AddRow({"policy", cache.policy().describe()});
    t.WrapColumn(1, 60);
    t.AddRow({"KV bytes resident", std::to_string(resident) + " (" + FormatBytes(resident) + ")"});
    t.AddRow({"KV bytes read, last step", std::to_string(read) + " (" + FormatBytes(read) + ")"});
    t.AddRow({"KV resident vs full", eval::VsFullText(achieved.resident_vs_full())});
    t.AddRow({"KV read vs full, conversation", eval::VsFullText(achieved.read_vs_full())});
    t.AddRow({"rows kept (of visible)", eval::KeptText(achieved)});
    AddBlockLevelRows(achieved.levels, &t);
    t.Print(out);
    out << std::flush;
  };

  // Feeds `text` (a rendering's new part) into the cache; when the cache is empty, BOS is
  // prepended if the tokenizer adds one and the template did not write it.
  bool ctx_full = false;  // set by feed when the message does not fit
  auto feed = [&](const std::string& text) -> Status {
    std::vector<int32_t> ids = tok->Encode(text, /*with_bos=*/false, /*parse_special=*/true);
    if (s.cache->n_tokens() == 0 && tok->add_bos() && tok->bos_id() >= 0 &&
        (ids.empty() || ids[0] != tok->bos_id())) {
      ids.insert(ids.begin(), tok->bos_id());
    }
    const int64_t n = static_cast<int64_t>(ids.size());
    const int64_t used = s.cache->n_tokens();
    // A reply needs room for at least one token after the prompt.
    if (ctx > 0 && used + n >= ctx) {
      ctx_full = true;
      return OutOfRange("the context is full: this message needs " + std::to_string(n) +
                        " tokens and " + std::to_string(used) + " of " + std::to_string(ctx) +
                        " are used (-c/--ctx-size); /reset starts a new conversation");
    }
    s.last_prefill = 0;
    if (n == 0) return OkStatus();
    RETURN_IF_ERROR(m.Prefill(ids.data(), n, o.chunk, s.cache.get(), &pool, logits.data()));
    for (const int32_t id : ids) sampler.Accept(id);
    s.cached_text += text;
    s.last_prefill = n;
    return OkStatus();
  };

  SigintScope sigint(&in == &std::cin);
  std::string line;
  for (;;) {
    if (interactive) out << "> " << std::flush;
    // A Ctrl-C that came since the last reply ended quits here; one that comes while waiting
    // quits from the handler.
    g_at_prompt.store(true);
    if (g_interrupted.load()) break;
    const bool got = static_cast<bool>(std::getline(in, line));
    g_at_prompt.store(false);
    if (!got) break;  // EOF (Ctrl-D) quits
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line[0] == '/') {
      if (line.size() > 1 && line[1] == '/') {
        line.erase(0, 1);  // "//text": the message "/text"
      } else {
        const std::string cmd = line.substr(0, line.find_last_not_of(" \t") + 1);
        if (cmd == "/reset") {
          if (Status st = reset(); !st.ok()) return fail(st.message());
          err << "(conversation and cache cleared)\n";
        } else if (cmd == "/stats") {
          print_stats();
        } else {
          err << "error: unknown command '" << cmd.substr(0, cmd.find_first_of(" \t"))
              << "'; the commands are " << kCommandHelp
              << " (start a line with // to send a message that begins with /)\n";
        }
        continue;
      }
    }

    s.messages.push_back({"user", line});
    if (Status st = tmpl.Validate(s.messages); !st.ok()) {
      s.messages.pop_back();
      err << "error: " << st.message() << "\n";
      continue;
    }
    const std::string rendered = tmpl.Render(s.messages, /*add_generation_prompt=*/true,
                                             bos_text, eos_text);
    Status st = OkStatus();
    ctx_full = false;
    if (rendered.compare(0, s.cached_text.size(), s.cached_text) == 0) {
      st = feed(rendered.substr(s.cached_text.size()));
    } else {
      // The template renders an earlier turn differently once more follow (e.g. a reply it
      // trims or whose reasoning it drops): the cache no longer matches a prefix of the
      // conversation, so it is rebuilt from the whole rendering.
      err << "note: the " << tmpl.name()
          << " template re-renders the earlier turns differently; re-reading the whole "
             "conversation into a new cache\n";
      std::vector<ChatMessage> keep = s.messages;
      const int64_t turns = s.turns;
      st = reset();
      s.messages = std::move(keep);
      s.turns = turns;
      if (st.ok()) st = feed(rendered);
    }
    if (!st.ok()) {
      s.messages.pop_back();
      err << "error: " << st.message() << "\n";
      if (ctx_full) continue;  // the user may /reset
      return kExitFailed;
    }

    // The reply: streamed pieces; `reply` is the assistant message as the template will
    // render it (a control token other than end-of-generation kept as its text, unprinted).
    std::string reply;
    bool full = false, stopped = false;
    for (int64_t i = 0; o.n_predict < 0 || i < o.n_predict; ++i) {
      if (g_interrupted.load()) {  // Ctrl-C: every token printed so far is in the cache
        stopped = true;
        break;
      }
      if (ctx > 0 && s.cache->n_tokens() >= ctx) {
        full = true;
        break;
      }
      const StatusOr<int32_t> next = sampler.Next(logits.data(), n_vocab, s.cache->n_tokens());
      if (!next.ok()) {
        out << "\n" << std::flush;
        err << "error: " << next.status().message() << "\n";
        return kExitFailed;
      }
      const int32_t id = *next;
      if (IsEndOfGeneration(*tok, id)) break;
      sampler.Accept(id);
      const std::string piece = tok->DecodeToken(id, /*render_special=*/true);
      const bool hidden = tok->DecodeToken(id).empty() && !piece.empty();  // a control token
      if (!hidden) out << piece << std::flush;
      reply += piece;
      // The last token of a -n limited reply is not fed (its logits would go unused); the
      // next turn's text carries it.
      if (o.n_predict >= 0 && i + 1 == o.n_predict) break;
      if (Status d = m.Decode(id, s.cache.get(), &pool, logits.data()); !d.ok()) {
        out << "\n";
        err << "error: decode: " << d.ToString() << "\n";
        return kExitFailed;
      }
      s.cached_text += piece;
    }
    out << "\n" << std::flush;
    if (stopped) {
      g_interrupted.store(false);
      err << "(reply stopped by Ctrl-C; its printed part stays in the conversation; Ctrl-C at "
             "the prompt quits)\n";
    }
    if (full) {
      err << "note: the context is full (" << ctx
          << " tokens, -c/--ctx-size): the reply was cut; /reset starts a new conversation\n";
    }
    // A template that writes text of its own between the generation prompt and the reply
    // (DeepSeek V2's "Assistant:" + " " + content) would render a reply that begins with that
    // text with it twice; the message drops it, so the next rendering repeats the cached text
    // and only the new turn is prefilled.
    const std::string lead = AssistantLead(tmpl, s.messages, bos_text, eos_text);
    if (!lead.empty() && reply.rfind(lead, 0) == 0) reply.erase(0, lead.size());
    s.messages.push_back({"assistant", reply});
    ++s.turns;
  }
  if (interactive) out << "\n";
  return kExitOk;
}

}  // namespace strata::cli
