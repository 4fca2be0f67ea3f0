// Needle-in-a-haystack with compression before the query (reference §5.1): a T-token
// prefix of haystack filler with a needle at a random depth in [0.1T, 0.8T), the compression event
// at the end of the prefix's Prefill call, then the question fed as a second Prefill call so it
// reads the compressed cache; score = teacher-forced NLL of the answer tokens.
// (Reference: docs/reference/vestigekv.md.)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"
#include "eval/runner.h"
#include "eval/stats.h"
#include "model/model.h"

namespace strata {
class Rng;
}

namespace strata::eval {

enum class NeedleFormat {
  kText,      // needle and question sentences through the model's tokenizer
  kKvTokens,  // the char-level testbed vocabulary: "KEY v1 v2" needle, "KEY" query, "v1 v2" answer
  // The same vocabulary, RULER's niah_multikey shape: n_keys needles "KEY k v1 v2" (distinct key
  // names k and distinct values) at independent depths, query "KEY k_q", answer "v1_q v2_q".
  kKvMultikey,
};
StatusOr<NeedleFormat> ParseNeedleFormat(const std::string& text);
const char* NeedleFormatName(NeedleFormat f);

// Token ids of the kv-tokens format (issue 6 testbed: 0 BOS, 1 KEY, 2..17 slot 0, 18..33 slot 1,
// characters from 50).
struct KvTokenIds {
  int32_t bos = 0;  // < 0: no BOS
  int32_t key = 1;
  int32_t slot0_first = 2;
  int32_t slot0_count = 16;
  int32_t slot1_first = 18;
  int32_t slot1_count = 16;
  int32_t char_first = 50;  // filler character c -> char_first + index of c in `charset`
  // Filler characters in id order. Empty: each character is mapped through the model's
  // tokenizer (its one-character token; a space is "\u2581" or " "), and a character with no
  // token is an error; without a tokenizer, the sorted distinct characters of the haystack
  // (after whitespace is collapsed to single spaces) from char_first, wrapping around the
  // vocabulary.
  std::string charset;
  // kv-multikey: the key names (slot 2 of the testbed vocabulary) and the needles per prefix.
  int32_t keyname_first = 34;
  int32_t keyname_count = 16;
  int32_t n_keys = 4;
};

struct NeedleOptions {
  std::vector<int64_t> lengths = {512};           // prefix lengths T (tokens, BOS included)
  std::vector<std::string> ratios = {"8", "32"};  // empty: the policies' own default budgets
  std::vector<std::string> policies = {"full"};   // "all": every registered policy
  std::map<std::string, std::string> settings;    // pass-through policy settings
  std::string reference = "full";  // the uncompressed baseline (built through the factory too)
  int64_t trials = 8;
  uint64_t seed = 1;
  NeedleFormat format = NeedleFormat::kText;
  std::string haystack;       // filler text; empty: the built-in corpus (eval/corpus.h)
  std::string haystack_name;  // for the report
  // Templates are used verbatim ("\n" escapes become newlines); {key} is replaced by the key.
  std::string needle_template = "The secret code is {key}.";
  std::string question_template = "What is the secret code? The secret code is";
  int key_digits = 5;
  KvTokenIds kv;
  double intact_nats = 1.0;         // intact iff NLL(policy) - NLL(reference) < intact_nats
  double baseline_gate_nats = 1.0;  // trials with NLL(reference) >= this are dropped and counted
  double depth_lo = 0.1;            // needle start in [depth_lo * T, depth_hi * T)
  double depth_hi = 0.8;
  int depth_buckets = 7;  // heat-map rows over [depth_lo, depth_hi)
  int chunk = 256;        // prefill chunk
  int threads = 1;
  // Policies whose cache cannot be built for this model (e.g. a row policy on a GQA model) are
  // reported as skipped instead of failing the run (the CLI sets it for --policy all).
  bool skip_unsupported = false;
  PolicyFactory factory;  // null: RegistryFactory()
  // When set: every trial's token ids are written to this file (JSON Lines, see
  // WriteTrialDump) as the run builds them, so another implementation can run the same trials.
  std::string dump_trials;
  DType kv_type = DType::kBF16;  // the caches' row storage (--kv-type)
  // JSON: each trial's results also list the level of every graded block (--block-levels).
  bool block_levels = false;
};

// One trial's token sequences.
struct NeedleTrial {
  int64_t index = 0;
  int64_t length = 0;           // T
  std::string key;              // text: the digits; kv-tokens: "v1 v2" ids
  int64_t depth = 0;            // position of the first needle token in `prefix`
  // Index into NeedleBuilder::filler() of the first filler token: the prefix is BOS (when the
  // model has one), filler[(filler_offset + i) % n] up to `depth`, the needle, then the filler
  // continuing from where it stopped until T tokens (RebuildPrefix).
  int64_t filler_offset = 0;
  std::vector<int32_t> prefix;  // [T]: BOS, filler, the needle at depth, filler
  std::vector<int32_t> needle;  // the inserted tokens (prefix[depth, depth + needle.size()))
  std::vector<int32_t> query;   // fed after the compression point
  std::vector<int32_t> answer;  // scored, teacher-forced, after the query
  // kv-multikey: the other needles (not asked), each at its own position in `prefix`; `depth`
  // and `needle` are the asked one's. Sorted by position; none overlaps another.
  struct Insert {
    int64_t depth = 0;
    std::vector<int32_t> tokens;
  };
  std::vector<Insert> distractors;
};

// Builds trials for one model and option set. Trial i depends only on (seed, i, T): its RNG is
// seeded from (seed, i), so it is identical for any trial count above i.
class NeedleBuilder {
 public:
  static StatusOr<NeedleBuilder> Create(const Model& model, const NeedleOptions& o);
  StatusOr<NeedleTrial> Build(int64_t length, int64_t index) const;
  // The filler token stream the prefixes are cut from (cyclically).
  const std::vector<int32_t>& filler() const { return filler_; }
  int32_t bos() const { return bos_; }  // -1: the prefix starts with filler

