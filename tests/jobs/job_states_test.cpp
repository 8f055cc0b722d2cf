// A job's states and runs: scheduling, re-runs asked for while running, the should_schedule() and
// should_run() hooks, priorities, suspend and resume, and the end of a manager. Tests written anew
// in our API, after the spirit of Eclipse's org.eclipse.core.tests.runtime jobs suite, as are the
// other tests in this folder.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

using test::Counter;
using test::Gate;
using test::Hooked;
using test::JobTest;
using test::patience;
using test::Vetoing;

TEST_F(JobTest, StatesThroughAJobsLife) {
  Gate in_run, release;
  auto j = job("life", [&](ProgressMonitor&) {
    in_run.open();
    release.wait();
    return Status::ok();
  });
  EXPECT_EQ(j->state(), JobState::none);
  j->schedule();
  ASSERT_TRUE(in_run.wait());
  EXPECT_EQ(j->state(), JobState::running);
  EXPECT_EQ(manager_->find(nullptr).size(), 1u);
  release.open();
  j->join();
  EXPECT_EQ(j->state(), JobState::none);
  EXPECT_TRUE(j->result().is_ok());
}

TEST_F(JobTest, ScheduleWhileRunningRunsOnceMoreAndWhileWaitingDoesNothing) {
  Gate in_run, release;
  std::atomic<int> runs{0};
  auto j = job("again", first_run_waits(runs, in_run, release));
  j->schedule();
  ASSERT_TRUE(in_run.wait());
  j->schedule();  // running: once more after it ends
  j->schedule();  // still just once more
  release.open();
  EXPECT_TRUE(manager_->join(nullptr, 30s));
  EXPECT_EQ(runs.load(), 2);

  // Waiting behind a held rule: scheduling again changes nothing.
  const Rule rule = rules::mutex("busy");
  j->set_rule(rule);
  manager_->begin_rule(rule);
  j->schedule();
  j->schedule();
  j->schedule(std::chrono::hours(1));  // no delay is imposed on a waiting job either
  EXPECT_EQ(j->state(), JobState::waiting);
  manager_->end_rule(rule);
  j->join();
  EXPECT_EQ(runs.load(), 3);
}

TEST_F(JobTest, SeveralSchedulesWhileRunningGiveOneMoreRunWithTheLastDelay) {
  Gate in_run, release;
  std::atomic<int> runs{0};
  auto j = job("complex", first_run_waits(runs, in_run, release));
  j->schedule();
  ASSERT_TRUE(in_run.wait());
  j->schedule(std::chrono::hours(2));
  j->schedule(std::chrono::hours(1));
  j->schedule(0ms);  // the last delay counts
  release.open();
  EXPECT_TRUE(manager_->join(nullptr, patience)) << "the re-run was not queued at once";
  EXPECT_EQ(runs.load(), 2);
}

// Reschedules itself from run() until should_schedule() says no.
class Repeating final : public Job {
 public:
  Repeating(std::chrono::milliseconds delay, int times, std::shared_ptr<JobManager> manager)
      : Job("repeating", std::move(manager)), delay_(delay), times_(times) {}
  std::atomic<int> runs{0};
  std::atomic<int> running{0};
  std::atomic<bool> overlapped{false};

 protected:
  Status run(ProgressMonitor&) override {
    if (running.fetch_add(1) != 0) overlapped = true;
    runs.fetch_add(1);
    schedule(delay_);
    running.fetch_sub(1);
    return Status::ok();
  }
  bool should_schedule() override { return runs.load() < times_; }

 private:
  std::chrono::milliseconds delay_;
  int times_;
};

TEST_F(JobTest, AJobReschedulingItselfRunsUntilShouldScheduleSaysNo) {
  for (const auto delay : {0ms, 1ms}) {
    auto j = std::make_shared<Repeating>(delay, 5, manager_);
    j->schedule();
    EXPECT_TRUE(manager_->join(nullptr, patience)) << "join(family) waits for every re-run";
    EXPECT_EQ(j->runs.load(), 5) << "delay " << delay.count();
    EXPECT_FALSE(j->overlapped.load());
    EXPECT_EQ(j->state(), JobState::none);
  }
}

