// MutexRule: identity conflicts and containment (the light-switch rule of Eclipse's guide).
#include "tasklet/rules/mutex_rule.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

TEST(MutexRuleTest, LightSwitchRuleConflictsWithItself) {
  // LightOn and LightOff share one rule, so the manager serializes them in scheduling order.
  const Rule light = rules::mutex("light");
  EXPECT_TRUE(light->is_conflicting(*light));
  EXPECT_TRUE(light->contains(*light));
}

TEST(MutexRuleTest, DistinctMutexesAreUnrelatedEvenWithTheSameName) {
  const Rule a = rules::mutex("light");
  const Rule b = rules::mutex("light");
  EXPECT_FALSE(a->is_conflicting(*b));
  EXPECT_FALSE(b->is_conflicting(*a));
  EXPECT_FALSE(a->contains(*b));
  EXPECT_FALSE(b->contains(*a));
}

TEST(MutexRuleTest, UnrelatedToPathRules) {
  const Rule lock = rules::mutex("lock");
  const Rule root = rules::path("/");
  const Rule read = rules::read_path("/");
  for (const Rule& other : {root, read}) {
    EXPECT_FALSE(lock->is_conflicting(*other)) << other->to_string();
    EXPECT_FALSE(other->is_conflicting(*lock)) << other->to_string();
    EXPECT_FALSE(lock->contains(*other)) << other->to_string();
    EXPECT_FALSE(other->contains(*lock)) << other->to_string();
  }
}

TEST(MutexRuleTest, ConflictsWithAMultiRuleHoldingIt) {
  const Rule light = rules::mutex("light");
  const Rule socket = rules::mutex("socket");
  const Rule both = rules::combine(light, socket);
  const Rule other = rules::combine(rules::mutex("x"), rules::path("/a"));
  EXPECT_TRUE(light->is_conflicting(*both));
  EXPECT_TRUE(both->is_conflicting(*light));
  EXPECT_FALSE(light->is_conflicting(*other));
  EXPECT_FALSE(other->is_conflicting(*light));
  // Nesting the pair inside one mutex is not allowed: the mutex contains only itself.
  EXPECT_FALSE(light->contains(*both));
  EXPECT_TRUE(both->contains(*light));
}

TEST(MutexRuleTest, KeyIsIdentity) {
  const Rule lock = rules::mutex("k");
  const RuleKey key = lock->key();
  EXPECT_EQ(key.kind, RuleKey::Kind::identity);
  EXPECT_FALSE(key.shared);
  EXPECT_TRUE(key.segments.empty());
  EXPECT_TRUE(key.children.empty());
}

TEST(MutexRuleTest, ToStringShowsTheNameOrTheAddress) {
  EXPECT_EQ(rules::mutex("light")->to_string(), "mutex(light)");
  const Rule unnamed = rules::mutex();
  const std::string text = unnamed->to_string();
  EXPECT_EQ(text.rfind("mutex@", 0), 0U) << text;
  EXPECT_NE(text, rules::mutex()->to_string());  // a different object, a different address
}

TEST(MutexRuleTest, NameAccessorAndDirectConstruction) {
  const auto lock = std::make_shared<const MutexRule>("db");
  EXPECT_EQ(lock->name(), "db");
  EXPECT_TRUE(lock->is_conflicting(*lock));
  EXPECT_EQ(MutexRule().name(), "");
}

}  // namespace
}  // namespace tasklet
