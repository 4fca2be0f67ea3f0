// `strata serve`: loads a model and runs the OpenAI-compatible server (serve/) until SIGINT or
// SIGTERM, then stops it gracefully.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <filesystem>

#include "cli/commands.h"
#include "cli/common.h"
#include "io/chat_template.h"
#include "serve/request.h"
#include "serve/server.h"

namespace strata::cli {

namespace {
// The write end is used by the signal handler (write is async-signal-safe).
int g_stop_pipe[2] = {-1, -1};
void OnStopSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const ssize_t n = write(g_stop_pipe[1], &b, 1);
  (void)n;
}
}  // namespace

void AddServeCommand(CLI::App* app, ServeOptions* o) {
  o->threads = HardwareThreads();
  o->prefill_chunk = serve::kDefaultPrefillChunk;
  CLI::App* cmd = app->add_subcommand(
      "serve", "Serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming)");
  cmd->add_option("-m,--model", o->model, "Model (.gguf or HF directory)")->required();
  cmd->add_option("--host", o->host,
                  "Address to listen on (loopback by default; 0.0.0.0 exposes the server)")
      ->capture_default_str();
  cmd->add_option("--port", o->port, "TCP port (0: any free port, printed at start)")
      ->capture_default_str();
  cmd->add_option("--parallel", o->parallel,
                  "Decode slots: sequences decoded together, one token each per step")
      ->capture_default_str();
  cmd->add_option("--kv-budget", o->kv_budget,
                  "KV cache memory for all sequences together, as the policies account it "
                  "(e.g. 8GiB, 512MiB)")
      ->capture_default_str();
  cmd->add_option("--queue", o->queue,
                  "Requests that may wait for a slot; more are refused with 429")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o->prefill_chunk,
                  "Prefill step budget: a new prompt is prefilled this many tokens at a time, "
                  "with a decode step of every running sequence between chunks (smaller: "
                  "running streams wait less for a long prompt, the prompt takes longer)")
      ->capture_default_str();
  std::string names;
  for (const auto& n : PolicyNames()) names += (names.empty() ? "" : ", ") + n;
  cmd->add_option("--policy", o->policy,
                  "Default KV cache policy NAME[:key=value...]; a request may choose its own "
                  "with \"strata\": {\"policy\": ...} (available: " +
                      names + ")")
      ->capture_default_str();
  std::string templates;
  for (const auto& n : ChatTemplate::BuiltinNames()) {
    templates += (templates.empty() ? "" : ", ") + n;
  }
  cmd->add_option("--chat-template", o->chat_template,
                  "Chat format for /v1/chat/completions (default: detected from the model's "
                  "template; one of " +
                      templates + ")");
  cmd->add_option("--api-key", o->api_key,
                  "Require Authorization: Bearer KEY on /v1/* and /metrics");
  cmd->add_option("-t,--threads", o->threads,
                  "Worker threads (default: the hardware threads; more are capped to them)")
      ->capture_default_str();
  cmd->add_option("--header-timeout", o->header_timeout,
                  "Seconds within which a request's headers must arrive (a deadline, not an "
                  "idle timeout; else 408)")
      ->capture_default_str();
  cmd->add_option("--read-timeout", o->read_timeout,
                  "Seconds within which a request's body must arrive after its headers (else 408)")
      ->capture_default_str();
  cmd->add_option("--write-timeout", o->write_timeout,
                  "Seconds a client may read nothing of a response before it is dropped")
      ->capture_default_str();
  cmd->add_option("--max-connections", o->max_connections,
                  "Connections held at once; beyond them a new one is answered 503 (0: "
                  "2 x (parallel + queue) + 16)")
      ->capture_default_str();
  cmd->add_option("--max-connections-per-peer", o->max_connections_per_peer,
                  "Connections held at once from one client address (0: parallel + queue + 8)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", o->ctx_size,
                  "Context size per sequence, prompt included (0: the model's trained context "
                  "length)")
      ->capture_default_str();
}

