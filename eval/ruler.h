// RULER's synthetic tasks (Hsieh et al., "RULER: What's the real context size of your
// long-context language models?", 2024) with compression before the question, as kvpress runs
// them: the context is prefilled and the cache compressed at its end, then the question and the
// answer prefix are fed and the answer generated greedily; scored by RULER's string_match_all.
//
// The samples are generated here, deterministically per (task, seed, sample index, length), from
// data on the machine: the essay haystack is the built-in KJV text (eval/corpus.h) in place of
// RULER's Paul Graham essays, and the words (needle keys, cwe's word list) come from
// /usr/share/dict/words (Debian wamerican) filtered to lowercase alphabetic words, or, without it,
// from the KJV text's vocabulary. Templates, needles, answer prefixes, task parameters and token
// budgets are RULER's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"
#include "eval/runner.h"
#include "eval/stats.h"
#include "io/chat_template.h"
#include "model/model.h"

namespace strata::eval {

// niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery, vt, cwe, fwe.
const std::vector<std::string>& RulerTaskNames();
// "all" or a comma-separated list of task names (order kept, duplicates dropped); the error
// names the unknown task and lists the known ones.
StatusOr<std::vector<std::string>> ParseRulerTasks(const std::string& list);
// Tokens generated per answer, as RULER sets them (niah 128, vt 30, cwe 120, fwe 50).
int RulerMaxNewTokens(const std::string& task);

// The word list of the needle keys and of cwe.
struct RulerWords {
  std::vector<std::string> words;  // sorted, distinct, lowercase a-z, 3 to 8 letters
  std::string source;              // the file, or "builtin:kjv-vocabulary"
};
// Reads `path` (one word a line); a missing or unreadable file, or one with too few usable words,
// gives the KJV text's vocabulary instead.
RulerWords LoadRulerWords(const std::string& path = "/usr/share/dict/words");

// One sample's text: the user message is context + question; the answer prefix follows the
// assistant header (or the question, without a chat template).
struct RulerText {
  std::string context;        // the task's preamble and the haystack (before the compression point)
  std::string question;       // the rest of the task's template
  std::string answer_prefix;  // RULER's answer prefix, fed before generation
  std::vector<std::string> expected;
  // Other questions the same context answers (the shared-context protocol): niah_multikey_1's
  // other keys, niah_multikey_2/3's other needle lines (in a fixed random order). Empty for the
  // tasks whose context holds one answerable question.
  struct Question {
    std::string question, answer_prefix;
    std::vector<std::string> expected;
  };
  std::vector<Question> others;
};

// One sample, tokenized for the model.
struct RulerSample {
  std::string task;
  int64_t length = 0;  // the target T: prompt tokens + max_new_tokens <= T
  int64_t index = 0;
  uint64_t seed = 0;
  int64_t units = 0;  // haystack units: lines (repeat, needle, vt), words (essay, cwe), fwe's N
  RulerText text;
  int max_new_tokens = 0;
  std::vector<int32_t> context_ids;   // BOS, the chat template's prefix and the context
  std::vector<int32_t> question_ids;  // the question, the template's suffix, the answer prefix
  // text.others, tokenized as question_ids (each read after the same context).
  std::vector<std::vector<int32_t>> other_question_ids;
  int64_t prompt_tokens() const {
    return static_cast<int64_t>(context_ids.size() + question_ids.size());
  }
  // The context with its longest question (RULER's or another): the one that must fit T.
  int64_t longest_prompt_tokens() const {
    size_t q = question_ids.size();
    for (const auto& o : other_question_ids) q = std::max(q, o.size());
    return static_cast<int64_t>(context_ids.size() + q);
  }
};

struct RulerBuilderOptions {
  uint64_t seed = 1;
  // "auto": the model's chat template when its tokenizer has one, else none; "none"; or a
  // built-in template name (io/chat_template.h).
  std::string chat_template = "auto";
  std::string words_path = "/usr/share/dict/words";
};

class RulerBuilder {
 public:
  // Needs the model's tokenizer.
  static StatusOr<RulerBuilder> Create(const Model& model, const RulerBuilderOptions& o);

  // The text of sample `index` of `task` with `units` haystack units at target length `length`
  // (cwe and fwe take their parameters from it, as RULER does). Deterministic in its arguments
  // and the seed.
  StatusOr<RulerText> Text(const std::string& task, int64_t length, int64_t index,
                           int64_t units) const;
  // The same, tokenized (chat template applied and split at the end of the context).
  StatusOr<RulerSample> BuildUnits(const std::string& task, int64_t length, int64_t index,
                                   int64_t units) const;
  // The sample with the most units whose prompt plus its generated tokens fit in `length`: it
  // fits, and one more unit would not. Error when even the fewest units do not fit, naming the
  // minimum --len.
  StatusOr<RulerSample> Build(const std::string& task, int64_t length, int64_t index) const;
  // The fewest units a task's sample has.
  static int64_t MinUnits(const std::string& task);

  const std::string& chat_name() const { return chat_name_; }  // "none" or the template's name
  const std::string& words_source() const { return words_.source; }

