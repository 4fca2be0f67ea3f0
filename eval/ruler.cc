#include "eval/ruler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "core/rng.h"
#include "eval/corpus.h"
#include "eval/needle.h"
#include "eval/svg.h"
#include "kv/geometry.h"

namespace strata::eval {

namespace {

// RULER's templates (scripts/data/synthetic/constants.py) and needles, split at {context}.
constexpr char kNiahHead[] =
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to "
    "memorize it. I will quiz you about the {type_needle_v} afterwards.\n";
constexpr char kNiahQuestion[] =
    "\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?";
constexpr char kNiahAnswer[] =
    " The special magic {type_needle_v} for {query} mentioned in the provided text are";
constexpr char kNiahNeedle[] = "One of the special magic {type_needle_v} for {key} is: {value}.";
constexpr char kRepeatHaystack[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

constexpr char kVtHead[] =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
constexpr char kVtQuestion[] =
    "\nQuestion: Find all variables that are assigned the value {query} in the text above.";
constexpr char kVtAnswer[] =
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
    "variables are assgined the value {query}, they are: ";
constexpr char kVtNoise[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n";

constexpr char kCweHead[] =
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n";
constexpr char kCweQuestion[] = "\nQuestion: What are the 10 most common words in the above list?";
constexpr char kCweAnswer[] = " Answer: The top 10 words that appear most often in the list are:";

constexpr char kFweHead[] =
    "Read the following coded text and track the frequency of each coded word. Find the three "
    "most frequently appeared coded words. ";
constexpr char kFweQuestion[] =
    "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three "
    "most frequently appeared words in the above coded text?";
constexpr char kFweAnswer[] =
    " Answer: According to the coded text above, the three most frequently appeared words are:";

// synthetic.yaml's niah rows.
enum class Hay { kRepeat, kEssay, kNeedle };
enum class Kind { kWords, kNumbers, kUuids };
struct NiahConfig {
  Hay hay;
  Kind k, v;
  int num_k, num_v, num_q;
};

const std::map<std::string, NiahConfig>& NiahConfigs() {
  static const std::map<std::string, NiahConfig> m = {
      {"niah_single_1", {Hay::kRepeat, Kind::kWords, Kind::kNumbers, 1, 1, 1}},
      {"niah_single_2", {Hay::kEssay, Kind::kWords, Kind::kNumbers, 1, 1, 1}},
      {"niah_single_3", {Hay::kEssay, Kind::kWords, Kind::kUuids, 1, 1, 1}},
      {"niah_multikey_1", {Hay::kEssay, Kind::kWords, Kind::kNumbers, 4, 1, 1}},
      {"niah_multikey_2", {Hay::kNeedle, Kind::kWords, Kind::kNumbers, 1, 1, 1}},
      {"niah_multikey_3", {Hay::kNeedle, Kind::kUuids, Kind::kUuids, 1, 1, 1}},
      {"niah_multivalue", {Hay::kEssay, Kind::kWords, Kind::kNumbers, 1, 4, 1}},
      {"niah_multiquery", {Hay::kEssay, Kind::kWords, Kind::kNumbers, 1, 1, 4}},
  };
  return m;
}

const char* KindName(Kind k) {
  return k == Kind::kWords ? "words" : k == Kind::kNumbers ? "numbers" : "uuids";
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) {
    s.replace(p, from.size(), to);
  }
  return s;
}

std::string Lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

uint64_t Fnv(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Python's random.sample(range(n), k) in spirit: k distinct values of [0, n), in draw order.
std::vector<int64_t> SampleDistinct(Rng& rng, int64_t n, int64_t k) {
  std::vector<int64_t> pool(n);
  std::iota(pool.begin(), pool.end(), 0);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = i + static_cast<int64_t>(rng.Below(static_cast<uint64_t>(n - i)));
    std::swap(pool[i], pool[j]);
  }
  pool.resize(k);
  return pool;
}

template <typename T>
void Shuffle(Rng& rng, std::vector<T>* v) {
  for (size_t i = v->size(); i > 1; --i) {
    std::swap((*v)[i - 1], (*v)[rng.Below(i)]);
  }
}

std::string RandomNumber(Rng& rng, int digits = 7) {
  uint64_t lo = 1;
  for (int d = 1; d < digits; ++d) lo *= 10;
  return std::to_string(lo + rng.Below(9 * lo));
}

// A version-4 UUID from 128 random bits, as Python's uuid.UUID(int=..., version=4) writes it.
std::string RandomUuid(Rng& rng) {
  uint64_t hi = rng.Next(), lo = rng.Next();
  hi = (hi & ~0xf000ull) | 0x4000ull;                  // version 4
  lo = (lo & ~(0xc000ull << 48)) | (0x8000ull << 48);  // RFC 4122 variant
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08llx-%04llx-%04llx-%04llx-%012llx",
                static_cast<unsigned long long>(hi >> 32),
                static_cast<unsigned long long>((hi >> 16) & 0xffff),
                static_cast<unsigned long long>(hi & 0xffff),
                static_cast<unsigned long long>(lo >> 48),
                static_cast<unsigned long long>(lo & 0xffffffffffffull));
  return buf;
}

std::string RandomUpper(Rng& rng, int k) {
  std::string s;
  for (int i = 0; i < k; ++i) s += static_cast<char>('A' + rng.Below(26));
  return s;
}

std::string RandomLower(Rng& rng, int k) {
  std::string s;
  for (int i = 0; i < k; ++i) s += static_cast<char>('a' + rng.Below(26));
  return s;
}

std::vector<std::string> SplitWords(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream ss(text);
  std::string w;
  while (ss >> w) out.push_back(w);
  return out;
}

std::string Join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

std::string Numbered(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(i + 1) + ". " + words[i];
  }
  return out;
}

bool UsableWord(const std::string& w) {
  if (w.size() < 3 || w.size() > 8) return false;
  return std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}

// RULER's depths: round(linspace(0, 100, 40)).
std::vector<int> Depths() {
  std::vector<int> d;
  for (int i = 0; i < 40; ++i) d.push_back(static_cast<int>(std::lround(100.0 * i / 39.0)));
  return d;
}

// One RNG per purpose, so the keys and values of a sample do not depend on its haystack size.
struct SampleRngs {
  Rng keys, hay, pos;
  Rng others;  // the order of the other questions (drawn last: the sample's text is unchanged)
  SampleRngs(uint64_t seed, const std::string& task, int64_t index)
      : keys(TrialSeed(seed ^ Fnv(task), index * 3)),
        hay(TrialSeed(seed ^ Fnv(task), index * 3 + 1)),
        pos(TrialSeed(seed ^ Fnv(task), index * 3 + 2)),
        others(TrialSeed(~(seed ^ Fnv(task)), index)) {}
};

// At most this many other questions are kept per context (niah_multikey_2/3 have one per line).
constexpr size_t kMaxOtherQuestions = 8;

// One chain of four hops: VAR X0 = value, VAR X1 = VAR X0, ... (RULER's variable names: random
// upper-case letters, five, or three in the in-context example).
std::vector<std::string> VtChain(Rng& rng, int letters, std::vector<std::string>* vars,
                                 std::string* value) {
  while (vars->size() < 5) {
    const std::string v = RandomUpper(rng, letters);
    if (std::find(vars->begin(), vars->end(), v) == vars->end()) vars->push_back(v);
  }
  *value = std::to_string(10000 + rng.Below(89999));
  std::vector<std::string> lines = {"VAR " + (*vars)[0] + " = " + *value};
  for (int j = 0; j < 4; ++j) {
    lines.push_back("VAR " + (*vars)[j + 1] + " = VAR " + (*vars)[j] + " ");
  }
  return lines;
}

// The chain's lines at sorted random places among `noises` noise lines.
std::string VtContext(Rng& pos, const std::vector<std::string>& lines, int64_t noises) {
  std::vector<std::string> s(static_cast<size_t>(noises), kVtNoise);
  std::vector<int64_t> at = SampleDistinct(pos, noises, static_cast<int64_t>(lines.size()));
  std::sort(at.begin(), at.end());
  for (size_t j = 0; j < lines.size(); ++j) s.insert(s.begin() + at[j] + j, lines[j]);
  return Replace(Join(s, " "), ". \n", ".\n");
}

// RULER's in-context example for vt: a chain of three-letter variables among `noises` noise lines,
// the template's whitespace collapsed, the answer given; the task follows it.
std::string VtExample(uint64_t seed, int64_t noises) {
  Rng keys(TrialSeed(seed ^ Fnv("vt-icl"), 0));
  Rng pos(TrialSeed(seed ^ Fnv("vt-icl"), 1));
  std::vector<std::string> vars;
  std::string value;
  const std::vector<std::string> lines = VtChain(keys, 3, &vars, &value);
  const std::string ctx = VtContext(pos, lines, noises);
  return Join(SplitWords(kVtHead), " ") + " " + ctx + " " +
         Join(SplitWords(Replace(kVtQuestion, "{query}", value)), " ") +
         Replace(Replace(kVtAnswer, "{num_v}", "5"), "{query}", value) + " " + Join(vars, " ") +
         "\n\n\n\n";
}

}  // namespace

