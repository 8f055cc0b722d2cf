// MultiRule and rules::combine: Eclipse's MultiRule semantics, flattening and reduction.
#include "tasklet/rules/multi_rule.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <deque>
#include <iterator>
#include <list>
#include <memory>
#include <ranges>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

std::span<const Rule> children_of(const Rule& rule) {
  const auto* multi = dynamic_cast<const MultiRule*>(rule.get());
  return multi ? multi->children() : std::span<const Rule>{};
}

// A custom rule that only it knows conflicts with the exclusive path rule `target` (built-in
// rules answer false for rules they do not know, as they must).
class WatcherRule final : public SchedulingRule {
 public:
  explicit WatcherRule(Rule target) : target_(std::move(target)) {}
  [[nodiscard]] bool contains(const SchedulingRule& other) const override { return &other == this; }
  [[nodiscard]] bool is_conflicting(const SchedulingRule& other) const override {
    return &other == this || &other == target_.get();
  }
  [[nodiscard]] std::string to_string() const override { return "watcher"; }

 private:
  Rule target_;
};

// A single-pass range that makes its rules on the fly, as a generator would.
class RuleGenerator {
 public:
  class Iterator {
   public:
    using value_type = Rule;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    explicit Iterator(RuleGenerator* owner) : owner_(owner) {}
    Rule operator*() const { return rules::path("/gen" + std::to_string(owner_->next_)); }
    Iterator& operator++() {
      ++owner_->next_;
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(std::default_sentinel_t) const { return owner_->next_ == owner_->count_; }

   private:
    RuleGenerator* owner_ = nullptr;
  };

  explicit RuleGenerator(int count) : count_(count) {}
  Iterator begin() { return Iterator(this); }
  [[nodiscard]] std::default_sentinel_t end() const { return {}; }

