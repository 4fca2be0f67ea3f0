#include "eval/needle.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include "core/rng.h"
#include "eval/corpus.h"
#include "eval/svg.h"

namespace strata::eval {

StatusOr<NeedleFormat> ParseNeedleFormat(const std::string& text) {
  if (text == "text") return NeedleFormat::kText;
  if (text == "kv-tokens") return NeedleFormat::kKvTokens;
  if (text == "kv-multikey") return NeedleFormat::kKvMultikey;
  return InvalidArgument("--needle-format '" + text +
                         "' must be text, kv-tokens or kv-multikey");
}

const char* NeedleFormatName(NeedleFormat f) {
  switch (f) {
    case NeedleFormat::kText: return "text";
    case NeedleFormat::kKvTokens: return "kv-tokens";
    case NeedleFormat::kKvMultikey: return "kv-multikey";
  }
  return "?";
}

uint64_t TrialSeed(uint64_t seed, int64_t index) {
  uint64_t x = seed ^ (0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(index) + 1));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

namespace {

std::string Unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size() && s[i + 1] == 'n') {
      out += '\n';
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) {
    s.replace(p, from.size(), to);
  }
  return s;
}

std::string CollapseWhitespace(const std::string& s) {
  std::string out;
  bool space = false;
  for (char c : s) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      space = true;
      continue;
    }
    if (space && !out.empty()) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

Status CheckId(const char* flag, int32_t id, int64_t n_vocab) {
  if (id < 0 || id >= n_vocab) {
    return InvalidArgument(std::string(flag) + " = " + std::to_string(id) +
                           " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
  }
  return OkStatus();
}

}  // namespace

StatusOr<NeedleBuilder> NeedleBuilder::Create(const Model& model, const NeedleOptions& o) {
  NeedleBuilder b;
  b.o_ = o;
  b.o_.factory = nullptr;
  b.n_vocab_ = model.config().n_vocab;
  if (o.trials < 1)
    return InvalidArgument("--trials must be >= 1, got " + std::to_string(o.trials));
  if (!(o.depth_lo >= 0 && o.depth_lo < o.depth_hi && o.depth_hi <= 1)) {
    return InvalidArgument("needle depth range [" + std::to_string(o.depth_lo) + ", " +
                           std::to_string(o.depth_hi) + ") must lie in [0, 1]");
  }
  const std::string text = o.haystack.empty() ? std::string(BuiltinHaystack()) : o.haystack;
  const std::string hay_name =
      o.haystack.empty() ? std::string(kBuiltinHaystackName) : "--haystack " + o.haystack_name;
  if (o.format == NeedleFormat::kText) {
    b.tok_ = model.tokenizer();
    if (!b.tok_) {
      return InvalidArgument(
          "--needle-format text needs a tokenizer, and the model has none "
          "(use --needle-format kv-tokens for token-level models)");
    }
    if (o.key_digits < 1 || o.key_digits > 18) {
      return InvalidArgument("--key-digits must be in [1, 18], got " +
                             std::to_string(o.key_digits));
    }
    if (o.needle_template.find("{key}") == std::string::npos) {
      return InvalidArgument("--needle '" + o.needle_template + "' has no {key} placeholder");
    }
    b.bos_ = b.tok_->add_bos() ? b.tok_->bos_id() : -1;
    b.filler_ = b.tok_->Encode(text, /*with_bos=*/false);
  } else {
    const KvTokenIds& kv = o.kv;
    if (kv.bos >= 0) RETURN_IF_ERROR(CheckId("--kv-bos", kv.bos, b.n_vocab_));
    RETURN_IF_ERROR(CheckId("--kv-key", kv.key, b.n_vocab_));
    if (kv.slot0_count < 1 || kv.slot1_count < 1) {
      return InvalidArgument("kv-tokens slots need >= 1 value each, got " +
                             std::to_string(kv.slot0_count) + " and " +
                             std::to_string(kv.slot1_count));
    }
    RETURN_IF_ERROR(CheckId("--kv-slot0 first", kv.slot0_first, b.n_vocab_));
    RETURN_IF_ERROR(CheckId("--kv-slot0 last", kv.slot0_first + kv.slot0_count - 1, b.n_vocab_));
    RETURN_IF_ERROR(CheckId("--kv-slot1 first", kv.slot1_first, b.n_vocab_));
    RETURN_IF_ERROR(CheckId("--kv-slot1 last", kv.slot1_first + kv.slot1_count - 1, b.n_vocab_));
    RETURN_IF_ERROR(CheckId("--kv-char-first", kv.char_first, b.n_vocab_));
    if (o.format == NeedleFormat::kKvMultikey) {
      if (kv.n_keys < 1 || kv.n_keys > std::min({kv.keyname_count, kv.slot0_count,
                                                  kv.slot1_count})) {
        return InvalidArgument(
            "--kv-keys " + std::to_string(kv.n_keys) + " must be in [1, " +
            std::to_string(std::min({kv.keyname_count, kv.slot0_count, kv.slot1_count})) +
            "] (each needle has its own key name and values)");
      }
      RETURN_IF_ERROR(CheckId("--kv-keynames first", kv.keyname_first, b.n_vocab_));
      RETURN_IF_ERROR(
          CheckId("--kv-keynames last", kv.keyname_first + kv.keyname_count - 1, b.n_vocab_));
    }
    b.bos_ = kv.bos;
    const std::string flat = CollapseWhitespace(text);
    const Tokenizer* tok = model.tokenizer();
    if (kv.charset.empty() && tok != nullptr) {
      // Each character is its own token in a char-level vocabulary (the testbed's).
      int32_t id_of[256];
      std::fill(std::begin(id_of), std::end(id_of), -2);  // -2: not looked up yet
      b.filler_.reserve(flat.size());
      for (char c : flat) {
        const unsigned char u = static_cast<unsigned char>(c);
        if (id_of[u] == -2) {
          int32_t id = c == ' ' ? tok->TokenId("\u2581") : -1;
          if (id < 0) id = tok->TokenId(std::string(1, c));
          if (id < 0) {
            char hex[8];
            std::snprintf(hex, sizeof hex, "0x%02x", u);
            return InvalidArgument("kv-tokens: haystack " + hay_name + " has the character '" +
                                   std::string(1, c) + "' (" + hex +
                                   "), which has no one-character token in the model's "
                                   "tokenizer (pass a --haystack without it, or --kv-charset)");
          }
          RETURN_IF_ERROR(CheckId("kv-tokens character token", id, b.n_vocab_));
          id_of[u] = id;
        }
        b.filler_.push_back(id_of[u]);
      }
    } else {
      std::string charset = kv.charset;
      if (charset.empty()) {
        std::set<char> distinct(flat.begin(), flat.end());
        charset.assign(distinct.begin(), distinct.end());
      }
      const int64_t range = b.n_vocab_ - kv.char_first;
      int index_of[256];
      std::fill(std::begin(index_of), std::end(index_of), -1);
      for (size_t i = 0; i < charset.size(); ++i) {
        const unsigned char c = static_cast<unsigned char>(charset[i]);
        if (index_of[c] < 0) index_of[c] = static_cast<int>(i);
      }
      for (char c : flat) {
        const int idx = index_of[static_cast<unsigned char>(c)];
        if (idx < 0) continue;  // not in --kv-charset
        b.filler_.push_back(kv.char_first + static_cast<int32_t>(idx % range));
      }
    }
    // The needle's own tokens must not occur in the filler (the protocol's value tokens are
    // out-of-vocabulary for the text by design).
    for (int32_t id : b.filler_) {
      const bool is_value =
          (id >= kv.slot0_first && id < kv.slot0_first + kv.slot0_count) ||
          (id >= kv.slot1_first && id < kv.slot1_first + kv.slot1_count) ||
          (o.format == NeedleFormat::kKvMultikey && id >= kv.keyname_first &&
           id < kv.keyname_first + kv.keyname_count);
      if (id == kv.key || id == kv.bos || is_value) {
        return InvalidArgument("kv-tokens: filler token " + std::to_string(id) +
                               " collides with the BOS, KEY, a key name or a value id (check "
                               "--kv-char-first, --kv-slot0/1, --kv-keynames, --kv-key)");
      }
    }
  }
  if (b.filler_.size() < 16) {
    return InvalidArgument("haystack " + hay_name + " gives only " +
                           std::to_string(b.filler_.size()) + " filler tokens (need >= 16)");
  }
  return b;
}