int RunServe(const ServeOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  for (const Status& st :
       {CheckAtLeast("--parallel", o.parallel, 1), CheckAtLeast("--queue", o.queue, 0),
        CheckAtLeast("--prefill-chunk", o.prefill_chunk, 1),
        CheckAtLeast("--threads", o.threads, 1), CheckAtLeast("--port", o.port, 0),
        CheckAtLeast("-c", o.ctx_size, 0), CheckAtLeast("--header-timeout", o.header_timeout, 1),
        CheckAtLeast("--read-timeout", o.read_timeout, 1),
        CheckAtLeast("--write-timeout", o.write_timeout, 1),
        CheckAtLeast("--max-connections", o.max_connections, 0),
        CheckAtLeast("--max-connections-per-peer", o.max_connections_per_peer, 0)}) {
    if (!st.ok()) return fail(st.message());
  }
  if (o.port > 65535) return fail("--port must be <= 65535, got " + std::to_string(o.port));
  StatusOr<int64_t> budget = serve::ParseByteSize("--kv-budget", o.kv_budget);
  if (!budget.ok()) return fail(budget.status().message());
  if (!o.chat_template.empty()) {
    if (auto t = ChatTemplate::ByName(o.chat_template); !t.ok()) {
      return fail("--chat-template: " + t.status().message());
    }
  }
  auto loaded = Model::Load(o.model);
  if (!loaded.ok()) {
    return fail("cannot load model '" + o.model + "' (-m): " + loaded.status().ToString());
  }
  Model& m = **loaded;
  err << "model: " << o.model << "\n" << m.config().Summary() << "\n";
  // A -c that one sequence's cache could never reach in this machine's memory is refused now
  // (--kv-budget bounds all sequences together; this is the one sequence -c promises), sized by
  // the default policy (an unknown one is left for the server to report).
  if (o.ctx_size > 0) {
    if (auto p = MakeCliPolicy(o.policy, ""); p.ok()) {
      if (auto c = m.NewCache(std::move(p).value()); c.ok()) {
        if (Status st = CheckContextFitsMemory("-c", o.ctx_size, **c); !st.ok()) {
          return fail(st.message());
        }
      }
    }
  }
  serve::ServerOptions so;
  so.host = o.host;
  so.port = static_cast<int>(o.port);
  so.model_name = std::filesystem::path(o.model).stem().string();
  so.parallel = static_cast<int>(o.parallel);
  so.kv_budget = *budget;
  so.queue = static_cast<int>(o.queue);
  if (o.prefill_chunk > (int64_t{1} << 20)) {
    return fail("--prefill-chunk must be <= 1048576, got " + std::to_string(o.prefill_chunk));
  }
  so.prefill_chunk = static_cast<int>(o.prefill_chunk);
  so.policy = o.policy;
  so.chat_template = o.chat_template;
  so.api_key = o.api_key;
  so.threads = CapThreads("--threads", o.threads, err);
  so.ctx = o.ctx_size;
  for (const auto& [flag, v] : {std::pair<const char*, int64_t>{"--header-timeout", o.header_timeout},
                                {"--read-timeout", o.read_timeout},
                                {"--write-timeout", o.write_timeout},
                                {"--max-connections", o.max_connections},
                                {"--max-connections-per-peer", o.max_connections_per_peer}}) {
    if (v > 1000000) return fail(std::string(flag) + " must be <= 1000000, got " + std::to_string(v));
  }
  so.header_timeout_s = static_cast<int>(o.header_timeout);
  so.read_timeout_s = static_cast<int>(o.read_timeout);
  so.write_timeout_s = static_cast<int>(o.write_timeout);
  so.max_connections = static_cast<int>(o.max_connections);
  so.max_connections_per_peer = static_cast<int>(o.max_connections_per_peer);

  // SIGINT and SIGTERM go to a handler that writes the signal's number to a pipe, which this
  // thread reads. Blocking them and calling sigwait is not enough: threads started before this
  // point (OpenBLAS starts its workers when the library loads) have them unblocked, and a
  // process-directed signal delivered to one of those would kill the process at once.
  // A client that hangs up mid-stream must be a failed write, not a process-killing SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  if (pipe(g_stop_pipe) != 0) return fail("cannot create the shutdown pipe");
  struct sigaction sa = {}, old_int = {}, old_term = {};
  sa.sa_handler = OnStopSignal;
  sa.sa_flags = SA_RESTART;  // the other threads' system calls resume
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  auto restore = [&] {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    close(g_stop_pipe[0]);
    close(g_stop_pipe[1]);
  };
  int code = kExitOk;
  {
    auto server = serve::Server::Create(&m, so);
    if (!server.ok()) {
      restore();
      return fail(server.status().message());
    }
    StatusOr<int> port = (*server)->Start();
    if (!port.ok()) {
      restore();
      return fail(port.status().message());
    }
    if (const ChatTemplate* t = (*server)->chat_template()) {
      err << "chat template: " << t->name() << "\n";
    } else {
      err << "chat: off (the model has no recognised chat template; --chat-template NAME)\n";
    }
    err << "serving '" << so.model_name << "' on http://" << so.host << ":" << *port << " (policy "
        << so.policy << ", " << so.parallel << " slots, KV budget "
        << FormatBytes(static_cast<double>(so.kv_budget)) << "); SIGINT/SIGTERM stops\n";
    out << "listening on http://" << so.host << ":" << *port << "\n" << std::flush;
    unsigned char sig = 0;
    while (read(g_stop_pipe[0], &sig, 1) != 1) {
      if (errno != EINTR) break;
    }
    err << "serve: " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
        << ": ending the running streams and stopping\n";
    (*server)->Stop();
    const serve::Metrics& mt = (*server)->metrics();
    err << "serve: stopped (" << mt.cancelled() << " sequences cancelled by their clients)\n";
  }
  restore();
  return code;
}

}  // namespace strata::cli
