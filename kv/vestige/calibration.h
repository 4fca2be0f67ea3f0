// VestigeKV recall-tier calibration rules: the basis fit, the z fits (prefix ladder, decode
// conformal order statistic) and the entropy gate, as pure functions of labelled calibration rows.
//
// RecallTier (recall.h) gathers the labels (which needs the store and the archive); everything
// here is testable on known inputs. Reference: docs/reference/vestigekv.md §3.1 (basis), §3.3
// (decode form), §3.4 (prefix form), §8.2 (open edge cases).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/vestige/recall.h"

namespace strata {

constexpr float kRecallZMax = 8.f;                    // Z_MAX: the provisional and clamped z
constexpr double kRecallTarget = 0.90;                 // tau
constexpr double kRecallScanTarget = 18.0 / 19.0;      // tau / (1 - gate_alpha), decode form
constexpr double kRecallGateAlphaDecode = 0.05;        // (1 - tau) / 2
constexpr int64_t kRecallMinRowsDecode = 18;           // ceil(s / (1 - s) - 1e-9), s = 18/19
constexpr double kRecallGateAlphaPrefix = 0.03;
constexpr int64_t kRecallMinHardPrefix = 6;            // "more than 5 hard rows"
constexpr double kRecallGateOffFraction = 0.60;        // auto-off above this share of rows
constexpr float kRecallZNoHard = 2.0f;                 // prefix ladder without hard rows
// The prefix z ladder, tried in order.
inline constexpr float kRecallZLadder[] = {0.f, .5f, 1.f, 1.5f, 2.f, 2.5f, 3.f, 4.f, 5.f, 6.f, 8.f};

// V_r: the top-`rank` eigenvectors, in descending eigenvalue order, of X_c^T X_c where X_c is x
// [n, d] f32 minus its column mean (f64 Gram, LAPACK dsyevr). basis: [rank, d] f32 orthonormal
// rows; each row's sign is fixed so that its largest-magnitude entry is positive (deterministic).
// eigenvalues (optional): the rank eigenvalues, descending. InvalidArgument for n < 1 or rank
// outside [1, d]; Internal naming LAPACK's info code if the solver fails. `pool` (may be null)
// splits the Gram's rows; each entry is summed over x's rows in order either way.
Status FitRecallBasis(const float* x, int64_t n, int d, int rank, float* basis,
                      std::vector<double>* eigenvalues = nullptr, ThreadPool* pool = nullptr);

// The alpha-quantile of v with linear interpolation between order statistics (numpy "linear":
// position alpha * (n - 1)). CHECKs a non-empty v and alpha in [0, 1].
double QuantileLinear(std::vector<double> v, double alpha);

// Entropy gate: thr = QuantileLinear(hard, alpha) when hard.size() >= min_hard, else -inf; if more
// than kRecallGateOffFraction of `all` (every calibration row) have entropy > thr, the gate is off
// (thr = -inf). A -inf threshold means "always scan".
struct GateFit {
  float thr = -1.f / 0.f;
  bool off = false;   // auto-off fired (a finite quantile was discarded)
  int64_t n_hard = 0;
};
GateFit FitGate(const std::vector<double>& hard, const std::vector<double>& all, double alpha,
                int64_t min_hard);

// Decode form (§3.3): z_q per calibration row with an archived row. n < 18: z = Z_MAX. Else
// z = min(z_(k), Z_MAX) with z_(k) the k-th smallest, k = ceil((n + 1) * 18/19 - 1e-9) (capped at
// n), then the floor (kZero: max(z, 0)).
struct ConformalFit {
  float z = kRecallZMax;
  int64_t n = 0;
  int64_t k = 0;           // 0 when n < 18
  bool clamped = false;    // Z_MAX or the floor changed the order statistic
};
ConformalFit FitConformalZ(std::vector<double> z_q, RecallZFloor floor);

// Prefix form (§3.4): one entry per hard calibration row (target archived), with the serve-time
// idx/cert of the target, the attended max and whether the gate is open for that row. z = the
// first ladder rung whose recall (share of rows with gate_open && idx + z * cert > max1 - margin)
// is >= 0.90; no rows: 2.0; no rung reaches it: 8.0. The floor is applied too (all rungs >= 0).
struct LadderRow {
  float idx = 0.f;
  float cert = 0.f;
  float max1 = 0.f;
  bool gate_open = true;
};
float FitLadderZ(const std::vector<LadderRow>& hard_rows, float margin);

// z_q = (true_q - idx_q) / max(cert_q, 1e-12) in f64 (§3.3 step 3).
inline double ZRequirement(double true_score, float idx, float cert) {
  const double c = cert > 1e-12f ? static_cast<double>(cert) : 1e-12;
  return (true_score - static_cast<double>(idx)) / c;
}

}  // namespace strata