StatusOr<NeedleTrial> NeedleBuilder::Build(int64_t length, int64_t index) const {
  NeedleTrial t;
  t.index = index;
  t.length = length;
  Rng rng(TrialSeed(o_.seed, index));
  // Draw order: key, depth, filler offset (fixed, so a trial never depends on anything else).
  if (o_.format == NeedleFormat::kText) {
    uint64_t lo = 1;
    for (int d = 1; d < o_.key_digits; ++d) lo *= 10;
    const uint64_t key = o_.key_digits == 1 ? rng.Below(10) : lo + rng.Below(9 * lo);
    t.key = std::to_string(key);
    t.needle = tok_->Encode(Replace(Unescape(o_.needle_template), "{key}", t.key), false);
    const std::string question = Unescape(o_.question_template);
    const std::vector<int32_t> q = tok_->Encode(question, false);
    const std::vector<int32_t> qa = tok_->Encode(question + " " + t.key, false);
    if (qa.size() > q.size() && std::equal(q.begin(), q.end(), qa.begin())) {
      t.query = q;
      t.answer.assign(qa.begin() + q.size(), qa.end());
    } else {
      // The key merged with the question's last token: score the key tokenized on its own.
      t.query = q;
      t.answer = tok_->Encode(" " + t.key, false);
    }
  } else if (o_.format == NeedleFormat::kKvMultikey) {
    RETURN_IF_ERROR(BuildMultikey(length, rng, &t));
    return t;
  } else {
    const KvTokenIds& kv = o_.kv;
    const int32_t v1 = kv.slot0_first + static_cast<int32_t>(rng.Below(kv.slot0_count));
    const int32_t v2 = kv.slot1_first + static_cast<int32_t>(rng.Below(kv.slot1_count));
    t.key = std::to_string(v1) + " " + std::to_string(v2);
    t.needle = {kv.key, v1, v2};
    t.query = {kv.key};
    t.answer = {v1, v2};
  }
  if (t.needle.empty() || t.query.empty() || t.answer.empty()) {
    return InvalidArgument("the needle, question or answer tokenizes to nothing (--needle '" +
                           o_.needle_template + "', --question '" + o_.question_template + "')");
  }
  const int64_t n_needle = static_cast<int64_t>(t.needle.size());
  const int64_t first = bos_ >= 0 ? 1 : 0;
  const int64_t lo =
      std::max<int64_t>(first, static_cast<int64_t>(std::ceil(o_.depth_lo * length)));
  const int64_t hi = std::min<int64_t>(static_cast<int64_t>(std::ceil(o_.depth_hi * length)),
                                       length - n_needle + 1);
  const double u = rng.Uniform();
  if (hi <= lo) {
    return InvalidArgument("--len " + std::to_string(length) + " is too short for a " +
                           std::to_string(n_needle) + "-token needle in [" +
                           std::to_string(o_.depth_lo) + "T, " + std::to_string(o_.depth_hi) +
                           "T)");
  }
  t.depth = lo + std::min<int64_t>(hi - lo - 1, static_cast<int64_t>(u * (hi - lo)));
  const int64_t n_fill = static_cast<int64_t>(filler_.size());
  t.filler_offset = static_cast<int64_t>(rng.Below(n_fill));
  t.prefix = RebuildPrefix(filler_, bos_, t.filler_offset, t.depth, t.needle, length);
  return t;
}

