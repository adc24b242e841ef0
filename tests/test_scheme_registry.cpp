// A new scheme is one file and one registration line: this test's scheme is a whole entry (here a ZeRO variant
// under its own name, reusing the family's parts as a new scheme's file would) registered with one call, and the
// search, plan files, checks and builder then take it like any built-in one. Its own binary (tests/CMakeLists.txt):
// registering changes the process-wide table.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "hwprofiles/catalog.hpp"
#include "planner/schemes/scheme.hpp"
#include "planner/schemes/zero_family.hpp"
#include "planner/search.hpp"
#include "tests/test_support.hpp"

namespace trainyard::planner {
namespace {

Scheme test_scheme() {
  Scheme s = zero_family_scheme("test-zero1", "ZeRO-1 only, for the registry test", {});
  s.summary = [](const PlanSpec& spec) { return zero_family_summary(spec.zero, ", test"); };
  s.enumerate = [](const StepInputs&, const AddPlan& add) {
    PlanSpec spec;
    spec.scheme = "test-zero1";
    spec.zero.stage = 1;
    add(spec);
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
  EXPECT_EQ(back.zero.stage, 1);
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
    EXPECT_TRUE(s.summary && s.check && s.build && s.enumerate && s.bounds && s.estimate && s.search_cost && s.recomputed_layer_share && s.layout &&
                s.set_micro_batch && s.row_multiple && s.complete_strategy)
        << name;
    EXPECT_EQ(s.chunk_of == nullptr, s.set_chunk == nullptr) << name;
    // Each parameter described whole, once: a value it writes reads back unchanged.
    ASSERT_FALSE(s.params.empty()) << name;
    PlanSpec spec;
    spec.scheme = name;
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

}  // namespace
}  // namespace trainyard::planner