 private:
  const Tokenizer* tok_ = nullptr;
  RulerBuilderOptions o_;
  bool chat_ = false;
  ChatTemplate tmpl_ = *ChatTemplate::ByName("chatml");
  std::string chat_name_ = "none";
  RulerWords words_;
  std::vector<std::string> essay_;  // the KJV text's words
  std::string vt_icl_;              // vt's in-context example (RULER's, about 500 tokens)
};

// RULER's string_match_all for one sample: the fraction of `expected` values that occur in
// `answer`, case-insensitively (1 when `expected` is empty).
double RulerStringMatchAll(const std::string& answer, const std::vector<std::string>& expected);

// The answer to one question.
struct RulerAnswer {
  std::string text;
  std::vector<int32_t> ids;
  double score = 0;
  AchievedCompression achieved;  // measured after the answer (reads: the question and answer)
  // The answer's decode steps (one token each, through the compressed cache) and their wall time.
  int64_t decode_tokens = 0;
  double decode_s = 0;
};

// Builds a fresh cache for `config` and prefills the sample's context into it: the end of the call
// is the compression point, so a query-aware policy has seen the context's queries only.
StatusOr<std::unique_ptr<KvCache>> PrefillRulerContext(Model& model, const RulerSample& sample,
                                                       const PolicyFactory& factory,
                                                       const PolicyConfig& config, int chunk,
                                                       ThreadPool* pool,
                                                       DType kv_type = DType::kBF16);
// Feeds the question and answer prefix into a cache that holds the sample's (compressed) context
// and generates greedily up to sample.max_new_tokens, stopping at an end-of-generation token;
// scores the answer with RulerStringMatchAll.
StatusOr<RulerAnswer> AnswerRulerQuestion(Model& model, const RulerSample& sample, KvCache* cache,
                                          int chunk, ThreadPool* pool, int question = 0);

struct RulerOptions {
  std::vector<std::string> tasks = RulerTaskNames();
  std::vector<int64_t> lengths = {4096};
  int64_t samples = 10;
  // Questions per context (>= 1): after the one compression of a sample's context, RULER's
  // question and up to questions - 1 of text.others are each answered from a fork of the
  // compressed cache (KvCache::Fork); each counts as a sample of its task.
  int questions = 1;
  uint64_t seed = 1;
  std::vector<std::string> policies = {"full"};
  std::vector<std::string> ratios;
  std::map<std::string, std::string> settings;
  bool skip_unsupported = false;
  PolicyFactory factory;  // null: RegistryFactory()
  DType kv_type = DType::kBF16;
  int chunk = 256;
  int threads = 1;
  std::string chat_template = "auto";
  std::string words_path = "/usr/share/dict/words";
};

struct RulerSampleRecord {
  std::string task;
  int64_t length = 0;
  int64_t index = 0;
  int question = 0;  // 0: RULER's question; k > 0: text.others[k - 1] on the same context
  uint64_t seed = 0;
  int64_t units = 0;
  int64_t context_tokens = 0;
  int64_t prompt_tokens = 0;
  std::vector<std::string> expected;
  std::vector<std::string> answers;  // [configs]
  std::vector<double> scores;        // [configs]
};

struct RulerCell {  // one (config, length, task)
  size_t config = 0;
  int64_t length = 0;
  std::string task;
  int64_t n = 0;
  double score = 0;     // mean string_match_all
  int64_t correct = 0;  // samples with every expected value found
  Interval correct_rate;
};

struct RulerConfigLength {  // one (config, length): the average over tasks and what it achieved
  size_t config = 0;
  int64_t length = 0;
  double average = 0;  // mean of the task scores
  // Decode steps of every answer at this length and their wall time: the policy's decode speed
  // at the task length (the same model, samples and process for every config).
  int64_t decode_tokens = 0;
  double decode_s = 0;
  AchievedCompression achieved;
  CompressionCheck check;
};

struct RulerReport {
  RulerOptions options;  // factory cleared
  std::string chat_template;
  std::string words_source;
  std::vector<PolicyConfig> configs;
  std::vector<SkippedConfig> skipped;
  std::vector<RulerSampleRecord> samples;
  std::vector<RulerCell> cells;
  std::vector<RulerConfigLength> averages;
  std::vector<std::string> warnings;
};

// Every (length, task, sample, config); one progress line per sample and config.
StatusOr<RulerReport> RunRuler(Model& model, const RulerOptions& o, std::ostream* progress);

// The tasks on which the config `full` (without a variant) scores >= `threshold` at `length`, in
// task order; empty when the run has no such config.
std::vector<std::string> RulerStrongTasks(const RulerReport& r, int64_t length,
                                          double threshold = 0.3);
// A config's mean score over `tasks` at `length` (0 when `tasks` is empty).
double RulerAverageOver(const RulerReport& r, size_t config, int64_t length,
                        const std::vector<std::string>& tasks);

// The "ruler" section of the report JSON (docs/eval.md).
nlohmann::json RulerJson(const RulerReport& r);

}  // namespace strata::eval
