// Token sampling: greedy, or llama.cpp's chain (repetition penalty, top-k, top-p, min-p,
// temperature, then a draw), reproducible from a seed.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/status.h"

namespace strata {

// The defaults turn every stage off except what the CLI asks for; flag names are llama.cpp's
// (--temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --seed), and the error
// messages name them.
struct SamplerOptions {
  float temperature = 0.f;  // 0: greedy (argmax; ties to the lowest id)
  int32_t top_k = 0;        // keep the k most likely tokens; 0 = off
  float top_p = 1.f;        // keep the smallest set of top tokens whose probability >= top_p
  float min_p = 0.f;        // keep tokens with probability >= min_p * the top one's; 0 = off
  // Logits of tokens seen in the last repeat_last_n context tokens: a positive logit is divided
  // by the penalty, a negative one multiplied (so the token always becomes less likely); each
  // distinct token once, however often it occurs. 1 = off.
  float repeat_penalty = 1.f;
  int32_t repeat_last_n = 64;  // -1 = the whole context, 0 = off
  // OpenAI's and llama.cpp's additive penalties over the same window: a token seen c > 0 times
  // in the last repeat_last_n context tokens has frequency_penalty * c + presence_penalty
  // subtracted from its logit (after the repetition penalty). 0 = off.
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  // (token id, bias) added to the logit before every stage (OpenAI's logit_bias; -inf bans).
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;
  // temperature >= 0 and finite; top_k >= 0; top_p in (0, 1]; min_p in [0, 1]; repeat_penalty
  // finite and > 0; repeat_last_n >= -1. The checks are on these float fields, so a value that
  // narrowing from a double made 0 or infinite (top_p 1e-300 -> 0, temperature 1e300 -> inf) is
  // refused like one given so; the errors name the llama.cpp flag and the value. Presence and
  // frequency penalties must be finite; logit_bias ids >= 0 with finite or -inf biases (the caller
  // checks the ids against the vocabulary).
  Status Validate() const;
  bool penalizes() const {
    return repeat_last_n != 0 &&
           (repeat_penalty != 1.f || presence_penalty != 0.f || frequency_penalty != 0.f);
  }
};

class Sampler {
 public:
  struct Candidate {
    int32_t id;
    double p;
  };

  explicit Sampler(const SamplerOptions& o) : o_(o), rng_(o.seed) {}

  // Records a context token (prompt or generated, in order) for the repetition penalty; as
  // llama.cpp's CLI does, the prompt's tokens count too. A no-op when the penalty is off.
  void Accept(int32_t token);
  // Forgets every accepted token (a new conversation); the random stream carries on.
  void ResetHistory();

  // The next token. Greedy (temperature 0) is the argmax of the logits, after the penalty when
  // one is set; with no penalty it reads `logits` only and allocates nothing. The logits must be
  // finite (a NaN makes every comparison false: the argmax would be token 0 and a draw the last
  // candidate); Next checks that first.
  int32_t Sample(const float* logits, int64_t n_vocab);
  // Sample, after CheckLogits: the token that goes at `position` (its index in the sequence,
  // prompt included), or the error of a non-finite logit.
  StatusOr<int32_t> Next(const float* logits, int64_t n_vocab, int64_t position);
  // OK when every logit is finite. Else DataLoss naming `position`, the first bad token id and
  // value and how many there are: a forward pass gives NaN or infinite logits only from a
  // corrupt or broken model file (e.g. NaN block scales in a quantized tensor).
  static Status CheckLogits(const float* logits, int64_t n_vocab, int64_t position);

  // What Sample draws from: the tokens left after the chain, most likely first (ties by id),
  // with probabilities summing to 1. Greedy: the argmax token with probability 1. Draws nothing.
  std::vector<Candidate> Distribution(const float* logits, int64_t n_vocab);

 private:
  // Fills scratch_ with the chain's survivors as (unnormalized weight, id), descending; returns
  // their weight sum.
  double RunChain(const float* logits, int64_t n);
  int32_t Argmax(const float* logits, int64_t n);
  // The logit after the repetition, frequency and presence penalties.
  float Penalized(int32_t id, float logit) const;
  // `logits` with logit_bias added (a copy), or `logits` itself when there is none.
  const float* Biased(const float* logits, int64_t n);

  SamplerOptions o_;
  Rng rng_;
  std::deque<int32_t> window_;                // the last repeat_last_n accepted tokens
  std::unordered_map<int32_t, int32_t> seen_;  // token -> occurrences in window_
  std::vector<float> biased_;
  std::vector<std::pair<float, int32_t>> scratch_;
  std::vector<double> weights_;
};

}  // namespace strata
