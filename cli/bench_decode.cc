// `strata bench decode`: decode tokens/s at several context lengths and thread counts, against the
// memory-bandwidth floor measured in the same process; with --batch, the aggregate tokens/s of B
// sequences decoded together (Model::DecodeBatch: the weights read once per step for all B).
//
// Floor: a decode step must read every decode weight byte and every KV byte the policy touches, so
// tokens/s <= bandwidth / (decode_weight_bytes + KV bytes read per token). The KV cache is filled
// with synthetic rows (random values, appended straight into the cache) rather than by a prefill:
// decode cost depends on how many rows are read, not on what they hold, and a 16k prefill on a
// small machine would take far longer than the measurement.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <limits>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/rng.h"
#include "kernels/membw.h"
#include "model/model.h"
#include "model/quantize.h"

namespace strata::cli {

namespace {

using Clock = std::chrono::steady_clock;

// Appends `ctx` synthetic tokens to every layer in one call, cycling through a few random rows
// per layer.
Status FillCache(KvCache* cache, int64_t ctx, uint64_t seed, std::ostream& err) {
  constexpr int kDistinctRows = 61;
  Rng rng(seed);
  struct Rows {
    std::vector<float> k, v;  // [kDistinctRows, n_kv_heads * k_dim], [.., n_kv_heads * v_dim]
    int64_t k_width = 0, v_width = 0;
  };
  std::vector<Rows> rows(cache->n_layers());
  for (int l = 0; l < cache->n_layers(); ++l) {
    const LayerGeometry& g = cache->geometry(l);
    Rows& r = rows[l];
    const bool mla = g.kind == AttnKind::kMla;
    r.k_width = mla ? g.k_dim : int64_t{g.n_kv_heads} * g.k_dim;
    r.v_width = mla ? 0 : int64_t{g.n_kv_heads} * g.v_dim;
    r.k.resize(kDistinctRows * r.k_width);
    r.v.resize(kDistinctRows * r.v_width);
    for (auto& x : r.k) x = static_cast<float>(rng.Normal());
    for (auto& x : r.v) x = static_cast<float>(rng.Normal());
  }
  const int64_t step = std::max<int64_t>(1, ctx / 4);
  RETURN_IF_ERROR(cache->BeginCall(ctx, CallKind::kPrefill));
  for (int64_t t = 0; t < ctx; ++t) {
    const int64_t i = t % kDistinctRows;
    for (int l = 0; l < cache->n_layers(); ++l) {
      const Rows& r = rows[l];
      RETURN_IF_ERROR(cache->Append(l, r.k.data() + i * r.k_width,
                                    r.v_width ? r.v.data() + i * r.v_width : nullptr));
    }
    if ((t + 1) % step == 0 && ctx >= 4096) {
      err << "  filled " << (t + 1) << " / " << ctx << " tokens\n" << std::flush;
    }
  }
  return cache->EndCall();
}

// The largest data or unified CPU cache visible to CPU 0 in bytes (Linux sysfs: the L3 on most
// machines), 0 when sysfs does not say. A decode working set below it is served from cache after
// the first step, so the memory-bandwidth floor does not bound it.
int64_t LargestCpuCacheBytes() {
  int64_t best = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
    std::ifstream type_f(dir + "/type"), size_f(dir + "/size");
    if (!type_f || !size_f) continue;
    std::string type, size;
    type_f >> type;
    size_f >> size;
    if (type == "Instruction" || size.empty()) continue;
    char* end = nullptr;
    const long long v = std::strtoll(size.c_str(), &end, 10);
    if (end == size.c_str() || v <= 0) continue;
    const int64_t mult = *end == 'K' ? 1024 : *end == 'M' ? 1024 * 1024 : *end == 'G' ? 1 << 30 : 1;
    best = std::max<int64_t>(best, v * mult);
  }
  return best;
}

// --batch: for each thread count, ctx and batch size B, B fresh full caches filled to ctx, then
// timed DecodeBatch steps (one token for each of the B sequences per step). Aggregate tok/s =
// B * steps / s; "x B=1" is its ratio to the B = 1 row of the same ctx and threads; the floor is
// the memory-bound rate with the weights read once per step: B * bw / (weights + B * KV/token).
int RunBatchMode(const BenchDecodeOptions& o, Model& m, const std::string& path,
                 const std::vector<int64_t>& ctxs, const std::vector<int64_t>& threads,
                 std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  auto batch_or = ParseIntList("--batch", o.batch);
  if (!batch_or.ok()) return fail(batch_or.status().message());
  std::vector<int64_t> batches = *batch_or;
  for (int64_t b : batches) {
    if (b < 1 || b > 4096) {
      return fail("--batch values must be in [1, 4096], got " + std::to_string(b));
    }
  }
  if (std::find(batches.begin(), batches.end(), 1) == batches.end()) {
    err << "--batch: adding B = 1, the reference of the ratio\n";
    batches.insert(batches.begin(), 1);
  }
  // The caches of the largest batch at the largest ctx must fit in memory: refuse up front
  // rather than be killed mid-run.
  {
    auto probe = m.NewCache(std::make_unique<FullPolicy>());
    if (!probe.ok()) return fail(probe.status().ToString());
    const int64_t max_b = *std::max_element(batches.begin(), batches.end());
    const int64_t max_ctx = *std::max_element(ctxs.begin(), ctxs.end());
    const double need = static_cast<double>((*probe)->FullBytesPerToken()) *
                        static_cast<double>(max_ctx + o.warmup + o.tokens) *
                        static_cast<double>(max_b);
    const double phys = PhysicalMemoryBytes();
    err << "KV caches: up to " << FormatBytes(need) << " (" << max_b << " sequences at ctx "
        << max_ctx << ")\n";
    if (phys > 0 && need > 0.75 * phys) {
      return fail("--batch " + std::to_string(max_b) + " at --ctx " + std::to_string(max_ctx) +
                  " needs " + FormatBytes(need) + " of KV cache, more than 3/4 of the " +
                  FormatBytes(phys) + " of memory: lower --batch or --ctx");
    }
  }
  const int64_t weight_bytes = m.decode_weight_bytes();
  const int64_t n_vocab = m.config().n_vocab;
  Rng token_rng(o.seed ^ 0x70c3e5ull);
  Table t({"ctx", "threads", "batch", "steps/s", "aggregate tok/s", "x B=1", "floor tok/s",
           "fraction", "weight MB/step", "KV MB read/step"});
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t n_threads : threads) {
    ThreadPool pool(static_cast<int>(n_threads));
    err << "[threads " << n_threads << "] measuring read bandwidth (" << o.bw_mib << " MiB)...\n"
        << std::flush;
    const auto bw_or = MeasureReadBandwidth(static_cast<size_t>(o.bw_mib) << 20, &pool);
    if (!bw_or.ok()) {
      return fail("--bw-mib " + std::to_string(o.bw_mib) + ": " + bw_or.status().ToString());
    }
    const double bw =
        std::max(*bw_or, MeasureReadBandwidthOf(m.file().data(), m.file().file_size(), &pool));
    for (int64_t ctx : ctxs) {
      double single_tok_s = 0;
      for (int64_t nb : batches) {
        const int B = static_cast<int>(nb);
        err << "[threads " << n_threads << ", ctx " << ctx << ", batch " << B
            << "] filling the caches...\n"
            << std::flush;
        std::vector<std::unique_ptr<KvCache>> owned;
        std::vector<KvCache*> caches;
        for (int b = 0; b < B; ++b) {
          auto c = m.NewCache(std::make_unique<FullPolicy>());
          if (!c.ok()) return fail(c.status().ToString());
          const uint64_t seed = o.seed + static_cast<uint64_t>(ctx) + 7919u * b;
          if (Status st = FillCache(c->get(), ctx, seed, err); !st.ok()) {
            return fail("filling the cache: " + st.ToString());
          }
          caches.push_back(c->get());
          owned.push_back(std::move(c).value());
        }
        std::vector<float> logits(static_cast<size_t>(B) * n_vocab);
        std::vector<int32_t> toks(B);
        auto step = [&]() -> Status {
          for (auto& tk : toks) tk = static_cast<int32_t>(token_rng.Below(n_vocab));
          return m.DecodeBatch(toks.data(), B, caches.data(), &pool, logits.data());
        };
        for (int i = 0; i < o.warmup; ++i) {
          if (Status st = step(); !st.ok()) return fail("decode: " + st.ToString());
        }
        err << "[threads " << n_threads << ", ctx " << ctx << ", batch " << B << "] timing "
            << o.tokens << " steps...\n"
            << std::flush;
        int64_t read_before = 0;
        for (KvCache* c : caches) read_before += c->counters().bytes_read_total;
        const auto t0 = Clock::now();
        for (int i = 0; i < o.tokens; ++i) {
          if (Status st = step(); !st.ok()) return fail("decode: " + st.ToString());
        }
        const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        int64_t read_after = 0;
        for (KvCache* c : caches) read_after += c->counters().bytes_read_total;
        double kv_per_step = static_cast<double>(read_after - read_before) / o.tokens;
        for (KvCache* c : caches) kv_per_step += 2.0 * static_cast<double>(c->RecurrentBytes());
        const double steps_s = secs > 0 ? o.tokens / secs : 0;
        const double tok_s = steps_s * B;
        if (B == 1) single_tok_s = tok_s;
        const double ratio = single_tok_s > 0 ? tok_s / single_tok_s : 0;
        const double floor_tok_s = B * bw / (static_cast<double>(weight_bytes) + kv_per_step);
        const double fraction = floor_tok_s > 0 ? tok_s / floor_tok_s : 0;
        t.AddRow({std::to_string(ctx), std::to_string(n_threads), std::to_string(B),
                  FormatFixed(steps_s, 2), FormatFixed(tok_s, 1), FormatFixed(ratio, 2),
                  FormatFixed(floor_tok_s, 1), FormatFixed(fraction, 3),
                  FormatFixed(weight_bytes / 1e6, 2), FormatFixed(kv_per_step / 1e6, 3)});
        rows.push_back({{"ctx", ctx},
                        {"threads", n_threads},
                        {"batch", B},
                        {"steps", o.tokens},
                        {"seconds", secs},
                        {"steps_per_s", steps_s},
                        {"tok_per_s", tok_s},
                        {"ratio_to_batch_1", ratio},
                        {"floor_tok_per_s", floor_tok_s},
                        {"fraction", fraction},
                        {"decode_weight_bytes", weight_bytes},
                        {"kv_bytes_read_per_step", kv_per_step},
                        {"read_bandwidth_bytes_per_s", bw}});
      }
    }
  }
  const GgufValue* ft = m.file().Find("general.file_type");
  out << "decode batch, model " << path << " (" << ArchName(m.config().arch) << ", "
      << (ft != nullptr && ft->IsInteger() ? FileTypeIdName(ft->AsInt())
                                           : std::string("no file type"))
      << "), " << o.tokens << " timed steps per row, full caches\n";
  t.Print(out);
  const std::vector<ColumnDoc> legend = {
      {"ctx", "rows in each sequence's cache (synthetic) before the timed steps"},
      {"threads", "threads of the decode step and of the bandwidth probe"},
      {"batch", "sequences decoded together per step (Model::DecodeBatch), each its own cache"},
      {"steps/s", "timed batch steps per second (one token for every sequence per step)"},
      {"aggregate tok/s", "batch * steps/s: tokens per second over all sequences"},
      {"x B=1", "aggregate tok/s / the batch-1 row's (same ctx, threads)"},
      {"floor tok/s",
       "batch * bandwidth / (weight MB/step + KV MB read/step): the memory-bound rate with the "
       "weights read once per step (compute is not counted: large batches are compute-bound)"},
      {"fraction", "aggregate tok/s / floor tok/s"},
      {"weight MB/step", "weight bytes one decode token reads (MoE: the routed experts' share)"},
      {"KV MB read/step", "KV bytes read per step over all sequences (the full caches)"},
  };
  PrintLegend(legend, out);
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"model", path}, {"summary", m.config().Summary()}, {"results", rows}};
    if (Status st = WriteTextFile(o.json_path, DumpJson(j)); !st.ok()) {
      return fail("--json: " + st.ToString());
    }
  }
  return kExitOk;
}

}  // namespace

