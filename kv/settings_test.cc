// The settings schema (kv/settings.h) and its use by the registry: type/range checks, the error
// messages for unknown, misspelt and inapplicable keys, the one policy-item parser, and that every
// registered policy's declared defaults parse, build and give the same config as before.
#include "kv/settings.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "kv/baselines/baselines.h"
#include "kv/cache.h"
#include "kv/geodesia/policy.h"
#include "kv/registry.h"
#include "kv/vestige/policy.h"

namespace strata {
namespace {

PolicySettings Toy() {
  PolicySettings p;
  p.policy = "toy";
  p.budget = "ratio";
  p.settings = {SettingDecl::Real("ratio", 32, "budget").Min(1).Shared(),
                SettingDecl::Int("block", 4096, "rows").Min(64).Constraint("a multiple of 64"),
                SettingDecl::Bool("recall", true, "tier 2"),
                SettingDecl::Enum("mode", "a", {"a", "b", "c"}, "mode"),
                SettingDecl::Real("keep", 1, "fraction").Min(0, true).Max(1),
                SettingDecl::Int("rank", 64, "rank").Alias("recall-rank"),
                SettingDecl::Int("group", 64, "group").Auto("auto: from the model")};
  return p;
}

TEST(SettingsTest, EditDistance) {
  EXPECT_EQ(EditDistance("recal", "recall"), 1);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
  EXPECT_EQ(EditDistance("", "abc"), 3);
  EXPECT_EQ(EditDistance("same", "same"), 0);
}

TEST(SettingsTest, RoundTripTextReadsBackExactly) {
  for (double v : {32.0, 0.5, 0.125, 0.1, 1e-7, 4096.0, 2.5}) {
    EXPECT_EQ(std::strtod(RoundTripText(v).c_str(), nullptr), v) << RoundTripText(v);
  }
  EXPECT_EQ(RoundTripText(32), "32");
  EXPECT_EQ(RoundTripText(0.5), "0.5");
}

TEST(SettingsTest, ChecksNameKeyAndValue) {
  const PolicySettings t = Toy();
  struct Case {
    std::string key, value, message;
  };
  for (const Case& c : std::vector<Case>{
           {"ratio", "abc", "--ratio = 'abc' is not a finite number"},
           {"ratio", "inf", "--ratio = 'inf' is not a finite number"},
           {"ratio", "0.5", "--ratio = 0.5 must be >= 1"},
           {"block", "12.5", "--block = '12.5' is not an integer"},
           {"block", "99999999999999999999", "--block = '99999999999999999999' is not an integer"},
           {"block", "32", "--block = 32 must be >= 64"},
           {"recall", "maybe", "--recall = 'maybe' must be on or off"},
           {"mode", "d", "--mode = 'd' must be a, b or c"},
           {"keep", "0", "--keep = 0 must be in (0, 1]"},
           {"keep", "1.5", "--keep = 1.5 must be in (0, 1]"},
       }) {
    auto r = ResolveSettings(t, {{c.key, c.value}});
    ASSERT_FALSE(r.ok()) << c.key << "=" << c.value;
    EXPECT_EQ(r.status().message(), c.message);
  }
  EXPECT_EQ(t.Find("block")->RangeText(), ">= 64; a multiple of 64");
  EXPECT_EQ(t.Find("keep")->RangeText(), "(0, 1]");
  EXPECT_EQ(t.Find("mode")->RangeText(), "a | b | c");
  EXPECT_EQ(t.Find("group")->DefaultText(), "auto: from the model");
}

TEST(SettingsTest, ResolveFillsDefaultsAndMapsAliases) {
  auto r = ResolveSettings(Toy(), {{"recall-rank", "16"}, {"recall", "off"}, {"group", "8"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->Int("rank"), 16);
  EXPECT_TRUE(r->given("rank"));
  EXPECT_FALSE(r->Bool("recall"));
  EXPECT_EQ(r->Real("ratio"), 32.0);
  EXPECT_FALSE(r->given("ratio"));
  EXPECT_EQ(r->Int("block"), 4096);
  EXPECT_EQ(r->text("mode"), "a");
  EXPECT_EQ(r->Int("group"), 8);
  auto none = ResolveSettings(Toy(), {});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->given("group"));  // auto: the policy decides
  // A setting and its alias together are one setting given twice.
  auto twice = ResolveSettings(Toy(), {{"rank", "8"}, {"recall-rank", "16"}});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("are the same setting (rank)"), std::string::npos)
      << twice.status().message();
}

TEST(SettingsTest, UnknownKeysNameTheClosestOrWhatThePolicyTakes) {
  auto typo = ResolveSettings(Toy(), {{"recal", "off"}});
  ASSERT_FALSE(typo.ok());
  EXPECT_EQ(typo.status().message(), "unknown setting 'recal' for toy; did you mean 'recall'?");
  auto far = ResolveSettings(Toy(), {{"bits", "5"}});
  ASSERT_FALSE(far.ok());
  EXPECT_EQ(far.status().message(),
            "unknown setting 'bits' for toy; toy takes: ratio, block, recall, mode, keep, rank, "
            "group");
  auto elsewhere = ResolveSettings(Toy(), {{"bits", "5"}}, [](const std::string& k) {
    return k == "bits" ? std::vector<std::string>{"geodesia"} : std::vector<std::string>{};
  });
  ASSERT_FALSE(elsewhere.ok());
  EXPECT_EQ(elsewhere.status().message(),
            "toy does not take 'bits' (a setting of geodesia); toy takes: ratio, block, recall, "
            "mode, keep, rank, group");
}

// The cases, through the registry.
TEST(RegistryTest, ValidatesSpecsBeforeTheMakerRuns) {
  struct Case {
    PolicySpec spec;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"vestige", {{"recal", "off"}}},
            "unknown setting 'recal' for vestige; did you mean 'recall'?"},
           {{"streaming", {{"bits", "5"}}},
            "streaming does not take 'bits' (a setting of geodesia, cquest); streaming takes: "
            "ratio, sinks"},
           {{"full", {{"ratio", "8"}}}, "full does not take 'ratio'"},
           {{"kivi2", {{"ratio", "8"}}}, "kivi2 does not take 'ratio'"},
           {{"geodesia", {{"group", "x"}}}, "--group = 'x' is not an integer"},
           {{"nosuch", {}}, "unknown policy 'nosuch' (available: full, vestige"},
       }) {
    auto p = MakePolicy(c.spec);
    ASSERT_FALSE(p.ok()) << c.spec.name;
    EXPECT_NE(p.status().message().find(c.message), std::string::npos) << p.status().message();
    EXPECT_EQ(ValidatePolicySpec(c.spec).message(), p.status().message());
  }
}

