#include "kv/achieved.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace strata {

void AchievedCompression::Add(const AchievedCompression& o) {
  resident_bytes += o.resident_bytes;
  full_resident_bytes += o.full_resident_bytes;
  bytes_read += o.bytes_read;
  full_bytes_read += o.full_bytes_read;
  rows_read += o.rows_read;
  rows_visible_read += o.rows_visible_read;
  reads += o.reads;
  fallbacks += o.fallbacks;
  policy.Add(o.policy);
  resident_parts.Add(o.resident_parts);
  resident_by_kind.Add(o.resident_by_kind);
  runs += o.runs;
  if (recovered.empty()) recovered = o.recovered;
  levels.Add(o.levels);
}

void LevelHistograms::Add(const LevelHistograms& o) {
  if (o.empty()) return;
  if (empty()) {
    *this = o;
    return;
  }
  if (counts.size() < o.counts.size()) counts.resize(o.counts.size());
  for (size_t l = 0; l < o.counts.size(); ++l) {
    if (counts[l].size() < o.counts[l].size()) counts[l].resize(o.counts[l].size());
    for (size_t h = 0; h < o.counts[l].size(); ++h) {
      if (counts[l][h].size() < o.counts[l][h].size()) counts[l][h].resize(o.counts[l][h].size());
      for (size_t i = 0; i < o.counts[l][h].size(); ++i) counts[l][h][i] += o.counts[l][h][i];
    }
  }
}

std::vector<std::vector<int64_t>> LevelHistograms::PerLayer() const {
  std::vector<std::vector<int64_t>> out(counts.size(), std::vector<int64_t>(levels.size(), 0));
  for (size_t l = 0; l < counts.size(); ++l) {
    for (const auto& head : counts[l]) {
      for (size_t i = 0; i < head.size() && i < levels.size(); ++i) out[l][i] += head[i];
    }
  }
  return out;
}

std::vector<int64_t> LevelHistograms::Total() const {
  std::vector<int64_t> out(levels.size(), 0);
  for (const auto& layer : PerLayer()) {
    for (size_t i = 0; i < layer.size(); ++i) out[i] += layer[i];
  }
  return out;
}

bool CacheBlockLevels(const KvCache& cache, std::vector<int>* levels,
                      std::vector<std::vector<std::vector<int>>>* blocks) {
  blocks->assign(cache.n_layers(), {});
  bool any = false;
  for (int l = 0; l < cache.n_layers(); ++l) {
    std::vector<int> lv;
    if (cache.is_local(l)) continue;  // a sliding-window layer: no policy blocks
    if (cache.policy().BlockLevels(cache.policy_layer(l), &lv, &(*blocks)[l])) {
      if (!any) *levels = lv;
      any = true;
    }
  }
  if (!any) blocks->clear();
  return any;
}

LevelHistograms CacheLevelHistograms(const KvCache& cache) {
  LevelHistograms h;
  std::vector<std::vector<std::vector<int>>> blocks;
  if (!CacheBlockLevels(cache, &h.levels, &blocks)) return h;
  h.counts.resize(blocks.size());
  for (size_t l = 0; l < blocks.size(); ++l) {
    h.counts[l].assign(blocks[l].size(), std::vector<int64_t>(h.levels.size(), 0));
    for (size_t kv = 0; kv < blocks[l].size(); ++kv) {
      for (int bits : blocks[l][kv]) {
        for (size_t i = 0; i < h.levels.size(); ++i) {
          if (h.levels[i] == bits) h.counts[l][kv][i]++;
        }
      }
    }
  }
  return h;
}

double AchievedCompression::resident_vs_full() const {
  return full_resident_bytes > 0
             ? static_cast<double>(resident_bytes) / static_cast<double>(full_resident_bytes)
             : 0;
}

double AchievedCompression::read_vs_full() const {
  return full_bytes_read > 0
             ? static_cast<double>(bytes_read) / static_cast<double>(full_bytes_read)
             : 0;
}

double AchievedCompression::kept_fraction() const {
  if (policy.rows_kept < 0 || policy.rows_visible <= 0) return -1;
  return static_cast<double>(policy.rows_kept) / static_cast<double>(policy.rows_visible);
}

