// The `strata` commands as functions: options structs filled by the CLI11 parser (or by tests),
// and Run functions that print to the given streams and return the process exit code.
#pragma once

#include <cstdint>
#include <istream>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace strata::cli {

// Cache-policy settings as shorthand flags (--ratio, --kappa, --bits, ...): one per shared setting
// of the policies' declarations (kv/settings.h), added by cli/common.cc for every command that
// builds a policy. Values stay text (empty = not given); the registry validates them against the
// named policy's declaration, so a flag that policy does not take is an error naming both.
struct PolicyFlags {
  std::map<std::string, std::string> values;
};
void AddPolicyFlags(CLI::App* cmd, PolicyFlags* f);

// Sampler flags shared by generate and chat, with llama.cpp's names and meanings
// (model/sampler.h): --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n,
// --seed.
struct SamplerFlags {
  float temperature = 0.f;
  int32_t top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
  float repeat_penalty = 1.f;
  int32_t repeat_last_n = 64;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  std::vector<std::string> logit_bias;  // llama.cpp's TOKEN_ID(+/-)BIAS, repeatable
  // --seed as given: an integer in [0, 2^64 - 1], or -1 (the default) for a random seed, which
  // the command prints so the run can be repeated (ResolveSamplerOptions).
  std::string seed = "-1";
};
void AddSamplerFlags(CLI::App* cmd, SamplerFlags* f);

// The default prefill chunk of generate and chat: MLA prefill decompresses the cached rows once
// per chunk (model/mla.h, expanded form), so longer chunks amortise it. 16,608-token prompt,
// synth --preset 150m f16, 2 threads: 158.6 prefill tokens/s at 512, 222.3 at 2048.
inline constexpr int kPromptChunk = 2048;

struct InspectOptions {
  std::string path;       // .gguf file or HF directory
  std::string json_path;  // optional JSON report
  std::string kv_type = "bf16";  // the KV storage the cache figures are computed for
};
void AddInspectCommand(CLI::App* app, InspectOptions* o);
int RunInspect(const InspectOptions& o, std::ostream& out, std::ostream& err);

struct GenerateOptions {
  std::string model;  // empty: the built-in default model
  std::string prompt = "The quick brown fox";
  bool prompt_given = false;  // -p was on the command line (with -f: an error)
  std::string prompt_file;    // -f: the prompt read from this file instead of -p
  int64_t n_predict = 32;
  SamplerFlags sampling;
  std::vector<std::string> stop;  // --stop: end the text where any of these appears
  bool escape = true;             // -e/--escape (--no-escape): \n, \t, \xNN... in -p and --stop
  bool ignore_eos = false;        // --ignore-eos: end-of-generation tokens are never sampled
  bool special = false;           // --special: control tokens written in the prompt are parsed
  int threads = 0;  // 0 means "not given": hardware concurrency
  int chunk = kPromptChunk;
  int64_t ctx_size = 0;  // -c: 0 = the model's trained context length
  bool no_mmap = false;  // read the model into huge-page memory instead of mapping it
  std::string policy = "full";
  std::string policy_settings;  // "key=value,..." passed to the policy registry
  PolicyFlags policy_flags;
  std::string kv_type = "bf16";  // --kv-type f32 | f16 | bf16 (f32/f16: the full policy only)
  bool verbose = false;  // --verbose: per-layer block-level histograms in the statistics
  std::string json_path;
  // Where the built-in default model lives (set from the build; tests override them).
  std::string models_dir;
  std::string cache_dir;
  std::istream* in = nullptr;  // what `-f -` reads (null: std::cin)
};
void AddGenerateCommand(CLI::App* app, GenerateOptions* o);
int RunGenerate(const GenerateOptions& o, std::ostream& out, std::ostream& err);

