// Sampler: each stage of the chain against distributions computed by hand, the chain's order,
// the repetition penalty's window and sign rule, greedy equal to a plain argmax, seeded draws.
#include "model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "core/rng.h"

namespace strata {
namespace {

// Four tokens; softmax at temperature 1 is e^(l-3) / (1 + e^-1 + e^-2 + e^-3):
// id 2: 0.643914, id 1: 0.236883, id 0: 0.087144, id 3: 0.032059.
const std::vector<float> kLogits = {1.f, 2.f, 3.f, 0.f};

SamplerOptions Opts(float temp) {
  SamplerOptions o;
  o.temperature = temp;
  return o;
}

void ExpectDistribution(const std::vector<Sampler::Candidate>& got,
                        const std::vector<std::pair<int32_t, double>>& want) {
  ASSERT_EQ(got.size(), want.size());
  double sum = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].id, want[i].first) << "rank " << i;
    EXPECT_NEAR(got[i].p, want[i].second, 1e-6) << "id " << want[i].first;
    sum += got[i].p;
  }
  EXPECT_NEAR(sum, 1.0, 1e-12);
}

TEST(Sampler, PlainSoftmaxAtTemperatureOneAndHalf) {
  Sampler s(Opts(1.f));
  ExpectDistribution(s.Distribution(kLogits.data(), 4),
                     {{2, 0.643914}, {1, 0.236883}, {0, 0.087144}, {3, 0.032059}});
  // T = 0.5: weights e^(2(l-3)) = 1, e^-2, e^-4, e^-6 (sum 1.156135).
  Sampler h(Opts(0.5f));
  ExpectDistribution(h.Distribution(kLogits.data(), 4),
                     {{2, 0.864955}, {1, 0.117059}, {0, 0.015842}, {3, 0.002144}});
}

TEST(Sampler, TopKKeepsTheKBest) {
  SamplerOptions o = Opts(1.f);
  o.top_k = 2;  // ids 2, 1: 1 / (1 + e^-1), e^-1 / (1 + e^-1)
  Sampler s(o);
  ExpectDistribution(s.Distribution(kLogits.data(), 4), {{2, 0.731059}, {1, 0.268941}});
  o.top_k = 10;  // more than the vocabulary: everything
  Sampler all(o);
  EXPECT_EQ(all.Distribution(kLogits.data(), 4).size(), 4u);
}

TEST(Sampler, TopPIsCutAtTemperatureOneThenTheTemperatureApplies) {
  // At T = 1 the cumulative mass is 0.6439, 0.8808: top-p 0.8 keeps ids 2 and 1. Had the
  // temperature (2) been applied first, the mass would be 0.4551, 0.7311 and three would stay.
  SamplerOptions o = Opts(2.f);
  o.top_p = 0.8f;
  Sampler s(o);
  // T = 2 over the survivors: weights 1, e^-0.5.
  ExpectDistribution(s.Distribution(kLogits.data(), 4), {{2, 0.622459}, {1, 0.377541}});
  o.top_p = 0.6f;  // the top token alone already has 0.64
  Sampler one(o);
  ExpectDistribution(one.Distribution(kLogits.data(), 4), {{2, 1.0}});
}

