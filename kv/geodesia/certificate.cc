// Geodesia-KV attention error certificate (see certificate.h).
#include "kv/geodesia/certificate.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/dtype.h"

namespace strata::geodesia {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

double LogSumExp(const std::vector<double>& x) {
  double m = -kInf;
  for (double v : x) m = std::max(m, v);
  if (m == -kInf) return -kInf;
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}
}  // namespace

double CertificateBound(const double* mass, const double* eps, const double* delta,
                        int64_t n_blocks, double max_v_norm) {
  double value_term = 0;
  bool hard = false;
  std::vector<double> lp, lm;
  for (int64_t b = 0; b < n_blocks; ++b) {
    if (eps[b] == kInf) hard = true;
    if (mass[b] <= 0) continue;
    value_term += mass[b] * delta[b];
    if (eps[b] == kInf) continue;
    lp.push_back(std::log(mass[b]) + eps[b]);
    lm.push_back(std::log(mass[b]) - eps[b]);
  }
  double l1 = 2.0;
  if (!hard && !lp.empty()) {
    // log(M+ / M-) >= 0; above 20 the term exceeds its cap of 2 (e^20 - e^-20 > 2), so the
    // clamp of the exponent to [-20, 20] never lowers the bound.
    const double r = std::min(20.0, std::max(-20.0, LogSumExp(lp) - LogSumExp(lm)));
    l1 = std::clamp(std::exp(r) - std::exp(-r), 0.0, 2.0);
  } else if (!hard) {
    l1 = 0;  // nothing attended
  }
  return value_term + l1 * max_v_norm;
}

CertificateTerms CertifyHead(const GradedLayer& layer, int h, const float* q, float scale,
                             double q_norm, const int64_t* selected, int64_t n_selected) {
  const PackedHeadView view = layer.view(h);
  const int D = view.head_dim, P = kBlockTokens;
  const int64_t nb = view.n_blocks;
  CertificateTerms t;
  t.mass.assign(nb, 0.0);
  t.eps.assign(nb, 0.0);
  t.delta.assign(nb, 0.0);
  std::vector<char> read(nb, selected ? 0 : 1);
  for (int64_t i = 0; selected && i < n_selected; ++i) read[selected[i]] = 1;
  // Logits of every attended row with its block, in f64.
  std::vector<double> logit;
  std::vector<int64_t> owner;
  std::vector<double> k(P * D), v(P * D);
  for (int64_t b = 0; b < nb; ++b) {
    const int nv = view.n_valid[b];
    ReconstructBlock(view, b, k.data(), v.data());
    // max ||v_j|| over exact values: recorded at close; the open block is exact, so its rows.
    if (layer.closed(b)) {
      t.max_v_norm = std::max<double>(t.max_v_norm, layer.v_norm_max(h, b));
    } else {
      for (int r = 0; r < nv; ++r) {
        double s = 0;
        for (int c = 0; c < D; ++c) s += v[r * D + c] * v[r * D + c];
        t.max_v_norm = std::max(t.max_v_norm, std::sqrt(s));
      }
    }
    t.delta[b] = layer.ev(h, b);
    if (!read[b]) {
      t.eps[b] = kInf;
      continue;
    }
    t.eps[b] = static_cast<double>(scale) * q_norm * layer.ek(h, b);
    const uint64_t over =
        view.res_mask ? view.res_mask[b] & (nv >= 64 ? ~uint64_t{0} : (uint64_t{1} << nv) - 1) : 0;
    auto dot = [&](const double* row) {
      double s = 0;
      for (int c = 0; c < D; ++c) s += static_cast<double>(q[c]) * row[c];
      return s * scale;
    };
    if (view.level[b] == 1) {
      const int n = nv - std::popcount(over);
      if (n > 0) {
        logit.push_back(dot(k.data()) + std::log(static_cast<double>(n)));
        owner.push_back(b);
      }
    } else {
      for (int r = 0; r < nv; ++r) {
        if ((over >> r) & 1) continue;
        logit.push_back(dot(k.data() + r * D));
        owner.push_back(b);
      }
    }
    for (uint64_t mm = over; mm != 0; mm &= mm - 1) {
      const int tok = std::countr_zero(mm);
      const uint64_t below = tok == 0 ? 0 : (view.res_mask[b] & ((uint64_t{1} << tok) - 1));
      const int64_t row = view.res_begin[b] + std::popcount(below);
      std::vector<double> kr(D);
      for (int c = 0; c < D; ++c) kr[c] = Bf16ToF32(view.res_k[row * D + c]);
      logit.push_back(dot(kr.data()));
      owner.push_back(b);
    }
  }
  if (!logit.empty()) {
    const double m = *std::max_element(logit.begin(), logit.end());
    double den = 0;
    for (double s : logit) den += std::exp(s - m);
    for (size_t i = 0; i < logit.size(); ++i) t.mass[owner[i]] += std::exp(logit[i] - m) / den;
  }
  for (int64_t b = 0; b < nb; ++b) t.value_term += t.mass[b] * t.delta[b];
  t.bound = CertificateBound(t.mass.data(), t.eps.data(), t.delta.data(), nb, t.max_v_norm);
  t.l1_term = t.max_v_norm > 0 ? (t.bound - t.value_term) / t.max_v_norm : 0;
  return t;
}

}  // namespace strata::geodesia