// `strata tokenize` (cli/tokenize.cc).
struct TokenizeOptions {
  std::string model;
  std::string tokenizer_json;  // --tokenizer: an HF tokenizer.json instead of -m
  std::string prompt;
  bool has_prompt = false;  // -p was given (an empty text is still a text)
  std::string prompt_file;
  bool ids = false;
  bool pieces = false;
  bool json = false;
  bool special = false;  // parse control tokens written in the text
  bool no_bos = false;
  std::istream* in = nullptr;  // what `-f -` reads (null: std::cin)
};
void AddTokenizeCommand(CLI::App* app, TokenizeOptions* o);
int RunTokenize(const TokenizeOptions& o, std::ostream& out, std::ostream& err);

// `strata chat` (cli/chat.cc): reads user lines from `in`; `interactive` (stdin is a terminal)
// shows a "> " prompt before each.
struct ChatOptions {
  std::string model;
  std::string system;         // --system: the conversation's first message
  bool escape = true;         // -e/--escape (--no-escape): \n, \t, \xNN... in --system
  std::string chat_template;  // empty: recognise the model's tokenizer.chat_template
  int64_t n_predict = 4096;   // per reply (strata serve's chat default); -1: until end of
                              // generation or the context size
  SamplerFlags sampling;
  int threads = 0;
  int chunk = kPromptChunk;
  int64_t ctx_size = 0;
  bool no_mmap = false;
  std::string policy = "full";
  PolicyFlags policy_flags;
  std::string kv_type = "bf16";
};
void AddChatCommand(CLI::App* app, ChatOptions* o);
int RunChat(const ChatOptions& o, std::istream& in, bool interactive, std::ostream& out,
            std::ostream& err);

struct SynthCliOptions {
  std::string arch;  // empty: the preset's architecture (llama for tiny)
  bool nope = false;
  std::string preset = "tiny";
  std::string dims;
  std::string dtype = "f16";
  uint64_t seed = 1;
  std::string format = "gguf";
  std::string out_path;
};
void AddSynthCommand(CLI::App* app, SynthCliOptions* o);
int RunSynth(const SynthCliOptions& o, std::ostream& out, std::ostream& err);

struct BenchDecodeOptions {
  std::string model;
  std::string ctx = "0,4096,16384";
  std::string threads;  // empty: "1,<hardware concurrency>"
  int tokens = 32;
  int warmup = 1;
  int64_t bw_mib = 512;  // bandwidth probe buffer
  uint64_t seed = 1;
  bool no_mmap = false;  // read the model into huge-page memory instead of mapping it
  // Non-empty: batch sizes (comma-separated): aggregate tok/s of B sequences decoded together
  // (Model::DecodeBatch), each at ctx, and the ratio to B = 1.
  std::string batch;
  std::string json_path;
  std::string models_dir;
  std::string cache_dir;
};
void AddBenchDecodeCommand(CLI::App* bench, BenchDecodeOptions* o);
int RunBenchDecode(const BenchDecodeOptions& o, std::ostream& out, std::ostream& err);

// `strata bench prefill` (cli/bench_prefill.cc): prefill tokens/s of each policy against full,
// alternated over rounds in one process.
struct BenchPrefillOptions {
  std::string model;
  std::string prompt_file;  // empty: `tokens` random token ids
  int64_t tokens = 0;       // 0: min(4096, trained context) random tokens, or the whole file
  std::string policy = "full";
  int rounds = 3;
  int threads = 0;  // 0: hardware concurrency
  int chunk = kPromptChunk;
  std::string kv_type = "bf16";
  bool no_mmap = false;
  uint64_t seed = 1;
  std::string json_path;
  std::string models_dir;
  std::string cache_dir;
};
void AddBenchPrefillCommand(CLI::App* bench, BenchPrefillOptions* o);
int RunBenchPrefill(const BenchPrefillOptions& o, std::ostream& out, std::ostream& err);