TEST(Sampler, MinPKeepsTokensWithinAFractionOfTheTop) {
  // p_i >= min_p * p_max  <=>  l_i >= 3 + ln(min_p): 0.3 -> 1.796 (ids 2, 1); 0.4 -> 2.084.
  SamplerOptions o = Opts(1.f);
  o.min_p = 0.3f;
  Sampler s(o);
  ExpectDistribution(s.Distribution(kLogits.data(), 4), {{2, 0.731059}, {1, 0.268941}});
  o.min_p = 0.4f;
  Sampler t(o);
  ExpectDistribution(t.Distribution(kLogits.data(), 4), {{2, 1.0}});
  o.min_p = 1.f;  // only the top token (and its ties) stay
  Sampler u(o);
  ExpectDistribution(u.Distribution(kLogits.data(), 4), {{2, 1.0}});
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplerOptions o = Opts(1.f);
  o.repeat_penalty = 2.f;
  Sampler s(o);
  s.Accept(2);
  s.Accept(0);
  s.Accept(2);  // counted once: 3 / 2, not 3 / 4
  // Penalized logits: id 0: 0.5, id 1: 2, id 2: 1.5, id 3: 0 -> weights relative to id 1:
  // 1, e^-0.5, e^-1.5, e^-2 (sum 1.964996).
  ExpectDistribution(s.Distribution(kLogits.data(), 4),
                     {{1, 0.508907}, {2, 0.308668}, {0, 0.113552}, {3, 0.068873}});
  // Greedy sees the penalized logits too.
  o.temperature = 0.f;
  Sampler g(o);
  g.Accept(2);
  EXPECT_EQ(g.Sample(kLogits.data(), 4), 1);
  // A negative logit is multiplied: -1 -> -2 falls below -1.5 (dividing would give -0.5).
  const std::vector<float> neg = {-1.f, -1.5f, -3.f};
  Sampler n(o);
  EXPECT_EQ(n.Sample(neg.data(), 3), 0);
  n.Accept(0);
  EXPECT_EQ(n.Sample(neg.data(), 3), 1);
  // ResetHistory forgets the tokens.
  n.ResetHistory();
  EXPECT_EQ(n.Sample(neg.data(), 3), 0);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesSubtractPerWindowCount) {
  SamplerOptions o = Opts(1.f);
  o.presence_penalty = 0.5f;
  o.frequency_penalty = 0.25f;
  Sampler s(o);
  s.Accept(2);
  s.Accept(2);
  s.Accept(0);
  // id 2: 3 - (2 * 0.25 + 0.5) = 2; id 0: 1 - (0.25 + 0.5) = 0.25; ids 1, 3 unchanged (2, 0).
  std::vector<double> w = {std::exp(0.25), std::exp(2.0), std::exp(2.0), std::exp(0.0)};
  const double sum = w[0] + w[1] + w[2] + w[3];
  ExpectDistribution(s.Distribution(kLogits.data(), 4),
                     {{1, w[1] / sum}, {2, w[2] / sum}, {0, w[0] / sum}, {3, w[3] / sum}});
  // Off (0, 0) with the repetition penalty off too: nothing is recorded, nothing changes.
  SamplerOptions off = Opts(1.f);
  EXPECT_FALSE(off.penalizes());
  off.frequency_penalty = 1.f;
  EXPECT_TRUE(off.penalizes());
}

TEST(Sampler, LogitBiasIsAddedBeforeEveryStage) {
  SamplerOptions o = Opts(0.f);  // greedy: the argmax of the biased logits
  o.logit_bias = {{2, -10.f}, {3, 2.5f}};
  Sampler g(o);
  EXPECT_EQ(g.Sample(kLogits.data(), 4), 3);  // 0 + 2.5 beats 2 (id 1) and 3 - 10
  o.logit_bias = {{2, -10.f}};
  Sampler g2(o);
  EXPECT_EQ(g2.Sample(kLogits.data(), 4), 1);
  // The caller's logits are not modified.
  EXPECT_EQ(kLogits[2], 3.f);
  o.logit_bias = {{-1, 1.f}};
  EXPECT_FALSE(o.Validate().ok());
  o.logit_bias = {{1, std::nanf("")}};
  EXPECT_FALSE(o.Validate().ok());
  o.logit_bias = {{1, std::numeric_limits<float>::infinity()}};
  EXPECT_FALSE(o.Validate().ok());
  o.logit_bias = {{1, -std::numeric_limits<float>::infinity()}, {3, 0.f}};  // a ban
  ASSERT_TRUE(o.Validate().ok());
  Sampler ban(o);
  EXPECT_EQ(ban.Sample(kLogits.data(), 4), 2);
  o.temperature = 1.f;
  Sampler ban_draw(o);
  for (const auto& c : ban_draw.Distribution(kLogits.data(), 4)) EXPECT_NE(c.id, 1);
}