const std::vector<std::string>& RulerTaskNames() {
  static const std::vector<std::string> names = {"niah_single_1",
                                                 "niah_single_2",
                                                 "niah_single_3",
                                                 "niah_multikey_1",
                                                 "niah_multikey_2",
                                                 "niah_multikey_3",
                                                 "niah_multivalue",
                                                 "niah_multiquery",
                                                 "vt",
                                                 "cwe",
                                                 "fwe"};
  return names;
}

StatusOr<std::vector<std::string>> ParseRulerTasks(const std::string& list) {
  if (list == "all") return RulerTaskNames();
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto& names = RulerTaskNames();
    if (std::find(names.begin(), names.end(), item) == names.end()) {
      return InvalidArgument("--task '" + item + "' is not a RULER task; the tasks are all, " +
                             Join(names, ", "));
    }
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  if (out.empty()) return InvalidArgument("--task needs at least one task");
  return out;
}

int RulerMaxNewTokens(const std::string& task) {
  if (task == "vt") return 30;
  if (task == "cwe") return 120;
  if (task == "fwe") return 50;
  return 128;
}

RulerWords LoadRulerWords(const std::string& path) {
  RulerWords w;
  std::set<std::string> set;
  if (!path.empty()) {
    std::ifstream f(path);
    std::string line;
    while (f && std::getline(f, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (UsableWord(line)) set.insert(line);
    }
  }
  if (set.size() >= 1000) {
    w.words.assign(set.begin(), set.end());
    w.source = path;
    return w;
  }
  set.clear();
  for (const std::string& raw : SplitWords(std::string(BuiltinHaystack()))) {
    std::string word;
    for (char c : raw) {
      if (std::isalpha(static_cast<unsigned char>(c))) word += c;
    }
    word = Lower(word);
    if (UsableWord(word)) set.insert(word);
  }
  w.words.assign(set.begin(), set.end());
  w.source = "builtin:kjv-vocabulary";
  return w;
}

double RulerStringMatchAll(const std::string& answer, const std::vector<std::string>& expected) {
  if (expected.empty()) return 1.0;
  const std::string a = Lower(answer);
  int found = 0;
  for (const std::string& e : expected) found += a.find(Lower(e)) != std::string::npos;
  return static_cast<double>(found) / static_cast<double>(expected.size());
}

int64_t RulerBuilder::MinUnits(const std::string& task) {
  if (task == "vt") return 5;     // the chain's five lines need five noise lines to sit among
  if (task == "cwe") return 11;   // the 10 common words and at least one other
  if (task == "fwe") return 100;  // ranks 2-4 strictly above rank 5 (floor(N k^-2 / zeta(2)))
  const NiahConfig& c = NiahConfigs().at(task);
  if (c.hay == Hay::kEssay) return 1;
  return static_cast<int64_t>(std::max(c.num_k, c.num_q)) * c.num_v;  // a line per needle
}

StatusOr<RulerBuilder> RulerBuilder::Create(const Model& model, const RulerBuilderOptions& o) {
  RulerBuilder b;
  b.o_ = o;
  b.tok_ = model.tokenizer();
  if (!b.tok_) return InvalidArgument("eval ruler needs a model with a tokenizer");
  if (o.chat_template == "none") {
    b.chat_ = false;
  } else if (o.chat_template == "auto") {
    if (!b.tok_->chat_template().empty() || b.tok_->HasGemmaTurns()) {
      auto t = ChatTemplate::ForModel(b.tok_->chat_template(), b.tok_->HasGemmaTurns());
      if (!t.ok()) return t.status().WithContext("--chat-template auto");
      b.tmpl_ = *t;
      b.chat_ = true;
    }
  } else {
    auto t = ChatTemplate::ByName(o.chat_template);
    if (!t.ok()) return t.status().WithContext("--chat-template");
    b.tmpl_ = *t;
    b.chat_ = true;
  }
  if (b.chat_) b.chat_name_ = b.tmpl_.name();
  b.words_ = LoadRulerWords(o.words_path);
  b.essay_ = SplitWords(std::string(BuiltinHaystack()));
  // vt's example fills about 500 tokens with 30 to generate, in steps of five noise lines.
  b.vt_icl_ = VtExample(o.seed, 5);
  for (int64_t n = 10;; n += 5) {
    const std::string icl = VtExample(o.seed, n);
    if (static_cast<int64_t>(b.tok_->Encode(icl, false).size()) + 30 > 500) break;
    b.vt_icl_ = icl;
  }
  return b;
}

StatusOr<RulerText> RulerBuilder::Text(const std::string& task, int64_t length, int64_t index,
                                       int64_t units) const {
  if (units < MinUnits(task)) {
    return InvalidArgument(task + " needs at least " + std::to_string(MinUnits(task)) +
                           " haystack units, got " + std::to_string(units));
  }
  SampleRngs r(o_.seed, task, index);
  const std::vector<std::string>& words = words_.words;
  RulerText t;
  auto random_of = [&](Kind k, Rng& rng) -> std::string {
    if (k == Kind::kNumbers) return RandomNumber(rng);
    if (k == Kind::kUuids) return RandomUuid(rng);
    // RULER's keys are adjective-noun pairs from wonderwords: two words of the list here.
    return words[rng.Below(words.size())] + "-" + words[rng.Below(words.size())];
  };

  if (auto it = NiahConfigs().find(task); it != NiahConfigs().end()) {
    const NiahConfig& c = it->second;
    const int num_k = std::max(c.num_k, c.num_q);
    const std::string type_v = KindName(c.v);
    std::vector<std::string> keys, needles;
    std::vector<std::vector<std::string>> values;
    for (int i = 0; i < num_k; ++i) {
      std::string key;
      do {
        key = random_of(c.k, r.keys);
      } while (std::find(keys.begin(), keys.end(), key) != keys.end());
      keys.push_back(key);
      values.emplace_back();
      for (int j = 0; j < c.num_v; ++j) {
        values.back().push_back(random_of(c.v, r.keys));
        needles.push_back(
            Replace(Replace(Replace(kNiahNeedle, "{type_needle_v}", type_v), "{key}", key),
                    "{value}", values.back().back()));
      }
    }
    Shuffle(r.keys, &needles);
    const std::vector<int64_t> picked = SampleDistinct(r.keys, num_k, c.num_q);
    std::vector<std::string> queries;
    for (int64_t i : picked) {
      queries.push_back(keys[i]);
      for (const std::string& v : values[i]) t.expected.push_back(v);
    }
    std::string query = queries.back();
    if (queries.size() > 1) {
      query = Join(std::vector<std::string>(queries.begin(), queries.end() - 1), ", ") + ", and " +
              queries.back();
    }
    // The other keys of the context with their values: the questions it also answers.
    std::vector<std::pair<std::string, std::vector<std::string>>> other_keys;
    if (c.num_q == 1) {
      for (int i = 0; i < num_k; ++i) {
        if (std::find(picked.begin(), picked.end(), i) == picked.end()) {
          other_keys.push_back({keys[i], values[i]});
        }
      }
    }
    std::string context;
    if (c.hay == Hay::kEssay) {
      // `units` words of the KJV text from a random word on (cyclically), cut into sentences;
      // the needles go between sentences at distinct depths drawn from RULER's 40.
      const size_t n_essay = essay_.size();
      size_t w = static_cast<size_t>(r.hay.Below(n_essay));
      std::vector<std::string> sents;
      std::string cur;
      for (int64_t i = 0; i < units; ++i, w = (w + 1) % n_essay) {
        const std::string& word = essay_[w];
        cur += (cur.empty() ? "" : " ") + word;
        const char last = word.back();
        if (last == '.' || last == '?' || last == '!') {
          sents.push_back(cur);
          cur.clear();
        }
      }
      if (!cur.empty()) sents.push_back(cur);
      const std::vector<int> depths = Depths();
      std::vector<int64_t> at;
      for (int64_t d : SampleDistinct(r.pos, static_cast<int64_t>(depths.size()),
                                      static_cast<int64_t>(needles.size()))) {
        at.push_back(static_cast<int64_t>(static_cast<double>(sents.size()) * depths[d] / 100.0));
      }
      std::sort(at.begin(), at.end());
      at.insert(at.begin(), 0);
      at.push_back(static_cast<int64_t>(sents.size()));
      std::vector<std::string> parts;
      for (size_t i = 1; i < at.size(); ++i) {
        std::vector<std::string> seg(sents.begin() + at[i - 1], sents.begin() + at[i]);
        if (!seg.empty()) parts.push_back(Join(seg, " "));
        if (i - 1 < needles.size()) parts.push_back(needles[i - 1]);
      }
      context = Join(parts, " ");
    } else {
      std::vector<std::string> lines;
      for (int64_t i = 0; i < units; ++i) {
        if (c.hay == Hay::kRepeat) {
          lines.push_back(kRepeatHaystack);
          continue;
        }
        std::string key;
        do {
          key = random_of(c.k, r.hay);
        } while (std::find(keys.begin(), keys.end(), key) != keys.end());
        const std::string value = random_of(c.v, r.hay);
        lines.push_back(
            Replace(Replace(Replace(kNiahNeedle, "{type_needle_v}", type_v), "{key}", key),
                    "{value}", value));
        // A line whose key recurs in the haystack has no single answer: not asked.
        bool unique = true;
        for (auto& [k, v] : other_keys) {
          if (k == key) unique = false, v.clear();
        }
        if (unique && c.num_q == 1) other_keys.push_back({key, {value}});
      }
      other_keys.erase(std::remove_if(other_keys.begin(), other_keys.end(),
                                      [](const auto& kv) { return kv.second.empty(); }),
                       other_keys.end());
      std::vector<int64_t> at = SampleDistinct(r.pos, units, static_cast<int64_t>(needles.size()));
      std::sort(at.rbegin(), at.rend());
      for (size_t i = 0; i < needles.size(); ++i) lines.insert(lines.begin() + at[i], needles[i]);
      context = Join(lines, "\n");
    }
    std::string head = kNiahHead, question = kNiahQuestion, answer = kNiahAnswer;
    std::string type = type_v;
    if (c.num_q * c.num_v == 1) {
      for (std::string* s : {&head, &question, &answer}) {
        *s = Replace(Replace(Replace(Replace(*s, "Some", "A"), "are all", "is"), "are", "is"),
                     "answers", "answer");
      }
      type.pop_back();
    }
    t.context = Replace(head, "{type_needle_v}", type) + context;
    t.question = Replace(Replace(question, "{type_needle_v}", type), "{query}", query);
    t.answer_prefix = Replace(Replace(answer, "{type_needle_v}", type), "{query}", query);
    Shuffle(r.others, &other_keys);
    if (other_keys.size() > kMaxOtherQuestions) other_keys.resize(kMaxOtherQuestions);
    for (const auto& [k, v] : other_keys) {
      t.others.push_back({Replace(Replace(question, "{type_needle_v}", type), "{query}", k),
                          Replace(Replace(answer, "{type_needle_v}", type), "{query}", k), v});
    }
    return t;
  }

  if (task == "vt") {
    t.context = vt_icl_;
    std::vector<std::string> vars;
    std::string value;
    const std::vector<std::string> lines = VtChain(r.keys, 5, &vars, &value);
    t.context += std::string(kVtHead) + VtContext(r.pos, lines, units);
    t.question = Replace(kVtQuestion, "{query}", value);
    t.answer_prefix = Replace(Replace(kVtAnswer, "{num_v}", "5"), "{query}", value);
    t.expected = vars;
    return t;
  }

  if (task == "cwe") {
    // RULER's parameters: below 4096 tokens the common words appear 6 times and the others once
    // (the example: 20 words, 3 and 1); from 4096 on, 30 and 3 (the example: 40 words, 10 and 3).
    const bool small = length < 4096;
    auto example = [&](Rng& rng, int64_t n, int common_rep, int uncommon_rep,
                       std::vector<std::string>* common) {
      std::vector<int64_t> pick = SampleDistinct(rng, static_cast<int64_t>(words.size()), n);
      std::vector<std::string> list;
      for (int64_t i = 0; i < n; ++i) {
        const std::string& w = words[pick[i]];
        if (i < 10) common->push_back(w);
        for (int k = 0; k < (i < 10 ? common_rep : uncommon_rep); ++k) list.push_back(w);
      }
      Shuffle(rng, &list);
      return Numbered(list);
    };
    if (units > static_cast<int64_t>(words.size())) {
      return InvalidArgument("cwe: " + std::to_string(units) + " words asked, the list has " +
                             std::to_string(words.size()));
    }
    std::vector<std::string> ex_common;
    const std::string ex =
        example(r.hay, small ? 20 : 40, small ? 3 : 10, small ? 1 : 3, &ex_common);
    const std::string list = example(r.keys, units, small ? 6 : 30, small ? 1 : 3, &t.expected);
    t.context = std::string(kCweHead) + ex + kCweQuestion + kCweAnswer + " " + Numbered(ex_common) +
                "\n" + kCweHead + list;
    t.question = kCweQuestion;
    t.answer_prefix = kCweAnswer;
    return t;
  }

  if (task == "fwe") {
    // A vocabulary of T/50 six-letter coded words, counts floor(N k^-2 / zeta(2)) by rank k; the
    // top rank is the noise "...", the answer ranks 2-4.
    const int64_t vocab_size = std::max<int64_t>(5, length / 50);
    std::set<std::string> seen;
    std::vector<std::string> vocab;
    while (static_cast<int64_t>(vocab.size()) < vocab_size) {
      std::string w = RandomLower(r.keys, 6);
      if (seen.insert(w).second) vocab.push_back(w);
    }
    vocab[0] = "...";
    const double zeta2 = M_PI * M_PI / 6.0;
    std::vector<std::string> text;
    for (int64_t k = 1; k <= vocab_size; ++k) {
      const int64_t count =
          static_cast<int64_t>(static_cast<double>(units) / (static_cast<double>(k * k) * zeta2));
      for (int64_t i = 0; i < count; ++i) text.push_back(vocab[k - 1]);
    }
    Shuffle(r.hay, &text);
    t.context = std::string(kFweHead) + Join(text, " ");
    t.question = kFweQuestion;
    t.answer_prefix = kFweAnswer;
    t.expected = {vocab[1], vocab[2], vocab[3]};
    return t;
  }
  return InvalidArgument("unknown RULER task '" + task + "'");
}

StatusOr<RulerSample> RulerBuilder::BuildUnits(const std::string& task, int64_t length,
                                               int64_t index, int64_t units) const {
  RulerSample s;
  s.task = task;
  s.length = length;
  s.index = index;
  s.seed = o_.seed;
  s.units = units;
  s.max_new_tokens = RulerMaxNewTokens(task);
  ASSIGN_OR_RETURN(s.text, Text(task, length, index, units));
  // The text before the compression point, and what follows it for a question: the question,
  // the chat template's suffix and the answer prefix.
  std::string before = s.text.context;
  auto after = [&](const std::string& question,
                   const std::string& answer_prefix) -> StatusOr<std::string> {
    if (!chat_) return question + answer_prefix;
    const std::string content = s.text.context + question;
    const std::string bos = tok_->bos_id() >= 0 ? tok_->token_text(tok_->bos_id()) : "";
    const std::string eos = tok_->eos_id() >= 0 ? tok_->token_text(tok_->eos_id()) : "";
    const std::string rendered = tmpl_.Render({{"user", content}}, true, bos, eos);
    const size_t at = rendered.find(content);
    if (at == std::string::npos) {
      return Internal("the " + tmpl_.name() + " chat template does not render the " + task +
                      " message verbatim; use --chat-template none");
    }
    before = rendered.substr(0, at + s.text.context.size());
    return rendered.substr(at + s.text.context.size()) + answer_prefix;
  };
  ASSIGN_OR_RETURN(const std::string first, after(s.text.question, s.text.answer_prefix));
  s.context_ids = tok_->Encode(before, /*with_bos=*/false, /*parse_special=*/true);
  if (tok_->add_bos() && tok_->bos_id() >= 0 &&
      (s.context_ids.empty() || s.context_ids[0] != tok_->bos_id())) {
    s.context_ids.insert(s.context_ids.begin(), tok_->bos_id());
  }
  s.question_ids = tok_->Encode(first, /*with_bos=*/false, /*parse_special=*/true);
  if (s.context_ids.empty() || s.question_ids.empty()) {
    return Internal(task + ": the context or the question tokenizes to nothing");
  }
  for (const RulerText::Question& q : s.text.others) {
    ASSIGN_OR_RETURN(const std::string text, after(q.question, q.answer_prefix));
    s.other_question_ids.push_back(
        tok_->Encode(text, /*with_bos=*/false, /*parse_special=*/true));
  }
  return s;
}

StatusOr<RulerSample> RulerBuilder::Build(const std::string& task, int64_t length,
                                          int64_t index) const {
  const int64_t lo_units = MinUnits(task);
  auto fits = [&](int64_t units, RulerSample* out) -> StatusOr<bool> {
    ASSIGN_OR_RETURN(RulerSample s, BuildUnits(task, length, index, units));
    // Every question the context answers fits T (RULER's and the others alike).
    const bool ok = s.longest_prompt_tokens() + s.max_new_tokens <= length;
    if (out) *out = std::move(s);
    return ok;
  };
  RulerSample first;
  ASSIGN_OR_RETURN(bool ok, fits(lo_units, &first));
  if (!ok) {
    return InvalidArgument("--len " + std::to_string(length) + " is too short for " + task +
                           ": its template with the fewest haystack units takes " +
                           std::to_string(first.longest_prompt_tokens()) + " tokens and " +
                           std::to_string(first.max_new_tokens) +
                           " are generated; the minimum --len is " +
                           std::to_string(first.longest_prompt_tokens() + first.max_new_tokens));
  }
  // Doubling, then bisection, then a walk so that `lo` fits and lo + 1 does not.
  int64_t lo = lo_units, hi = std::max<int64_t>(lo_units * 2, lo_units + 16);
  const int64_t cap = task == "cwe" ? static_cast<int64_t>(words_.words.size()) : int64_t{1} << 40;
  for (;;) {
    if (hi >= cap) {
      hi = cap;
      break;
    }
    ASSIGN_OR_RETURN(bool f, fits(hi, nullptr));
    if (!f) break;
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    ASSIGN_OR_RETURN(bool f, fits(mid, nullptr));
    (f ? lo : hi) = mid;
  }
  for (;;) {
    if (lo + 1 > cap) break;
    ASSIGN_OR_RETURN(bool f, fits(lo + 1, nullptr));
    if (!f) break;
    ++lo;
  }
  RulerSample s;
  for (;;) {
    ASSIGN_OR_RETURN(bool f, fits(lo, &s));
    if (f || lo <= lo_units) break;
    --lo;
  }
  return s;
}

StatusOr<std::unique_ptr<KvCache>> PrefillRulerContext(Model& model, const RulerSample& sample,
                                                       const PolicyFactory& factory,
                                                       const PolicyConfig& config, int chunk,
                                                       ThreadPool* pool, DType kv_type) {
  ASSIGN_OR_RETURN(auto cache, NewConfigCache(model, factory, config, kv_type));
  // The end of this call is the compression point: only the context's queries were observed.
  RETURN_IF_ERROR(model.Prefill(sample.context_ids.data(),
                                static_cast<int64_t>(sample.context_ids.size()), chunk, cache.get(),
                                pool, nullptr));
  return cache;
}

StatusOr<RulerAnswer> AnswerRulerQuestion(Model& model, const RulerSample& sample, KvCache* cache,
                                          int chunk, ThreadPool* pool, int question) {
  const Tokenizer* tok = model.tokenizer();
  if (!tok) return InvalidArgument("eval ruler needs a model with a tokenizer");
  if (question < 0 || question > static_cast<int>(sample.other_question_ids.size())) {
    return InvalidArgument("question " + std::to_string(question) + " of a " + sample.task +
                           " sample with " + std::to_string(sample.other_question_ids.size()) +
                           " other questions");
  }
  const std::vector<int32_t>& ids =
      question == 0 ? sample.question_ids : sample.other_question_ids[question - 1];
  const std::vector<std::string>& expected =
      question == 0 ? sample.text.expected : sample.text.others[question - 1].expected;
  const int64_t v = model.config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(v));
  const CacheCounters counters0 = cache->counters();
  RETURN_IF_ERROR(model.Prefill(ids.data(), static_cast<int64_t>(ids.size()), chunk, cache, pool,
                                logits.data()));
  RulerAnswer a;
  for (int i = 0; i < sample.max_new_tokens; ++i) {
    // Greedy: the first maximum wins ties.
    const int32_t id =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    if (tok->IsEog(id)) break;
    a.ids.push_back(id);
    if (i + 1 == sample.max_new_tokens) break;
    const auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(model.Decode(id, cache, pool, logits.data()));
    a.decode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    a.decode_tokens++;
  }
  a.text = tok->Decode(a.ids);
  a.score = RulerStringMatchAll(a.text, expected);
  a.achieved = MeasureAchieved(*cache, counters0);
  return a;
}

