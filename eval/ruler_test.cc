#include "eval/ruler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace strata::eval {
namespace {

// The shipped char-level testbed: a real tokenizer, so lengths are its own tokens.
class RulerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = Model::Load(std::string(STRATA_SOURCE_DIR) + "/models/gqa.gguf");
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static RulerBuilder Builder(uint64_t seed = 1) {
    RulerBuilderOptions o;
    o.seed = seed;
    auto b = RulerBuilder::Create(*model_, o);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    return *b;
  }
  static inline Model* model_ = nullptr;
};

constexpr int64_t kLen = 2048;

std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream ss(text);
  std::string w;
  while (ss >> w) out.push_back(w);
  return out;
}

TEST_F(RulerTest, TaskListsAndBudgets) {
  EXPECT_EQ(RulerTaskNames().size(), 11u);
  auto all = ParseRulerTasks("all");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, RulerTaskNames());
  auto some = ParseRulerTasks("vt,niah_single_1,vt");
  ASSERT_TRUE(some.ok());
  EXPECT_EQ(*some, (std::vector<std::string>{"vt", "niah_single_1"}));
  auto bad = ParseRulerTasks("niah_single_9");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("niah_single_9"), std::string::npos);
  EXPECT_EQ(RulerMaxNewTokens("niah_multikey_2"), 128);
  EXPECT_EQ(RulerMaxNewTokens("vt"), 30);
  EXPECT_EQ(RulerMaxNewTokens("cwe"), 120);
  EXPECT_EQ(RulerMaxNewTokens("fwe"), 50);
}

TEST_F(RulerTest, StringMatchAllIsRulersScore) {
  EXPECT_DOUBLE_EQ(RulerStringMatchAll("the numbers are 123 and 456", {"123", "456"}), 1.0);
  EXPECT_DOUBLE_EQ(RulerStringMatchAll("only 123 here", {"123", "456"}), 0.5);
  EXPECT_DOUBLE_EQ(RulerStringMatchAll("nothing", {"123", "456"}), 0.0);
  EXPECT_DOUBLE_EQ(RulerStringMatchAll("VAR ABCDE and var fghij", {"abcde", "FGHIJ"}), 1.0);
  EXPECT_DOUBLE_EQ(RulerStringMatchAll("a b c", {"a", "b", "c", "d"}), 0.75);
}

TEST_F(RulerTest, WordsAreLowercaseAlphabetic) {
  const RulerWords w = LoadRulerWords();
  ASSERT_GE(w.words.size(), 100u) << w.source;
  for (const auto& word : w.words) {
    ASSERT_GE(word.size(), 3u);
    ASSERT_LE(word.size(), 8u);
    for (char c : word) ASSERT_TRUE(c >= 'a' && c <= 'z') << word;
  }
  const RulerWords fallback = LoadRulerWords("/nonexistent/words");
  EXPECT_EQ(fallback.source, "builtin:kjv-vocabulary");
  EXPECT_GE(fallback.words.size(), 100u);
}

TEST_F(RulerTest, SamplesAreDeterministicPerSeed) {
  const RulerBuilder a = Builder(1), b = Builder(1), c = Builder(2);
  for (const std::string& task : RulerTaskNames()) {
    SCOPED_TRACE(task);
    auto s1 = a.Build(task, kLen, 3);
    auto s2 = b.Build(task, kLen, 3);
    auto other = c.Build(task, kLen, 3);
    auto next = a.Build(task, kLen, 4);
    ASSERT_TRUE(s1.ok()) << s1.status().ToString();
    ASSERT_TRUE(s2.ok() && other.ok() && next.ok());
    EXPECT_EQ(s1->text.context, s2->text.context);
    EXPECT_EQ(s1->text.question, s2->text.question);
    EXPECT_EQ(s1->text.expected, s2->text.expected);
    EXPECT_EQ(s1->context_ids, s2->context_ids);
    EXPECT_EQ(s1->question_ids, s2->question_ids);
    EXPECT_NE(s1->text.context, other->text.context);
    EXPECT_NE(s1->text.context, next->text.context);
  }
}

TEST_F(RulerTest, LengthHitsTheTargetWithinOneUnit) {
  const RulerBuilder b = Builder();
  for (const std::string& task : RulerTaskNames()) {
    for (int64_t len : {kLen, int64_t{3000}}) {
      SCOPED_TRACE(task + " T=" + std::to_string(len));
      auto s = b.Build(task, len, 0);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      EXPECT_LE(s->prompt_tokens() + s->max_new_tokens, len);
      auto more = b.BuildUnits(task, len, 0, s->units + 1);
      ASSERT_TRUE(more.ok());
      EXPECT_GT(more->prompt_tokens() + more->max_new_tokens, len);
      EXPECT_EQ(s->max_new_tokens, RulerMaxNewTokens(task));
    }
  }
}