// `strata bench attention` (cli/bench_attention.cc): per-step decode attention of registered
// policies vs full over one synthetic MLA or GQA layer.
inline constexpr const char* kBenchAttentionMlaPolicies = "full,vestige:recall=off,vestige";
// The models `bench attention --rows model` reads by default (in the models directory).
inline constexpr const char* kBenchAttentionMlaModel = "nope-mla.gguf";
inline constexpr const char* kBenchAttentionGqaModel = "gqa.gguf";
// The paper's Geodesia at 5 and 2.5 bits (issue 21's speed goals are the reference's), the default
// geodesia (retrieval profile) and Compressed-Quest.
inline constexpr const char* kBenchAttentionGqaPolicies =
    "full,geodesia@5:profile=reference,geodesia@2.5:profile=reference,geodesia,cquest";
struct BenchAttentionOptions {
  std::string kind = "mla";
  std::string ctx;     // empty: 8192,32768 (mla), 16384 (gqa)
  std::string policy;  // empty: kBenchAttentionMlaPolicies or kBenchAttentionGqaPolicies
  PolicyFlags policy_flags;
  // Where rows and queries come from: "model" (a model's own prefill and decode queries,
  // cli/bench_capture.h) or "random" (synthetic rows: the worst case for a certified recall).
  std::string rows = "model";
  std::string model;  // empty: kBenchAttentionMlaModel / kBenchAttentionGqaModel in models/
  int layer = -1;     // the model's cache layer; -1: its last of the kind
  // --rows random geometry; 0: the default (mla 16 heads, d_c 512, d_r 64; gqa 32/8/128).
  int heads = 0;  // mla
  int d_c = 0;
  int d_r = 0;
  int q_heads = 0;  // gqa
  int kv_heads = 0;
  int head_dim = 0;
  int steps = 8;
  int warmup = 2;
  int threads = 0;  // 0: hardware concurrency
  uint64_t seed = 1;
  std::string attn_math = "f32,auto";  // every policy is measured under each (comma-separated)
  std::string json_path;
};
void AddBenchAttentionCommand(CLI::App* bench, BenchAttentionOptions* o);
int RunBenchAttention(const BenchAttentionOptions& o, std::ostream& out, std::ostream& err);

// `strata policies` (cli/policies.cc): every registered policy's declared settings.
struct PoliciesOptions {
  std::vector<std::string> names;  // empty: all
  bool json = false;
  bool markdown = false;
  bool summary = false;  // one row per policy
};
void AddPoliciesCommand(CLI::App* app, PoliciesOptions* o);
int RunPolicies(const PoliciesOptions& o, std::ostream& out, std::ostream& err);

// `strata eval needle|ppl|kl` (cli/eval.cc; its options are private to that file).
struct EvalCliOptions;
std::shared_ptr<EvalCliOptions> AddEvalCommand(CLI::App* app);
int RunEval(const EvalCliOptions& o, std::ostream& out, std::ostream& err);

// `strata demo` (cli/demo.cc): one needle trial on the NoPE-MLA testbed model, answered greedily
// with the full cache and with compressed caches at one budget; a table of the answers, resident
// and read bytes, and decode speed.
struct DemoOptions {
  std::string model;  // empty: <models_dir>/nope-mla.gguf
  int64_t len = 2048;  // prefix tokens (BOS and needle included)
  uint64_t seed = 1;   // picks the needle's values and depth
  std::string ratio = "32";
  int threads = 1;
  int64_t ctx_size = 0;  // -c: 0 = the model's trained context length; --len must fit
  // vestige:archive=file: the file archive in a temporary folder, beside the RAM archive.
  std::string policy = "full,vestige:recall=off,vestige,vestige:archive=file,streaming,h2o,snapkv";
  int64_t gen = 30;  // greedy tokens decoded after the answer, for the tok/s figure
  std::string json_path;
  std::string models_dir;  // empty: DefaultModelsDir() (tests override it)
};
void AddDemoCommand(CLI::App* app, DemoOptions* o);
int RunDemo(const DemoOptions& o, std::ostream& out, std::ostream& err);

