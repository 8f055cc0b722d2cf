// Canceling a job in each state, scheduling it again after a cancel, and joining it.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

using test::Gate;
using test::Hooked;
using test::JobTest;
using test::patience;
using test::Recorder;

TEST_F(JobTest, CancelReturnsWhetherTheJobWasStopped) {
  auto none = job("none", [](ProgressMonitor&) { return Status::ok(); });
  EXPECT_TRUE(none->cancel());
  EXPECT_EQ(none->state(), JobState::none);
  EXPECT_TRUE(none->result().is_ok()) << "canceling a job in state none changes nothing";

  auto sleeping = job("sleeping", [](ProgressMonitor&) { return Status::ok(); });
  sleeping->schedule(std::chrono::hours(1));
  EXPECT_TRUE(sleeping->cancel());

  const Rule rule = rules::mutex("held");
  manager_->begin_rule(rule);
  auto waiting = job("waiting", [](ProgressMonitor&) { return Status::ok(); });
  waiting->set_rule(rule);
  waiting->schedule();
  EXPECT_TRUE(waiting->cancel());
  manager_->end_rule(rule);

  Gate in_run;
  auto running = job("running", [&](ProgressMonitor& monitor) {
    in_run.open();
    while (!monitor.is_canceled()) std::this_thread::yield();
    return Status::cancel();
  });
  running->schedule();
  ASSERT_TRUE(in_run.wait());
  EXPECT_FALSE(running->cancel());
  EXPECT_TRUE(running->join(patience));
  for (const auto& j : {sleeping, waiting, running}) EXPECT_TRUE(j->result().is_canceled()) << j->name();
}

TEST_F(JobTest, CancelingASleepingJobRemovesItAtOnce) {
  std::atomic<bool> ran{false};
  auto j = job("never", [&](ProgressMonitor&) {
    ran = true;
    return Status::ok();
  });
  j->schedule(std::chrono::hours(1));
  EXPECT_TRUE(j->cancel());
  EXPECT_EQ(j->state(), JobState::none);
  EXPECT_TRUE(j->result().is_canceled());
  EXPECT_TRUE(j->join(0ms));
  EXPECT_FALSE(ran.load());
}

TEST_F(JobTest, CancelingAWaitingJob) {
  const Rule rule = rules::path("/busy");
  std::atomic<bool> ran{false};
  auto j = job("waiting", [&](ProgressMonitor&) {
    ran = true;
    return Status::ok();
  });
  j->set_rule(rule);
  manager_->begin_rule(rule);
  j->schedule();
  EXPECT_EQ(j->state(), JobState::waiting);
  EXPECT_EQ(manager_->rule_stats().waiting, 1u);
  EXPECT_TRUE(j->cancel());
  EXPECT_EQ(j->state(), JobState::none);
  EXPECT_TRUE(j->result().is_canceled());
  EXPECT_EQ(manager_->rule_stats().waiting, 0u) << "its request left the rule table";
  manager_->end_rule(rule);
  EXPECT_FALSE(ran.load());
}

class CancelAwareJob final : public Job {
 public:
  using Job::Job;
  Gate in_run, saw_cancel, release;
  std::atomic<int> canceling_calls{0};

 protected:
  // Spins until its monitor says canceled, then stays in run() until released, so the test can
  // cancel it again while it is certainly still running.
  Status run(ProgressMonitor& monitor) override {
    in_run.open();
    while (!monitor.is_canceled()) std::this_thread::yield();
    saw_cancel.open();
    release.wait();
    return Status::cancel();
  }
  void canceling() override { canceling_calls.fetch_add(1); }
};

TEST_F(JobTest, CancelingARunningJobIsSeenThroughItsMonitor) {
  auto j = std::make_shared<CancelAwareJob>("spinner", manager_);
  j->schedule();
  ASSERT_TRUE(j->in_run.wait());
  EXPECT_FALSE(j->cancel()) << "a running job is only asked to stop";
  ASSERT_TRUE(j->saw_cancel.wait()) << "the monitor shows the cancellation";
  EXPECT_FALSE(j->cancel()) << "still running: again only asked";
  j->release.open();
  j->join();
  EXPECT_TRUE(j->result().is_canceled());
  EXPECT_EQ(j->canceling_calls.load(), 1) << "canceling() once per run";
}