std::vector<int32_t> RebuildPrefix(const std::vector<int32_t>& filler, int32_t bos,
                                   int64_t filler_offset, int64_t depth,
                                   const std::vector<int32_t>& needle, int64_t length) {
  return RebuildPrefix(filler, bos, filler_offset, {NeedleTrial::Insert{depth, needle}}, length);
}

std::vector<int32_t> RebuildPrefix(const std::vector<int32_t>& filler, int32_t bos,
                                   int64_t filler_offset,
                                   const std::vector<NeedleTrial::Insert>& inserts,
                                   int64_t length) {
  std::vector<int32_t> prefix;
  if (filler.empty() || length <= 0) return prefix;
  const int64_t n_fill = static_cast<int64_t>(filler.size());
  int64_t f = ((filler_offset % n_fill) + n_fill) % n_fill;
  prefix.reserve(length);
  if (bos >= 0) prefix.push_back(bos);
  auto fill_to = [&](int64_t n) {
    while (static_cast<int64_t>(prefix.size()) < n) {
      prefix.push_back(filler[f]);
      f = (f + 1) % n_fill;
    }
  };
  for (const NeedleTrial::Insert& in : inserts) {
    fill_to(in.depth);
    prefix.insert(prefix.end(), in.tokens.begin(), in.tokens.end());
  }
  fill_to(length);
  return prefix;
}

Status NeedleBuilder::BuildMultikey(int64_t length, Rng& rng, NeedleTrial* out) const {
  NeedleTrial& t = *out;
  const KvTokenIds& kv = o_.kv;
  const int n = kv.n_keys;
  // Draw order: key names, v1s, v2s (each n distinct, by a partial Fisher-Yates shuffle), the n
  // needle positions, the asked needle, the filler offset.
  auto distinct = [&rng, n](int32_t first, int32_t count) {
    std::vector<int32_t> pool(count);
    for (int32_t i = 0; i < count; ++i) pool[i] = first + i;
    for (int i = 0; i < n; ++i) {
      const int64_t j = i + static_cast<int64_t>(rng.Below(count - i));
      std::swap(pool[i], pool[j]);
    }
    pool.resize(n);
    return pool;
  };
  const std::vector<int32_t> names = distinct(kv.keyname_first, kv.keyname_count);
  const std::vector<int32_t> v1 = distinct(kv.slot0_first, kv.slot0_count);
  const std::vector<int32_t> v2 = distinct(kv.slot1_first, kv.slot1_count);
  // Positions in filler coordinates (the prefix without the needles), uniform in
  // [depth_lo, depth_hi) of that span, sorted; needle i then sits at first + cut_i + 4 i.
  const int64_t first = bos_ >= 0 ? 1 : 0;
  const int64_t n_fill = length - first - 4 * static_cast<int64_t>(n);
  const int64_t lo = static_cast<int64_t>(std::ceil(o_.depth_lo * n_fill));
  const int64_t hi = std::min<int64_t>(static_cast<int64_t>(std::ceil(o_.depth_hi * n_fill)),
                                       n_fill + 1);
  if (n_fill < 1 || hi <= lo) {
    return InvalidArgument("--len " + std::to_string(length) + " is too short for " +
                           std::to_string(n) + " 4-token needles in [" +
                           std::to_string(o_.depth_lo) + "T, " + std::to_string(o_.depth_hi) +
                           "T)");
  }
  std::vector<int64_t> cuts(n);
  for (int i = 0; i < n; ++i) {
    cuts[i] = lo + std::min<int64_t>(hi - lo - 1, static_cast<int64_t>(rng.Uniform() * (hi - lo)));
  }
  std::sort(cuts.begin(), cuts.end());
  const int q = static_cast<int>(rng.Below(n));
  t.filler_offset = static_cast<int64_t>(rng.Below(static_cast<int64_t>(filler_.size())));
  std::vector<NeedleTrial::Insert> inserts;
  for (int i = 0; i < n; ++i) {
    NeedleTrial::Insert in{first + cuts[i] + 4 * i, {kv.key, names[i], v1[i], v2[i]}};
    if (i == q) {
      t.depth = in.depth;
      t.needle = in.tokens;
    } else {
      t.distractors.push_back(in);
    }
    inserts.push_back(std::move(in));
  }
  t.key = std::to_string(v1[q]) + " " + std::to_string(v2[q]);
  t.query = {kv.key, names[q]};
  t.answer = {v1[q], v2[q]};
  t.prefix = RebuildPrefix(filler_, bos_, t.filler_offset, inserts, length);
  return OkStatus();
}

