// Shared fixtures for tasklet's tests.
#pragma once

#include <atomic>
#include <cstdlib>
#include <future>
#include <latch>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tasklet.hpp"

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

/// A manager of its own with two workers, which holds no rule and has no waiter at the end.
class ManagerTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_EQ(manager_->rule_stats().held, 0u);
    EXPECT_EQ(manager_->rule_stats().waiting, 0u);
  }
  std::shared_ptr<JobManager> manager_ = JobManager::create(JobManager::Options{.concurrency = 2});
};

/// The calling thread's id, asked anew at every call: use it in coroutines. Clang (14, -O2) takes
/// std::this_thread::get_id() (glibc's pthread_self, declared const) for a value that cannot change
/// within a function, and gives a coroutine that was resumed on another thread the id it read
/// before its co_await. It cannot see through a call through a volatile pointer.
inline std::thread::id current_thread_id() {
  static std::thread::id (*volatile const ask)() noexcept = []() noexcept {
    return std::this_thread::get_id();
  };
  return ask();
}

/// "thread <id>" for the calling thread: how the library names a thread that holds or waits for
/// a rule.
inline std::string this_thread_name() {
  std::ostringstream text;
  text << "thread " << std::this_thread::get_id();
  return text.str();
}

/// A job of `manager` that holds `rule` from construction (it is scheduled and running by then)
/// until release() (or destruction).
class HoldingJob {
 public:
  HoldingJob(const std::shared_ptr<JobManager>& manager, std::string name, Rule rule) {
    job = make_job(
        std::move(name),
        [this](ProgressMonitor&) {
          running_.count_down();
          released_.wait();
        },
        manager);
    job->set_rule(std::move(rule));
    job->schedule();
    running_.wait();
  }
  ~HoldingJob() {
    release();
    job->join();
  }
  HoldingJob(const HoldingJob&) = delete;
  HoldingJob& operator=(const HoldingJob&) = delete;
  /// Once, from any thread.
  void release() {
    if (!released_once_.exchange(true)) release_.set_value();
  }

  std::shared_ptr<Job> job;

 private:
  std::latch running_{1};
  std::promise<void> release_;
  std::shared_future<void> released_ = release_.get_future().share();
  std::atomic<bool> released_once_{false};
};

}  // namespace tasklet::test