TEST_F(JobTest, CancelFromAboutToRunEndsTheRunUnrun) {
  struct Canceler final : JobListener {
    void about_to_run(const JobEvent& e) override { e.job->cancel(); }
  };
  auto recorder = std::make_shared<Recorder>();
  std::atomic<int> runs{0};
  auto j = job("stopped at the door", [&](ProgressMonitor&) {
    runs.fetch_add(1);
    return Status::ok();
  });
  j->add_listener(std::make_shared<Canceler>());
  j->add_listener(recorder);
  j->schedule();
  ASSERT_TRUE(recorder->dones.wait_for(1));
  EXPECT_EQ(runs.load(), 0);
  EXPECT_TRUE(j->result().is_canceled());
  EXPECT_EQ(recorder->of("stopped at the door"),
            (std::vector<std::string>{"scheduled", "about_to_run", "done"}));
}

TEST_F(JobTest, CancelInsideShouldRunEndsTheRun) {
  auto j = std::make_shared<Hooked>(
      [](Job& self) {
        self.cancel();
        return true;
      },
      manager_);
  j->schedule();
  EXPECT_TRUE(j->join(patience));
  EXPECT_EQ(j->runs.load(), 0);
  EXPECT_TRUE(j->result().is_canceled());
}

TEST_F(JobTest, CancelThenScheduleWhileRunningRunsAgain) {
  Gate in_run, release;
  std::atomic<int> runs{0};
  auto j = job("cancel then schedule", [&](ProgressMonitor& monitor) {
    if (runs.fetch_add(1) == 0) {
      in_run.open();
      release.wait();
    }
    return monitor.is_canceled() ? Status::cancel() : Status::ok();
  });
  j->schedule();
  ASSERT_TRUE(in_run.wait());
  EXPECT_FALSE(j->cancel());
  j->schedule();
  release.open();
  EXPECT_TRUE(manager_->join(nullptr, patience));
  EXPECT_EQ(runs.load(), 2);
  EXPECT_TRUE(j->result().is_ok()) << "the re-run has a fresh monitor";
}

TEST_F(JobTest, ScheduleAfterCancelingAWaitingJobQueuesItAgain) {
  const Rule rule = rules::mutex("busy");
  std::atomic<int> runs{0};
  auto j = job("requeued", [&](ProgressMonitor&) {
    runs.fetch_add(1);
    return Status::ok();
  });
  j->set_rule(rule);
  manager_->begin_rule(rule);
  j->schedule();
  EXPECT_TRUE(j->cancel());
  EXPECT_TRUE(j->result().is_canceled());
  j->schedule();
  EXPECT_EQ(j->state(), JobState::waiting);
  manager_->end_rule(rule);
  EXPECT_TRUE(j->join(patience));
  EXPECT_EQ(runs.load(), 1);
  EXPECT_TRUE(j->result().is_ok());
}

// cancel() is the last word: a re-run asked for before it is dropped (one asked for after it is
// kept: CancelThenScheduleWhileRunningRunsAgain), and a schedule() once the run has ended runs the
// job again.
TEST_F(JobTest, CancelDropsAReRunAskedForWhileTheJobRuns) {
  Gate in_run, release;
  std::atomic<int> runs{0};
  auto j = job("re-run dropped", [&](ProgressMonitor& monitor) {
    if (runs.fetch_add(1) == 0) {
      in_run.open();
      release.wait();
    }
    return monitor.is_canceled() ? Status::cancel() : Status::ok();
  });
  j->schedule();
  ASSERT_TRUE(in_run.wait());
  j->schedule();  // running: asks for one more run
  EXPECT_FALSE(j->cancel()) << "a running job is only asked to stop";
  release.open();
  EXPECT_TRUE(manager_->join(nullptr, patience)) << "join(family) waits for a re-run too";
  EXPECT_EQ(runs.load(), 1) << "the re-run asked for before the cancel was dropped";
  EXPECT_EQ(j->state(), JobState::none);
  EXPECT_TRUE(j->result().is_canceled());

  j->schedule();
  EXPECT_TRUE(j->join(patience));
  EXPECT_EQ(runs.load(), 2);
  EXPECT_TRUE(j->result().is_ok()) << "the new run has a fresh monitor";
}