// Every registered policy: the declared defaults are valid values of their own declarations,
// MakePolicy with an empty spec succeeds, and each declared default given explicitly builds too.
TEST(RegistryTest, EveryPolicysDeclaredDefaultsParseAndBuild) {
  ASSERT_FALSE(Policies().empty());
  for (const PolicyInfo& p : Policies()) {
    SCOPED_TRACE(p.name);
    EXPECT_EQ(p.settings.policy, p.name);
    auto empty = MakePolicy({p.name, {}});
    ASSERT_TRUE(empty.ok()) << empty.status().ToString();
    EXPECT_EQ((*empty)->name(), p.name);
    PolicySpec all{p.name, {}};
    for (const SettingDecl& d : p.settings.settings) {
      EXPECT_FALSE(d.help.empty()) << d.name;
      if (!d.auto_default.empty()) continue;
      EXPECT_TRUE(d.Check(d.def).ok()) << d.name << " = " << d.def;
      all.settings[d.name] = d.def;
    }
    auto explicit_defaults = MakePolicy(all);
    ASSERT_TRUE(explicit_defaults.ok()) << explicit_defaults.status().ToString();
    EXPECT_EQ((*explicit_defaults)->describe(), (*empty)->describe());
    if (!p.settings.budget.empty()) {
      EXPECT_TRUE(p.settings.Takes(p.settings.budget));
    }
  }
}

