// The KV storage types (--kv-type, issue 19 defect 13): f32 and f16 stores read by the full
// policy through the attention kernels, accounting in the stored width, and the refusal of the
// policies whose formats are defined over bf16 rows.
#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/status_testing.h"
#include "kv/cache.h"
#include "kv/registry.h"

namespace strata {
namespace {

LayerGeometry Mla(DType t) {
  LayerGeometry g;
  g.kind = AttnKind::kMla;
  g.n_q_heads = 5;  // > 4 heads and widths that are not whole vectors: the staged kernel path
  g.n_kv_heads = 1;
  g.k_dim = 40;
  g.v_dim = 32;
  g.rope_dim = 8;
  g.rope = false;
  g.scale = 0.3f;
  g.kv_type = t;
  return g;
}

LayerGeometry Gqa(DType t) {
  LayerGeometry g;
  g.kind = AttnKind::kGqa;
  g.n_q_heads = 8;  // groups of 4: bf16 rows are read in registers, others staged
  g.n_kv_heads = 2;
  g.k_dim = 64;
  g.v_dim = 64;
  g.rope_dim = 64;
  g.scale = 0.125f;
  g.kv_type = t;
  return g;
}

// The value x as the store of type t holds it.
double Stored(DType t, float x) {
  if (t == DType::kF32) return x;
  if (t == DType::kF16) return F16ToF32(F32ToF16(x));
  return Bf16ToF32(F32ToBf16(x));
}

struct Rows {
  std::vector<std::vector<float>> k, v;  // [n][n_kv_heads * dim] as appended (f32)
};

// float64 attention of q over rows [0, n) with every value as `as` stores it (kF32: exact).
std::vector<double> Reference(const LayerGeometry& g, const Rows& r, const std::vector<float>& q,
                              DType as) {
  const int64_t n = static_cast<int64_t>(r.k.size());
  const bool mla = g.kind == AttnKind::kMla;
  std::vector<double> out(static_cast<size_t>(g.n_q_heads) * g.v_dim, 0.0);
  for (int h = 0; h < g.n_q_heads; ++h) {
    const int kh = h / g.group_size();
    std::vector<double> s(n);
    double mx = -1e300;
    for (int64_t u = 0; u < n; ++u) {
      double a = 0;
      for (int c = 0; c < g.k_dim; ++c) {
        a += static_cast<double>(q[h * g.k_dim + c]) * Stored(as, r.k[u][kh * g.k_dim + c]);
      }
      s[u] = a * g.scale;
      mx = std::max(mx, s[u]);
    }
    double z = 0;
    for (int64_t u = 0; u < n; ++u) z += std::exp(s[u] - mx);
    for (int64_t u = 0; u < n; ++u) {
      const double w = std::exp(s[u] - mx) / z;
      for (int c = 0; c < g.v_dim; ++c) {
        const float x = mla ? r.k[u][c] : r.v[u][kh * g.v_dim + c];
        out[h * g.v_dim + c] += w * Stored(as, x);
      }
    }
  }
  return out;
}

// The full policy over an f32 or f16 store is exact attention over the stored values (to f32
// accumulation, 2e-5 as for bf16), so with f32 it matches attention over the rows as appended;
// bf16 rows are ~100x further from them. Rows span several pages and both thread counts.
TEST(KvTypeTest, FullPolicyReadsEveryStoredType) {
  const uint64_t seed = TestSeed();
  for (bool mla : {false, true}) {
    double err_f32 = 0, err_bf16 = 0;
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(std::string(mla ? "MLA" : "GQA") + " kv " + KvTypeName(t) + " seed " +
                   std::to_string(seed));
      Rng rng(seed);
      const LayerGeometry g = mla ? Mla(t) : Gqa(t);
      auto made = KvCache::Create({g}, std::make_unique<FullPolicy>());
      ASSERT_OK(made.status());
      KvCache& c = **made;
      const int64_t n = 150;
      Rows rows;
      ASSERT_OK(c.BeginCall(n, CallKind::kPrefill));
      for (int64_t u = 0; u < n; ++u) {
        rows.k.emplace_back(g.n_kv_heads * g.k_dim);
        rows.v.emplace_back(g.n_kv_heads * g.v_dim);
        for (auto& x : rows.k.back()) x = static_cast<float>(rng.Normal());
        for (auto& x : rows.v.back()) x = static_cast<float>(rng.Normal());
        ASSERT_OK(c.Append(0, rows.k.back().data(), rows.v.back().data()));
      }
      std::vector<float> q(g.n_q_heads * g.k_dim), out(g.n_q_heads * g.v_dim);
      for (auto& x : q) x = static_cast<float>(rng.Normal());
      const std::vector<double> own = Reference(g, rows, q, t);
      const std::vector<double> plain = Reference(g, rows, q, DType::kF32);
      ThreadPool pool(2);
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        ASSERT_OK(c.Attend(0, q.data(), n - 1, p, out.data()));
        for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], own[i], 2e-5) << i;
      }
      double err = 0;
      for (size_t i = 0; i < out.size(); ++i) err = std::max(err, std::fabs(out[i] - plain[i]));
      if (t == DType::kF32) err_f32 = err;
      if (t == DType::kBF16) err_bf16 = err;
      ASSERT_OK(c.EndCall());
      // Accounting in the stored width: f32 rows are twice the bytes.
      EXPECT_EQ(g.bytes_per_token(),
                (t == DType::kF32 ? 4 : 2) *
                    (mla ? g.k_dim : int64_t{g.n_kv_heads} * (g.k_dim + g.v_dim)));
      EXPECT_EQ(c.ResidentBytes(), c.FullResidentBytes());
      EXPECT_EQ(c.FullResidentBytes(), 3 * LayerStore::kPageRows * g.bytes_per_token());
      // The stored rows read back as the type rounds them.
      std::vector<float> back(g.k_dim);
      c.store(0).KeyRowF32(g.n_kv_heads - 1, 77, back.data());
      for (int i = 0; i < g.k_dim; ++i) {
        ASSERT_EQ(back[i], static_cast<float>(
                               Stored(t, rows.k[77][(g.n_kv_heads - 1) * g.k_dim + i])));
      }
    }
    EXPECT_LT(err_f32 * 100, err_bf16) << "f32 " << err_f32 << " bf16 " << err_bf16;
  }
}

// The compressed policies' formats (quantised blocks, scores, archives) are defined over bf16
// rows: an f32 or f16 cache is refused at creation with an error naming the policy and the type.
TEST(KvTypeTest, PoliciesOverBf16RowsRefuseOtherTypes) {
  for (const PolicyInfo& info : Policies()) {
    if (info.name == "full") continue;
    for (DType t : {DType::kF32, DType::kF16}) {
      auto spec = ParsePolicySpec(info.name);
      ASSERT_OK(spec.status());
      auto policy = MakePolicy(*spec);
      ASSERT_OK(policy.status());
      const LayerGeometry g = Mla(t);
      auto made = KvCache::Create({g}, std::move(policy).value());
      ASSERT_FALSE(made.ok()) << info.name;
      EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(made.status().message().find("policy '" + info.name + "'"), std::string::npos)
          << made.status().message();
      EXPECT_NE(made.status().message().find("--kv-type " + KvTypeName(t)), std::string::npos)
          << made.status().message();
    }
  }
  EXPECT_EQ(ParseKvType("F32").value(), DType::kF32);
  EXPECT_EQ(ParseKvType("bf16").value(), DType::kBF16);
  auto bad = ParseKvType("f64");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'f64'"), std::string::npos);
}

}  // namespace
}  // namespace strata