void AddBenchDecodeCommand(CLI::App* bench, BenchDecodeOptions* o) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  o->threads = hw > 1 ? "1," + std::to_string(hw) : "1";
  CLI::App* cmd = bench->add_subcommand(
      "decode", "Decode tokens/s vs the memory-bandwidth floor, per context length and threads");
  cmd->add_option("-m,--model", o->model,
                  "Model (.gguf or HF directory); default: the built-in model");
  cmd->add_option("--ctx", o->ctx, "Context lengths (comma-separated) the cache is filled to")
      ->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Thread counts (comma-separated)")
      ->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "Timed decode steps per configuration")
      ->capture_default_str();
  cmd->add_flag("--no-mmap", o->no_mmap,
               "Read the model into memory (huge pages where the kernel grants them) instead of "
               "mapping the file");
  cmd->add_option("--warmup", o->warmup, "Untimed decode steps before timing")
      ->capture_default_str();
  cmd->add_option("--bw-mib", o->bw_mib, "Buffer size of the read-bandwidth probe in MiB")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the synthetic cache rows and tokens")
      ->capture_default_str();
  cmd->add_option("--batch", o->batch,
                  "Batch sizes (comma-separated, e.g. 1,4,16,64): aggregate tok/s of that many "
                  "sequences decoded together, each at --ctx, and the ratio to batch 1");
  cmd->add_option("--json", o->json_path, "Also write the results as JSON to this file");
}