 private:
  int next_ = 0;
  int count_;
};

// Eclipse MultiRuleTest, with its rules /a, /b/c, /a/b and /z/d.
class EclipseMultiRuleTest : public ::testing::Test {
 protected:
  Rule child1 = rules::path("/a");
  Rule child2 = rules::path("/b/c");
  Rule child_of_child1 = rules::path("/a/b");
  Rule non_child = rules::path("/z/d");
  Rule multi1 = rules::combine(child1, child2);
};

TEST_F(EclipseMultiRuleTest, Combine) {
  ASSERT_EQ(children_of(multi1).size(), 2U);
  // Combining a multi rule with its own children or with rules they contain returns it.
  EXPECT_EQ(rules::combine({multi1}), multi1);
  EXPECT_EQ(rules::combine({multi1, child1, child2, child_of_child1}), multi1);
  EXPECT_EQ(rules::combine(multi1, child2), multi1);
  EXPECT_EQ(rules::combine(child_of_child1, multi1), multi1);
  // Nulls.
  EXPECT_EQ(rules::combine(nullptr, nullptr), nullptr);
  EXPECT_EQ(rules::combine(nullptr, multi1), multi1);
  EXPECT_EQ(rules::combine(child1, nullptr), child1);
  // With an unrelated rule: a new multi rule containing both.
  const Rule result = rules::combine(multi1, non_child);
  ASSERT_NE(result, multi1);
  EXPECT_EQ(children_of(result).size(), 3U);
  EXPECT_TRUE(result->contains(*multi1));
  EXPECT_TRUE(result->contains(*non_child));
  EXPECT_FALSE(multi1->contains(*result));
}

TEST_F(EclipseMultiRuleTest, Contains) {
  const Rule multi2 = rules::combine(child_of_child1, rules::path("/b/c/d"));
  EXPECT_TRUE(multi1->contains(*child1));
  EXPECT_TRUE(multi1->contains(*child2));
  EXPECT_FALSE(multi1->contains(*non_child));
  EXPECT_TRUE(multi1->contains(*child_of_child1));
  EXPECT_TRUE(multi1->contains(*multi2));
  EXPECT_FALSE(multi2->contains(*multi1));
  EXPECT_TRUE(multi1->contains(*multi1));
  EXPECT_FALSE(multi1->contains(*rules::combine(child_of_child1, non_child)));
}

TEST_F(EclipseMultiRuleTest, IsConflicting) {
  const Rule multi2 = rules::combine(child_of_child1, non_child);
  EXPECT_TRUE(multi1->is_conflicting(*child1));
  EXPECT_TRUE(multi1->is_conflicting(*child2));
  EXPECT_FALSE(multi1->is_conflicting(*non_child));
  EXPECT_TRUE(multi1->is_conflicting(*child_of_child1));
  EXPECT_TRUE(multi1->is_conflicting(*multi2));
  EXPECT_TRUE(multi2->is_conflicting(*multi1));
  EXPECT_TRUE(multi1->is_conflicting(*multi1));
  // And from the other side, as the rules' own is_conflicting (symmetry).
  EXPECT_TRUE(child1->is_conflicting(*multi1));
  EXPECT_TRUE(child_of_child1->is_conflicting(*multi1));
  EXPECT_FALSE(non_child->is_conflicting(*multi1));
  EXPECT_TRUE(rules::path("/b")->is_conflicting(*multi1));  // an ancestor of /b/c
  EXPECT_FALSE(rules::combine(rules::path("/q"), non_child)->is_conflicting(*multi1));
}

TEST(MultiRuleTest, UnrelatedMutexesCombined) {
  // Eclipse's guide: a job that flips the light switch and writes to a socket.
  const Rule light = rules::mutex("light");
  const Rule socket = rules::mutex("socket");
  const Rule both = rules::combine(light, socket);
  ASSERT_EQ(children_of(both).size(), 2U);
  EXPECT_TRUE(both->is_conflicting(*light));
  EXPECT_TRUE(both->is_conflicting(*socket));
  EXPECT_TRUE(both->contains(*light));
  EXPECT_TRUE(both->contains(*socket));
  EXPECT_FALSE(both->is_conflicting(*rules::mutex("light")));
  EXPECT_EQ(both->to_string(), "multi[mutex(light), mutex(socket)]");
}

TEST(MultiRuleTest, NestedMultiRulesAreFlattened) {
  const Rule inner1 = rules::combine(rules::path("/a"), rules::mutex("m"));
  const Rule inner2 = rules::combine(rules::read_path("/b"), rules::path("/c"));
  const Rule outer = rules::combine(inner1, inner2);
  const auto children = children_of(outer);
  ASSERT_EQ(children.size(), 4U);
  for (const Rule& child : children) {
    ASSERT_NE(child, nullptr);
    EXPECT_NE(child->key().kind, RuleKey::Kind::multi) << child->to_string();
  }
  EXPECT_EQ(outer->to_string(), "multi[path(/a), mutex(m), read_path(/b), path(/c)]");
  EXPECT_TRUE(outer->contains(*inner1));
  EXPECT_TRUE(outer->contains(*inner2));
  // The flattened rule behaves like the union of its parts.
  EXPECT_TRUE(outer->is_conflicting(*rules::path("/b/x")));
  EXPECT_FALSE(outer->is_conflicting(*rules::read_path("/b/x")));
  EXPECT_TRUE(outer->is_conflicting(*rules::read_path("/c/x")));
}

TEST(MultiRuleTest, ChildrenContainedByAnotherChildAreDropped) {
  const Rule a = rules::path("/a");
  EXPECT_EQ(rules::combine({rules::path("/a/b"), a, rules::path("/a/c/d")}), a);
  const Rule b = rules::path("/b");
  const Rule both = rules::combine({rules::path("/a/x"), b, a, rules::path("/b/y"), rules::read_path("/a")});
  const auto children = children_of(both);
  ASSERT_EQ(children.size(), 2U);
  EXPECT_EQ(std::set<Rule>(children.begin(), children.end()), (std::set<Rule>{a, b}));
}

TEST(MultiRuleTest, OfTwoEquivalentChildrenTheFirstIsKept) {
  const Rule first = rules::path("/a");
  const Rule second = rules::path("//a/");
  EXPECT_EQ(rules::combine({first, second}), first);
  EXPECT_EQ(rules::combine({second, first}), second);
  EXPECT_EQ(rules::combine(first, second), first);
  const Rule m = rules::mutex("m");
  const Rule multi = rules::combine({first, m, second, m, first});
  const auto children = children_of(multi);
  ASSERT_EQ(children.size(), 2U);
  EXPECT_EQ(children[0], first);
  EXPECT_EQ(children[1], m);
}

TEST(MultiRuleTest, WriteAbsorbsReadOfTheSamePathButNotTheOtherWay) {
  const Rule read = rules::read_path("/a");
  const Rule write = rules::path("/a");
  EXPECT_EQ(rules::combine(read, write), write);
  EXPECT_EQ(rules::combine({read, write}), write);
  EXPECT_EQ(rules::combine({rules::read_path("/a/b"), read}), read);
  const Rule mixed = rules::combine(read, rules::path("/a/b"));  // a read does not contain a write
  EXPECT_EQ(children_of(mixed).size(), 2U);
}

TEST(MultiRuleTest, CombineOfNothingIsNull) {
  EXPECT_EQ(rules::combine({}), nullptr);
  EXPECT_EQ(rules::combine({nullptr, nullptr, nullptr}), nullptr);
  EXPECT_EQ(rules::combine(std::vector<Rule>{}), nullptr);
  const Rule only = rules::mutex();
  EXPECT_EQ(rules::combine({nullptr, only, nullptr}), only);
  EXPECT_EQ(rules::combine(only, only), only);
}

TEST(MultiRuleTest, CombineAcceptsAnyInputRange) {
  const Rule a = rules::path("/a");
  const Rule b = rules::mutex("b");
  const Rule c = rules::read_path("/c");
  const std::vector<Rule> vector{a, b, c};
  const std::list<Rule> list{a, b, c};
  const std::array<Rule, 3> array{a, b, c};
  const std::deque<Rule> deque{c, b, a};
  for (const Rule& combined : {rules::combine(vector), rules::combine(list), rules::combine(array),
                               rules::combine(deque), rules::combine(std::vector<Rule>{a, b, c})}) {
    ASSERT_EQ(children_of(combined).size(), 3U) << combined->to_string();
    for (const Rule& part : vector) EXPECT_TRUE(combined->contains(*part)) << part->to_string();
  }
  // Elements need only convert to Rule.
  const std::vector<std::shared_ptr<const PathRule>> typed{
      std::make_shared<const PathRule>("/x", PathRule::Mode::exclusive),
      std::make_shared<const PathRule>("/y", PathRule::Mode::shared)};
  EXPECT_EQ(children_of(rules::combine(typed)).size(), 2U);
  // A single-pass range yielding temporaries.
  static_assert(rules::RuleRange<RuleGenerator>);
  static_assert(!std::ranges::forward_range<RuleGenerator>);
  RuleGenerator generated(12);
  const Rule combined = rules::combine(generated);
  EXPECT_EQ(children_of(combined).size(), 12U);
  EXPECT_TRUE(combined->is_conflicting(*rules::read_path("/gen11/x")));
  EXPECT_FALSE(combined->is_conflicting(*rules::read_path("/gen12")));
}

TEST(MultiRuleTest, ContainsAnotherMultiWhenEveryChildIsCovered) {
  const Rule m = rules::mutex("m");
  const Rule outer = rules::combine({rules::path("/a"), rules::read_path("/r"), m});
  EXPECT_TRUE(outer->contains(*rules::combine({rules::path("/a/x"), m})));
  EXPECT_TRUE(outer->contains(*rules::combine({rules::read_path("/a/x"), rules::read_path("/r/y")})));
  EXPECT_FALSE(outer->contains(*rules::combine({rules::path("/a/x"), rules::path("/r/y")})));
  EXPECT_FALSE(outer->contains(*rules::combine({rules::path("/a/x"), rules::mutex("other")})));
}

TEST(MultiRuleTest, ReadOnlyMultiRuleDoesNotConflictWithItself) {
  const Rule readers = rules::combine(rules::read_path("/a"), rules::read_path("/b"));
  EXPECT_FALSE(readers->is_conflicting(*readers));
  EXPECT_TRUE(readers->contains(*readers));
  EXPECT_TRUE(readers->is_conflicting(*rules::path("/b/c")));
  const Rule mixed = rules::combine(rules::read_path("/a"), rules::path("/b"));
  EXPECT_TRUE(mixed->is_conflicting(*mixed));
}

TEST(MultiRuleTest, CustomChildIsHeardOnEitherSide) {
  const Rule target = rules::path("/t");
  const Rule watcher = std::make_shared<const WatcherRule>(target);
  const Rule multi = rules::combine(watcher, rules::mutex("m"));
  ASSERT_EQ(children_of(multi).size(), 2U);
  // The path rule knows nothing of the watcher, but the multi rule asks both directions.
  EXPECT_TRUE(multi->is_conflicting(*target));
  EXPECT_TRUE(target->is_conflicting(*multi));
  const Rule other_multi = rules::combine(target, rules::path("/u"));
  EXPECT_TRUE(multi->is_conflicting(*other_multi));
  EXPECT_TRUE(other_multi->is_conflicting(*multi));
  EXPECT_FALSE(multi->is_conflicting(*rules::path("/t/child")));
}

TEST(MultiRuleTest, KeyListsTheChildren) {
  const Rule multi = rules::combine(rules::path("/a"), rules::mutex("m"));
  const RuleKey key = multi->key();
  EXPECT_EQ(key.kind, RuleKey::Kind::multi);
  const auto children = children_of(multi);
  ASSERT_EQ(key.children.size(), children.size());
  EXPECT_EQ(key.children.data(), children.data());
  EXPECT_TRUE(key.path.empty());
}

TEST(MultiRuleTest, LargeCombinationsStayReduced) {
  std::vector<Rule> many;
  many.reserve(1001);
  for (int i = 0; i < 1000; ++i) many.push_back(rules::path("/root/n" + std::to_string(i)));
  const Rule wide = rules::combine(many);
  EXPECT_EQ(children_of(wide).size(), 1000U);
  const std::string text = wide->to_string();
  EXPECT_NE(text.find("984 more"), std::string::npos) << text.substr(0, 200);
  for (int i = 0; i < 1000; i += 97) EXPECT_TRUE(wide->is_conflicting(*many[static_cast<std::size_t>(i)]));
  EXPECT_FALSE(wide->is_conflicting(*rules::path("/root/n1000")));

  const Rule root = rules::path("/root");
  many.push_back(root);
  EXPECT_EQ(rules::combine(many), root);
  EXPECT_EQ(rules::combine(wide, root), root);
  EXPECT_TRUE(root->contains(*wide));
}

}  // namespace
}  // namespace tasklet
