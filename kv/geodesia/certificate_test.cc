// Tests of the Geodesia-KV attention error certificate: never violated.
// § numbers cite docs/reference/geodesia-kv.md (the reference behaviour).
#include "kv/geodesia/certificate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"

namespace strata::geodesia {
namespace {

// §12.21: 20 random (T = 1024, D = 32) configurations with demotion to every level
// (cascades included), residual tokens and hard-masked selections; the true ||o - o_hat|| never
// exceeds the bound + 1e-4, and the l1 term stays <= 2.
TEST(GeodesiaCertificate, NeverViolated) {
  const uint64_t seed = TestSeed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int D = 32, T = 1024, H = 1;
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  int n_checked = 0;
  for (int cfg = 0; cfg < 20; ++cfg) {
    SCOPED_TRACE(testing::Message() << "config " << cfg);
    const int g = (cfg % 2) ? 32 : 16;
    GradedLayer layer =
        std::move(GradedLayer::Create({H, D, g, DemotionMode::kCascade})).value();
    std::vector<uint16_t> ek, evv;
    const double kmag = std::exp(rng.Normal() * 0.5);
    for (int t = 0; t < T; ++t) {
      std::vector<uint16_t> k(D), v(D);
      for (int c = 0; c < D; ++c) {
        k[c] = F32ToBf16(static_cast<float>(kmag * (rng.Normal() + 0.5 * (c % 3))));
        v[c] = F32ToBf16(static_cast<float>(rng.Normal()));
      }
      ek.insert(ek.end(), k.begin(), k.end());
      evv.insert(evv.end(), v.begin(), v.end());
      layer.Append(k.data(), v.data());
    }
    const int64_t nb = layer.n_blocks();
    for (int64_t b = 1; b + 2 < nb; ++b) {
      int level = kLevels[rng.Below(kNumLevels)];
      if (level == 16) continue;
      if (rng.Below(3) == 0 && level > 1) {  // a cascade: first a higher level
        ASSERT_TRUE(layer.Demote(0, b, 8).ok() || level == 8);
        if (level == 8) level = 4;
      }
      if (level < layer.level(0, b)) {
        ASSERT_TRUE(layer.Demote(0, b, level).ok());
      }
    }
    for (int r = 0; r < 20; ++r) {
      const int64_t p = rng.Below(T);
      if (!layer.has_residual(0, p)) {
        ASSERT_TRUE(layer.AddResidual(0, p, ek.data() + p * D, evv.data() + p * D).ok());
      }
    }
    for (int qi = 0; qi < 8; ++qi) {
      std::vector<float> q(D);
      const double qs = std::exp(rng.Normal());
      double qn = 0;
      for (auto& x : q) {
        x = static_cast<float>(qs * rng.Normal());
        qn += static_cast<double>(x) * x;
      }
      qn = std::sqrt(qn);
      // Selections: all blocks, or a hard mask keeping half of them.
      std::vector<int64_t> sel;
      for (int64_t b = 0; b < nb; ++b) {
        if (rng.Below(2) == 0 || b == nb - 1) sel.push_back(b);
      }
      for (int pass = 0; pass < 2; ++pass) {
        const int64_t* list = pass ? sel.data() : nullptr;
        const int64_t n_list = pass ? static_cast<int64_t>(sel.size()) : nb;
        const CertificateTerms ct = CertifyHead(layer, 0, q.data(), scale, qn, list, n_list);
        // True outputs in f64: exact dense attention vs the compressed one.
        std::vector<double> o(D, 0.0), oh(D, 0.0);
        {
          std::vector<double> s(T);
          double m = -1e300, den = 0;
          for (int t = 0; t < T; ++t) {
            double a = 0;
            for (int c = 0; c < D; ++c) a += static_cast<double>(q[c]) * Bf16ToF32(ek[t * D + c]);
            s[t] = a * scale;
            m = std::max(m, s[t]);
          }
          for (int t = 0; t < T; ++t) {
            const double p = std::exp(s[t] - m);
            den += p;
            for (int c = 0; c < D; ++c) o[c] += p * Bf16ToF32(evv[t * D + c]);
          }
          for (int c = 0; c < D; ++c) o[c] /= den;
        }
        {
          const PackedHeadView view = layer.view(0);
          std::vector<double> kb(64 * D), vb(64 * D), s, w;
          std::vector<std::vector<double>> vals;
          std::vector<char> read(nb, pass ? 0 : 1);
          for (int64_t b : sel) read[b] = 1;
          for (int64_t b = 0; b < nb; ++b) {
            if (!read[b]) continue;
            ReconstructBlock(view, b, kb.data(), vb.data());
            for (int t = 0; t < view.n_valid[b]; ++t) {
              const int64_t pos = b * 64 + t;
              const bool over = layer.has_residual(0, pos);
              const double* kr = kb.data() + t * D;
              const double* vr = vb.data() + t * D;
              std::vector<double> kx(D), vx(D);
              for (int c = 0; c < D; ++c) {
                kx[c] = over ? Bf16ToF32(ek[pos * D + c]) : kr[c];
                vx[c] = over ? Bf16ToF32(evv[pos * D + c]) : vr[c];
              }
              double a = 0;
              for (int c = 0; c < D; ++c) a += static_cast<double>(q[c]) * kx[c];
              s.push_back(a * scale);
              vals.push_back(vx);
            }
          }
          const double m = *std::max_element(s.begin(), s.end());
          double den = 0;
          for (size_t i = 0; i < s.size(); ++i) {
            const double p = std::exp(s[i] - m);
            den += p;
            for (int c = 0; c < D; ++c) oh[c] += p * vals[i][c];
          }
          for (int c = 0; c < D; ++c) oh[c] /= den;
        }
        double err = 0;
        for (int c = 0; c < D; ++c) err += (o[c] - oh[c]) * (o[c] - oh[c]);
        err = std::sqrt(err);
        ASSERT_LE(err, ct.bound + 1e-4) << "query " << qi << " pass " << pass;
        ASSERT_LE(ct.l1_term, 2.0 + 1e-12);
        ASSERT_GE(ct.l1_term, 0.0);
        if (pass == 1 && sel.size() < static_cast<size_t>(nb)) {
          // A hard mask caps the l1 term: bound = sum a delta + 2 max ||v||.
          EXPECT_NEAR(ct.bound, ct.value_term + 2 * ct.max_v_norm, 1e-9 * ct.bound);
        }
        ++n_checked;
      }
    }
  }
  EXPECT_EQ(n_checked, 20 * 8 * 2);
}

TEST(GeodesiaCertificate, BoundFormula) {
  // Two blocks, exact values of norm 1: hand-computed M+ / M-.
  const double mass[2] = {0.25, 0.75}, eps[2] = {0.1, 0.0}, delta[2] = {0.5, 0.0};
  const double mp = 0.25 * std::exp(0.1) + 0.75, mm = 0.25 * std::exp(-0.1) + 0.75;
  EXPECT_NEAR(CertificateBound(mass, eps, delta, 2, 1.0), 0.125 + (mp / mm - mm / mp), 1e-12);
  // Exact cache: zero bound.
  const double zero[2] = {0, 0};
  EXPECT_EQ(CertificateBound(mass, zero, zero, 2, 3.0), 0.0);
  // Hard mask: the l1 term is 2.
  const double inf[2] = {std::numeric_limits<double>::infinity(), 0.0};
  const double m2[2] = {0.0, 1.0};
  EXPECT_DOUBLE_EQ(CertificateBound(m2, inf, zero, 2, 3.0), 6.0);
}

}  // namespace
}  // namespace strata::geodesia