TEST(Sampler, RepetitionPenaltyWindow) {
  SamplerOptions o = Opts(0.f);
  o.repeat_penalty = 4.f;  // id 2: 3 -> 0.75, below id 1's 2
  o.repeat_last_n = 2;
  Sampler s(o);
  s.Accept(2);
  EXPECT_EQ(s.Sample(kLogits.data(), 4), 1);
  s.Accept(0);
  EXPECT_EQ(s.Sample(kLogits.data(), 4), 1);  // window {2, 0}
  s.Accept(3);
  EXPECT_EQ(s.Sample(kLogits.data(), 4), 2);  // window {0, 3}: 2 has left it
  // The default window is 64 tokens; -1 is the whole context; 0 turns the penalty off.
  for (int32_t last_n : {64, -1, 0}) {
    o.repeat_last_n = last_n;
    Sampler w(o);
    w.Accept(2);
    for (int i = 0; i < 70; ++i) w.Accept(3);
    EXPECT_EQ(w.Sample(kLogits.data(), 4), last_n == -1 ? 1 : 2) << "repeat_last_n " << last_n;
  }
}

TEST(Sampler, ChainOrderPenaltyBeforeTopK) {
  SamplerOptions o = Opts(1.f);
  o.repeat_penalty = 4.f;
  o.top_k = 1;  // after the penalty, id 1 is the best
  Sampler s(o);
  s.Accept(2);
  ExpectDistribution(s.Distribution(kLogits.data(), 4), {{1, 1.0}});
  // Top-k before top-p: top-p sees the top-k survivors renormalized. Over ids 2, 1, 0 the
  // mass is 0.665, 0.245, 0.090, so top-p 0.9 stops at two (0.910); over all four (0.644,
  // 0.237, 0.087) it would have kept three (0.881 < 0.9).
  o.repeat_penalty = 1.f;
  o.top_k = 3;
  o.top_p = 0.9f;
  Sampler t(o);
  ExpectDistribution(t.Distribution(kLogits.data(), 4), {{2, 0.731059}, {1, 0.268941}});
  // Without top-k the same top-p keeps three.
  o.top_k = 0;
  Sampler u(o);
  ExpectDistribution(u.Distribution(kLogits.data(), 4),
                     {{2, 0.665241}, {1, 0.244728}, {0, 0.090031}});
}