 private:
  // kv-multikey: fills t's needles, query, answer and prefix from rng.
  Status BuildMultikey(int64_t length, Rng& rng, NeedleTrial* t) const;
  NeedleOptions o_;
  const Tokenizer* tok_ = nullptr;
  int64_t n_vocab_ = 0;
  int32_t bos_ = -1;
  std::vector<int32_t> filler_;
};

// The prefix a trial record describes, rebuilt from its parts alone (no RNG): BOS (when >= 0),
// then filler[(filler_offset + i) % filler.size()] until `depth` tokens, the needle, and the
// filler continuing until `length` tokens. NeedleBuilder::Build's prefix is exactly this.
std::vector<int32_t> RebuildPrefix(const std::vector<int32_t>& filler, int32_t bos,
                                   int64_t filler_offset, int64_t depth,
                                   const std::vector<int32_t>& needle, int64_t length);
// The same with several inserts (sorted by depth, not overlapping): the filler runs on between
// them, so the prefix is BOS, filler, insert 0 at its depth, filler, insert 1, ... to `length`.
std::vector<int32_t> RebuildPrefix(const std::vector<int32_t>& filler, int32_t bos,
                                   int64_t filler_offset,
                                   const std::vector<NeedleTrial::Insert>& inserts,
                                   int64_t length);

// The RNG seed of trial i (SplitMix-style mix of seed and i).
uint64_t TrialSeed(uint64_t seed, int64_t index);

// One trial under one config: the teacher-forced answer NLL, and whether the argmax at each
// answer step is the answer token (teacher-forced argmax over every answer step equals greedy
// decoding of the whole answer, so `answered` is "greedy decoding gives the answer").
struct NeedleScore {
  double nll = 0;
  int tokens_right = 0;
  int tokens = 0;
  bool answered = false;  // tokens_right == tokens
  // Engine accounting after the question: resident bits per cached value, and bits read per
  // visible value over the question's query steps (counters().bytes_read_total).
  double resident_bits = 0;
  double read_bits = 0;
  // The same counters beside the full cache's (reads: the question's query steps).
  AchievedCompression achieved;
  // The level of every block after the question, [layer][KV head][block] (graded policies).
  std::vector<std::vector<std::vector<int>>> block_levels;
};

struct NeedleConfigResult {
  double nll = 0;
  double delta = 0;  // nll - reference nll
  bool intact = false;
  bool answered = false;
  int tokens_right = 0;
  double resident_bits = 0;
  double read_bits = 0;
  AchievedCompression achieved;
  std::vector<std::vector<std::vector<int>>> block_levels;  // NeedleScore::block_levels
};

struct NeedleTrialRecord {
  int64_t length = 0;
  int64_t index = 0;
  int64_t depth = 0;
  double depth_frac = 0;
  int bucket = 0;
  std::string key;
  int answer_tokens = 0;
  // What rebuilds the trial (RebuildPrefix with the report's filler and BOS): the filler
  // offset and the needle, question and answer token ids.
  int64_t filler_offset = 0;
  std::vector<int32_t> needle, query, answer;
  std::vector<NeedleTrial::Insert> distractors;  // kv-multikey: the needles not asked
  double reference_nll = 0;
  bool reference_answered = false;
  bool dropped = false;                     // reference NLL >= the baseline gate
  std::vector<NeedleConfigResult> results;  // [configs], empty when dropped
};

struct NeedleCell {  // one (config, length)
  size_t config = 0;
  int64_t length = 0;
  int64_t n = 0;
  int64_t intact = 0;
  Interval rate;
  double mean_delta = 0;
  int64_t answered = 0;      // greedy answer exactly right
  Interval answer_rate;      // Wilson interval of answered / n
  double token_accuracy = 0; // answer tokens right / answer tokens
  double resident_bits = 0;  // mean over the cell's trials
  double read_bits = 0;
  AchievedCompression achieved;  // summed over the cell's trials
  CompressionCheck check;        // of `achieved`, labelled "<config label> T=<length>"
};

struct NeedleBucketCell {  // one (config, length, depth bucket)
  size_t config = 0;
  int64_t length = 0;
  int bucket = 0;
  double depth_lo = 0, depth_hi = 0;
  int64_t n = 0;
  int64_t intact = 0;
};

struct NeedleReport {
  NeedleOptions options;  // factory cleared
  std::vector<PolicyConfig> configs;
  std::vector<SkippedConfig> skipped;
  struct LengthSummary {
    int64_t length = 0;
    int64_t trials = 0;
    int64_t dropped = 0;
  };
  std::vector<LengthSummary> lengths;
  std::vector<NeedleTrialRecord> trials;
  // The filler token stream the prefixes are cut from and the BOS id (-1: none): with a trial
  // record they rebuild its prefix. The JSON carries the stream's length and FNV-1a hash (the
  // ids themselves are in the --dump-trials file).
  std::vector<int32_t> filler;
  int32_t bos = -1;
  std::vector<NeedleCell> cells;
  std::vector<NeedleBucketCell> buckets;
  std::vector<std::string> warnings;  // the cells' CompressionCheck warnings, in cell order
};

// Teacher-forced NLL (nats, summed over the answer tokens) and argmax hits of one trial under one
// config: Prefill(prefix) = compression point, then Prefill(query + answer[:-1]) on the
// compressed cache.
StatusOr<NeedleScore> ScoreNeedleTrial(Model& model, const NeedleTrial& trial,
                                  const PolicyFactory& factory, const PolicyConfig& config,
                                  int chunk, ThreadPool* pool, DType kv_type = DType::kBF16);

// Runs every (length, trial, config); progress lines go to `progress` (may be null).
StatusOr<NeedleReport> RunNeedle(Model& model, const NeedleOptions& o, std::ostream* progress);

// FNV-1a 64 over the ids' little-endian int32 bytes, as 16 hex digits (the filler's fingerprint).
std::string TokenHash(const std::vector<int32_t>& ids);

// The --dump-trials file, JSON Lines: first {"filler": [ids], "bos": id or -1, "format", "seed"},
// then one {"length", "trial", "depth", "filler_offset", "key", "prefix": [T ids], "query":
// [ids], "answer": [ids]} per trial in run order. A trial is: Prefill(prefix) (the compression
// point), then the query and the teacher-forced answer.
nlohmann::json TrialDumpHeader(const NeedleOptions& o, const std::vector<int32_t>& filler,
                               int32_t bos);
nlohmann::json TrialDumpLine(const NeedleTrial& t);

// The "needle" section of the report JSON (docs/eval.md).
nlohmann::json NeedleJson(const NeedleReport& r);
// The heat map of intact rates (depth bucket x ratio, one panel per length) for one policy.
std::string NeedleHeatmapSvg(const NeedleReport& r, const std::string& policy);
// The run's comparison chart: every config side by side (one row each, one panel per length),
// intact and answered rates as bars with their 95% Wilson intervals.
std::string NeedleComparisonSvg(const NeedleReport& r);

}  // namespace strata::eval