StatusOr<RulerReport> RunRuler(Model& model, const RulerOptions& o, std::ostream* progress) {
  RulerReport r;
  r.options = o;
  r.options.factory = nullptr;
  const PolicyFactory factory = o.factory ? o.factory : RegistryFactory();
  const Progress prog(progress);
  if (o.lengths.empty()) return InvalidArgument("--len needs at least one length");
  if (o.tasks.empty()) return InvalidArgument("--task needs at least one task");
  if (o.questions < 1) {
    return InvalidArgument("--questions must be >= 1, got " + std::to_string(o.questions));
  }
  if (o.samples < 1) {
    return InvalidArgument("--samples must be >= 1, got " + std::to_string(o.samples));
  }
  if (o.chunk < 1) return InvalidArgument("--chunk must be >= 1, got " + std::to_string(o.chunk));
  RulerBuilderOptions bo;
  bo.seed = o.seed;
  bo.chat_template = o.chat_template;
  bo.words_path = o.words_path;
  ASSIGN_OR_RETURN(RulerBuilder builder, RulerBuilder::Create(model, bo));
  r.chat_template = builder.chat_name();
  r.words_source = builder.words_source();
  ASSIGN_OR_RETURN(const std::vector<PolicyConfig> grid,
                   ExpandGrid(o.policies, o.ratios, o.settings));
  ASSIGN_OR_RETURN(r.configs, BuildableConfigs(model, factory, grid, o.skip_unsupported, &r.skipped,
                                               progress, o.kv_type));
  // Every sample is built before any is run, so a --len too short for a task fails at once.
  std::vector<RulerSample> all;
  for (int64_t len : o.lengths) {
    for (const std::string& task : o.tasks) {
      for (int64_t i = 0; i < o.samples; ++i) {
        ASSIGN_OR_RETURN(RulerSample s, builder.Build(task, len, i));
        all.push_back(std::move(s));
      }
    }
  }
  ThreadPool pool(std::max(1, o.threads));
  const size_t nc = r.configs.size();
  std::map<std::pair<int64_t, size_t>, AchievedCompression> achieved;  // (length, config)
  std::map<std::pair<int64_t, size_t>, std::pair<int64_t, double>> decode;  // tokens, seconds
  const auto t0 = std::chrono::steady_clock::now();
  size_t done = 0;
  for (const RulerSample& s : all) {
    // RULER's question, then up to questions - 1 others on the same compressed context.
    const int n_q =
        static_cast<int>(std::min<size_t>(o.questions, 1 + s.other_question_ids.size()));
    std::vector<RulerSampleRecord> recs(n_q);
    for (int q = 0; q < n_q; ++q) {
      RulerSampleRecord& rec = recs[q];
      rec.task = s.task;
      rec.length = s.length;
      rec.index = s.index;
      rec.question = q;
      rec.seed = s.seed;
      rec.units = s.units;
      rec.context_tokens = static_cast<int64_t>(s.context_ids.size());
      const auto& ids = q == 0 ? s.question_ids : s.other_question_ids[q - 1];
      rec.prompt_tokens = static_cast<int64_t>(s.context_ids.size() + ids.size());
      rec.expected = q == 0 ? s.text.expected : s.text.others[q - 1].expected;
    }
    std::string line = "ruler T=" + std::to_string(s.length) + " " + s.task + " sample " +
                       std::to_string(s.index + 1) + "/" + std::to_string(o.samples) + " (" +
                       std::to_string(recs[0].prompt_tokens) + " tokens" +
                       (n_q > 1 ? ", " + std::to_string(n_q) + " questions" : "") + "):";
    for (size_t c = 0; c < nc; ++c) {
      ASSIGN_OR_RETURN(auto cache, PrefillRulerContext(model, s, factory, r.configs[c], o.chunk,
                                                       &pool, o.kv_type));
      line += " " + r.configs[c].Label();
      for (int q = 0; q < n_q; ++q) {
        // Each question reads its own copy of the compressed context (the last one the cache).
        std::unique_ptr<KvCache> fork;
        if (q + 1 < n_q) {
          ASSIGN_OR_RETURN(fork, cache->Fork());
        }
        KvCache* use = fork ? fork.get() : cache.get();
        ASSIGN_OR_RETURN(RulerAnswer a, AnswerRulerQuestion(model, s, use, o.chunk, &pool, q));
        recs[q].answers.push_back(a.text);
        recs[q].scores.push_back(a.score);
        achieved[{s.length, c}].Add(a.achieved);
        decode[{s.length, c}].first += a.decode_tokens;
        decode[{s.length, c}].second += a.decode_s;
        line += (q ? "/" : " ") + FormatNum(a.score, 2);
      }
    }
    ++done;
    const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    line += " [" + std::to_string(done) + "/" + std::to_string(all.size()) + ", " +
            FormatNum(el, 0) + " s]";
    prog.Line(line);
    for (RulerSampleRecord& rec : recs) r.samples.push_back(std::move(rec));
  }
  for (int64_t len : o.lengths) {
    for (size_t c = 0; c < nc; ++c) {
      RulerConfigLength avg;
      avg.config = c;
      avg.length = len;
      double sum = 0;
      for (const std::string& task : o.tasks) {
        RulerCell cell;
        cell.config = c;
        cell.length = len;
        cell.task = task;
        double score = 0;
        for (const auto& rec : r.samples) {
          if (rec.length != len || rec.task != task) continue;
          cell.n++;
          score += rec.scores[c];
          cell.correct += rec.scores[c] >= 1.0;
        }
        cell.score = cell.n ? score / static_cast<double>(cell.n) : 0;
        cell.correct_rate = WilsonInterval(cell.correct, cell.n);
        sum += cell.score;
        r.cells.push_back(cell);
      }
      avg.average = sum / static_cast<double>(o.tasks.size());
      avg.achieved = achieved[{len, c}];
      avg.decode_tokens = decode[{len, c}].first;
      avg.decode_s = decode[{len, c}].second;
      avg.check = CheckAchieved(r.configs[c].Label() + " T=" + std::to_string(len), avg.achieved);
      if (!avg.check.warning.empty()) r.warnings.push_back(avg.check.warning);
      r.averages.push_back(avg);
    }
  }
  return r;
}