TEST_F(JobTest, ScheduleFromADoneListenerRunsAgain) {
  struct Again final : JobListener {
    void done(const JobEvent& e) override {
      if (dones.add() < 3) e.job->schedule();
    }
    Counter dones;
  };
  auto again = std::make_shared<Again>();
  std::atomic<int> runs{0};
  auto j = job("from done", [&](ProgressMonitor&) {
    runs.fetch_add(1);
    return Status::ok();
  });
  j->add_listener(again);
  j->schedule();
  ASSERT_TRUE(again->dones.wait_for(3));
  EXPECT_EQ(runs.load(), 3);
}

TEST_F(JobTest, HooksCanVetoSchedulingAndRunning) {
  auto no_schedule = std::make_shared<Vetoing>(false, true, manager_);
  no_schedule->schedule();
  EXPECT_EQ(no_schedule->state(), JobState::none);
  auto no_run = std::make_shared<Vetoing>(true, false, manager_);
  no_run->schedule();
  no_run->join();
  EXPECT_FALSE(no_run->ran.load());
  EXPECT_TRUE(no_run->result().is_canceled());
}

TEST_F(JobTest, ShouldRunThatThrowsDropsTheRun) {
  auto j = std::make_shared<Hooked>([](Job&) -> bool { throw std::runtime_error("hook failed"); }, manager_);
  j->schedule();
  EXPECT_TRUE(j->join(patience));
  EXPECT_EQ(j->runs.load(), 0);
  EXPECT_TRUE(j->result().is_canceled());
  EXPECT_EQ(j->state(), JobState::none);
}

TEST_F(JobTest, ScheduleInsideShouldRunRunsOnceMoreNeverConcurrently) {
  std::atomic<int> asked{0};
  auto j = std::make_shared<Hooked>(
      [&](Job& self) {
        if (asked.fetch_add(1) == 0) self.schedule();  // about to run: counts as a re-run request
        return true;
      },
      manager_);
  j->schedule();
  EXPECT_TRUE(manager_->join(nullptr, patience));
  EXPECT_EQ(j->runs.load(), 2);
  EXPECT_FALSE(j->overlapped.load());
}

TEST_F(JobTest, ExceptionsBecomeErrorResults) {
  auto j = job("thrower", [](ProgressMonitor&) -> Status { throw std::runtime_error("broken"); });
  j->schedule();
  j->join();
  const Status result = j->result();
  ASSERT_TRUE(result.is_error());
  EXPECT_EQ(result.message, "broken");
  EXPECT_THROW(std::rethrow_exception(result.exception), std::runtime_error);
}

// make_job also takes a callable that returns nothing: ok, unless it throws.
TEST_F(JobTest, MakeJobTakesACallableThatReturnsNothing) {
  std::atomic<int> ran{0};
  auto quiet = make_job(
      "quiet", [&](ProgressMonitor&) { ran.fetch_add(1); }, manager_);
  auto loud = make_job(
      "loud", [](ProgressMonitor&) { throw std::runtime_error("void and broken"); }, manager_);
  quiet->schedule();
  loud->schedule();
  ASSERT_TRUE(quiet->join(patience));
  ASSERT_TRUE(loud->join(patience));
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE(quiet->result().is_ok());
  EXPECT_TRUE(loud->result().is_error());
  EXPECT_EQ(loud->result().message, "void and broken");
}

TEST_F(JobTest, CurrentJobIsTheRunningJob) {
  std::shared_ptr<Job> seen;
  std::shared_ptr<Job> j;
  j = job("me", [&](ProgressMonitor&) {
    seen = manager_->current_job();
    return Status::ok();
  });
  j->schedule();
  j->join();
  EXPECT_EQ(seen, j);
  EXPECT_EQ(manager_->current_job(), nullptr);
}

