// begin_rule out of memory: when the push of its frame fails there is nothing to end, and RuleScope
// rethrows std::bad_alloc instead of ending a frame that is not there (which would end the frame
// below it, or throw RuleMismatch in place of the real error).
#include <cstdlib>
#include <memory>
#include <new>

#include <gtest/gtest.h>

#include "support/failing_allocation.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

TEST(BeginRuleOutOfMemory, AFrameThatCouldNotBePushedIsNotEnded) {
  auto manager = JobManager::create(JobManager::Options{1, nullptr});
  const Rule rule = rules::path("/a");
  // The thread's frames have room for four in place: four no-op scopes fill it, so the next push
  // allocates.
  RuleScope first(*manager, nullptr), second(*manager, nullptr), third(*manager, nullptr),
      fourth(*manager, nullptr);
  {
    const test::FailNth failing(1);
    EXPECT_THROW(RuleScope failed(*manager, rule), std::bad_alloc);
  }
  EXPECT_EQ(manager->current_rule(), nullptr);
  EXPECT_EQ(manager->rule_stats().held, 0u);
  {
    // The four scopes below are intact: a rule begun now is the innermost and ends in order.
    const RuleScope scope(*manager, rule);
    EXPECT_EQ(manager->current_rule(), rule);
    EXPECT_EQ(manager->rule_stats().held, 1u);
  }
  EXPECT_EQ(manager->rule_stats().held, 0u);
}

}  // namespace
}  // namespace tasklet