// A shared setting means one thing: the same type wherever it is declared (its --KEY flag is one).
TEST(RegistryTest, SharedSettingsHaveOneTypeEverywhere) {
  std::map<std::string, SettingType> type;
  for (const PolicyInfo& p : Policies()) {
    for (const SettingDecl& d : p.settings.settings) {
      auto [it, fresh] = type.emplace(d.name, d.type);
      EXPECT_EQ(it->second, d.type) << d.name << " in " << p.name;
      if (d.shared) {
        for (const std::string& other : PoliciesDeclaring(d.name)) {
          EXPECT_TRUE(FindPolicy(other)->settings.Find(d.name)->shared)
              << d.name << " is shared in " << p.name << " but not in " << other;
        }
      }
    }
  }
}

// The configs parsed from the declarations' defaults are the ones the parsers' old literal
// defaults gave (the struct initial values), field for field.
TEST(RegistryTest, DefaultsAreTheConfigsInitialValues) {
  auto v = VestigeConfig::FromSpec({"vestige", {}}, false);
  ASSERT_TRUE(v.ok());
  const VestigeConfig vd;
  const RecallOptions rd;
  EXPECT_EQ(v->ratio(), 32.0);
  EXPECT_TRUE(v->selector.ratio.exact);
  EXPECT_EQ(v->block(), vd.selector.block);
  EXPECT_EQ(v->kappa(), vd.selector.kappa);
  EXPECT_EQ(v->selector.sinks, vd.selector.sinks);
  EXPECT_EQ(v->archive, VestigeArchivePlacement::kRam);
  EXPECT_EQ(v->recall, vd.recall);
  EXPECT_FALSE(v->rank_explicit);
  EXPECT_EQ(v->recall_options.rank, rd.rank);
  EXPECT_EQ(v->recall_options.capacity, rd.capacity);
  EXPECT_EQ(v->recall_options.margin, rd.margin);
  EXPECT_EQ(v->recall_options.truncate, rd.truncate);
  EXPECT_EQ(v->recall_options.calibration, rd.calibration);
  EXPECT_EQ(v->recall_options.z_floor, rd.z_floor);
  EXPECT_EQ(v->recall_options.prefix_max_queries, rd.prefix_max_queries);
  EXPECT_EQ(v->recall_options.branch_sidecar, rd.branch_sidecar);
  auto r = VestigeConfig::FromSpec({"vestige", {{"rank", "16"}}}, false);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->rank_explicit);
  EXPECT_EQ(r->recall_options.rank, 16);

  // geodesia's default profile is retrieval, cquest's the reference (the struct's values).
  const GeodesiaConfig ref;
  const GeodesiaConfig ret = GeodesiaConfig::RetrievalProfile(ref);
  EXPECT_EQ(ret.bits, 3.4);
  EXPECT_EQ(ret.floor, 2);
  EXPECT_EQ(ret.sinks, 0);
  EXPECT_EQ(ret.window, 0);
  EXPECT_FALSE(ret.predecessor_exact);
  EXPECT_EQ(ref.floor, 1);
  EXPECT_TRUE(ref.predecessor_exact);
  for (bool cquest : {false, true}) {
    const GeodesiaConfig& gd = cquest ? ref : ret;
    auto g = GeodesiaConfig::FromSpec({cquest ? "cquest" : "geodesia", {}}, cquest);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->profile, gd.profile);
    EXPECT_EQ(g->bits, cquest ? 16.0 : gd.bits);
    EXPECT_EQ(g->floor, gd.floor);
    EXPECT_EQ(g->predecessor_exact, gd.predecessor_exact);
    EXPECT_EQ(g->quest_keep, cquest ? 0.125 : gd.quest_keep);
    EXPECT_TRUE(g->group_auto);
    EXPECT_EQ(g->decay, gd.decay);
    EXPECT_EQ(g->window, gd.window);
    EXPECT_EQ(g->sinks, gd.sinks);
    EXPECT_EQ(g->rd_frac, gd.rd_frac);
    EXPECT_EQ(g->ratchet, gd.ratchet);
    EXPECT_EQ(g->requant, gd.requant);
    EXPECT_EQ(g->mass_power, gd.mass_power);
    EXPECT_EQ(g->value_weight, gd.value_weight);
    EXPECT_EQ(g->budget_all, gd.budget_all);
  }
  const baselines::EvictionConfig ed;
  for (auto kind : {baselines::EvictionKind::kStreaming, baselines::EvictionKind::kH2o,
                    baselines::EvictionKind::kSnapKv, baselines::EvictionKind::kRandom}) {
    auto e = baselines::EvictionConfig::FromSpec({baselines::EvictionName(kind), {}}, kind);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->ratio, ed.ratio);
    EXPECT_EQ(e->sinks, ed.sinks);
    EXPECT_EQ(e->h2o_queries, ed.h2o_queries);
    EXPECT_EQ(e->snap_window, ed.snap_window);
    EXPECT_EQ(e->snap_kernel, ed.snap_kernel);
    EXPECT_EQ(e->seed, ed.seed);
  }
  auto q = baselines::QuestConfig::FromSpec({"quest", {}});
  ASSERT_TRUE(q.ok());
  const baselines::QuestConfig qd;
  EXPECT_EQ(q->ratio, qd.ratio);
  EXPECT_EQ(q->pages, qd.pages);
  EXPECT_EQ(q->keep, qd.keep);
  EXPECT_EQ(q->each, qd.each);
}

