#include "eval/windows.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "eval/svg.h"

namespace strata::eval {

StatusOr<std::vector<int64_t>> ResolveOffsets(int64_t n_tokens, const WindowOptions& w) {
  if (w.eval_tokens < 2) {
    return InvalidArgument("--eval-tokens must be >= 2 (E - 1 targets are scored), got " +
                           std::to_string(w.eval_tokens));
  }
  if (w.length <= w.eval_tokens) {
    return InvalidArgument("--len " + std::to_string(w.length) + " must exceed --eval-tokens " +
                           std::to_string(w.eval_tokens) + " (the prefix is T - E tokens)");
  }
  if (n_tokens < w.length) {
    return InvalidArgument("the text has " + std::to_string(n_tokens) +
                           " tokens, fewer than one window (--len " + std::to_string(w.length) +
                           ")");
  }
  std::vector<int64_t> out;
  if (!w.offsets.empty()) {
    for (int64_t off : w.offsets) {
      if (off < 0 || off + w.length > n_tokens) {
        return InvalidArgument("--offsets " + std::to_string(off) + ": the window [" +
                               std::to_string(off) + ", " + std::to_string(off + w.length) +
                               ") does not fit in the text's " + std::to_string(n_tokens) +
                               " tokens");
      }
      out.push_back(off);
    }
    return out;
  }
  if (w.windows < 1) {
    return InvalidArgument("--windows must be >= 1, got " + std::to_string(w.windows));
  }
  const int64_t span = n_tokens - w.length;
  for (int64_t k = 0; k < w.windows; ++k) {
    out.push_back(w.windows == 1 ? 0 : span * k / (w.windows - 1));
  }
  return out;
}

StatusOr<std::vector<int32_t>> TokenizeCorpus(const Model& model, const std::string& text) {
  const Tokenizer* tok = model.tokenizer();
  if (!tok) return InvalidArgument("the model has no tokenizer, so --text cannot be tokenized");
  return tok->Encode(text, /*with_bos=*/true);
}

StatusOr<WindowResult> RunPplWindow(Model& model, const std::vector<int32_t>& tokens,
                                    int64_t offset, const WindowOptions& w,
                                    const PolicyFactory& factory, const PolicyConfig& config,
                                    ThreadPool* pool) {
  if (offset < 0 || offset + w.length > static_cast<int64_t>(tokens.size())) {
    return InvalidArgument("window at " + std::to_string(offset) + " does not fit");
  }
  ASSIGN_OR_RETURN(auto cache, NewConfigCache(model, factory, config));
  const int64_t n_prefix = w.length - w.eval_tokens;
  const int32_t* win = tokens.data() + offset;
  RETURN_IF_ERROR(model.Prefill(win, n_prefix, w.chunk, cache.get(), pool, nullptr));
  const int32_t* targets = win + n_prefix;  // [E]
  const int64_t v = model.config().n_vocab;
  const int64_t vpt = ValuesPerToken(*cache);
  WindowResult r;
  r.offset = offset;
  const int64_t read0 = cache->counters().bytes_read_total;
  const CacheCounters counters0 = cache->counters();
  double visible_values = 0;
  if (w.chunked) {
    std::vector<float> logits;
    RETURN_IF_ERROR(
        model.Prefill(targets, w.eval_tokens - 1, w.chunk, cache.get(), pool, nullptr, &logits));
    for (int64_t i = 0; i + 1 < w.eval_tokens; ++i) {
      r.nll.push_back(TokenNll(logits.data() + i * v, v, targets[i + 1]));
      visible_values += static_cast<double>(n_prefix + i + 1) * vpt;
    }
  } else {
    std::vector<float> logits(v);
    for (int64_t i = 0; i + 1 < w.eval_tokens; ++i) {
      RETURN_IF_ERROR(model.Decode(targets[i], cache.get(), pool, logits.data()));
      r.nll.push_back(TokenNll(logits.data(), v, targets[i + 1]));
      visible_values += static_cast<double>(cache->n_tokens()) * vpt;
    }
  }
  r.bytes_read = cache->counters().bytes_read_total - read0;
  r.read_bits_per_value = visible_values > 0 ? r.bytes_read * 8.0 / visible_values : 0;
  r.resident_bytes = cache->ResidentBytes();
  r.resident_bits_per_value = ResidentBitsPerValue(*cache);
  r.achieved = MeasureAchieved(*cache, counters0);
  double s = 0;
  for (double x : r.nll) s += x;
  r.mean_nll = s / static_cast<double>(r.nll.size());
  return r;
}

namespace {

double Elapsed(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

nlohmann::json WindowOptionsJson(const WindowOptions& w, const std::vector<int64_t>& offsets) {
  return {{"length", w.length},
          {"eval_tokens", w.eval_tokens},
          {"scored_per_window", w.eval_tokens - 1},
          {"mode", w.chunked ? "chunked" : "q1"},
          {"screening_only", w.chunked},
          {"offsets", offsets}};
}

}  // namespace

StatusOr<PplReport> RunPpl(Model& model, const std::vector<int32_t>& tokens, const PplOptions& o,
                           std::ostream* progress) {
  PplReport r;
  r.options = o;
  r.options.factory = nullptr;
  r.corpus_tokens = static_cast<int64_t>(tokens.size());
  const PolicyFactory factory = o.factory ? o.factory : RegistryFactory();
  const Progress prog(progress);
  ASSIGN_OR_RETURN(r.offsets, ResolveOffsets(r.corpus_tokens, o.w));
  // Fail (or skip) before any work when a config cannot be built.
  ASSIGN_OR_RETURN(const std::vector<PolicyConfig> grid,
                   ExpandGrid(o.policies, o.ratios, o.settings));
  ASSIGN_OR_RETURN(std::vector<PolicyConfig> configs,
                   BuildableConfigs(model, factory, grid,
                                    o.skip_unsupported, &r.skipped, progress));
  if (!o.policy2.empty()) {
    auto b_or = SingleConfig(o.policy2, o.ratio2, o.settings);
    if (!b_or.ok()) return b_or.status().WithContext("--policy2");
    const PolicyConfig b = std::move(b_or).value();
    RETURN_IF_ERROR(NewConfigCache(model, factory, b).status().WithContext("--policy2"));
    configs.push_back(b);
  }
  ThreadPool pool(std::max(1, o.w.threads));
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& c : configs) {
    PplConfigResult cr;
    cr.config = c;
    double nll_sum = 0, res = 0, rd = 0;
    for (size_t wi = 0; wi < r.offsets.size(); ++wi) {
      ASSIGN_OR_RETURN(WindowResult w,
                       RunPplWindow(model, tokens, r.offsets[wi], o.w, factory, c, &pool));
      for (double x : w.nll) nll_sum += x;
      cr.n_targets += static_cast<int64_t>(w.nll.size());
      res += w.resident_bits_per_value;
      rd += w.read_bits_per_value;
      cr.achieved.Add(w.achieved);
      prog.Line("ppl: " + c.Label() + " window " + std::to_string(wi + 1) + "/" +
                std::to_string(r.offsets.size()) + " @" + std::to_string(w.offset) + ": PPL " +
                FormatNum(std::exp(w.mean_nll), 3) + " [" + FormatNum(Elapsed(t0), 1) + " s]");
      cr.windows.push_back(std::move(w));
    }
    cr.mean_nll = nll_sum / static_cast<double>(cr.n_targets);
    cr.ppl = std::exp(cr.mean_nll);
    cr.resident_bits_per_value = res / r.offsets.size();
    cr.read_bits_per_value = rd / r.offsets.size();
    cr.check = CheckAchieved(c.Label(), cr.achieved);
    if (!cr.check.warning.empty()) r.warnings.push_back(cr.check.warning);
    r.configs.push_back(std::move(cr));
  }
  if (!o.policy2.empty()) {
    const size_t b = r.configs.size() - 1;
    for (size_t a = 0; a < b; ++a) {
      std::vector<ClusterDelta> clusters;
      for (size_t wi = 0; wi < r.offsets.size(); ++wi) {
        const auto& na = r.configs[a].windows[wi].nll;
        const auto& nb = r.configs[b].windows[wi].nll;
        ClusterDelta d;
        for (size_t i = 0; i < na.size(); ++i) d.sum += na[i] - nb[i];
        d.count = static_cast<int64_t>(na.size());
        clusters.push_back(d);
      }
      ASSIGN_OR_RETURN(BootstrapResult boot,
                       PairedClusterBootstrap(clusters, o.draws, o.bootstrap_seed));
      r.comparisons.push_back({a, b, boot});
    }
  }
  return r;
}

nlohmann::json PplJson(const PplReport& r) {
  nlohmann::json j = WindowOptionsJson(r.options.w, r.offsets);
  j["text"] = r.options.text_name;
  j["corpus_tokens"] = r.corpus_tokens;
  j["configs"] = nlohmann::json::array();
  for (const auto& c : r.configs) {
    nlohmann::json cj = ConfigJson(c.config);
    cj["ppl"] = c.ppl;
    cj["mean_nll"] = c.mean_nll;
    cj["n_targets"] = c.n_targets;
    cj["resident_bits_per_value"] = c.resident_bits_per_value;
    cj["read_bits_per_value"] = c.read_bits_per_value;
    AddAchievedFields(c.achieved, c.check, &cj);
    cj["windows"] = nlohmann::json::array();
    for (const auto& w : c.windows) {
      cj["windows"].push_back({{"offset", w.offset},
                               {"mean_nll", w.mean_nll},
                               {"ppl", std::exp(w.mean_nll)},
                               {"n_targets", static_cast<int64_t>(w.nll.size())},
                               {"resident_bytes", w.resident_bytes},
                               {"bytes_read", w.bytes_read},
                               {"resident_bits_per_value", w.resident_bits_per_value},
                               {"read_bits_per_value", w.read_bits_per_value},
                               {"nll", w.nll}});
    }
    j["configs"].push_back(cj);
  }
  j["warnings"] = r.warnings;
  j["comparisons"] = nlohmann::json::array();
  for (const auto& c : r.comparisons) {
    const BootstrapResult& b = c.boot;
    j["comparisons"].push_back({{"a", r.configs[c.a].config.Label()},
                                {"b", r.configs[c.b].config.Label()},
                                {"ppl_ratio", b.ratio},
                                {"ratio_lo", b.ratio_lo},
                                {"ratio_hi", b.ratio_hi},
                                {"mean_delta_nll", b.mean_delta},
                                {"delta_lo", b.delta_lo},
                                {"delta_hi", b.delta_hi},
                                {"wins_a", b.wins_a},
                                {"wins_b", b.wins_b},
                                {"n_windows", b.n_clusters},
                                {"draws", b.draws},
                                {"seed", b.seed}});
  }
  return j;
}

std::string PplParetoSvg(const PplReport& r) {
  const double width = 720, height = 480, left = 80, right = 200, top = 50, bottom = 60;
  const double pw = width - left - right, ph = height - top - bottom;
  double x_max = 16, y_min = INFINITY, y_max = -INFINITY;
  for (const auto& c : r.configs) {
    x_max = std::max(x_max, c.resident_bits_per_value);
    y_min = std::min(y_min, c.ppl);
    y_max = std::max(y_max, c.ppl);
  }
  x_max *= 1.05;
  if (!(y_max > y_min)) {
    y_min = (std::isfinite(y_min) ? y_min : 1) * 0.95;
    y_max = y_min / 0.95 * 1.05;
  }
  const double pad = (y_max - y_min) * 0.08;
  y_min -= pad;
  y_max += pad;
  auto X = [&](double v) { return left + pw * v / x_max; };
  auto Y = [&](double v) { return top + ph * (1 - (v - y_min) / (y_max - y_min)); };
  Svg svg(width, height);
  svg.Text(left + pw / 2, 26,
           std::string("PPL vs resident bits/value") +
               (r.options.w.chunked ? " (chunked: screening-only)" : " (causal Q=1)"),
           "middle", 15, "bold");
  svg.Rect(left, top, pw, ph, "none", "#444444");
  for (int k = 0; k <= 4; ++k) {
    const double xv = x_max * k / 4, yv = y_min + (y_max - y_min) * k / 4;
    svg.Line(X(xv), top + ph, X(xv), top + ph + 5, "#444444");
    svg.Text(X(xv), top + ph + 18, FormatNum(xv, 1), "middle", 10);
    svg.Line(left - 5, Y(yv), left, Y(yv), "#444444");
    svg.Line(left, Y(yv), left + pw, Y(yv), "#eeeeee");
    svg.Text(left - 8, Y(yv) + 4, FormatNum(yv, 3), "end", 10);
  }
  svg.Text(left + pw / 2, height - 18, "resident bits per cached value (16 = full bf16 cache)",
           "middle", 12);
  svg.Text(20, top + ph / 2, "perplexity", "middle", 12, "", -90);
  // Pareto front: points not beaten (lower or equal PPL at lower or equal bits) by another.
  std::vector<size_t> order(r.configs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& ca = r.configs[a];
    const auto& cb = r.configs[b];
    return ca.resident_bits_per_value != cb.resident_bits_per_value
               ? ca.resident_bits_per_value < cb.resident_bits_per_value
               : ca.ppl < cb.ppl;
  });
  std::string pts;
  double best = INFINITY;
  for (size_t i : order) {
    if (r.configs[i].ppl < best) {
      best = r.configs[i].ppl;
      if (!pts.empty()) pts += ' ';
      pts += FormatNum(X(r.configs[i].resident_bits_per_value), 1);
      pts += ',';
      pts += FormatNum(Y(r.configs[i].ppl), 1);
    }
  }
  if (!pts.empty()) svg.Polyline(pts, "#1a9850", 1.5);
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                  "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
  for (size_t i = 0; i < r.configs.size(); ++i) {
    const auto& c = r.configs[i];
    const std::string color = kColors[i % 8];
    svg.Circle(X(c.resident_bits_per_value), Y(c.ppl), 4, color);
    const double ly = top + 14 + 16 * static_cast<double>(i);
    svg.Circle(left + pw + 16, ly - 4, 4, color);
    svg.Text(left + pw + 26, ly,
             c.config.Label() + ": " + FormatNum(c.ppl, 3) + " @ " +
                 FormatNum(c.resident_bits_per_value, 2) + " b/v",
             "start", 10);
  }
  return svg.Finish();
}

