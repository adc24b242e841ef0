// A new scheme is one file and one registration line: this test's scheme is a whole entry (here a ZeRO variant
// under its own name, reusing the family's parts as a new scheme's file would) registered with one call, and the
// search, plan files, checks and builder then take it like any built-in one. Its own binary (tests/CMakeLists.txt):
// registering changes the process-wide table.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "hwprofiles/catalog.hpp"
#include "planner/hotspa.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/schemes/zero_family/family.hpp"
#include "planner/search.hpp"
#include "tests/test_support.hpp"

namespace trainyard::planner {
namespace {

Scheme test_scheme() {
  Scheme s = zero_family_scheme("test-zero1", "ZeRO-1 only, for the registry test", {});
  s.summary = [](const PlanSpec& spec) { return zero_family_summary(spec.as<ZeroParams>(), ", test"); };
  s.enumerate = [](const StepInputs&, const AddPlan& add) {
    ZeroParams z;
    z.stage = 1;
    add(PlanSpec{"test-zero1", z});
  };
  return s;
}

TEST(SchemeRegistry, ANewSchemeIsOneEntryAndOneRegistration) {
  register_scheme(test_scheme());  // the one registration line
  const auto& names = scheme_names();
  ASSERT_EQ(names.back(), "test-zero1");
  EXPECT_NE(scheme_list().find("test-zero1"), std::string::npos);

  const model::ModelConfig m = model::parse_custom_model("custom:layers=2,hidden=512,heads=8,vocab=1024");
  const sim::Cluster c(hw::load_node(std::string(TRAINYARD_TEST_DATA_DIR) + "/tiny-node.json"), 1, test::ideal_stack());
  const StepInputs in{m, c, {4096, 4}, model::precision_policy("bf16-mixed")};
  // The search enumerates it, checks and builds it through its entry.
  const auto specs = enumerate_plans(in, {"test-zero1"});
  ASSERT_EQ(specs.size(), 1U);
  EXPECT_EQ(specs[0].summary(), "zero-1, test, mb 1");
  check_plan(in, specs[0]);
  sim::TaskGraph g = build_plan(in, specs[0]);
  EXPECT_GT(g.size(), 0U);
  // Plan files write and read it.
  const PlanSpec back = parse_parameters("test-zero1", parameters_json(specs[0]), "test");
  EXPECT_EQ(back.scheme, "test-zero1");
  EXPECT_EQ(back.as<ZeroParams>().stage, 1);
  // A name can be registered once.
  EXPECT_NE(test::error_of([] { register_scheme(test_scheme()); }).find("a name no scheme has yet"), std::string::npos);
}

TEST(SchemeRegistry, AnUnknownSchemeIsRefusedNamingTheKnownOnes) {
  const std::string error = test::error_of([] { scheme_named("hotspot", "plan.json", "scheme"); });
  EXPECT_NE(error.find("plan.json"), std::string::npos) << error;
  for (const auto& name : scheme_names()) EXPECT_NE(error.find(name), std::string::npos) << name;
  EXPECT_EQ(find_scheme("hotspot"), nullptr);
  // Every built-in entry is complete: a missing hook would crash the first caller, so the table is checked here.
  for (const auto& name : scheme_names()) {
    const Scheme& s = scheme_named(name);
    EXPECT_FALSE(s.description.empty()) << name;
    EXPECT_FALSE(s.flags.empty()) << name;
    EXPECT_TRUE(s.from_flags && s.summary && s.check && s.build && s.enumerate && s.bounds && s.analytic && s.estimate && s.search_cost &&
                s.recomputed_layer_share)
        << name;
    // A facet, where a scheme has one, is whole.
    EXPECT_TRUE(!s.run || s.run->refusal) << name;
    EXPECT_TRUE(!s.hotspa || (s.hotspa->layout && s.hotspa->set_micro_batch && s.hotspa->row_multiple && s.hotspa->complete_strategy)) << name;
    EXPECT_TRUE(!s.chunk || (s.chunk->tokens && s.chunk->set_tokens && s.chunk->interactive_chunks > 0)) << name;
    // Each parameter described whole, once: a value it writes reads back unchanged.
    ASSERT_FALSE(s.params.empty()) << name;
    PlanSpec spec = s.blank();
    const nlohmann::json before = params_json(s, spec);
    std::set<std::string> keys;
    for (const Param& p : s.params) {
      EXPECT_TRUE(keys.insert(p.key).second) << name << "." << p.key << " twice";
      ASSERT_TRUE(p.get) << name << "." << p.key;
      if (p.kind == Param::Kind::custom) {
        EXPECT_TRUE(p.read && !p.in_panel) << name << "." << p.key;
        continue;
      }
      ASSERT_TRUE(p.set) << name << "." << p.key;
      if (p.kind == Param::Kind::choice || p.kind == Param::Kind::set) {
        EXPECT_FALSE(p.choices.empty()) << name << "." << p.key;
      }
      p.set(spec, p.get(spec));
    }
    EXPECT_EQ(params_json(s, spec), before) << name;
  }
}

// A plan holds its own scheme's parameter struct and no other's: a read of another's is a bug, caught where it
// happens instead of returning some other scheme's defaults.
TEST(SchemeRegistry, APlanHoldsOnlyItsOwnSchemesParameters) {
  const PlanSpec ring = scheme_named("ringtrack").blank();
  EXPECT_EQ(ring.as<RingTrackParams>().ring, RingTrackParams{}.ring);
  EXPECT_THROW((void)ring.as<MegatronParams>(), InternalError);
  for (const auto& name : scheme_names()) {
    const PlanSpec spec = scheme_named(name).blank();
    EXPECT_EQ(spec.scheme, name);
    EXPECT_EQ(spec.params.index(), scheme_named(name).defaults.index()) << name;
  }
}

// HotSPa switches between the schemes that have its facet; a strategy string naming one without it is refused
// by name, not crashed on.
TEST(SchemeRegistry, HotSpaRefusesASchemeWithoutItsFacet) {
  Scheme s = zero_family_scheme("test-no-hotspa", "ZeRO without HotSPa hooks, for the registry test", {});
  s.summary = [](const PlanSpec&) { return std::string("test"); };
  s.enumerate = [](const StepInputs&, const AddPlan&) {};
  s.hotspa = std::nullopt;
  register_scheme(s);
  const std::string error = test::error_of([] { parse_strategy("test-no-hotspa:zero_stage=1", "--static", 8); });
  EXPECT_NE(error.find("no HotSPa facet"), std::string::npos) << error;
  EXPECT_NE(error.find("--static"), std::string::npos) << error;
}

}  // namespace
}  // namespace trainyard::planner