TEST(Sampler, GreedyIsThePlainArgmaxWithTiesToTheLowestId) {
  Rng rng(3);
  std::vector<float> logits(1000);
  for (int trial = 0; trial < 20; ++trial) {
    for (float& l : logits) l = static_cast<float>(std::round(rng.Normal() * 4));  // many ties
    int64_t best = 0;
    for (int64_t i = 1; i < 1000; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    Sampler s(Opts(0.f));
    EXPECT_EQ(s.Sample(logits.data(), 1000), best);
    s.Accept(static_cast<int32_t>(best));  // the penalty is off: nothing changes
    EXPECT_EQ(s.Sample(logits.data(), 1000), best);
    ExpectDistribution(s.Distribution(logits.data(), 1000), {{static_cast<int32_t>(best), 1.0}});
  }
}

TEST(Sampler, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  SamplerOptions o = Opts(1.f);
  o.seed = 42;
  Sampler a(o), b(o);
  o.seed = 43;
  Sampler c(o);
  std::vector<int32_t> da, db, dc;
  for (int i = 0; i < 200; ++i) {
    da.push_back(a.Sample(kLogits.data(), 4));
    db.push_back(b.Sample(kLogits.data(), 4));
    dc.push_back(c.Sample(kLogits.data(), 4));
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
  // 40,000 draws: each frequency within 0.01 of the hand-computed probability (> 5 sigma).
  std::map<int32_t, int> count;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[a.Sample(kLogits.data(), 4)];
  const std::map<int32_t, double> want = {{2, 0.643914}, {1, 0.236883}, {0, 0.087144},
                                          {3, 0.032059}};
  for (const auto& [id, p] : want) EXPECT_NEAR(count[id] / double(n), p, 0.01) << "id " << id;
}

TEST(Sampler, ValidationNamesTheFlagAndTheValue) {
  const std::vector<std::pair<SamplerOptions, std::string>> cases = [] {
    std::vector<std::pair<SamplerOptions, std::string>> v;
    SamplerOptions o;
    o.temperature = -0.5f;
    v.push_back({o, "--temp must be a finite number >= 0 (0 = greedy), got -0.5"});
    o = {};
    o.top_k = -1;
    v.push_back({o, "--top-k must be >= 0 (0 = off), got -1"});
    o = {};
    o.top_p = 0.f;
    v.push_back({o, "--top-p must be in (0, 1], got 0"});
    o = {};
    o.min_p = 1.5f;
    v.push_back({o, "--min-p must be in [0, 1] (0 = off), got 1.5"});
    o = {};
    o.min_p = NAN;
    v.push_back({o, "--min-p must be in [0, 1] (0 = off), got nan"});
    o = {};
    o.repeat_penalty = 0.f;
    v.push_back({o, "--repeat-penalty must be a finite number > 0 (1 = off), got 0"});
    o = {};
    o.repeat_last_n = -2;
    v.push_back({o, "--repeat-last-n must be >= -1 (-1 = the whole context, 0 = off), got -2"});
    return v;
  }();
  for (const auto& [o, msg] : cases) {
    const Status st = o.Validate();
    EXPECT_FALSE(st.ok()) << msg;
    EXPECT_EQ(st.message(), msg);
  }
  EXPECT_TRUE(SamplerOptions{}.Validate().ok());
}

// Values that are legal as doubles but not after narrowing to the float fields (an HTTP request's
// JSON numbers are doubles) are refused by the same checks.
TEST(Sampler, ValidateChecksTheNarrowedFloats) {
  SamplerOptions o;
  const double tiny = 1e-300, huge = 1e300;
  o.top_p = static_cast<float>(tiny);
  EXPECT_EQ(o.Validate().message(), "--top-p must be in (0, 1], got 0");
  o = {};
  o.temperature = static_cast<float>(huge);
  EXPECT_EQ(o.Validate().message(), "--temp must be a finite number >= 0 (0 = greedy), got inf");
  o = {};
  o.repeat_penalty = static_cast<float>(tiny);
  EXPECT_FALSE(o.Validate().ok());
  o = {};
  o.repeat_penalty = static_cast<float>(huge);
  EXPECT_FALSE(o.Validate().ok());
}

// A NaN or infinite logit is an error naming the position, never a token: with the old argmax a
// NaN at id 0 won every comparison (token 0), and a draw over NaN weights took the last
// candidate.
TEST(Sampler, NonFiniteLogitsAreAnErrorNamingThePosition) {
  for (float temp : {0.f, 0.8f}) {
    SCOPED_TRACE(temp);
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      Sampler s(Opts(temp));
      std::vector<float> logits = kLogits;
      logits[1] = bad;
      const StatusOr<int32_t> got = s.Next(logits.data(), 4, 17);
      ASSERT_FALSE(got.ok());
      EXPECT_EQ(got.status().code(), StatusCode::kDataLoss);
      EXPECT_NE(got.status().message().find("non-finite logits at position 17"),
                std::string::npos)
          << got.status().message();
      EXPECT_NE(got.status().message().find("token 1's logit is"), std::string::npos)
          << got.status().message();
      EXPECT_NE(got.status().message().find("1 of 4 logits"), std::string::npos)
          << got.status().message();
    }
    // Every logit NaN (a NaN norm weight): the first is named.
    Sampler s(Opts(temp));
    const std::vector<float> all_nan(1000, NAN);
    const Status st = Sampler::CheckLogits(all_nan.data(), 1000, 3);
    EXPECT_NE(st.message().find("token 0's logit is nan, 1000 of 1000"), std::string::npos)
        << st.message();
    EXPECT_FALSE(s.Next(all_nan.data(), 1000, 3).ok());
    // Finite logits: Next is Sample.
    Sampler a(Opts(temp)), b(Opts(temp));
    for (int i = 0; i < 8; ++i) {
      const StatusOr<int32_t> n = a.Next(kLogits.data(), 4, i);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      EXPECT_EQ(*n, b.Sample(kLogits.data(), 4));
    }
  }
}

}  // namespace
}  // namespace strata