// The same for a waiting job whose run a runner has already taken: the run is held inside
// should_run() while the test asks for a re-run and then cancels. The run ends the job unrun and
// canceled, and nothing runs after it until the next schedule().
TEST_F(JobTest, CancelOfARunAlreadyTakenDropsItAndAReRunAskedForBefore) {
  Gate in_should_run, release;
  std::atomic<int> asked{0};
  auto j = std::make_shared<Hooked>(
      [&](Job&) {
        if (asked.fetch_add(1) == 0) {
          in_should_run.open();
          release.wait();
        }
        return true;
      },
      manager_);
  j->schedule();
  ASSERT_TRUE(in_should_run.wait());
  EXPECT_EQ(j->state(), JobState::waiting) << "taken by a runner, not running yet";
  j->schedule();  // about to run: asks for one more run
  EXPECT_FALSE(j->cancel()) << "the run is taken: it is left to end the job";
  release.open();
  EXPECT_TRUE(manager_->join(nullptr, patience)) << "join(family) waits for a re-run too";
  EXPECT_EQ(j->runs.load(), 0);
  EXPECT_EQ(asked.load(), 1) << "the re-run asked for before the cancel was dropped";
  EXPECT_EQ(j->state(), JobState::none);
  EXPECT_TRUE(j->result().is_canceled());
  EXPECT_EQ(j->result().message, "canceled before it ran");

  j->schedule();
  EXPECT_TRUE(j->join(patience));
  EXPECT_EQ(asked.load(), 2);
  EXPECT_EQ(j->runs.load(), 1);
  EXPECT_TRUE(j->result().is_ok());
}

TEST_F(JobTest, JoinWithTimeoutAndSelfJoin) {
  const Rule rule = rules::mutex("m");
  manager_->begin_rule(rule);
  std::atomic<bool> self_join_refused{false};
  std::shared_ptr<Job> j;
  j = job("joiner", [&](ProgressMonitor&) {
    try {
      j->join();
    } catch (const IllegalState&) {
      self_join_refused = true;
    }
    return Status::ok();
  });
  j->set_rule(rule);
  j->schedule();
  EXPECT_FALSE(j->join(20ms)) << "still waiting for its rule";
  manager_->end_rule(rule);
  EXPECT_TRUE(j->join(30s));
  EXPECT_TRUE(self_join_refused.load());
}

TEST_F(JobTest, JoinTimesOutWhileTheJobRuns) {
  Gate in_run, release;
  auto j = job("long", [&](ProgressMonitor&) {
    in_run.open();
    release.wait();
    return Status::ok();
  });
  j->schedule();
  ASSERT_TRUE(in_run.wait());
  EXPECT_FALSE(j->join(1ms));
  EXPECT_EQ(j->state(), JobState::running);
  release.open();
  EXPECT_TRUE(j->join(patience));
}

TEST_F(JobTest, JoinReturnsWhenAWaitingJobIsCanceled) {
  const Rule rule = rules::mutex("held");
  manager_->begin_rule(rule);
  auto j = job("never runs", [](ProgressMonitor&) { return Status::ok(); });
  j->set_rule(rule);
  j->schedule();
  auto joined = std::async(std::launch::async, [&] { return j->join(patience); });
  EXPECT_TRUE(j->cancel());
  ASSERT_EQ(joined.wait_for(patience), std::future_status::ready);
  EXPECT_TRUE(joined.get());
  manager_->end_rule(rule);
}

TEST_F(JobTest, JoinKeepsWaitingAcrossSleepAndWake) {
  const Rule rule = rules::mutex("held");
  manager_->begin_rule(rule);
  std::atomic<bool> ran{false};
  auto j = job("napper", [&](ProgressMonitor&) {
    ran = true;
    return Status::ok();
  });
  j->set_rule(rule);
  j->schedule();
  auto joined = std::async(std::launch::async, [&] {
    j->join();
    return ran.load();
  });
  EXPECT_TRUE(j->sleep());
  j->wake_up(1ms);
  EXPECT_NE(joined.wait_for(0ms), std::future_status::ready);
  manager_->end_rule(rule);
  ASSERT_EQ(joined.wait_for(patience), std::future_status::ready);
  EXPECT_TRUE(joined.get()) << "join returned before the run";
}

}  // namespace
}  // namespace tasklet