TEST_F(JobTest, PrioritiesOrderTheStartOfNonConflictingJobs) {
  auto one = JobManager::create(JobManager::Options{1, nullptr});
  Gate blocker_in, release;
  std::vector<std::string> order;
  std::mutex order_mutex;
  auto blocker = make_job(
      "blocker",
      [&](ProgressMonitor&) {
        blocker_in.open();
        release.wait();
        return Status::ok();
      },
      one);
  blocker->schedule();
  ASSERT_TRUE(blocker_in.wait());
  const auto recorder = [&](std::string name) {
    return [&, name](ProgressMonitor&) {
      std::lock_guard lock(order_mutex);
      order.push_back(name);
      return Status::ok();
    };
  };
  auto slow = make_job("decorate", recorder("decorate"), one);
  slow->set_priority(Priority::decorate);
  auto fast = make_job("interactive", recorder("interactive"), one);
  fast->set_priority(Priority::interactive);
  slow->schedule();
  fast->schedule();
  release.open();
  EXPECT_TRUE(one->join(nullptr, 30s));
  EXPECT_EQ(order, (std::vector<std::string>{"interactive", "decorate"}));
}

TEST_F(JobTest, SuspendedManagerStartsNoJob) {
  std::atomic<bool> ran{false};
  manager_->suspend();
  auto j = job("held", [&](ProgressMonitor&) {
    ran = true;
    return Status::ok();
  });
  j->schedule();
  EXPECT_TRUE(manager_->join(nullptr, 30s)) << "while suspended, join waits only for running jobs";
  EXPECT_FALSE(ran.load());
  EXPECT_EQ(j->state(), JobState::waiting);
  EXPECT_FALSE(manager_->is_idle());
  manager_->resume();
  j->join();
  EXPECT_TRUE(ran.load());
}

TEST_F(JobTest, ResumeStartsTheHeldJobsInScheduleOrder) {
  const Rule rule = rules::mutex("ordered");
  std::vector<int> order;  // guarded by the rule
  manager_->suspend();
  EXPECT_TRUE(manager_->is_suspended());
  for (int i = 0; i < 20; ++i) {
    auto j = job("held" + std::to_string(i), [&order, i](ProgressMonitor&) {
      order.push_back(i);
      return Status::ok();
    });
    j->set_rule(rule);
    j->schedule();
  }
  EXPECT_FALSE(manager_->is_idle());
  manager_->resume();
  EXPECT_FALSE(manager_->is_suspended());
  EXPECT_TRUE(manager_->join(nullptr, patience));
  ASSERT_EQ(order.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST_F(JobTest, WhileSuspendedJoinWaitsForTheRunningJobsOnly) {
  Gate in_run, release;
  auto running = job("running", [&](ProgressMonitor&) {
    in_run.open();
    release.wait();
    return Status::ok();
  });
  running->schedule();
  ASSERT_TRUE(in_run.wait());
  manager_->suspend();
  auto held = job("held", [](ProgressMonitor&) { return Status::ok(); });
  held->schedule();
  auto joined = std::async(std::launch::async, [&] { return manager_->join(nullptr, patience); });
  EXPECT_NE(joined.wait_for(0ms), std::future_status::ready) << "a running job is waited for";
  release.open();
  ASSERT_EQ(joined.wait_for(patience), std::future_status::ready);
  EXPECT_TRUE(joined.get());
  EXPECT_EQ(held->state(), JobState::waiting);
  manager_->resume();
  EXPECT_TRUE(held->join(patience));
}

TEST_F(JobTest, DestroyingAManagerCancelsWhatHasNotStarted) {
  std::atomic<int> ran{0};
  std::vector<std::shared_ptr<Job>> jobs;
  {
    auto local = JobManager::create(JobManager::Options{1, nullptr});
    const Rule rule = rules::mutex("m");
    local->begin_rule(rule);
    for (int i = 0; i < 10; ++i) {
      auto j = make_job(
          "pending" + std::to_string(i),
          [&](ProgressMonitor&) {
            ran.fetch_add(1);
            return Status::ok();
          },
          local);
      j->set_rule(rule);
      j->schedule();
      jobs.push_back(j);
    }
    auto sleeper = make_job(
        "sleeper",
        [&](ProgressMonitor&) {
          ran.fetch_add(1);
          return Status::ok();
        },
        local);
    sleeper->schedule(std::chrono::hours(1));
    jobs.push_back(sleeper);
    local->end_rule(rule);
    local->suspend();  // nothing new starts; the destructor cancels the rest
    local.reset();     // the jobs keep their manager alive ...
  }
  for (auto& j : jobs) {
    // ... so cancel them through it: nothing must hang or leak.
    j->cancel();
  }
  for (auto& j : jobs) EXPECT_NE(j->state(), JobState::running);
}

}  // namespace
}  // namespace tasklet
