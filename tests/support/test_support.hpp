// Shared fixtures for tasklet's tests.
#pragma once

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "tasklet/tasklet.hpp"

namespace tasklet::test {

/// Multiplier for stress sizes: TASKLET_STRESS_SCALE (default 1).
inline int stress_scale() {
  const char* text = std::getenv("TASKLET_STRESS_SCALE");
  const int scale = text ? std::atoi(text) : 1;
  return scale > 0 ? scale : 1;
}

/// Engine tests run with 1, 2 and 4 worker threads.
class WorkerCountTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    manager_ = JobManager::create(JobManager::Options{GetParam(), nullptr});
    scheduler_ = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  }
  void TearDown() override {
    // Quiescence: nothing is left behind by a finished test.
    EXPECT_EQ(scheduler_->active_count(), 0u);
    EXPECT_FALSE(scheduler_->is_running());
  }
  Scheduler& scheduler() { return *scheduler_; }

  std::shared_ptr<JobManager> manager_;
  std::shared_ptr<Scheduler> scheduler_;
};

inline std::string worker_count_name(const ::testing::TestParamInfo<int>& info) {
  return "Workers" + std::to_string(info.param);
}

#define TASKLET_WORKER_COUNTS(suite) \
  INSTANTIATE_TEST_SUITE_P(Workers, suite, ::testing::Values(1, 2, 4), ::tasklet::test::worker_count_name)

/// A user's rule whose check throws when asked about a path rule (conflicts with itself only
/// otherwise): the engine must count a throwing check as a conflict.
class ThrowsOnPathRule final : public SchedulingRule {
 public:
  bool contains(const SchedulingRule& other) const override { return &other == this; }
  bool is_conflicting(const SchedulingRule& other) const override {
    if (other.key().kind == RuleKey::Kind::path) throw std::runtime_error("broken custom rule");
    return &other == this;
  }
  std::string to_string() const override { return "throwing rule"; }
};

}  // namespace tasklet::test