// geodesia's profile sets five defaults; a setting given explicitly wins over its profile.
TEST(RegistryTest, GeodesiaProfileSetsDefaultsAndGivenSettingsOverrideIt) {
  const GeodesiaConfig ref;
  auto r = GeodesiaConfig::FromSpec({"geodesia", {{"profile", "reference"}}}, false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->profile, GeodesiaConfig::Profile::kReference);
  EXPECT_EQ(r->bits, ref.bits);
  EXPECT_EQ(r->floor, ref.floor);
  EXPECT_EQ(r->sinks, ref.sinks);
  EXPECT_EQ(r->window, ref.window);
  EXPECT_EQ(r->predecessor_exact, ref.predecessor_exact);
  GeodesiaConfig ref_auto = ref;  // the struct's defaults, with the group left to Bind as parsed
  ref_auto.group_auto = true;
  EXPECT_EQ(r->ToString(), ref_auto.ToString());  // the reference profile IS the struct's defaults

  auto mixed = GeodesiaConfig::FromSpec(
      {"geodesia", {{"profile", "reference"}, {"floor", "2"}, {"bits", "4"}}}, false);
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed->floor, 2);
  EXPECT_EQ(mixed->bits, 4.0);
  EXPECT_EQ(mixed->sinks, ref.sinks);
  EXPECT_EQ(mixed->window, ref.window);
  EXPECT_TRUE(mixed->predecessor_exact);

  auto ret = GeodesiaConfig::FromSpec({"geodesia", {{"sinks", "4"}, {"window", "128"}}}, false);
  ASSERT_TRUE(ret.ok());
  EXPECT_EQ(ret->profile, GeodesiaConfig::Profile::kRetrieval);
  EXPECT_EQ(ret->sinks, 4);
  EXPECT_EQ(ret->window, 128);
  EXPECT_EQ(ret->floor, 2);
  EXPECT_EQ(ret->bits, 3.4);
  EXPECT_FALSE(ret->predecessor_exact);

  // cquest: the profile moves the hot blocks and the floor, never its exact-cache bits.
  auto cq = GeodesiaConfig::FromSpec({"cquest", {{"profile", "retrieval"}}}, true);
  ASSERT_TRUE(cq.ok());
  EXPECT_EQ(cq->bits, 16.0);
  EXPECT_EQ(cq->floor, 2);
  EXPECT_EQ(cq->sinks, 0);

  // The default is the setting measured against KIVI-2 (docs/geodesia.md, the golden cells of
  // geodesia:bits=3.4:floor=2:sinks=0:window=0:predecessor=coded).
  auto dflt = GeodesiaConfig::FromSpec({"geodesia", {}}, false);
  auto measured = GeodesiaConfig::FromSpec({"geodesia",
                                            {{"bits", "3.4"},
                                             {"floor", "2"},
                                             {"sinks", "0"},
                                             {"window", "0"},
                                             {"predecessor", "coded"}}},
                                           false);
  ASSERT_TRUE(dflt.ok() && measured.ok());
  EXPECT_EQ(dflt->ToString(), measured->ToString());

  auto bad = GeodesiaConfig::FromSpec({"geodesia", {{"profile", "paper"}}}, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("profile"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("reference"), std::string::npos) << bad.status().message();

  // The help of a moved setting names the other profile's value.
  const SettingDecl* floor = FindPolicy("geodesia")->settings.Find("floor");
  ASSERT_NE(floor, nullptr);
  EXPECT_EQ(floor->def, "2");
  EXPECT_NE(floor->help.find("profile=reference: 1"), std::string::npos) << floor->help;
  EXPECT_EQ(FindPolicy("cquest")->settings.Find("floor")->def, "1");
}