ResidentParts ResidentByLayerKind(const KvCache& cache) {
  ResidentParts by;
  for (int l = 0; l < cache.n_layers(); ++l) {
    ResidentParts one;
    if (cache.is_local(l)) {
      one.parts.push_back({"gqa sliding-window", cache.store(l).resident_bytes()});
    } else {
      one.parts.push_back({cache.geometry(l).kind == AttnKind::kMla ? "mla" : "gqa",
                           cache.policy().ResidentBytes(cache.policy_layer(l), cache.store(l))});
    }
    by.Add(one);
  }
  if (cache.recurrent().n_layers > 0) {
    ResidentParts rec;
    rec.parts.push_back({"kda", cache.RecurrentBytes()});
    by.Add(rec);
  }
  return by;
}

AchievedCompression MeasureAchieved(const KvCache& cache, const CacheCounters& since) {
  const CacheCounters& c = cache.counters();
  AchievedCompression a;
  a.resident_bytes = cache.ResidentBytes();
  a.full_resident_bytes = cache.FullResidentBytes();
  a.bytes_read = c.bytes_read_total - since.bytes_read_total;
  a.full_bytes_read = c.full_bytes_read_total - since.full_bytes_read_total;
  a.rows_read = c.rows_attended_total - since.rows_attended_total;
  a.rows_visible_read = c.rows_visible_total - since.rows_visible_total;
  a.reads = c.reads - since.reads;
  a.fallbacks = c.fallbacks_total - since.fallbacks_total;
  a.policy = cache.Summary();
  a.resident_parts = cache.ResidentBreakdown();
  a.resident_by_kind = ResidentByLayerKind(cache);
  a.runs = 1;
  const Status rec = cache.policy().recovered_error();
  if (!rec.ok()) a.recovered = rec.message();
  a.levels = CacheLevelHistograms(cache);
  return a;
}

namespace {
std::string Times(double r) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fx", r);
  return buf;
}
}  // namespace

CompressionCheck CheckAchieved(const std::string& label, const AchievedCompression& a) {
  CompressionCheck c;
  const PolicySummary& p = a.policy;
  if (p.reference) return c;  // full is what the others are measured against
  const bool reads = a.reads > 0 && a.full_bytes_read > 0;
  const bool holds_less = a.resident_bytes < a.full_resident_bytes;
  const bool reads_less = reads && a.bytes_read < a.full_bytes_read;
  const bool holds_more = a.resident_bytes > a.full_resident_bytes;
  const bool reads_more = reads && a.bytes_read > a.full_bytes_read;
  c.compressed = p.compressed && (holds_less || reads_less);
  std::vector<std::string> parts;
  if (!p.compressed) {
    parts.push_back("compressed nothing on this run" + (p.note.empty() ? "" : " (" + p.note + ")"));
  }
  if (holds_more || reads_more) {
    std::string more = holds_more ? "holds " + Times(a.resident_vs_full()) : "";
    if (reads_more) more += (more.empty() ? "reads " : " and reads ") + Times(a.read_vs_full());
    more += " the bytes of the full cache";
    // What it still saves on the other axis, so the line is not read as "useless".
    if (holds_more && reads_less) more += " (it reads " + Times(a.read_vs_full()) + ")";
    if (reads_more && holds_less) more += " (it holds " + Times(a.resident_vs_full()) + ")";
    parts.push_back(more);
    if (!p.remedy.empty()) parts.push_back(p.remedy);
  } else if (p.compressed && !c.compressed) {
    parts.push_back("saved nothing on this run: it holds and reads what the full cache does");
  }
  if (p.budget_bits > 0 && p.budget_bits < 16 && p.budget_values > 0) {
    const double got = p.budget_bits_used / static_cast<double>(p.budget_values);
    if (std::abs(got - p.budget_bits) > kBudgetMarginBits) {
      char buf[200];
      std::snprintf(buf, sizeof(buf),
                    "its budget was %g bits per value, it achieved %.2f (more than %g off%s)",
                    p.budget_bits, got, kBudgetMarginBits,
                    got > p.budget_bits ? "; its exact blocks (sink, recent) and its level "
                                          "floor do not fit the budget at this length"
                                        : "");
      parts.push_back(buf);
    }
  }
  if (!a.recovered.empty()) {
    parts.push_back("recovered from an error with an exact fallback: " + a.recovered);
  }
  for (size_t i = 0; i < parts.size(); ++i) c.warning += (i ? "; " : label + ": ") + parts[i];
  return c;
}

}  // namespace strata
