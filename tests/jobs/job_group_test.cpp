// Job groups: throttling to max_threads, combined results, should_cancel() after a failure,
// canceling a group, and seed jobs.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

using test::Counter;
using test::Gate;
using test::JobTest;
using test::patience;

TEST_F(JobTest, JobGroupThrottlesAndCombinesResults) {
  auto wide = JobManager::create(JobManager::Options{4, nullptr});  // more runners than the group may use
  auto group = std::make_shared<JobGroup>("pair", 2, 6);
  Gate release;
  Counter entered;
  std::atomic<int> running{0}, most{0};
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 6; ++i) {
    auto j = make_job(
        "g" + std::to_string(i),
        [&](ProgressMonitor&) {
          const int now = running.fetch_add(1) + 1;
          int seen = most.load();
          while (now > seen && !most.compare_exchange_weak(seen, now)) {
          }
          entered.add();
          release.wait();
          running.fetch_sub(1);
          return Status::ok();
        },
        wide);
    j->set_group(group);
    j->schedule();
    jobs.push_back(j);
  }
  ASSERT_TRUE(entered.wait_for(2));
  int throttled = 0;
  for (auto& j : jobs) throttled += j->state() == JobState::waiting ? 1 : 0;
  EXPECT_EQ(throttled, 4) << "two runners are free, but the group lets two in";
  EXPECT_EQ(entered.get(), 2);
  release.open();
  EXPECT_TRUE(group->join(patience));
  EXPECT_EQ(entered.get(), 6);
  EXPECT_LE(most.load(), 2);
  EXPECT_TRUE(group->result().is_ok());
  EXPECT_EQ(group->state(), JobGroup::State::none);
}

TEST_F(JobTest, AFailedJobCancelsItsGroup) {
  auto group = std::make_shared<JobGroup>("fragile", 1, 4);
  std::atomic<int> ran{0};
  std::vector<std::shared_ptr<Job>> jobs;
  jobs.push_back(job("fails", [](ProgressMonitor&) { return Status::error("no"); }));
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(job("after" + std::to_string(i), [&](ProgressMonitor&) {
      ran.fetch_add(1);
      return Status::ok();
    }));
  }
  for (auto& j : jobs) {
    j->set_group(group);
    j->schedule();
  }
  const bool joined = group->join(30s);
  EXPECT_TRUE(joined);
  if (!joined) {
    for (auto& j : group->active_jobs()) {
      ADD_FAILURE() << "still active: " << j->name() << " state " << static_cast<int>(j->state());
    }
  }
  EXPECT_EQ(ran.load(), 0) << "throttled behind the failure, then canceled";
  const Status result = group->result();
  EXPECT_TRUE(result.is_error());
  EXPECT_EQ(result.children.size(), 4u);
}

TEST_F(JobTest, CancelingAGroupCancelsItsJobsAndRefusesNewOnesUntilItIsOver) {
  auto group = std::make_shared<JobGroup>("canceled", 1, 0);
  Gate in_run, release;
  auto first = job("first", [&](ProgressMonitor& monitor) {
    in_run.open();
    release.wait();  // the group stays canceling until it ends
    return monitor.is_canceled() ? Status::cancel() : Status::error("not canceled");
  });
  auto throttled = job("throttled", [](ProgressMonitor&) { return Status::ok(); });
  for (auto& j : {first, throttled}) {
    j->set_group(group);
    j->schedule();
  }
  ASSERT_TRUE(in_run.wait());
  EXPECT_EQ(throttled->state(), JobState::waiting) << "behind max_threads = 1";
  EXPECT_EQ(group->active_jobs().size(), 2u);
  group->cancel();
  EXPECT_EQ(group->state(), JobGroup::State::canceling);
  auto late = job("late", [](ProgressMonitor&) { return Status::ok(); });
  late->set_group(group);
  late->schedule();
  EXPECT_EQ(late->state(), JobState::none);
  EXPECT_EQ(late->result().message, "the job's group is canceling");
  release.open();
  EXPECT_TRUE(group->join(patience));
  EXPECT_EQ(group->state(), JobGroup::State::none);
  EXPECT_TRUE(throttled->result().is_canceled());
  EXPECT_TRUE(group->result().is_canceled());
}

// Never cancels; keeps what it was asked about.
class Tolerant final : public JobGroup {
 public:
  Tolerant() : JobGroup("tolerant", 0, 3) {}
  std::atomic<int> asked{0};

 protected:
  bool should_cancel(const Status&, int, int) override {
    asked.fetch_add(1);
    return false;
  }
};

// Its should_cancel() tells the test it was asked, waits for its answer, then gives `cancel`.
class Deliberating final : public JobGroup {
 public:
  Deliberating(int max_threads, bool cancel) : JobGroup("deliberating", max_threads, 2), cancel_(cancel) {}
  Gate asked, answer;

 protected:
  bool should_cancel(const Status&, int, int) override {
    asked.open();
    answer.wait();
    return cancel_;
  }

 private:
  bool cancel_;
};

