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
  ASSIGN_OR_RETURN(auto cache, NewConfigCache(model, factory, config, w.kv_type));
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
  std::vector<int> levels;
  CacheBlockLevels(*cache, &levels, &r.block_levels);
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
          {"offsets", offsets},
          {"kv_type", KvTypeName(w.kv_type)}};
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
                                    o.skip_unsupported, &r.skipped, progress, o.w.kv_type));
  if (!o.policy2.empty()) {
    auto b_or = SingleConfig(o.policy2, o.ratio2, o.settings);
    if (!b_or.ok()) return b_or.status().WithContext("--policy2");
    const PolicyConfig b = std::move(b_or).value();
    RETURN_IF_ERROR(
        NewConfigCache(model, factory, b, o.w.kv_type).status().WithContext("--policy2"));
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
      nlohmann::json wj = {{"offset", w.offset},
                               {"mean_nll", w.mean_nll},
                               {"ppl", std::exp(w.mean_nll)},
                               {"n_targets", static_cast<int64_t>(w.nll.size())},
                               {"resident_bytes", w.resident_bytes},
                               {"bytes_read", w.bytes_read},
                               {"resident_bits_per_value", w.resident_bits_per_value},
                               {"read_bits_per_value", w.read_bits_per_value},
                               {"nll", w.nll}};
      // [layer][KV head][block] levels at the window's end (graded policies, --block-levels).
      if (r.options.w.block_levels && !w.block_levels.empty()) wj["block_levels"] = w.block_levels;
      cj["windows"].push_back(std::move(wj));
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

namespace {

// Mean and 95% normal interval of per-window means (>= 2 windows: windows are the independent
// units) or, with one window, of its per-position values (positions are correlated: narrower
// than the truth, and the chart says which it used).
Interval MeanInterval(const std::vector<std::vector<double>>& per_window, bool* over_windows) {
  std::vector<double> xs;
  *over_windows = per_window.size() >= 2;
  if (*over_windows) {
    for (const auto& w : per_window) {
      double s = 0;
      for (double v : w) s += v;
      xs.push_back(w.empty() ? 0 : s / static_cast<double>(w.size()));
    }
  } else if (!per_window.empty()) {
    xs = per_window[0];
  }
  Interval iv;
  if (xs.empty()) return iv;
  double m = 0;
  for (double v : xs) m += v;
  m /= static_cast<double>(xs.size());
  double ss = 0;
  for (double v : xs) ss += (v - m) * (v - m);
  const double se =
      xs.size() > 1 ? std::sqrt(ss / static_cast<double>(xs.size() - 1) / xs.size()) : 0;
  iv.point = m;
  iv.lo = m - kZ95 * se;
  iv.hi = m + kZ95 * se;
  return iv;
}

const char* const kSeriesColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                     "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

}  // namespace

std::string PplParetoSvg(const PplReport& r) {
  const size_t n = r.configs.size();
  // Per config: PPL and its interval (exp of the mean NLL's interval).
  std::vector<Interval> ppl(n);
  bool over_windows = true;
  for (size_t i = 0; i < n; ++i) {
    std::vector<std::vector<double>> nll;
    for (const auto& w : r.configs[i].windows) nll.push_back(w.nll);
    const Interval m = MeanInterval(nll, &over_windows);
    ppl[i] = {r.configs[i].ppl, std::exp(m.lo), std::exp(m.hi)};
  }
  std::vector<std::string> legend(n);
  double legend_w = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& c = r.configs[i];
    legend[i] = c.config.Label() + ": " + FormatNum(c.ppl, 3) + " [" + FormatNum(ppl[i].lo, 3) +
                ", " + FormatNum(ppl[i].hi, 3) + "] @ " +
                FormatNum(c.resident_bits_per_value, 2) + " b/v";
    legend_w = std::max(legend_w, TextWidth(legend[i], 10));
  }
  const std::string title = std::string("PPL vs resident bits/value") +
                            (r.options.w.chunked ? " (chunked: screening-only)" : " (causal Q=1)");
  const std::string note = std::string("whiskers: 95% interval of the PPL over ") +
                           (over_windows ? "windows" : "positions of the one window") +
                           "; markers at the same point are set side by side";
  const double left = 80, top = 50, bottom = 78, pw = 440;
  const double right = legend_w + 50;
  const double width = std::max(left + pw + right, left + TextWidth(note, 10) + 20);
  const double height = std::max(480.0, top + 14 + 16.0 * n + bottom);
  const double ph = height - top - bottom;
  double x_max = 16, y_min = INFINITY, y_max = -INFINITY;
  for (size_t i = 0; i < n; ++i) {
    x_max = std::max(x_max, r.configs[i].resident_bits_per_value);
    y_min = std::min({y_min, r.configs[i].ppl, ppl[i].lo});
    y_max = std::max({y_max, r.configs[i].ppl, ppl[i].hi});
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
  svg.Text(left + pw / 2, 26, title, "middle", 15, "bold");
  svg.Rect(left, top, pw, ph, "none", "#444444");
  for (int k = 0; k <= 4; ++k) {
    const double xv = x_max * k / 4, yv = y_min + (y_max - y_min) * k / 4;
    svg.Line(X(xv), top + ph, X(xv), top + ph + 5, "#444444");
    svg.Text(X(xv), top + ph + 18, FormatNum(xv, 1), "middle", 10);
    svg.Line(left - 5, Y(yv), left, Y(yv), "#444444");
    svg.Line(left, Y(yv), left + pw, Y(yv), "#eeeeee");
    svg.Text(left - 8, Y(yv) + 4, FormatNum(yv, 3), "end", 10);
  }
  svg.Text(left + pw / 2, top + ph + 38, "resident bits per cached value (16 = full bf16 cache)",
           "middle", 12);
  svg.Text(20, top + ph / 2, "perplexity", "middle", 12, "", -90);
  svg.Text(left, height - 12, note, "start", 10);
  // Pareto front: points not beaten (lower or equal PPL at lower or equal bits) by another.
  std::vector<size_t> order(n);
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
  // Markers closer than 9 px to an earlier one (e.g. policies that hold the same bytes and give
  // the same PPL) move sideways by 9 px per twin, so that none hides another.
  std::vector<double> mx(n), my(n);
  for (size_t i = 0; i < n; ++i) {
    mx[i] = X(r.configs[i].resident_bits_per_value);
    my[i] = Y(r.configs[i].ppl);
    int twins = 0;
    for (size_t j = 0; j < i; ++j) {
      if (std::fabs(X(r.configs[j].resident_bits_per_value) - mx[i]) < 9 &&
          std::fabs(Y(r.configs[j].ppl) - my[i]) < 9) {
        ++twins;
      }
    }
    mx[i] += 9.0 * twins;
  }
  for (size_t i = 0; i < n; ++i) {
    const std::string color = kSeriesColors[i % 8];
    svg.Line(mx[i], Y(ppl[i].lo), mx[i], Y(ppl[i].hi), color, 1.2);
    svg.Line(mx[i] - 3, Y(ppl[i].lo), mx[i] + 3, Y(ppl[i].lo), color, 1.2);
    svg.Line(mx[i] - 3, Y(ppl[i].hi), mx[i] + 3, Y(ppl[i].hi), color, 1.2);
    svg.Circle(mx[i], my[i], 4, color);
    const double ly = top + 14 + 16 * static_cast<double>(i);
    svg.Circle(left + pw + 16, ly - 4, 4, color);
    svg.Text(left + pw + 26, ly, legend[i], "start", 10);
  }
  return svg.Finish();
}

std::string KlSvg(const KlReport& r) {
  const size_t n = r.configs.size();
  const std::string title = "KL(full || policy) per scored position";
  const std::string note = std::string("bar: mean KL; whisker: its 95% interval over ") +
                           (r.offsets.size() >= 2 ? "windows" : "positions of the one window") +
                           "; tick: max KL";
  double label_w = 60;
  for (const auto& c : r.configs) label_w = std::max(label_w, TextWidth(c.config.Label(), 11));
  const double left = label_w + 24, pw = 420, top = 50, row_h = 26;
  const double ph = row_h * std::max<size_t>(1, n);
  const double width = std::max({left + pw + 40, TextWidth(title, 15) + 40,
                                 24 + TextWidth(note, 10) + 20});
  const double height = top + ph + 76;
  std::vector<Interval> iv(n);
  bool over_windows = true;
  double x_max = 0;
  for (size_t i = 0; i < n; ++i) {
    std::vector<std::vector<double>> kl;
    for (const auto& w : r.configs[i].windows) kl.push_back(w.kl);
    iv[i] = MeanInterval(kl, &over_windows);
    iv[i].point = r.configs[i].mean_kl;
    x_max = std::max({x_max, iv[i].hi, r.configs[i].max_kl});
  }
  if (!(x_max > 0)) x_max = 1e-6;
  x_max *= 1.05;
  auto X = [&](double v) { return left + pw * std::clamp(v, 0.0, x_max) / x_max; };
  Svg svg(width, height);
  svg.Text(width / 2, 26, title, "middle", 15, "bold");
  svg.Rect(left, top, pw, ph, "none", "#444444");
  for (int k = 0; k <= 4; ++k) {
    const double v = x_max * k / 4;
    svg.Line(X(v), top, X(v), top + ph, "#eeeeee");
    svg.Line(X(v), top + ph, X(v), top + ph + 4, "#444444");
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.2g", v);
    svg.Text(X(v), top + ph + 16, buf, "middle", 10);
  }
  svg.Text(left + pw / 2, top + ph + 36, "KL divergence (nats)", "middle", 12);
  svg.Text(24, height - 12, note, "start", 10);
  for (size_t i = 0; i < n; ++i) {
    const double y = top + row_h * i;
    const std::string color = kSeriesColors[i % 8];
    svg.Text(left - 10, y + row_h / 2 + 4, r.configs[i].config.Label(), "end", 11);
    svg.Rect(left, y + 7, std::max(0.0, X(iv[i].point) - left), 12, color);
    svg.Line(X(iv[i].lo), y + 13, X(iv[i].hi), y + 13, "#222222", 1.2);
    svg.Line(X(iv[i].lo), y + 9, X(iv[i].lo), y + 17, "#222222", 1.2);
    svg.Line(X(iv[i].hi), y + 9, X(iv[i].hi), y + 17, "#222222", 1.2);
    svg.Line(X(r.configs[i].max_kl), y + 4, X(r.configs[i].max_kl), y + 22, "#000000", 2);
  }
  return svg.Finish();
}

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = std::clamp(q, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(at));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (at - static_cast<double>(lo)) * (v[hi] - v[lo]);
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
                                    o.skip_unsupported, &r.skipped, progress, o.w.kv_type));
  auto ref_or = SingleConfig(o.reference, std::nullopt, o.settings);
  if (!ref_or.ok()) return ref_or.status().WithContext("--reference");
  const PolicyConfig reference = std::move(ref_or).value();
  RETURN_IF_ERROR(NewConfigCache(model, factory, reference, o.w.kv_type)
                      .status()
                      .WithContext("--reference"));
  ThreadPool pool(std::max(1, o.w.threads));
  const int64_t v = model.config().n_vocab;
  const int64_t n_prefix = o.w.length - o.w.eval_tokens;
  const int64_t n_scored = o.w.eval_tokens - 1;
  // Logits after each scored step, [n_scored, n_vocab], for one cache, and what the policy
  // achieved over those steps (when `achieved` is given).
  auto run = [&](const PolicyConfig& c, int64_t offset, std::vector<float>* out,
                 AchievedCompression* achieved) -> Status {
    ASSIGN_OR_RETURN(auto cache, NewConfigCache(model, factory, c, o.w.kv_type));
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
  auto argmax = [v](const float* x) {
    return static_cast<int64_t>(std::max_element(x, x + v) - x);
  };
  std::vector<std::vector<float>> ref(r.offsets.size());
  double ref_nll = 0;
  for (size_t wi = 0; wi < r.offsets.size(); ++wi) {
    RETURN_IF_ERROR(run(reference, r.offsets[wi], &ref[wi], nullptr));
    const int32_t* targets = tokens.data() + r.offsets[wi] + n_prefix;
    for (int64_t i = 0; i < n_scored; ++i) {
      ref_nll += TokenNll(ref[wi].data() + i * v, v, targets[i + 1]);
    }
  }
  r.reference_ppl =
      std::exp(ref_nll / static_cast<double>(n_scored * static_cast<int64_t>(r.offsets.size())));
  for (const auto& c : configs) {
    KlConfigResult cr;
    cr.config = c;
    double sum = 0, nll_sum = 0;
    std::vector<double> all_kl;
    std::vector<float> pol;
    for (size_t wi = 0; wi < r.offsets.size(); ++wi) {
      RETURN_IF_ERROR(run(c, r.offsets[wi], &pol, &cr.achieved));
      KlWindow kw;
      kw.offset = r.offsets[wi];
      const int32_t* targets = tokens.data() + r.offsets[wi] + n_prefix;
      double ws = 0;
      for (int64_t i = 0; i < n_scored; ++i) {
        const float* p = ref[wi].data() + i * v;
        const float* q = pol.data() + i * v;
        const double kl = KlDivergence(p, q, v);
        kw.kl.push_back(kl);
        ws += kl;
        kw.max_kl = std::max(kw.max_kl, kl);
        kw.nll.push_back(TokenNll(q, v, targets[i + 1]));
        nll_sum += kw.nll.back();
        if (argmax(p) == argmax(q)) ++kw.same_top1;
      }
      kw.mean_kl = ws / n_scored;
      sum += ws;
      all_kl.insert(all_kl.end(), kw.kl.begin(), kw.kl.end());
      cr.n_positions += n_scored;
      cr.same_top1 += kw.same_top1;
      cr.max_kl = std::max(cr.max_kl, kw.max_kl);
      prog.Line("kl: " + c.Label() + " window " + std::to_string(wi + 1) + "/" +
                std::to_string(r.offsets.size()) + ": mean KL " + FormatNum(kw.mean_kl, 5) + " [" +
                FormatNum(Elapsed(t0), 1) + " s]");
      cr.windows.push_back(std::move(kw));
    }
    cr.mean_kl = sum / static_cast<double>(cr.n_positions);
    cr.median_kl = Quantile(all_kl, 0.5);
    cr.p99_kl = Quantile(all_kl, 0.99);
    cr.ppl = std::exp(nll_sum / static_cast<double>(cr.n_positions));
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
  j["reference_ppl"] = r.reference_ppl;
  j["warnings"] = r.warnings;
  j["configs"] = nlohmann::json::array();
  for (const auto& c : r.configs) {
    nlohmann::json cj = ConfigJson(c.config);
    cj["mean_kl"] = c.mean_kl;
    cj["median_kl"] = c.median_kl;
    cj["p99_kl"] = c.p99_kl;
    cj["max_kl"] = c.max_kl;
    cj["n_positions"] = c.n_positions;
    cj["same_top1"] = c.same_top1;
    cj["same_top1_fraction"] =
        c.n_positions > 0 ? static_cast<double>(c.same_top1) / c.n_positions : 0.0;
    cj["ppl"] = c.ppl;
    AddAchievedFields(c.achieved, c.check, &cj);
    cj["windows"] = nlohmann::json::array();
    for (const auto& w : c.windows) {
      cj["windows"].push_back({{"offset", w.offset},
                               {"mean_kl", w.mean_kl},
                               {"max_kl", w.max_kl},
                               {"same_top1", w.same_top1},
                               {"kl", w.kl},
                               {"nll", w.nll}});
    }
    j["configs"].push_back(cj);
  }
  return j;
}

}  // namespace strata::eval