// `strata convert` and `strata logits` (cli/convert.cc).
struct ConvertOptions {
  std::string dir;
  std::string out_path;
  std::string dtype = "f16";
  bool overwrite = false;  // --overwrite: replace an existing output file
};
void AddConvertCommand(CLI::App* app, ConvertOptions* o);
int RunConvert(const ConvertOptions& o, std::ostream& out, std::ostream& err);

struct QuantizeOptions {
  std::string in_path;
  std::string out_path;
  std::string type;        // --type (or the third positional argument, as llama-quantize takes it)
  std::string type_positional;
  int threads = 0;         // 0: not given (hardware threads)
  bool allow_requantize = false;
  bool overwrite = false;  // --overwrite: replace an existing output file
};
void AddQuantizeCommand(CLI::App* app, QuantizeOptions* o);
int RunQuantize(const QuantizeOptions& o, std::ostream& out, std::ostream& err);

struct LogitsOptions {
  std::string model;
  std::string tokens_path;
  std::string out_path;
  std::string dump_kv_path;  // --dump-kv: the KV cache after the run (full policy), see convert.cc
  int chunk = 512;
  std::string policy = "full";
  std::string policy_settings;
  PolicyFlags policy_flags;
  std::string kv_type = "bf16";  // --kv-type f32 | f16 | bf16
};
void AddLogitsCommand(CLI::App* app, LogitsOptions* o);
int RunLogits(const LogitsOptions& o, std::ostream& out, std::ostream& err);

// `strata serve` (cli/serve.cc over serve/): the OpenAI-compatible HTTP server.
struct ServeOptions {
  std::string model;
  std::string host = "127.0.0.1";
  int64_t port = 8080;
  int64_t parallel = 4;
  std::string kv_budget = "8GiB";
  int64_t queue = 64;
  int64_t prefill_chunk = 0;  // set to serve::kDefaultPrefillChunk by AddServeCommand
  std::string policy = "full";
  std::string chat_template;  // empty: detected from the model
  std::string api_key;
  int threads = 0;  // 0: not given (hardware threads)
  int64_t ctx_size = 0;
  int64_t header_timeout = 10, read_timeout = 30, write_timeout = 30;  // seconds
  int64_t max_connections = 0, max_connections_per_peer = 0;  // 0: the defaults
};
void AddServeCommand(CLI::App* app, ServeOptions* o);
int RunServe(const ServeOptions& o, std::ostream& out, std::ostream& err);

// `strata bench serve` (cli/bench_serve.cc): the load generator and the capacity mode.
struct BenchServeOptions {
  std::string model;  // -m: an in-process server (--capacity: the model's cache geometry)
  std::string url;    // --url: a running server on loopback
  std::string streams = "1,4,16";
  std::string ctx;  // empty: 128 (load), 16384 (--capacity)
  int64_t max_tokens = 32;
  int64_t requests_per_stream = 1;
  double duration = 300;
  std::string policy;  // load: one (empty: the server's default); --capacity: a list
  int64_t parallel = 0;   // 0: the largest --streams
  std::string kv_budget;  // empty: 8GiB (load), 4GiB (--capacity)
  int64_t queue = 64;
  std::string prefill_chunk;  // in-process server: a list, one run per value (empty: the default)
  int threads = 0;  // 0: all cores
  std::string api_key;
  uint64_t seed = 1;
  bool capacity = false;
  std::string geometry;  // --capacity: named cache shapes (empty: the default list)
  int samples = 1;
  std::string json_path;
};
void AddBenchServeCommand(CLI::App* bench, BenchServeOptions* o);
int RunBenchServe(const BenchServeOptions& o, std::ostream& out, std::ostream& err);

// The whole binary: parses args (without the program name) and runs the chosen command. --help
// prints to `out` and returns 0; parse errors and unknown commands print to `err` and return 2.
int RunStrata(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
// The same with `in` as stdin (read by `strata chat`); the overload above passes std::cin, and
// only then can the input be a terminal.
int RunStrata(const std::vector<std::string>& args, std::istream& in, std::ostream& out,
              std::ostream& err);

}  // namespace strata::cli
