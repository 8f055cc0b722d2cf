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
  EXPECT_TRUE(key.path.empty());
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

TEST(NamedMutexRuleTest, SameNameIsTheSameLockAcrossObjects) {
  const Rule a = rules::named_mutex("tenant-42");
  const Rule b = rules::named_mutex("tenant-42");
  const Rule other = rules::named_mutex("tenant-7");
  EXPECT_TRUE(a->is_conflicting(*b));
  EXPECT_TRUE(b->is_conflicting(*a));
  EXPECT_TRUE(a->contains(*b));
  EXPECT_TRUE(b->contains(*a));
  EXPECT_FALSE(a->is_conflicting(*other));
  EXPECT_FALSE(a->contains(*other));
  // Unrelated to identity mutexes of the same name and to paths, the root included.
  for (const Rule& unrelated :
       {rules::mutex("tenant-42"), rules::path("/"), rules::read_path("/tenant-42")}) {
    EXPECT_FALSE(a->is_conflicting(*unrelated)) << unrelated->to_string();
    EXPECT_FALSE(unrelated->is_conflicting(*a)) << unrelated->to_string();
    EXPECT_FALSE(a->contains(*unrelated)) << unrelated->to_string();
    EXPECT_FALSE(unrelated->contains(*a)) << unrelated->to_string();
  }
}

TEST(NamedMutexRuleTest, CombineKeepsOneOfTheSameNameAndConflictsThroughMulti) {
  const Rule a = rules::named_mutex("x");
  const Rule both = rules::combine({a, rules::named_mutex("x"), rules::path("/p")});
  ASSERT_EQ(both->key().kind, RuleKey::Kind::multi);
  EXPECT_EQ(both->key().children.size(), 2U) << both->to_string();
  EXPECT_TRUE(both->contains(*rules::named_mutex("x")));
  EXPECT_TRUE(rules::named_mutex("x")->is_conflicting(*both));
  EXPECT_TRUE(both->is_conflicting(*rules::named_mutex("x")));
  EXPECT_FALSE(rules::named_mutex("y")->is_conflicting(*both));
}

TEST(NamedMutexRuleTest, KeyToStringAndBadNames) {
  const Rule lock = rules::named_mutex("db");
  const RuleKey key = lock->key();
  EXPECT_EQ(key.kind, RuleKey::Kind::named);
  EXPECT_EQ(key.name, "db");
  EXPECT_TRUE(key.path.empty());
  EXPECT_EQ(lock->to_string(), "named_mutex(db)");
  EXPECT_THROW((void)rules::named_mutex(""), InvalidRule);
  EXPECT_THROW((void)rules::named_mutex(std::string("a\0b", 3)), InvalidRule);
  EXPECT_NO_THROW(validate_rule(lock));
}

}  // namespace
}  // namespace tasklet
