// validate_rule against built-in and custom rules: built-ins keep the laws; bad custom rules are
// rejected with InvalidRule naming them.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "rules/make_rule.hpp"  // FreeRule
#include "tasklet/error.hpp"
#include "tasklet/rules/multi_rule.hpp"
#include "tasklet/rules/mutex_rule.hpp"
#include "tasklet/rules/path_rule.hpp"
#include "tasklet/rules/rules.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet {
namespace {

// A custom rule whose answers are given as functions, to build rules that break one law each.
class ScriptedRule final : public SchedulingRule {
 public:
  using Answer = std::function<bool(const ScriptedRule& self, const SchedulingRule& other)>;
  ScriptedRule(std::string name, Answer conflicts, Answer contains)
      : name_(std::move(name)), conflicts_(std::move(conflicts)), contains_(std::move(contains)) {}
  [[nodiscard]] bool contains(const SchedulingRule& other) const override { return contains_(*this, other); }
  [[nodiscard]] bool is_conflicting(const SchedulingRule& other) const override {
    return conflicts_(*this, other);
  }
  [[nodiscard]] std::string to_string() const override { return name_; }

 private:
  std::string name_;
  Answer conflicts_;
  Answer contains_;
};

bool identity(const ScriptedRule& self, const SchedulingRule& other) { return &other == &self; }
bool always(const ScriptedRule&, const SchedulingRule&) { return true; }
bool never(const ScriptedRule&, const SchedulingRule&) { return false; }

Rule scripted(std::string name, ScriptedRule::Answer conflicts, ScriptedRule::Answer contains) {
  return std::make_shared<const ScriptedRule>(std::move(name), std::move(conflicts), std::move(contains));
}

// Expects validate_rule to throw InvalidRule whose message holds every one of `fragments`.
void expect_invalid(const Rule& rule, const std::vector<std::string>& fragments) {
  try {
    validate_rule(rule);
    ADD_FAILURE() << "validate_rule accepted " << rule->to_string();
  } catch (const InvalidRule& error) {
    const std::string what = error.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(what.find(fragment), std::string::npos) << "missing \"" << fragment << "\" in: " << what;
    }
  }
}

TEST(ValidationTest, BuiltInRulesPass) {
  const std::vector<Rule> built_in = {
      rules::mutex(),
      rules::mutex("named"),
      rules::path("/"),
      rules::path("/a/b"),
      rules::write_path("/a"),
      rules::read_path("/"),
      rules::read_path("/a/b"),
      rules::combine(rules::path("/a"), rules::mutex("m")),
      rules::combine(rules::read_path("/a"), rules::path("/b")),
      rules::combine({rules::path("/a"), rules::path("/b"), rules::mutex(), rules::read_path("/c")}),
      rules::combine(rules::combine(rules::path("/x"), rules::mutex()),
                     rules::combine(rules::path("/y"), rules::mutex())),
  };
  for (const Rule& rule : built_in) EXPECT_NO_THROW(validate_rule(rule)) << rule->to_string();
  EXPECT_NO_THROW(validate_rule(nullptr));
}

// Where a rule made by make_rule keeps its reference counts: the deleter sits beside them in the
// same small block (std::get_deleter finds it there), or null when `rule` is not an R.
template <class R>
std::uintptr_t counts_of(const Rule& rule) {
  return reinterpret_cast<std::uintptr_t>(std::get_deleter<rules::detail::FreeRule<R>>(rule));
}