std::vector<std::string> RulerStrongTasks(const RulerReport& r, int64_t length, double threshold) {
  std::vector<std::string> out;
  for (size_t c = 0; c < r.configs.size(); ++c) {
    if (r.configs[c].policy != "full" || !r.configs[c].variant.empty()) continue;
    for (const RulerCell& cell : r.cells) {
      if (cell.config == c && cell.length == length && cell.n > 0 && cell.score >= threshold) {
        out.push_back(cell.task);
      }
    }
    break;
  }
  return out;
}

double RulerAverageOver(const RulerReport& r, size_t config, int64_t length,
                        const std::vector<std::string>& tasks) {
  if (tasks.empty()) return 0;
  double sum = 0;
  for (const RulerCell& cell : r.cells) {
    if (cell.config == config && cell.length == length &&
        std::find(tasks.begin(), tasks.end(), cell.task) != tasks.end()) {
      sum += cell.score;
    }
  }
  return sum / static_cast<double>(tasks.size());
}

nlohmann::json RulerJson(const RulerReport& r) {
  nlohmann::json j;
  j["tasks"] = r.options.tasks;
  j["lengths"] = r.options.lengths;
  j["samples_per_task"] = r.options.samples;
  j["questions_per_context"] = r.options.questions;
  j["seed"] = r.options.seed;
  j["chat_template"] = r.chat_template;
  j["words"] = r.words_source;
  j["haystack"] = std::string(kBuiltinHaystackName);
  j["kv_type"] = KvTypeName(r.options.kv_type);
  j["max_new_tokens"] = nlohmann::json::object();
  for (const std::string& t : r.options.tasks) j["max_new_tokens"][t] = RulerMaxNewTokens(t);
  j["configs"] = nlohmann::json::array();
  for (const auto& c : r.configs) j["configs"].push_back(ConfigJson(c));
  j["cells"] = nlohmann::json::array();
  for (const auto& c : r.cells) {
    nlohmann::json x = ConfigJson(r.configs[c.config]);
    x["length"] = c.length;
    x["task"] = c.task;
    x["n"] = c.n;
    x["score"] = c.score;
    x["correct"] = c.correct;
    x["correct_rate"] = c.correct_rate.point;
    x["wilson_lo"] = c.correct_rate.lo;
    x["wilson_hi"] = c.correct_rate.hi;
    j["cells"].push_back(x);
  }
  j["averages"] = nlohmann::json::array();
  for (const auto& a : r.averages) {
    nlohmann::json x = ConfigJson(r.configs[a.config]);
    x["length"] = a.length;
    x["average"] = a.average;
    x["decode_tokens"] = a.decode_tokens;
    x["decode_s"] = a.decode_s;
    x["decode_tokens_per_s"] =
        a.decode_s > 0 ? nlohmann::json(static_cast<double>(a.decode_tokens) / a.decode_s)
                       : nlohmann::json(nullptr);
    AddAchievedFields(a.achieved, a.check, &x);
    j["averages"].push_back(x);
  }
  // The tasks the uncompressed cache answers (full >= 0.3) and each config's average over them.
  j["full_tasks"] = nlohmann::json::array();
  for (int64_t len : r.options.lengths) {
    const std::vector<std::string> tasks = RulerStrongTasks(r, len);
    nlohmann::json x = {{"length", len}, {"threshold", 0.3}, {"tasks", tasks}};
    x["averages"] = nlohmann::json::array();
    for (size_t c = 0; c < r.configs.size(); ++c) {
      x["averages"].push_back(
          {{"label", r.configs[c].Label()}, {"average", RulerAverageOver(r, c, len, tasks)}});
    }
    j["full_tasks"].push_back(x);
  }
  j["samples"] = nlohmann::json::array();
  for (const auto& s : r.samples) {
    nlohmann::json x = {{"task", s.task},
                        {"length", s.length},
                        {"index", s.index},
                        {"question", s.question},
                        {"seed", s.seed},
                        {"units", s.units},
                        {"context_tokens", s.context_tokens},
                        {"prompt_tokens", s.prompt_tokens},
                        {"expected", s.expected}};
    x["results"] = nlohmann::json::array();
    for (size_t c = 0; c < s.answers.size(); ++c) {
      x["results"].push_back(
          {{"label", r.configs[c].Label()}, {"answer", s.answers[c]}, {"score", s.scores[c]}});
    }
    j["samples"].push_back(x);
  }
  return j;
}

}  // namespace strata::eval