TEST(RegistryTest, ParsePolicySpecIsTheOneSyntax) {
  auto a = ParsePolicySpec("vestige:recall=off:block=1024");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->name, "vestige");
  EXPECT_EQ(a->settings,
            (std::map<std::string, std::string>{{"recall", "off"}, {"block", "1024"}}));
  auto b = ParsePolicySpec("geodesia@2.5:rd-frac=0.03");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->settings,
            (std::map<std::string, std::string>{{"bits", "2.5"}, {"rd-frac", "0.03"}}));
  auto c = ParsePolicySpec("vestige@8");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->settings.at("ratio"), "8");
  // A value may hold ':' (a directory).
  auto d = ParsePolicySpec("vestige:archive=file:/tmp/a:b:recall=off");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->settings.at("archive"), "file:/tmp/a:b");
  EXPECT_EQ(d->settings.at("recall"), "off");
  struct Bad {
    std::string text, message;
  };
  for (const Bad& x : std::vector<Bad>{
           {"vestige:kappa=2:kappa=4", "'kappa' is given twice"},
           {"vestige@8:ratio=4", "'ratio' is given twice"},
           {"vestige:rank=8:recall-rank=16", "'recall-rank' is given twice"},
           {"full@8", "full has no budget setting"},
           {"vestige:recall", "setting 'recall' must be key=value"},
           {"vestige:=1", "must be key=value"},
           {"vestige:a=1:", "an empty setting"},
           {":k=v", "has no policy name"},
           {"nosuch@3", "unknown policy 'nosuch'"},
       }) {
    auto r = ParsePolicySpec(x.text);
    ASSERT_FALSE(r.ok()) << x.text;
    EXPECT_NE(r.status().message().find(x.message), std::string::npos) << r.status().message();
  }
  PolicySpec s{"vestige", {{"kappa", "2"}}};
  EXPECT_FALSE(AddPolicySetting(&s, "kappa", "4", "--kappa").ok());
  EXPECT_TRUE(AddPolicySetting(&s, "block", "1024", "--block").ok());
  EXPECT_EQ(SettingsFor("full", {{"ratio", "8"}}).size(), 0u);
  EXPECT_EQ(SettingsFor("vestige", {{"ratio", "8"}, {"bits", "5"}}),
            (std::map<std::string, std::string>{{"ratio", "8"}}));
  EXPECT_EQ(SettingsFor("unregistered", {{"x", "1"}}).size(), 1u);  // its factory decides
}

}  // namespace
}  // namespace strata