StatusOr<KlReport> RunKl(Model& model, const std::vector<int32_t>& tokens, const KlOptions& o,
                         std::ostream* progress) {
  KlReport r;
  r.options = o;
  r.options.factory = nullptr;
  r.corpus_tokens = static_cast<int64_t>(tokens.size());
  const PolicyFactory factory = o.factory ? o.factory : RegistryFactory();
  const Progress prog(progress);
  ASSIGN_OR_RETURN(r.offsets, ResolveOffsets(r.corpus_tokens, o.w));
  ASSIGN_OR_RETURN(const std::vector<PolicyConfig> grid,
                   ExpandGrid(o.policies, o.ratios, o.settings));
  ASSIGN_OR_RETURN(const std::vector<PolicyConfig> configs,
                   BuildableConfigs(model, factory, grid,
                                    o.skip_unsupported, &r.skipped, progress));
  auto ref_or = SingleConfig(o.reference, std::nullopt, o.settings);
  if (!ref_or.ok()) return ref_or.status().WithContext("--reference");
  const PolicyConfig reference = std::move(ref_or).value();
  RETURN_IF_ERROR(NewConfigCache(model, factory, reference).status().WithContext("--reference"));
  ThreadPool pool(std::max(1, o.w.threads));
  const int64_t v = model.config().n_vocab;
  const int64_t n_prefix = o.w.length - o.w.eval_tokens;
  const int64_t n_scored = o.w.eval_tokens - 1;
  // Logits after each scored step, [n_scored, n_vocab], for one cache, and what the policy
  // achieved over those steps (when `achieved` is given).
  auto run = [&](const PolicyConfig& c, int64_t offset, std::vector<float>* out,
                 AchievedCompression* achieved) -> Status {
    ASSIGN_OR_RETURN(auto cache, NewConfigCache(model, factory, c));
    const int32_t* win = tokens.data() + offset;
    RETURN_IF_ERROR(model.Prefill(win, n_prefix, o.w.chunk, cache.get(), &pool, nullptr));
    const CacheCounters counters0 = cache->counters();
    const int32_t* targets = win + n_prefix;
    if (o.w.chunked) {
      RETURN_IF_ERROR(
          model.Prefill(targets, n_scored, o.w.chunk, cache.get(), &pool, nullptr, out));
    } else {
      out->assign(static_cast<size_t>(n_scored) * v, 0.f);
      for (int64_t i = 0; i < n_scored; ++i) {
        RETURN_IF_ERROR(model.Decode(targets[i], cache.get(), &pool, out->data() + i * v));
      }
    }
    if (achieved) achieved->Add(MeasureAchieved(*cache, counters0));
    return OkStatus();
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<float>> ref(r.offsets.size());
  for (size_t wi = 0; wi < r.offsets.size(); ++wi) {
    RETURN_IF_ERROR(run(reference, r.offsets[wi], &ref[wi], nullptr));
  }
  for (const auto& c : configs) {
    KlConfigResult cr;
    cr.config = c;
    double sum = 0;
    std::vector<float> pol;
    for (size_t wi = 0; wi < r.offsets.size(); ++wi) {
      RETURN_IF_ERROR(run(c, r.offsets[wi], &pol, &cr.achieved));
      KlWindow kw;
      kw.offset = r.offsets[wi];
      double ws = 0;
      for (int64_t i = 0; i < n_scored; ++i) {
        const double kl = KlDivergence(ref[wi].data() + i * v, pol.data() + i * v, v);
        kw.kl.push_back(kl);
        ws += kl;
        kw.max_kl = std::max(kw.max_kl, kl);
      }
      kw.mean_kl = ws / n_scored;
      sum += ws;
      cr.n_positions += n_scored;
      cr.max_kl = std::max(cr.max_kl, kw.max_kl);
      prog.Line("kl: " + c.Label() + " window " + std::to_string(wi + 1) + "/" +
                std::to_string(r.offsets.size()) + ": mean KL " + FormatNum(kw.mean_kl, 5) + " [" +
                FormatNum(Elapsed(t0), 1) + " s]");
      cr.windows.push_back(std::move(kw));
    }
    cr.mean_kl = sum / static_cast<double>(cr.n_positions);
    cr.check = CheckAchieved(c.Label(), cr.achieved);
    if (!cr.check.warning.empty()) r.warnings.push_back(cr.check.warning);
    r.configs.push_back(std::move(cr));
  }
  return r;
}

nlohmann::json KlJson(const KlReport& r) {
  nlohmann::json j = WindowOptionsJson(r.options.w, r.offsets);
  j["text"] = r.options.text_name;
  j["corpus_tokens"] = r.corpus_tokens;
  j["reference"] = r.options.reference;
  j["warnings"] = r.warnings;
  j["configs"] = nlohmann::json::array();
  for (const auto& c : r.configs) {
    nlohmann::json cj = ConfigJson(c.config);
    cj["mean_kl"] = c.mean_kl;
    cj["max_kl"] = c.max_kl;
    cj["n_positions"] = c.n_positions;
    AddAchievedFields(c.achieved, c.check, &cj);
    cj["windows"] = nlohmann::json::array();
    for (const auto& w : c.windows) {
      cj["windows"].push_back(
          {{"offset", w.offset}, {"mean_kl", w.mean_kl}, {"max_kl", w.max_kl}, {"kl", w.kl}});
    }
    j["configs"].push_back(cj);
  }
  return j;
}

}  // namespace strata::eval