TEST_F(RulerTest, TooShortLengthNamesTheMinimum) {
  const RulerBuilder b = Builder();
  auto s = b.Build("niah_single_1", 200, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("minimum --len is"), std::string::npos)
      << s.status().message();
  auto fewest = b.BuildUnits("niah_single_1", 200, 0, RulerBuilder::MinUnits("niah_single_1"));
  ASSERT_TRUE(fewest.ok());
  const std::string min = std::to_string(fewest->prompt_tokens() + fewest->max_new_tokens);
  EXPECT_NE(s.status().message().find(min), std::string::npos) << s.status().message();
  EXPECT_TRUE(b.Build("niah_single_1", std::stoll(min), 0).ok());
}

TEST_F(RulerTest, NeedleAnswersAreInTheContextUnderTheAskedKeys) {
  const RulerBuilder b = Builder();
  const std::map<std::string, size_t> n_expected = {{"niah_single_1", 1},   {"niah_single_2", 1},
                                                    {"niah_single_3", 1},   {"niah_multikey_1", 1},
                                                    {"niah_multikey_2", 1}, {"niah_multikey_3", 1},
                                                    {"niah_multivalue", 4}, {"niah_multiquery", 4}};
  for (const auto& [task, n] : n_expected) {
    for (int64_t i = 0; i < 3; ++i) {
      SCOPED_TRACE(task + " sample " + std::to_string(i));
      auto s = b.Build(task, kLen, i);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      const RulerText& t = s->text;
      ASSERT_EQ(t.expected.size(), n);
      for (const std::string& v : t.expected) {
        // The needle "One of the special magic ... for KEY is: VALUE." with an asked KEY.
        const size_t at = t.context.find(" is: " + v + ".");
        ASSERT_NE(at, std::string::npos) << v;
        const size_t for_at = t.context.rfind(" for ", at);
        ASSERT_NE(for_at, std::string::npos);
        const std::string key = t.context.substr(for_at + 5, at - for_at - 5);
        EXPECT_NE(t.question.find(key), std::string::npos) << key << " / " << t.question;
        EXPECT_NE(t.answer_prefix.find(key), std::string::npos);
        // The value occurs once: no distractor carries it.
        EXPECT_EQ(t.context.find(v, at + 5 + v.size()), std::string::npos);
      }
      EXPECT_EQ(t.context.find("A special magic") == 0, n == 1);
    }
  }
  // niah_single_1's haystack is RULER's repeated noise; niah_single_3's values are UUIDs.
  auto s1 = b.Build("niah_single_1", kLen, 0);
  EXPECT_NE(s1->text.context.find("The grass is green. The sky is blue."), std::string::npos);
  EXPECT_EQ(s1->text.expected[0].size(), 7u);
  auto s3 = b.Build("niah_single_3", kLen, 0);
  EXPECT_EQ(s3->text.expected[0].size(), 36u);
  EXPECT_EQ(s3->text.expected[0][14], '4');
}

TEST_F(RulerTest, VariableChainLeadsToTheValue) {
  const RulerBuilder b = Builder();
  for (int64_t i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    auto s = b.Build("vt", kLen, i);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const RulerText& t = s->text;
    // The task's own text follows the in-context example.
    const std::string head =
        "Memorize and track the chain(s) of variable assignment hidden in "
        "the following text.\n\n";
    const size_t start = t.context.rfind(head);
    ASSERT_NE(start, std::string::npos);
    const std::vector<std::string> w = Words(t.context.substr(start + head.size()));
    std::map<std::string, std::string> assigned;  // VAR X = (number | VAR Y)
    for (size_t j = 0; j + 3 < w.size(); ++j) {
      if (w[j] != "VAR" || w[j + 2] != "=") continue;
      assigned[w[j + 1]] = w[j + 3] == "VAR" && j + 4 < w.size() ? "VAR " + w[j + 4] : w[j + 3];
    }
    const size_t q = t.question.find("the value ");
    ASSERT_NE(q, std::string::npos);
    const std::string query = Words(t.question.substr(q + 10))[0];
    std::set<std::string> leads;
    for (const auto& [var, rhs] : assigned) {
      std::string x = rhs;
      for (int hop = 0; hop < 10 && x.rfind("VAR ", 0) == 0; ++hop) x = assigned[x.substr(4)];
      if (x == query) leads.insert(var);
    }
    EXPECT_EQ(leads, std::set<std::string>(t.expected.begin(), t.expected.end()));
    EXPECT_EQ(t.expected.size(), 5u);
    EXPECT_NE(t.answer_prefix.find("5 variables are assgined the value " + query),
              std::string::npos);
  }
}