// Every copy of a Rule writes its reference counts while the rule table reads the rule on another
// core: no cache line of a mutex or multi rule holds its counts (32 of each kind, so that blocks
// placed by chance would be caught). A path rule, mostly made for one job, lives in one block with
// its counts (make_rule_with_counts). Every rule goes with its last reference like any other.
TEST(ValidationTest, SharedRulesKeepTheirCountsApartAndPathRulesBesideThem) {
  constexpr std::uintptr_t line = 64;
  std::vector<Rule> built_in;
  const auto add = [&]<class R>(const Rule& rule, std::type_identity<R>) {
    built_in.push_back(rule);
    const std::uintptr_t counts = counts_of<R>(rule);
    ASSERT_NE(counts, 0u) << rule->to_string() << " was not made by make_rule";
    const auto first = reinterpret_cast<std::uintptr_t>(rule.get());
    for (std::uintptr_t at = first / line; at <= (first + sizeof(R) - 1) / line; ++at) {
      EXPECT_NE(at, counts / line) << rule->to_string() << ": its counts share a cache line with it";
    }
  };
  const auto add_path = [&](const Rule& rule) {
    built_in.push_back(rule);
    EXPECT_EQ(counts_of<PathRule>(rule), 0u) << rule->to_string() << " was made in two blocks";
    EXPECT_NE(dynamic_cast<const PathRule*>(rule.get()), nullptr) << rule->to_string();
  };
  for (int i = 0; i < 32; ++i) {
    const std::string at = "/a" + std::to_string(i);
    add(rules::mutex("m" + std::to_string(i)), std::type_identity<MutexRule>{});
    add(rules::named_mutex("n" + std::to_string(i)), std::type_identity<NamedMutexRule>{});
    add(rules::combine(rules::path(at), rules::mutex("n")), std::type_identity<MultiRule>{});
    add_path(rules::path(at + "/b"));
    add_path(rules::read_path(at));
  }
  for (const Rule& rule : built_in) {
    std::weak_ptr<const SchedulingRule> watch = rule;
    Rule copy = rule;
    EXPECT_EQ(watch.use_count(), 2) << rule->to_string();
    copy.reset();
    EXPECT_EQ(watch.use_count(), 1) << rule->to_string();
  }
  std::weak_ptr<const SchedulingRule> gone;
  {
    const Rule alone = rules::path("/c");
    gone = alone;
  }
  EXPECT_TRUE(gone.expired());
}

TEST(ValidationTest, RuleConflictingWithEverythingIsRejected) {
  expect_invalid(scripted("greedy-conflicts", always, identity), {"greedy-conflicts", "conflicts"});
}

TEST(ValidationTest, RuleContainingEverythingIsRejected) {
  expect_invalid(scripted("greedy-contains", identity, always), {"greedy-contains", "contains"});
}

TEST(ValidationTest, RuleNotContainingItselfIsRejected) {
  expect_invalid(scripted("not-reflexive", identity, never), {"not-reflexive", "contain itself"});
}

TEST(ValidationTest, RuleNotConflictingWithItselfIsRejected) {
  expect_invalid(scripted("no-self-conflict", never, identity), {"no-self-conflict", "conflict with itself"});
}

TEST(ValidationTest, MultiRuleWithABadCustomChildNamesTheChild) {
  const Rule bad = scripted("bad-child", always, identity);
  const Rule multi = rules::combine(rules::path("/a"), bad);
  ASSERT_EQ(multi->key().kind, RuleKey::Kind::multi);
  expect_invalid(multi, {"bad-child", "multi["});
}

TEST(ValidationTest, WellBehavedCustomRulePasses) {
  EXPECT_NO_THROW(validate_rule(scripted("identity", identity, identity)));
  EXPECT_NO_THROW(validate_rule(rules::combine(scripted("identity", identity, identity), rules::path("/a"))));
}

TEST(ValidationTest, InvalidPathNamesTheInput) {
  for (const std::string input : {"", "relative/path", "/../up", "/a/../../b"}) {
    try {
      (void)rules::path(input);
      ADD_FAILURE() << "accepted " << input;
    } catch (const InvalidRule& error) {  // InvalidPath is an InvalidRule
      EXPECT_NE(dynamic_cast<const InvalidPath*>(&error), nullptr);
      EXPECT_NE(std::string(error.what()).find("\"" + input + "\""), std::string::npos) << error.what();
    }
  }
}

// A multi rule of read rules conflicts with nothing it holds, itself included (readers share),
// so it must be exempt from the self-conflict law like its read children; validate_rule checks
// its children one by one instead.
TEST(ValidationTest, MultiRuleOfReadRulesPasses) {
  const Rule readers = rules::combine(rules::read_path("/a"), rules::read_path("/b"));
  ASSERT_EQ(readers->key().kind, RuleKey::Kind::multi);
  ASSERT_FALSE(readers->is_conflicting(*readers));
  EXPECT_NO_THROW(validate_rule(readers));
  EXPECT_NO_THROW(validate_rule(rules::combine(rules::read_path("/a"), rules::mutex("m"))));
}

}  // namespace
}  // namespace tasklet