std::string TokenHash(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    const uint32_t u = static_cast<uint32_t>(id);
    for (int b = 0; b < 4; ++b) {
      h ^= (u >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

nlohmann::json TrialDumpHeader(const NeedleOptions& o, const std::vector<int32_t>& filler,
                               int32_t bos) {
  return {{"format", NeedleFormatName(o.format)}, {"seed", o.seed}, {"bos", bos},
          {"filler_hash", TokenHash(filler)},    {"filler", filler}};
}

nlohmann::json TrialDumpLine(const NeedleTrial& t) {
  nlohmann::json j = {{"length", t.length},   {"trial", t.index},   {"depth", t.depth},
                      {"filler_offset", t.filler_offset},           {"key", t.key},
                      {"needle", t.needle},   {"prefix", t.prefix}, {"query", t.query},
                      {"answer", t.answer}};
  if (!t.distractors.empty()) {
    nlohmann::json d = nlohmann::json::array();
    for (const NeedleTrial::Insert& in : t.distractors) {
      d.push_back({{"depth", in.depth}, {"tokens", in.tokens}});
    }
    j["distractors"] = d;
  }
  return j;
}

StatusOr<NeedleScore> ScoreNeedleTrial(Model& model, const NeedleTrial& trial,
                                  const PolicyFactory& factory, const PolicyConfig& config,
                                  int chunk, ThreadPool* pool, DType kv_type) {
  ASSIGN_OR_RETURN(auto cache, NewConfigCache(model, factory, config, kv_type));
  // Event: the compression point is the end of this call.
  RETURN_IF_ERROR(model.Prefill(trial.prefix.data(), static_cast<int64_t>(trial.prefix.size()),
                                chunk, cache.get(), pool, nullptr));
  // The question (and the teacher-forced answer prefix) reads the compressed cache.
  std::vector<int32_t> tail = trial.query;
  tail.insert(tail.end(), trial.answer.begin(), trial.answer.end() - 1);
  std::vector<float> logits;
  const int64_t read0 = cache->counters().bytes_read_total;
  const CacheCounters counters0 = cache->counters();
  const int64_t n0 = cache->n_tokens();
  RETURN_IF_ERROR(model.Prefill(tail.data(), static_cast<int64_t>(tail.size()), chunk, cache.get(),
                                pool, nullptr, &logits));
  const int64_t v = model.config().n_vocab;
  NeedleScore s;
  const size_t q = trial.query.size();
  for (size_t j = 0; j < trial.answer.size(); ++j) {
    const float* row = logits.data() + (q - 1 + j) * v;
    s.nll += TokenNll(row, v, trial.answer[j]);
    // First maximum wins ties, as a greedy sampler does.
    s.tokens_right += static_cast<int32_t>(std::max_element(row, row + v) - row) == trial.answer[j];
    s.tokens++;
  }
  s.answered = s.tokens_right == s.tokens;
  double visible = 0;  // query j sees n0 + j + 1 rows
  for (size_t j = 0; j < tail.size(); ++j) visible += static_cast<double>(n0 + j + 1);
  visible *= static_cast<double>(ValuesPerToken(*cache));
  const int64_t read = cache->counters().bytes_read_total - read0;
  s.read_bits = visible > 0 ? static_cast<double>(read) * 8.0 / visible : 0;
  s.resident_bits = ResidentBitsPerValue(*cache);
  s.achieved = MeasureAchieved(*cache, counters0);
  std::vector<int> levels;
  CacheBlockLevels(*cache, &levels, &s.block_levels);
  return s;
}

StatusOr<NeedleReport> RunNeedle(Model& model, const NeedleOptions& o, std::ostream* progress) {
  NeedleReport r;
  r.options = o;
  r.options.factory = nullptr;
  const PolicyFactory factory = o.factory ? o.factory : RegistryFactory();
  const Progress prog(progress);
  if (o.lengths.empty()) return InvalidArgument("--len needs at least one length");
  for (int64_t len : o.lengths) {
    if (len < 8) return InvalidArgument("--len " + std::to_string(len) + " must be >= 8");
  }
  if (o.depth_buckets < 1) {
    return InvalidArgument("depth buckets must be >= 1, got " + std::to_string(o.depth_buckets));
  }
  if (o.chunk < 1) return InvalidArgument("--chunk must be >= 1, got " + std::to_string(o.chunk));
  ASSIGN_OR_RETURN(NeedleBuilder builder, NeedleBuilder::Create(model, o));
  // The list's settings reach the reference only where it declares them (full declares none).
  auto ref_or = SingleConfig(o.reference, std::nullopt, o.settings);
  if (!ref_or.ok()) return ref_or.status().WithContext("--reference");
  const PolicyConfig reference = std::move(ref_or).value();
  {
    auto c = NewConfigCache(model, factory, reference, o.kv_type);
    if (!c.ok()) return c.status().WithContext("--reference");
  }
  // Every config must build for this model; unsupported ones are skipped only when asked.
  ASSIGN_OR_RETURN(const std::vector<PolicyConfig> grid,
                   ExpandGrid(o.policies, o.ratios, o.settings));
  ASSIGN_OR_RETURN(r.configs,
                   BuildableConfigs(model, factory, grid,
                                    o.skip_unsupported, &r.skipped, progress, o.kv_type));
  ThreadPool pool(std::max(1, o.threads));
  r.filler = builder.filler();
  r.bos = builder.bos();
  std::ofstream dump;
  if (!o.dump_trials.empty()) {
    dump.open(o.dump_trials, std::ios::binary | std::ios::trunc);
    if (!dump) return IoError("--dump-trials: cannot write '" + o.dump_trials + "'");
    dump << TrialDumpHeader(o, r.filler, r.bos).dump() << "\n";
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t len : o.lengths) {
    NeedleReport::LengthSummary ls{len, o.trials, 0};
    for (int64_t i = 0; i < o.trials; ++i) {
      ASSIGN_OR_RETURN(NeedleTrial trial, builder.Build(len, i));
      NeedleTrialRecord rec;
      rec.length = len;
      rec.index = i;
      rec.depth = trial.depth;
      rec.depth_frac = static_cast<double>(trial.depth) / static_cast<double>(len);
      const double span = o.depth_hi - o.depth_lo;
      rec.bucket = std::clamp(
          static_cast<int>(std::floor((rec.depth_frac - o.depth_lo) / span * o.depth_buckets)), 0,
          o.depth_buckets - 1);
      rec.key = trial.key;
      rec.answer_tokens = static_cast<int>(trial.answer.size());
      rec.filler_offset = trial.filler_offset;
      rec.needle = trial.needle;
      rec.distractors = trial.distractors;
      rec.query = trial.query;
      rec.answer = trial.answer;
      if (dump.is_open()) {
        dump << TrialDumpLine(trial).dump() << "\n";
        if (!dump) return IoError("--dump-trials: write to '" + o.dump_trials + "' failed");
      }
      ASSIGN_OR_RETURN(const NeedleScore ref,
                       ScoreNeedleTrial(model, trial, factory, reference, o.chunk, &pool,
                                        o.kv_type));
      rec.reference_nll = ref.nll;
      rec.reference_answered = ref.answered;
      rec.dropped = !(rec.reference_nll < o.baseline_gate_nats);
      if (rec.dropped) {
        ls.dropped++;
      } else {
        for (const PolicyConfig& c : r.configs) {
          ASSIGN_OR_RETURN(const NeedleScore sc,
                           ScoreNeedleTrial(model, trial, factory, c, o.chunk, &pool,
                                            o.kv_type));
          const double delta = sc.nll - rec.reference_nll;
          rec.results.push_back({sc.nll, delta, delta < o.intact_nats, sc.answered, sc.tokens_right,
                                 sc.resident_bits, sc.read_bits, sc.achieved,
                                 o.block_levels ? sc.block_levels
                                                : std::vector<std::vector<std::vector<int>>>{}});
        }
      }
      const double el =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      int64_t n_intact = 0, n_answered = 0;
      for (const auto& x : rec.results) {
        n_intact += x.intact;
        n_answered += x.answered;
      }
      prog.Line("needle: T=" + std::to_string(len) + " trial " + std::to_string(i + 1) + "/" +
                std::to_string(o.trials) + " depth " + std::to_string(trial.depth) + " ref NLL " +
                std::to_string(rec.reference_nll) +
                (rec.dropped ? " (dropped: the uncompressed model misses it)"
                             : ", intact in " + std::to_string(n_intact) + "/" +
                                   std::to_string(r.configs.size()) + " configs, answered in " +
                                   std::to_string(n_answered) + "/" +
                                   std::to_string(r.configs.size())) +
                " [" + std::to_string(static_cast<int>(el)) + " s]");
      r.trials.push_back(std::move(rec));
    }
    r.lengths.push_back(ls);
  }
  // Aggregates.
  const double span = o.depth_hi - o.depth_lo;
  for (size_t c = 0; c < r.configs.size(); ++c) {
    for (int64_t len : o.lengths) {
      NeedleCell cell;
      cell.config = c;
      cell.length = len;
      std::vector<NeedleBucketCell> bk(o.depth_buckets);
      for (int b = 0; b < o.depth_buckets; ++b) {
        bk[b].config = c;
        bk[b].length = len;
        bk[b].bucket = b;
        bk[b].depth_lo = o.depth_lo + span * b / o.depth_buckets;
        bk[b].depth_hi = o.depth_lo + span * (b + 1) / o.depth_buckets;
      }
      double delta_sum = 0;
      int64_t tokens_right = 0, tokens = 0;
      for (const auto& t : r.trials) {
        if (t.length != len || t.dropped) continue;
        const auto& x = t.results[c];
        cell.n++;
        cell.intact += x.intact;
        cell.answered += x.answered;
        tokens_right += x.tokens_right;
        cell.resident_bits += x.resident_bits;
        cell.read_bits += x.read_bits;
        cell.achieved.Add(x.achieved);
        tokens += static_cast<int64_t>(t.answer_tokens);
        delta_sum += x.delta;
        bk[t.bucket].n++;
        bk[t.bucket].intact += x.intact;
      }
      cell.rate = WilsonInterval(cell.intact, cell.n);
      cell.answer_rate = WilsonInterval(cell.answered, cell.n);
      cell.token_accuracy = tokens ? static_cast<double>(tokens_right) / tokens : 0;
      if (cell.n > 0) {
        cell.resident_bits /= static_cast<double>(cell.n);
        cell.read_bits /= static_cast<double>(cell.n);
      }
      cell.mean_delta = cell.n ? delta_sum / cell.n : 0;
      if (cell.n > 0) {
        cell.check = CheckAchieved(r.configs[c].Label() + " T=" + std::to_string(len),
                                   cell.achieved);
        if (!cell.check.warning.empty()) r.warnings.push_back(cell.check.warning);
      }
      r.cells.push_back(cell);
      for (auto& b : bk) r.buckets.push_back(b);
    }
  }
  return r;
}

namespace {
nlohmann::json RatioJson(const PolicyConfig& c) {
  return c.ratio ? nlohmann::json(*c.ratio) : nlohmann::json(nullptr);
}
}  // namespace

nlohmann::json NeedleJson(const NeedleReport& r) {
  const NeedleOptions& o = r.options;
  nlohmann::json j;
  j["format"] = NeedleFormatName(o.format);
  j["haystack"] = o.haystack.empty() ? std::string(kBuiltinHaystackName) : o.haystack_name;
  j["needle_template"] = o.needle_template;
  j["question_template"] = o.question_template;
  j["reference"] = o.reference;
  j["trials_per_length"] = o.trials;
  j["kv_type"] = KvTypeName(o.kv_type);
  // With a trial's filler_offset, depth and needle ids these rebuild its prefix (RebuildPrefix);
  // the filler ids themselves are in the --dump-trials file.
  j["trial_recipe"] = {{"bos", r.bos},
                       {"filler_tokens", r.filler.size()},
                       {"filler_hash", TokenHash(r.filler)},
                       {"prefix", "BOS (if bos >= 0), filler[(filler_offset + i) % filler_tokens] "
                                  "until depth tokens, needle_ids, the filler continuing until "
                                  "length tokens; kv-multikey: each of distractors and the "
                                  "asked needle inserted at its depth, in depth order"}};
  j["seed"] = o.seed;
  j["intact_nats"] = o.intact_nats;
  j["baseline_gate_nats"] = o.baseline_gate_nats;
  j["depth_range"] = {o.depth_lo, o.depth_hi};
  j["lengths"] = nlohmann::json::array();
  for (const auto& l : r.lengths) {
    j["lengths"].push_back({{"length", l.length},
                            {"trials", l.trials},
                            {"dropped", l.dropped},
                            {"kept", l.trials - l.dropped}});
  }
  j["cells"] = nlohmann::json::array();
  for (const auto& c : r.cells) {
    const PolicyConfig& pc = r.configs[c.config];
    nlohmann::json cell = {{"policy", pc.policy},
                           {"variant", pc.variant},
                           {"ratio", RatioJson(pc)},
                           {"length", c.length},
                           {"n", c.n},
                           {"intact", c.intact},
                           {"rate", c.rate.point},
                           {"wilson_lo", c.rate.lo},
                           {"wilson_hi", c.rate.hi},
                           {"mean_delta_nll", c.mean_delta},
                           {"answered", c.answered},
                           {"answer_rate", c.answer_rate.point},
                           {"answer_wilson_lo", c.answer_rate.lo},
                           {"answer_wilson_hi", c.answer_rate.hi},
                           {"token_accuracy", c.token_accuracy},
                           {"resident_bits_per_value", c.resident_bits},
                           {"read_bits_per_value", c.read_bits}};
    AddAchievedFields(c.achieved, c.check, &cell);
    j["cells"].push_back(std::move(cell));
  }
  j["buckets"] = nlohmann::json::array();
  for (const auto& b : r.buckets) {
    const PolicyConfig& pc = r.configs[b.config];
    j["buckets"].push_back({{"policy", pc.policy},
                            {"variant", pc.variant},
                            {"ratio", RatioJson(pc)},
                            {"length", b.length},
                            {"bucket", b.bucket},
                            {"depth_lo", b.depth_lo},
                            {"depth_hi", b.depth_hi},
                            {"n", b.n},
                            {"intact", b.intact}});
  }
  j["warnings"] = r.warnings;
  j["trials"] = nlohmann::json::array();
  for (const auto& t : r.trials) {
    nlohmann::json res = nlohmann::json::array();
    for (size_t c = 0; c < t.results.size(); ++c) {
      const PolicyConfig& pc = r.configs[c];
      nlohmann::json rj = {{"policy", pc.policy},
                     {"variant", pc.variant},
                     {"ratio", RatioJson(pc)},
                     {"nll", t.results[c].nll},
                     {"delta_nll", t.results[c].delta},
                     {"intact", t.results[c].intact},
                     {"answered", t.results[c].answered},
                     {"tokens_right", t.results[c].tokens_right},
                     {"resident_bits_per_value", t.results[c].resident_bits},
                     {"read_bits_per_value", t.results[c].read_bits}};
      // [layer][KV head][block] levels after the question (graded policies, --block-levels).
      if (!t.results[c].block_levels.empty()) rj["block_levels"] = t.results[c].block_levels;
      res.push_back(std::move(rj));
    }
    nlohmann::json distractors = nlohmann::json::array();
    for (const NeedleTrial::Insert& in : t.distractors) {
      distractors.push_back({{"depth", in.depth}, {"tokens", in.tokens}});
    }
    j["trials"].push_back({{"length", t.length},
                           {"trial", t.index},
                           {"depth", t.depth},
                           {"depth_frac", t.depth_frac},
                           {"key", t.key},
                           {"answer_tokens", t.answer_tokens},
                           {"filler_offset", t.filler_offset},
                           {"needle_ids", t.needle},
                           {"distractors", distractors},
                           {"query_ids", t.query},
                           {"answer_ids", t.answer},
                           {"reference_nll", t.reference_nll},
                           {"reference_answered", t.reference_answered},
                           {"dropped", t.dropped},
                           {"results", res}});
  }
  return j;
}

namespace {

// Whether config `c` ran as the uncompressed reference (`full`: PolicySummary::reference on its
// measured cells), which the charts mark as such: it has no ratio to label it like the others.
bool IsUncompressed(const NeedleReport& r, size_t c) {
  bool any = false, reference = true;
  for (const NeedleCell& cell : r.cells) {
    if (cell.config != c || cell.achieved.runs == 0) continue;
    any = true;
    reference = reference && cell.achieved.policy.reference;
  }
  return any && reference;
}

// A config's row label in the comparison chart: "vestige@32", or "full (uncompressed)".
std::string ChartLabel(const NeedleReport& r, size_t c) {
  return r.configs[c].Label() + (IsUncompressed(r, c) ? " (uncompressed)" : "");
}

}  // namespace

std::string NeedleHeatmapSvg(const NeedleReport& r, const std::string& policy) {
  const NeedleOptions& o = r.options;
  std::vector<size_t> cfgs;
  for (size_t c = 0; c < r.configs.size(); ++c) {
    if (r.configs[c].Name() == policy) cfgs.push_back(c);
  }
  const int n_rows = o.depth_buckets;
  const int n_cols = std::max<int>(1, static_cast<int>(cfgs.size()));
  const double cw = 64, ch = 30, left = 90, top = 70, gap = 40;
  auto panel_title = [&](size_t li) {
    return "T = " + std::to_string(r.lengths[li].length) + " (" +
           std::to_string(r.lengths[li].trials - r.lengths[li].dropped) + " kept, " +
           std::to_string(r.lengths[li].dropped) + " dropped)";
  };
  // A panel is as wide as its columns or its title, whichever is wider, so that titles of
  // neighbouring panels never run into each other.
  double panel_w = cw * n_cols;
  for (size_t li = 0; li < r.lengths.size(); ++li) {
    panel_w = std::max(panel_w, TextWidth(panel_title(li), 12) + 8);
  }
  const double col_w = panel_w / n_cols;
  const std::string title = "needle intact rate: " + policy + " (dNLL < " +
                            FormatNum(o.intact_nats, 2) + " nat vs " + o.reference + ")";
  const std::string footer =
      "cell: intact rate (trials); colour: red 0 - green 1; grey: no trials";
  const std::string y_label = "needle depth (fraction of T)";
  const double width =
      std::max({left + (panel_w + gap) * r.lengths.size() + 20, TextWidth(title, 15) + 40,
                left + TextWidth(footer, 10) + 20});
  const double grid_h = std::max(ch * n_rows, TextWidth(y_label, 12) + 10);
  const double height = top + grid_h + 80;
  Svg svg(width, height);
  svg.Text(width / 2, 24, title, "middle", 15, "bold");
  svg.Text(18, top + grid_h / 2, y_label, "middle", 12, "", -90);
  for (size_t li = 0; li < r.lengths.size(); ++li) {
    const int64_t len = r.lengths[li].length;
    const double x0 = left + li * (panel_w + gap);
    svg.Text(x0 + panel_w / 2, top - 28, panel_title(li), "middle", 12);
    for (int row = 0; row < n_rows; ++row) {
      const double lo = o.depth_lo + (o.depth_hi - o.depth_lo) * row / n_rows;
      const double hi = o.depth_lo + (o.depth_hi - o.depth_lo) * (row + 1) / n_rows;
      if (li == 0) {
        svg.Text(left - 6, top + ch * row + ch / 2 + 4, FormatNum(lo, 2) + "-" + FormatNum(hi, 2),
                 "end", 10);
      }
    }
    for (size_t ci = 0; ci < cfgs.size(); ++ci) {
      const PolicyConfig& pc = r.configs[cfgs[ci]];
      svg.Text(x0 + col_w * ci + col_w / 2, top - 8,
               pc.ratio                        ? "r=" + *pc.ratio
               : IsUncompressed(r, cfgs[ci]) ? std::string("uncompressed")
                                               : std::string("no ratio"),
               "middle", 11);
      for (const auto& b : r.buckets) {
        if (b.config != cfgs[ci] || b.length != len) continue;
        const double x = x0 + col_w * ci, y = top + ch * b.bucket;
        if (b.n == 0) {
          svg.Rect(x, y, col_w, ch, "#dddddd", "#ffffff");
          svg.Text(x + col_w / 2, y + ch / 2 + 4, "n=0", "middle", 10);
        } else {
          const double rate = static_cast<double>(b.intact) / b.n;
          svg.Rect(x, y, col_w, ch, RateColor(rate), "#ffffff");
          svg.Text(x + col_w / 2, y + ch / 2 + 4,
                   FormatNum(rate, 2) + " (" + std::to_string(b.n) + ")", "middle", 10);
        }
      }
    }
    svg.Text(x0 + panel_w / 2, top + grid_h + 22, "ratio (compression)", "middle", 12);
  }
  svg.Text(left, height - 16, footer, "start", 10);
  return svg.Finish();
}

std::string NeedleComparisonSvg(const NeedleReport& r) {
  const NeedleOptions& o = r.options;
  const std::string title = "needle retrieval by configuration (compression before the query)";
  const std::string intact_key = "intact: answer NLL within " + FormatNum(o.intact_nats, 2) +
                                 " nat of " + o.reference;
  const std::string answered_key = "answered: greedy answer exactly right";
  const std::string ci_key = "whiskers: 95% Wilson intervals; n = kept trials";
  double label_w = 60;
  for (size_t c = 0; c < r.configs.size(); ++c) {
    label_w = std::max(label_w, TextWidth(ChartLabel(r, c), 11));
  }
  const double left = label_w + 24, panel_w = 240, gap = 36, row_h = 36, top = 124;
  const size_t n_len = std::max<size_t>(1, r.lengths.size());
  const double plot_h = row_h * std::max<size_t>(1, r.configs.size());
  const double width =
      std::max({left + (panel_w + gap) * n_len + 10, TextWidth(title, 15) + 40,
                24 + TextWidth(intact_key, 11) + 40});
  const double height = top + plot_h + 64;
  Svg svg(width, height);
  svg.Text(width / 2, 24, title, "middle", 15, "bold");
  // Legend.
  svg.Rect(24, 40, 14, 10, "#3b6fb6");
  svg.Text(44, 49, intact_key, "start", 11);
  svg.Rect(24, 58, 14, 10, "#e08a2c");
  svg.Text(44, 67, answered_key, "start", 11);
  svg.Text(24, 85, ci_key, "start", 11);
  for (size_t ci = 0; ci < r.configs.size(); ++ci) {
    svg.Text(left - 10, top + row_h * ci + row_h / 2 + 4, ChartLabel(r, ci), "end", 11);
  }
  for (size_t li = 0; li < r.lengths.size(); ++li) {
    const auto& ls = r.lengths[li];
    const double x0 = left + li * (panel_w + gap);
    auto X = [&](double v) { return x0 + panel_w * std::clamp(v, 0.0, 1.0); };
    svg.Text(x0 + panel_w / 2, top - 12,
             "T = " + std::to_string(ls.length) + ": " + std::to_string(ls.trials - ls.dropped) +
                 " of " + std::to_string(ls.trials) + " trials kept",
             "middle", 12);
    svg.Rect(x0, top, panel_w, plot_h, "none", "#444444");
    for (int k = 0; k <= 4; ++k) {
      const double v = k / 4.0;
      svg.Line(X(v), top, X(v), top + plot_h, "#eeeeee");
      svg.Line(X(v), top + plot_h, X(v), top + plot_h + 4, "#444444");
      svg.Text(X(v), top + plot_h + 16, FormatNum(v, 2), "middle", 10);
    }
    svg.Text(x0 + panel_w / 2, top + plot_h + 34, "rate", "middle", 12);
    for (const auto& cell : r.cells) {
      if (cell.length != ls.length) continue;
      const double y = top + row_h * cell.config;
      auto bar = [&](const Interval& iv, double yb, const std::string& color) {
        svg.Rect(x0, yb, std::max(0.0, X(iv.point) - x0), 10, color);
        if (cell.n > 0) {  // the interval: a whisker with end caps
          svg.Line(X(iv.lo), yb + 5, X(iv.hi), yb + 5, "#222222", 1.2);
          svg.Line(X(iv.lo), yb + 1, X(iv.lo), yb + 9, "#222222", 1.2);
          svg.Line(X(iv.hi), yb + 1, X(iv.hi), yb + 9, "#222222", 1.2);
        }
      };
      bar(cell.rate, y + 6, "#3b6fb6");
      bar(cell.answer_rate, y + 19, "#e08a2c");
    }
  }
  return svg.Finish();
}

}  // namespace strata::eval