TEST_F(RulerTest, CommonWordsAreTheMostCommon) {
  const RulerBuilder b = Builder();
  for (int64_t len : {kLen, int64_t{8192}}) {
    SCOPED_TRACE(len);
    auto s = b.Build("cwe", len, 0);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const std::string head = "Memorize the ones that appear most often.\n";
    const size_t start = s->text.context.rfind(head);
    ASSERT_NE(start, std::string::npos);
    std::map<std::string, int> count;
    int index = 0;
    const std::vector<std::string> w = Words(s->text.context.substr(start + head.size()));
    ASSERT_EQ(w.size() % 2, 0u);
    for (size_t j = 0; j < w.size(); j += 2) {
      EXPECT_EQ(w[j], std::to_string(++index) + ".");
      count[w[j + 1]]++;
    }
    ASSERT_EQ(s->text.expected.size(), 10u);
    int min_common = 1 << 30, max_other = 0;
    for (const auto& [word, n] : count) {
      const bool common = std::find(s->text.expected.begin(), s->text.expected.end(), word) !=
                          s->text.expected.end();
      if (common)
        min_common = std::min(min_common, n);
      else
        max_other = std::max(max_other, n);
    }
    for (const auto& e : s->text.expected) EXPECT_GT(count[e], 0) << e;
    EXPECT_GT(min_common, max_other);
    EXPECT_EQ(min_common, len < 4096 ? 6 : 30);
  }
}

TEST_F(RulerTest, FrequentWordsAreTheMostFrequent) {
  const RulerBuilder b = Builder();
  for (int64_t i = 0; i < 3; ++i) {
    auto s = b.Build("fwe", kLen, i);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const std::string head = "Find the three most frequently appeared coded words. ";
    const size_t start = s->text.context.find(head);
    ASSERT_NE(start, std::string::npos);
    std::map<std::string, int> count;
    for (const auto& w : Words(s->text.context.substr(start + head.size()))) count[w]++;
    ASSERT_EQ(s->text.expected.size(), 3u);
    int min_top = 1 << 30, max_other = 0;
    for (const auto& [word, n] : count) {
      if (word == "...") continue;  // the noise rank, which the question says to ignore
      const bool top = std::find(s->text.expected.begin(), s->text.expected.end(), word) !=
                       s->text.expected.end();
      if (top)
        min_top = std::min(min_top, n);
      else
        max_other = std::max(max_other, n);
    }
    for (const auto& e : s->text.expected) EXPECT_GT(count[e], 0) << e;
    EXPECT_GT(min_top, max_other);
    EXPECT_GT(count["..."], min_top);
  }
}

TEST_F(RulerTest, ChatTemplateSplitsAtTheEndOfTheContext) {
  RulerBuilderOptions o;
  o.chat_template = "chatml";
  auto b = RulerBuilder::Create(*model_, o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->chat_name(), "chatml");
  auto s = b->Build("niah_single_2", kLen, 0);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const Tokenizer& tok = *model_->tokenizer();
  const std::string before = tok.Decode(s->context_ids, /*render_special=*/true);
  const std::string after = tok.Decode(s->question_ids, /*render_special=*/true);
  // The user turn opens before the context; the question, the assistant header and the answer
  // prefix come after the compression point.
  EXPECT_NE(before.find("user"), std::string::npos);
  EXPECT_EQ(before.find("assistant"), std::string::npos);
  EXPECT_EQ(before.find("What is the special magic"), std::string::npos);
  EXPECT_NE(after.find("What is the special magic"), std::string::npos);
  EXPECT_LT(after.find("What is the special magic"), after.find("assistant"));
  EXPECT_NE(after.find("mentioned in the provided text is"), std::string::npos);
  RulerBuilderOptions none;
  none.chat_template = "none";
  auto plain = RulerBuilder::Create(*model_, none);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->chat_name(), "none");
  EXPECT_FALSE(RulerBuilder::Create(*model_, RulerBuilderOptions{1, "no-such-template", ""}).ok());
}

TEST_F(RulerTest, AnswerReadsTheCompressedCacheAndIsScored) {
  const RulerBuilder b = Builder();
  auto s = b.Build("niah_single_1", 1024, 0);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ThreadPool pool(1);
  auto config = SingleConfig("streaming", std::string("4"), {});
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto cache = PrefillRulerContext(*model_, *s, RegistryFactory(), *config, 256, &pool);
  ASSERT_TRUE(cache.ok()) << cache.status().ToString();
  EXPECT_EQ((*cache)->n_tokens(), static_cast<int64_t>(s->context_ids.size()));
  auto a = AnswerRulerQuestion(*model_, *s, cache->get(), 256, &pool);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_LE(static_cast<int>(a->ids.size()), s->max_new_tokens);
  EXPECT_DOUBLE_EQ(a->score, RulerStringMatchAll(a->text, s->text.expected));
  EXPECT_LT(a->achieved.kept_fraction(), 1.0);  // the context was compressed before the question
}