int RunBenchDecode(const BenchDecodeOptions& o, std::ostream& out, std::ostream& err) {
  auto fail = [&](const std::string& msg) {
    err << "error: " << msg << "\n";
    return kExitUsage;
  };
  if (o.tokens < 1) return fail("--tokens must be >= 1, got " + std::to_string(o.tokens));
  if (o.warmup < 0) return fail("--warmup must be >= 0, got " + std::to_string(o.warmup));
  if (o.bw_mib < 1 || o.bw_mib > (int64_t{1} << 30)) {
    return fail("--bw-mib must be in [1, 1073741824], got " + std::to_string(o.bw_mib));
  }
  auto ctxs = ParseIntList("--ctx", o.ctx);
  if (!ctxs.ok()) return fail(ctxs.status().message());
  for (int64_t c : *ctxs) {
    if (c < 0) return fail("--ctx values must be >= 0, got " + std::to_string(c));
  }
  auto threads = ParseIntList("--threads", o.threads);
  if (!threads.ok()) return fail(threads.status().message());
  for (int64_t t : *threads) {
    if (t < 1 || t > 4096)
      return fail("--threads values must be in [1, 4096], got " + std::to_string(t));
  }

  std::string path;
  auto loaded = LoadCommandModel(o.model, o.no_mmap, o.models_dir, o.cache_dir, err, &path);
  if (!loaded.ok()) return fail(loaded.status().message());
  Model& m = **loaded;
  {
    // The largest --ctx must fit in memory: refused now with the bytes it needs, not by
    // std::bad_alloc (or the OOM killer) while the cache fills.
    auto probe = m.NewCache(std::make_unique<FullPolicy>());
    if (!probe.ok()) return fail(probe.status().ToString());
    const int64_t max_ctx = *std::max_element(ctxs->begin(), ctxs->end());
    const int64_t rows = max_ctx > std::numeric_limits<int64_t>::max() - o.warmup - o.tokens
                             ? max_ctx
                             : max_ctx + o.warmup + o.tokens;
    if (Status st = CheckKvFitsMemory("--ctx", max_ctx, KvCacheBytesAt(**probe, rows),
                                      static_cast<double>((*probe)->FullBytesPerToken()),
                                      AvailableMemoryBytes());
        !st.ok()) {
      return fail(st.message());
    }
  }
  {
    // Every page of the model is read once before timing (a mapped file may not be in memory:
    // the first steps would measure the disk).
    const GgufFile& f = m.file();
    const auto t0 = Clock::now();
    volatile float sink = StreamSum(reinterpret_cast<const float*>(f.data()), f.file_size() / 4);
    (void)sink;
    err << "model " << (o.no_mmap ? "read into memory" : "mapped") << ", "
        << FormatFixed(f.file_size() / 1e6, 1) << " MB touched in "
        << FormatFixed(std::chrono::duration<double>(Clock::now() - t0).count(), 2) << " s\n";
  }
  if (!o.batch.empty()) return RunBatchMode(o, m, path, *ctxs, *threads, out, err);
  const int64_t weight_bytes = m.decode_weight_bytes();
  // Bits per weight of the file's tensors (the floor counts the real bytes of every type).
  double bpw = 0;
  {
    int64_t n_weights = 0, n_bytes = 0;
    for (const auto& ti : m.file().tensors()) {
      int64_t n = 1;
      for (int64_t x : ti.shape) n *= x;
      n_weights += n;
      n_bytes += static_cast<int64_t>(ti.n_bytes);
    }
    bpw = n_weights > 0 ? 8.0 * static_cast<double>(n_bytes) / static_cast<double>(n_weights) : 0;
  }
  const int64_t cpu_cache = LargestCpuCacheBytes();
  double max_working_set = 0;  // decode weight bytes + KV bytes read per token, largest ctx
  const int64_t n_vocab = m.config().n_vocab;
  std::vector<float> logits(n_vocab);
  Rng token_rng(o.seed ^ 0x70c3e5ull);

  Table t({"ctx", "threads", "tok/s", "floor tok/s", "fraction", "weight MB", "KV MB read/token",
           "bandwidth GB/s"});
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t n_threads : *threads) {
    ThreadPool pool(static_cast<int>(n_threads));
    err << "[threads " << n_threads << "] measuring read bandwidth (" << o.bw_mib << " MiB)...\n"
        << std::flush;
    const auto bw_or = MeasureReadBandwidth(static_cast<size_t>(o.bw_mib) << 20, &pool);
    if (!bw_or.ok()) return fail("--bw-mib " + std::to_string(o.bw_mib) + ": " + bw_or.status().ToString());
    // The floor uses the faster of two reads: the probe buffer, and the model's own mapped bytes
    // (what a decode step reads), so no access pattern of the decode can beat a slow probe.
    const double bw_model =
        MeasureReadBandwidthOf(m.file().data(), m.file().file_size(), &pool);
    const double bw = std::max(*bw_or, bw_model);
    err << "[threads " << n_threads << "] buffer " << FormatFixed(*bw_or / 1e9, 2)
        << " GB/s, model bytes " << FormatFixed(bw_model / 1e9, 2) << " GB/s\n";
    for (int64_t ctx : *ctxs) {
      err << "[threads " << n_threads << ", ctx " << ctx << "] filling the cache...\n"
          << std::flush;
      auto cache_or = m.NewCache(std::make_unique<FullPolicy>());
      if (!cache_or.ok()) return fail(cache_or.status().ToString());
      KvCache& cache = **cache_or;
      if (Status st = FillCache(&cache, ctx, o.seed + static_cast<uint64_t>(ctx), err); !st.ok()) {
        return fail("filling the cache: " + st.ToString());
      }
      auto step = [&]() -> Status {
        const int32_t tok = static_cast<int32_t>(token_rng.Below(n_vocab));
        return m.Decode(tok, &cache, &pool, logits.data());
      };
      for (int i = 0; i < o.warmup; ++i) {
        if (Status st = step(); !st.ok()) return fail("decode: " + st.ToString());
      }
      err << "[threads " << n_threads << ", ctx " << ctx << "] timing " << o.tokens
          << " decode steps...\n"
          << std::flush;
      const int64_t read_before = cache.counters().bytes_read_total;
      const auto t0 = Clock::now();
      for (int i = 0; i < o.tokens; ++i) {
        if (Status st = step(); !st.ok()) return fail("decode: " + st.ToString());
      }
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      // A recurrent (kimi-linear KDA) state is read and written once per token: in the floor.
      const double kv_per_token =
          static_cast<double>(cache.counters().bytes_read_total - read_before) / o.tokens +
          2.0 * static_cast<double>(cache.RecurrentBytes());
      const double tok_s = secs > 0 ? o.tokens / secs : 0;
      const double floor_tok_s = bw / (static_cast<double>(weight_bytes) + kv_per_token);
      const double fraction = floor_tok_s > 0 ? tok_s / floor_tok_s : 0;
      max_working_set =
          std::max(max_working_set, static_cast<double>(weight_bytes) + kv_per_token);
      t.AddRow({std::to_string(ctx), std::to_string(n_threads), FormatFixed(tok_s, 1),
                FormatFixed(floor_tok_s, 1), FormatFixed(fraction, 3),
                FormatFixed(weight_bytes / 1e6, 2), FormatFixed(kv_per_token / 1e6, 3),
                FormatFixed(bw / 1e9, 2)});
      rows.push_back({{"ctx", ctx},
                      {"threads", n_threads},
                      {"tokens", o.tokens},
                      {"seconds", secs},
                      {"tok_per_s", tok_s},
                      {"floor_tok_per_s", floor_tok_s},
                      {"fraction", fraction},
                      {"decode_weight_bytes", weight_bytes},
                      {"kv_bytes_read_per_token", kv_per_token},
                      {"read_bandwidth_bytes_per_s", bw},
                      {"probe_buffer_bytes_per_s", *bw_or},
                      {"probe_model_bytes_per_s", bw_model},
                      {"bits_per_weight", bpw}});
    }
  }
  const GgufValue* ft = m.file().Find("general.file_type");
  out << "decode, model " << path << " (" << ArchName(m.config().arch) << ", "
      << (ft != nullptr && ft->IsInteger() ? FileTypeIdName(ft->AsInt()) : std::string("no file type"))
      << ", " << FormatFixed(bpw, 2) << " bits per weight), " << o.tokens
      << " timed steps, --attn-math " << AttnMathName(DefaultAttnMath())
      << "; floor = read bandwidth / (decode weight bytes + KV bytes read per "
         "token)\n";
  out << CpuDotSummary() << "\n";
  t.Print(out);
  const std::vector<ColumnDoc> legend = {
      {"ctx", "rows in the cache (synthetic) before the timed steps"},
      {"threads", "threads of the decode step and of the bandwidth probe"},
      {"tok/s", "timed decode steps per second"},
      {"floor tok/s", "read bandwidth / (weight MB + KV MB read/token): the memory-bound rate"},
      {"fraction", "tok/s / floor tok/s (1 = as fast as reading the bytes once from memory)"},
      {"weight MB", "weight bytes one decode step reads (MoE: the routed experts' share)"},
      {"KV MB read/token", "KV cache bytes one decode step read (the full cache: every row), "
                           "plus a recurrent (KDA) state read and written once"},
      {"bandwidth GB/s",
       "read bandwidth measured in this process: the faster of a --bw-mib MiB buffer and a "
       "streaming read of the model file's own bytes"},
  };
  PrintLegend(legend, out);
  // A working set that fits in the CPU's cache is read from cache, not memory, after the first
  // step: the floor is then no bound and a fraction above 1 means nothing.
  const bool fits_in_cache = cpu_cache > 0 && max_working_set <= static_cast<double>(cpu_cache);
  if (fits_in_cache) {
    out << "caveat: the decode working set (" << FormatBytes(max_working_set)
        << " at most: weights + KV read per token) fits in the CPU cache ("
        << FormatBytes(static_cast<double>(cpu_cache))
        << "), so steps read it from cache, not memory: the floor is not a bound here and "
           "fraction > 1 is not meaningful. Use a model larger than the cache for the floor.\n";
  }
  if (cpu_cache > 0 && (o.bw_mib << 20) <= cpu_cache) {
    out << "caveat: the bandwidth probe (--bw-mib " << o.bw_mib << ") fits in the CPU cache ("
        << FormatBytes(static_cast<double>(cpu_cache))
        << "): it measured cache bandwidth, not memory bandwidth.\n";
  }
  if (!o.json_path.empty()) {
    nlohmann::json j = {{"model", path}, {"summary", m.config().Summary()}, {"results", rows},
                        {"cpu_cache_bytes", cpu_cache}, {"fits_in_cpu_cache", fits_in_cache}};
    if (Status st = WriteTextFile(o.json_path, DumpJson(j)); !st.ok()) {
      return fail("--json: " + st.ToString());
    }
  }
  return kExitOk;
}

}  // namespace strata::cli
