// Sleeping, waking and delays: schedule(delay), sleep() and wake_up() in each state, and the timer
// that wakes delayed jobs.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

using test::Counter;
using test::eventually;
using test::Gate;
using test::JobTest;
using test::patience;

TEST_F(JobTest, DelayedJobSleepsThenRuns) {
  std::atomic<bool> ran{false};
  auto j = job("later", [&](ProgressMonitor&) {
    ran = true;
    return Status::ok();
  });
  j->schedule(20ms);
  EXPECT_EQ(j->state(), JobState::sleeping);
  j->join();
  EXPECT_TRUE(ran.load());
}

TEST_F(JobTest, ALongDelayDoesNotHoldBackAShortOne) {
  auto slow = job("in an hour", [](ProgressMonitor&) { return Status::ok(); });
  auto soon = job("soon", [](ProgressMonitor&) { return Status::ok(); });
  slow->schedule(std::chrono::hours(1));
  soon->schedule(1ms);
  EXPECT_TRUE(soon->join(patience));
  EXPECT_TRUE(soon->result().is_ok());
  EXPECT_EQ(slow->state(), JobState::sleeping);
  EXPECT_TRUE(slow->cancel());
}

TEST_F(JobTest, DelayedConflictingJobsStartInDelayOrder) {
  const Rule rule = rules::mutex("ordered");
  std::vector<int> order;  // guarded by the rule
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i <= 5; ++i) {  // later and with a longer delay: due strictly later
    auto j = job("delay" + std::to_string(i), [&order, i](ProgressMonitor&) {
      order.push_back(i);
      return Status::ok();
    });
    j->set_rule(rule);
    j->schedule(std::chrono::milliseconds((i + 1) * 5));  // all through the one timer thread
    jobs.push_back(j);
  }
  EXPECT_TRUE(manager_->join(nullptr, patience));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST_F(JobTest, DelayedJobsWakeOnTimeWhileEveryWorkerIsBusy) {
  // Eclipse woke sleeping jobs only when a worker looked for work; here a timer does it, so a
  // delayed job is waiting on time even while every worker is busy, and runs when one frees up.
  Gate release;
  std::vector<std::shared_ptr<Job>> busy;
  for (int i = 0; i < 2; ++i) {
    busy.push_back(job("busy" + std::to_string(i), [&](ProgressMonitor&) {
      release.wait();
      return Status::ok();
    }));
    busy.back()->schedule();
  }
  for (auto& b : busy) {
    ASSERT_TRUE(eventually([&] { return b->state() == JobState::running; }));
  }
  auto delayed = job("delayed", [](ProgressMonitor&) { return Status::ok(); });
  delayed->schedule(5ms);
  EXPECT_TRUE(eventually([&] { return delayed->state() != JobState::sleeping; }));
  EXPECT_EQ(delayed->state(), JobState::waiting) << "woken while both workers were busy";
  release.open();
  delayed->join();
  for (auto& b : busy) b->join();  // they use `release`, which dies with this scope
  EXPECT_TRUE(delayed->result().is_ok());
}

// Counts the `scheduled` events it hears.
class ScheduledCounter final : public JobListener {
 public:
  void scheduled(const JobEvent&) override { count.add(); }
  Counter count;
};

TEST_F(JobTest, ScheduleWhileSleepingKeepsTheJobAsleep) {
  auto j = job("sleeper", [](ProgressMonitor&) { return Status::ok(); });
  j->schedule(std::chrono::hours(1));
  j->schedule();
  j->schedule(1ms);
  EXPECT_EQ(j->state(), JobState::sleeping) << "a sleeping job keeps its delay";
  EXPECT_TRUE(j->cancel());
}

TEST_F(JobTest, RescheduleWithADelayWhileRunningSleepsAfterTheRun) {
  Gate in_run, release;
  std::atomic<int> runs{0};
  auto scheduled = std::make_shared<ScheduledCounter>();
  auto j = job("again later", first_run_waits(runs, in_run, release));
  j->add_listener(scheduled);
  j->schedule();
  ASSERT_TRUE(in_run.wait());
  j->schedule(std::chrono::hours(1));
  release.open();
  ASSERT_TRUE(scheduled->count.wait_for(2)) << "the re-run was queued";
  EXPECT_EQ(j->state(), JobState::sleeping);
  j->schedule();  // sleeping: no effect
  EXPECT_EQ(j->state(), JobState::sleeping);
  j->wake_up();
  EXPECT_TRUE(manager_->join(nullptr, patience));
  EXPECT_EQ(runs.load(), 2);
}

TEST_F(JobTest, SleepAndWakeUp) {
  const Rule rule = rules::mutex("held");
  manager_->begin_rule(rule);
  std::atomic<int> runs{0};
  auto j = job("napper", [&](ProgressMonitor&) {
    runs.fetch_add(1);
    return Status::ok();
  });
  j->set_rule(rule);
  j->schedule();
  EXPECT_TRUE(j->sleep());
  EXPECT_EQ(j->state(), JobState::sleeping);
  manager_->end_rule(rule);
  EXPECT_EQ(runs.load(), 0);
  j->wake_up();
  j->join();
  EXPECT_EQ(runs.load(), 1);
}

TEST_F(JobTest, SleepInEachState) {
  auto none = job("none", [](ProgressMonitor&) { return Status::ok(); });
  EXPECT_TRUE(none->sleep());
  EXPECT_EQ(none->state(), JobState::none);

  auto sleeping = job("sleeping", [](ProgressMonitor&) { return Status::ok(); });
  sleeping->schedule(std::chrono::hours(1));
  EXPECT_TRUE(sleeping->sleep()) << "a sleeping job loses its wake-up time";
  EXPECT_EQ(sleeping->state(), JobState::sleeping);
  EXPECT_TRUE(sleeping->cancel());
  EXPECT_EQ(sleeping->state(), JobState::none);

  Gate in_run, release;
  auto running = job("running", [&](ProgressMonitor&) {
    in_run.open();
    release.wait();
    return Status::ok();
  });
  running->schedule();
  ASSERT_TRUE(in_run.wait());
  EXPECT_FALSE(running->sleep());
  EXPECT_EQ(running->state(), JobState::running);
  release.open();
  EXPECT_TRUE(running->join(patience));
}

TEST_F(JobTest, AWaitingJobPutToSleepStaysAsleepAfterItsBlockerEnds) {
  const Rule rule = rules::mutex("blocker");
  std::atomic<bool> ran{false};
  Gate in_blocker, release;
  auto blocker = job("blocker", [&](ProgressMonitor&) {
    in_blocker.open();
    release.wait();
    return Status::ok();
  });
  auto sleeper = job("sleeper", [&](ProgressMonitor&) {
    ran = true;
    return Status::ok();
  });
  blocker->set_rule(rule);
  sleeper->set_rule(rule);
  blocker->schedule();
  ASSERT_TRUE(in_blocker.wait());
  sleeper->schedule();
  EXPECT_TRUE(sleeper->sleep());
  release.open();
  EXPECT_TRUE(blocker->join(patience));
  EXPECT_EQ(sleeper->state(), JobState::sleeping);
  EXPECT_EQ(manager_->rule_stats().waiting, 0u) << "its request left the rule table";
  EXPECT_FALSE(ran.load());
  sleeper->wake_up();
  EXPECT_TRUE(sleeper->join(patience));
  EXPECT_TRUE(ran.load());
}

}  // namespace
}  // namespace tasklet