// The failure's slot is free while should_cancel() decides, and a runner is free too: a job
// scheduled into the group then waits for the decision (and is canceled with the group).
TEST_F(JobTest, AJobScheduledWhileTheGroupDecidesAboutAFailureWaitsForTheDecision) {
  for (const int max_threads : {1, 0}) {
    for (const bool cancel : {true, false}) {
      SCOPED_TRACE("max_threads " + std::to_string(max_threads) + (cancel ? ", cancels" : ", goes on"));
      auto group = std::make_shared<Deliberating>(max_threads, cancel);
      std::atomic<int> ran{0};
      auto fails = job("fails", [](ProgressMonitor&) { return Status::error("no"); });
      auto late = job("late", [&](ProgressMonitor&) {
        ran.fetch_add(1);
        return Status::ok();
      });
      fails->set_group(group);
      late->set_group(group);
      fails->schedule();
      ASSERT_TRUE(group->asked.wait());
      late->schedule();
      EXPECT_FALSE(late->join(50ms)) << "let in before should_cancel() decided";
      EXPECT_EQ(ran.load(), 0);
      group->answer.open();
      EXPECT_TRUE(group->join(patience));
      EXPECT_TRUE(late->join(patience));
      if (cancel) {
        EXPECT_EQ(ran.load(), 0);
        EXPECT_TRUE(late->result().is_canceled());
      } else {
        EXPECT_EQ(ran.load(), 1);
        EXPECT_TRUE(late->result().is_ok());
      }
    }
  }
}

// The group is over (its other job ended) while should_cancel() still decides about a failure; a
// job scheduled into it since starts a new batch, which that late decision does not cancel.
TEST_F(JobTest, ALateDecisionAboutAFailureDoesNotCancelTheGroupsNextBatch) {
  class DecidesLate final : public JobGroup {
   public:
    DecidesLate() : JobGroup("decides late", 0, 0) {}
    Gate asked, answer;

   protected:
    bool should_cancel(const Status&, int, int) override {
      asked.open();
      answer.wait();
      return true;
    }
  };
  auto group = std::make_shared<DecidesLate>();
  Gate go;
  auto slow = job("slow", [&](ProgressMonitor&) {
    go.wait();
    return Status::ok();
  });
  auto fails = job("fails", [](ProgressMonitor&) { return Status::error("no"); });
  std::atomic<int> ran{0};
  auto next = job("next batch", [&](ProgressMonitor&) {
    ran.fetch_add(1);
    return Status::ok();
  });
  for (const auto& j : {slow, fails, next}) j->set_group(group);
  slow->schedule();
  fails->schedule();
  ASSERT_TRUE(group->asked.wait());
  go.open();  // the slow job ends: the group is over, the decision still pending
  ASSERT_TRUE(group->join(patience));
  next->schedule();
  group->answer.open();
  ASSERT_TRUE(next->join(patience));
  EXPECT_TRUE(next->result().is_ok()) << next->result().message;
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE(group->join(patience));
}

TEST_F(JobTest, AGroupCombinesItsResultsAndTellsTheLastDoneEvent) {
  struct GroupResult final : JobListener {
    void done(const JobEvent& e) override {
      std::lock_guard lock(mutex);
      if (e.group_result) result = *e.group_result;
      dones.add();
    }
    std::mutex mutex;
    std::optional<Status> result;
    Counter dones;
  };
  auto listener = std::make_shared<GroupResult>();
  manager_->add_listener(listener);
  auto group = std::make_shared<Tolerant>();
  std::vector<std::shared_ptr<Job>> jobs{
      job("fails", [](ProgressMonitor&) { return Status::error("bad"); }),
      job("cancels", [](ProgressMonitor&) { return Status::cancel("stopped"); }),
      job("succeeds", [](ProgressMonitor&) { return Status::ok(); }),
  };
  for (auto& j : jobs) {
    j->set_group(group);
    j->schedule();
  }
  EXPECT_TRUE(group->join(patience));
  const Status combined = group->result();
  EXPECT_TRUE(combined.is_error());
  EXPECT_EQ(combined.children.size(), 2u);
  for (auto& j : jobs) EXPECT_EQ(j->state(), JobState::none) << "the group tolerated the failure";
  EXPECT_GE(group->asked.load(), 1);
  ASSERT_TRUE(listener->dones.wait_for(3));
  std::lock_guard lock(listener->mutex);
  ASSERT_TRUE(listener->result.has_value());
  EXPECT_TRUE(listener->result->is_error());
}

TEST_F(JobTest, AGroupStaysActiveUntilItsSeedsHaveFinished) {
  auto group = std::make_shared<JobGroup>("seeded", 0, 2);
  auto one = job("one", [](ProgressMonitor&) { return Status::ok(); });
  one->set_group(group);
  one->schedule();
  EXPECT_TRUE(one->join(patience));
  EXPECT_EQ(group->state(), JobGroup::State::active) << "one seed of two has finished";
  EXPECT_FALSE(group->join(1ms));
  auto two = job("two", [](ProgressMonitor&) { return Status::ok(); });
  two->set_group(group);
  two->schedule();
  EXPECT_TRUE(group->join(patience));
  EXPECT_TRUE(group->result().is_ok());
}

}  // namespace
}  // namespace tasklet