// The other questions a context answers: each names a key the context holds with its own value,
// none is RULER's question, each fits the length; the tasks with one answerable question have
// none; the sample's own text does not depend on them.
TEST_F(RulerTest, OtherQuestionsAskOtherKeysOfTheSameContext) {
  const RulerBuilder b = Builder();
  for (const std::string task : {"niah_multikey_1", "niah_multikey_2", "niah_multikey_3"}) {
    for (int64_t i = 0; i < 3; ++i) {
      SCOPED_TRACE(task + " sample " + std::to_string(i));
      auto s = b.Build(task, kLen, i);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      const RulerText& t = s->text;
      ASSERT_GE(t.others.size(), task == "niah_multikey_1" ? 3u : 2u);
      ASSERT_EQ(s->other_question_ids.size(), t.others.size());
      std::set<std::string> questions = {t.question};
      for (size_t k = 0; k < t.others.size(); ++k) {
        const auto& q = t.others[k];
        ASSERT_EQ(q.expected.size(), 1u);
        EXPECT_TRUE(questions.insert(q.question).second) << "asked twice: " << q.question;
        // "... for KEY is: VALUE." is in the context, once, with the question's KEY.
        const std::string& v = q.expected[0];
        const size_t at = t.context.find(" is: " + v + ".");
        ASSERT_NE(at, std::string::npos) << v;
        const size_t for_at = t.context.rfind(" for ", at);
        const std::string key = t.context.substr(for_at + 5, at - for_at - 5);
        EXPECT_NE(q.question.find(key), std::string::npos) << key << " / " << q.question;
        EXPECT_NE(q.answer_prefix.find(key), std::string::npos);
        EXPECT_EQ(t.context.find(" for " + key + " is: ", at + 1), std::string::npos)
            << "the key recurs";
        EXPECT_LE(static_cast<int64_t>(s->context_ids.size() + s->other_question_ids[k].size()) +
                      s->max_new_tokens,
                  kLen);
      }
    }
  }
  for (const std::string task : {"niah_single_1", "niah_single_2", "niah_multivalue",
                                 "niah_multiquery", "vt", "cwe"}) {
    auto s = b.Build(task, kLen, 0);
    ASSERT_TRUE(s.ok()) << task;
    EXPECT_TRUE(s->text.others.empty()) << task;
  }
}

// --questions N: one prefill and compression per sample and config, each question answered from
// its own fork; RULER's question scores exactly as in a run without the others, and every
// question is a sample of its task.
TEST_F(RulerTest, SharedContextQuestionsAnswerFromForks) {
  RulerOptions o;
  o.tasks = {"niah_multikey_1", "niah_single_1"};
  o.lengths = {1024};
  o.samples = 2;
  o.policies = {"full", "streaming", "kivi2"};
  o.ratios = {"4"};
  auto one = RunRuler(*model_, o, nullptr);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  o.questions = 3;
  auto three = RunRuler(*model_, o, nullptr);
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  ASSERT_EQ(one->samples.size(), 4u);
  ASSERT_EQ(three->samples.size(), 2u * 3 + 2u);  // multikey_1: 3 questions; single_1: 1
  const RulerBuilder b = Builder();
  for (const auto& rec : three->samples) {
    SCOPED_TRACE(rec.task + " " + std::to_string(rec.index) + " q" + std::to_string(rec.question));
    if (rec.question == 0) {
      const auto it = std::find_if(one->samples.begin(), one->samples.end(), [&](const auto& x) {
        return x.task == rec.task && x.index == rec.index;
      });
      ASSERT_NE(it, one->samples.end());
      EXPECT_EQ(rec.answers, it->answers);  // the fork answers as the cache itself did
      EXPECT_EQ(rec.scores, it->scores);
      continue;
    }
    EXPECT_EQ(rec.task, "niah_multikey_1");
    // Against a fresh prefill of the same context answering the same question, per config.
    auto s = b.Build(rec.task, 1024, rec.index);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(rec.expected, s->text.others[rec.question - 1].expected);
    ThreadPool pool(1);
    for (size_t c = 0; c < three->configs.size(); ++c) {
      auto cache = PrefillRulerContext(*model_, *s, RegistryFactory(), three->configs[c], 256,
                                       &pool);
      ASSERT_TRUE(cache.ok());
      auto a = AnswerRulerQuestion(*model_, *s, cache->get(), 256, &pool, rec.question);
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      EXPECT_EQ(a->text, rec.answers[c]) << three->configs[c].Label();
    }
  }
  for (const auto& cell : three->cells) {
    EXPECT_EQ(cell.n, cell.task == "niah_multikey_1" ? 6 : 2) << cell.task;
  }
  o.questions = 0;
  auto bad = RunRuler(*model_, o, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--questions must be >= 1"), std::string::npos);
}

}  // namespace
}  // namespace strata::eval
