// The job manager: Eclipse Jobs semantics on the tasklet engine (tests written anew in our API,
// after the spirit of Eclipse's org.eclipse.core.tests.runtime jobs suite).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <latch>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

using test::Counter;
using test::eventually;
using test::Gate;
using test::patience;
using test::Recorder;

class JobTest : public ::testing::Test {
 protected:
  void TearDown() override {
    const bool joined = manager_->join(nullptr, 30s);
    EXPECT_TRUE(joined);
    if (!joined) {
      for (auto& j : manager_->find(nullptr)) {
        ADD_FAILURE() << "left behind: " << j->name() << " state " << static_cast<int>(j->state());
      }
    }
    EXPECT_TRUE(manager_->is_idle());
    EXPECT_EQ(manager_->rule_stats().held, 0u);
    EXPECT_EQ(manager_->rule_stats().waiting, 0u);
  }
  std::shared_ptr<JobManager> manager_ = JobManager::create(JobManager::Options{2, nullptr});

  std::shared_ptr<Job> job(std::string name, std::function<Status(ProgressMonitor&)> fn) {
    return make_job(std::move(name), std::move(fn), manager_);
  }
};

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

class Vetoing final : public Job {
 public:
  Vetoing(bool schedule, bool run, std::shared_ptr<JobManager> manager)
      : Job("veto", std::move(manager)), schedule_(schedule), run_(run) {}
  std::atomic<bool> ran{false};

 protected:
  Status run(ProgressMonitor&) override {
    ran = true;
    return Status::ok();
  }
  bool should_schedule() override { return schedule_; }
  bool should_run() override { return run_; }

 private:
  bool schedule_, run_;
};

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

TEST_F(JobTest, ExceptionsBecomeErrorResults) {
  auto j = job("thrower", [](ProgressMonitor&) -> Status { throw std::runtime_error("broken"); });
  j->schedule();
  j->join();
  const Status result = j->result();
  ASSERT_TRUE(result.is_error());
  EXPECT_EQ(result.message, "broken");
  EXPECT_THROW(std::rethrow_exception(result.exception), std::runtime_error);
}

TEST_F(JobTest, ConflictingJobsFinishInScheduleOrder) {
  const Rule rule = rules::path("/shared");
  std::vector<int> order;  // guarded by the rule
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 500; ++i) {
    auto j = job("j" + std::to_string(i), [&, i](ProgressMonitor&) {
      order.push_back(i);
      return Status::ok();
    });
    j->set_rule(rule);
    jobs.push_back(j);
  }
  for (auto& j : jobs) j->schedule();
  EXPECT_TRUE(manager_->join(nullptr, 60s));
  ASSERT_EQ(order.size(), 500u);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST_F(JobTest, ListenerEventsArriveInOrder) {
  auto recorder = std::make_shared<Recorder>();
  manager_->add_listener(recorder);
  auto j = job("observed", [](ProgressMonitor&) { return Status::ok(); });
  j->schedule();
  j->join();
  auto sleepy = job("sleepy", [](ProgressMonitor&) { return Status::ok(); });
  sleepy->schedule(std::chrono::hours(1));
  sleepy->wake_up();
  sleepy->join();
  EXPECT_TRUE(manager_->join(nullptr, 30s));
  // join() returns when the run is over; the done events may still be on their way.
  ASSERT_TRUE(recorder->dones.wait_for(2));
  manager_->remove_listener(recorder);
  EXPECT_EQ(recorder->of("observed"),
            (std::vector<std::string>{"scheduled", "about_to_run", "running", "done"}));
  EXPECT_EQ(recorder->of("sleepy"),
            (std::vector<std::string>{"scheduled", "awake", "about_to_run", "running", "done"}));
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

struct Tagged final : Job {
  Tagged(std::string name, Family family, std::shared_ptr<JobManager> manager)
      : Job(std::move(name), std::move(manager)), family_(family) {}
  bool belongs_to(Family family) const override { return family == family_; }
  Status run(ProgressMonitor& monitor) override {
    while (!monitor.is_canceled() && blocked && !released->load()) std::this_thread::yield();
    return monitor.is_canceled() ? Status::cancel() : Status::ok();
  }
  Family family_;
  bool blocked = false;
  std::atomic<bool>* released = nullptr;
};

TEST_F(JobTest, FamiliesFindCancelJoinSleepAndWake) {
  static const int builds = 0, docs = 0;
  std::atomic<bool> released{false};
  std::vector<std::shared_ptr<Tagged>> build_jobs;
  for (int i = 0; i < 3; ++i) {
    auto j = std::make_shared<Tagged>("build" + std::to_string(i), &builds, manager_);
    j->blocked = true;
    j->released = &released;
    build_jobs.push_back(j);
  }
  auto doc = std::make_shared<Tagged>("doc", &docs, manager_);
  doc->schedule(std::chrono::hours(1));
  for (auto& j : build_jobs) j->schedule();
  EXPECT_EQ(manager_->find(&builds).size(), 3u);
  EXPECT_EQ(manager_->find(&docs).size(), 1u);
  EXPECT_FALSE(manager_->join(&builds, 20ms));
  manager_->cancel(&builds);
  EXPECT_TRUE(manager_->join(&builds, 30s));
  for (auto& j : build_jobs) EXPECT_TRUE(j->result().is_canceled()) << j->name();
  EXPECT_EQ(doc->state(), JobState::sleeping) << "other families are left alone";
  manager_->wake_up(&docs);
  EXPECT_TRUE(manager_->join(&docs, 30s));
  EXPECT_TRUE(doc->result().is_ok());
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

TEST_F(JobTest, ProgressMonitorCountsWorkAndSplits) {
  std::shared_ptr<ProgressMonitor> seen;
  auto j = job("progress", [&](ProgressMonitor& monitor) {
    monitor.begin_task("copy", 100);
    monitor.worked(40);
    auto half = monitor.split(60);
    half->begin_task("inner", 3);
    half->worked(1);
    EXPECT_NEAR(monitor.work_done(), 60.0, 1e-9);
    half->done();
    EXPECT_NEAR(monitor.work_done(), 100.0, 1e-9);
    monitor.subtask("finishing");
    EXPECT_EQ(monitor.subtask_name(), "finishing");
    return Status::ok();
  });
  j->schedule();
  j->join();
  EXPECT_TRUE(j->result().is_ok());
}

TEST_F(JobTest, ProgressProviderChoosesTheMonitor) {
  struct Counting final : ProgressMonitor {
    std::atomic<int>* begun;
    void on_begin_task(std::string_view, int) override { begun->fetch_add(1); }
  };
  std::atomic<int> begun{0};
  manager_->set_progress_provider([&](Job&) {
    auto monitor = std::make_unique<Counting>();
    monitor->begun = &begun;
    return monitor;
  });
  auto j = job("watched", [](ProgressMonitor& monitor) {
    monitor.begin_task("work", 1);
    return Status::ok();
  });
  j->schedule();
  j->join();
  EXPECT_EQ(begun.load(), 1);
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

TEST_F(JobTest, YieldRuleLetsAConflictingJobGoFirst) {
  const Rule rule = rules::mutex("shared");
  std::vector<std::string> order;
  std::mutex order_mutex;
  const auto note = [&](std::string what) {
    std::lock_guard lock(order_mutex);
    order.push_back(std::move(what));
  };
  Gate b_waiting;
  std::atomic<bool> yielded{false};
  auto a = job("a", [&](ProgressMonitor&) {
    note("a starts");
    if (!eventually([&] { return manager_->rule_stats().waiting != 0; }))
      return Status::error("b never came");
    yielded = manager_->current_job()->yield_rule();
    note("a resumes");
    return Status::ok();
  });
  auto b = job("b", [&](ProgressMonitor&) {
    note("b runs");
    return Status::ok();
  });
  a->set_rule(rule);
  b->set_rule(rule);
  a->schedule();
  b->schedule();
  EXPECT_TRUE(manager_->join(nullptr, 30s));
  EXPECT_TRUE(yielded.load());
  EXPECT_EQ(order, (std::vector<std::string>{"a starts", "b runs", "a resumes"}));
  auto lone = job("lone", [&](ProgressMonitor&) {
    return manager_->current_job()->yield_rule() ? Status::error("nobody waited") : Status::ok();
  });
  lone->set_rule(rule);
  lone->schedule();
  lone->join();
  EXPECT_TRUE(lone->result().is_ok());
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

// ---------------------------------------------------------------------------------------------
// Rescheduling (Eclipse's JobTest.testReschedule*)

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

// ---------------------------------------------------------------------------------------------
// Canceling in each state

// A job canceled (or put to sleep) just as a runner takes it, or just as schedule() hands its run
// over: whichever wins, by the time join() returns its rule is free, and the job either ran (ok)
// or did not (canceled). Repeated so that some of them land in each window; every round is
// checked, whichever it hit.
TEST_F(JobTest, ARuleIsFreeWhenJoinReturnsAfterACancelThatRacesTheRunner) {
  const Rule rule = rules::mutex("raced");
  std::atomic<int> ran{0};
  auto j = job("raced", [&](ProgressMonitor&) {
    ran.fetch_add(1);
    return Status::ok();
  });
  j->set_rule(rule);
  for (int i = 0; i < 2'000; ++i) {
    const int before = ran.load();
    j->schedule();
    if (i % 2 == 0) {
      j->cancel();
    } else {
      j->sleep();
    }
    if (j->state() == JobState::sleeping) {
      ASSERT_TRUE(j->cancel()) << "round " << i;
    }
    ASSERT_TRUE(j->join(patience)) << "round " << i;
    ASSERT_EQ(manager_->rule_stats().held, 0u) << "round " << i << ": the rule is still held after join()";
    const bool did_run = ran.load() != before;
    ASSERT_EQ(did_run, j->result().is_ok()) << "round " << i << ": " << j->result().message;
  }
}

// The same from another thread, which cancels while schedule() is still handing the run over
// (before its request is anywhere cancel() could take it out of): once join() has returned and
// nobody schedules the job any more, its rule is free and its result tells whether it ran.
TEST_F(JobTest, ARuleIsFreeWhenJoinReturnsAfterACancelFromAnotherThreadRacingSchedule) {
  const Rule rule = rules::mutex("raced");
  std::atomic<int> ran{0};
  auto j = job("raced", [&](ProgressMonitor&) {
    ran.fetch_add(1);
    return Status::ok();
  });
  j->set_rule(rule);
  std::atomic<bool> stop{false};
  std::latch canceling{1};
  std::thread canceler([&] {
    canceling.count_down();
    while (!stop.load()) j->cancel();
  });
  canceling.wait();
  int canceled = 0;
  for (int i = 0; i < 2'000; ++i) {
    const int before = ran.load();
    j->schedule();
    ASSERT_TRUE(j->join(patience)) << "round " << i;
    ASSERT_EQ(manager_->rule_stats().held, 0u) << "round " << i << ": the rule is still held after join()";
    const bool did_run = ran.load() != before;
    ASSERT_EQ(did_run, j->result().is_ok()) << "round " << i << ": " << j->result().message;
    if (!did_run) ++canceled;
  }
  stop.store(true);
  canceler.join();
  RecordProperty("canceled_rounds", canceled);
}

// Another thread cancels, puts to sleep and wakes the job over and over while this one schedules
// it: whatever each call hit (waiting in the table, granted, taken by a runner, still being handed
// over), every run ends, join() returns with the rule free, and the result tells whether it ran.
TEST_F(JobTest, CancelSleepAndWakeFromAnotherThreadRacingScheduleLeaveNothingBehind) {
  const Rule rule = rules::mutex("raced");
  std::atomic<int> ran{0};
  auto j = job("raced", [&](ProgressMonitor&) {
    ran.fetch_add(1);
    return Status::ok();
  });
  j->set_rule(rule);
  std::atomic<bool> stop{false};
  std::latch racing{1};
  std::thread racer([&] {
    racing.count_down();
    while (!stop.load()) {
      j->cancel();
      j->sleep();
      j->wake_up();
    }
  });
  racing.wait();
  for (int i = 0; i < 1'000; ++i) {
    const int before = ran.load();
    j->schedule();
    ASSERT_TRUE(j->join(patience)) << "round " << i;
    ASSERT_EQ(manager_->rule_stats().held, 0u) << "round " << i << ": the rule is still held after join()";
    const bool did_run = ran.load() != before;
    ASSERT_EQ(did_run, j->result().is_ok()) << "round " << i << ": " << j->result().message;
  }
  stop.store(true);
  racer.join();
  j->cancel();  // the racer's last sleep() may have caught a run scheduled by nobody since: none is
  EXPECT_TRUE(j->join(patience));
  EXPECT_EQ(j->state(), JobState::none);
}

// A schedule() right after a cancel(), whatever the cancel hit (a waiting job, a run a runner has
// taken, a running job, a job already over), makes the job run: a cancel that could not take the
// run back (false) lets the run end it and the schedule() queues one more run.
TEST_F(JobTest, ScheduleAfterACancelThatCouldNotStopTheRunRunsAgain) {
  const Rule rule = rules::mutex("again");
  std::atomic<int> ran{0};
  auto j = job("again", [&](ProgressMonitor&) {
    ran.fetch_add(1);
    return Status::ok();
  });
  j->set_rule(rule);
  int late_cancels = 0;
  for (int i = 0; i < 2'000; ++i) {
    const int before = ran.load();
    j->schedule();
    const bool stopped = j->cancel();
    j->schedule();
    ASSERT_TRUE(manager_->join(nullptr, patience)) << "round " << i;
    // Stopped or not, the second schedule() made it run (once: it was not running meanwhile, or
    // the first run was canceled unrun).
    ASSERT_GE(ran.load() - before, 1) << "round " << i << (stopped ? " (stopped)" : " (late)");
    if (!stopped) ++late_cancels;
  }
  RecordProperty("late_cancels", late_cancels);
}

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

// should_run() does what the test asks of it.
class Hooked final : public Job {
 public:
  Hooked(std::function<bool(Job&)> should_run, std::shared_ptr<JobManager> manager)
      : Job("hooked", std::move(manager)), should_run_(std::move(should_run)) {}
  std::atomic<int> runs{0};
  std::atomic<int> running{0};
  std::atomic<bool> overlapped{false};

 protected:
  Status run(ProgressMonitor&) override {
    if (running.fetch_add(1) != 0) overlapped = true;
    runs.fetch_add(1);
    running.fetch_sub(1);
    return Status::ok();
  }
  bool should_run() override { return should_run_(*this); }

 private:
  std::function<bool(Job&)> should_run_;
};

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

TEST_F(JobTest, ScheduleAndCancelFromAScheduledListenerNeverRunConcurrently) {
  struct Racer final : JobListener {
    void scheduled(const JobEvent& e) override {
      if (calls.fetch_add(1) % 2 == 0) {
        e.job->cancel();
        e.job->schedule();
      } else {
        e.job->schedule();
      }
    }
    std::atomic<int> calls{0};
  };
  auto j = std::make_shared<Hooked>([](Job&) { return true; }, manager_);
  auto racer = std::make_shared<Racer>();
  j->add_listener(racer);
  for (int i = 0; i < 100; ++i) {
    j->schedule();
    EXPECT_TRUE(manager_->join(nullptr, patience));
  }
  // A worker can be delivering a `scheduled` event of a re-run, and the racer's cancel() there
  // leaves the job ended for a moment before its schedule(): a join in that moment rightly
  // returns, and the job is queued again just after. Once the racer is removed (which waits
  // for its calls in progress) nothing schedules the job any more, so the last join is final.
  j->remove_listener(racer);
  EXPECT_TRUE(manager_->join(nullptr, patience));
  EXPECT_FALSE(j->overlapped.load());
  EXPECT_GE(j->runs.load(), 1);
}

// ---------------------------------------------------------------------------------------------
// Joining

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

TEST_F(JobTest, AFailingDoneListenerDoesNotHangJoin) {
  struct Failing final : JobListener {
    void running(const JobEvent&) override { throw std::runtime_error("listener broken"); }
    void done(const JobEvent&) override { throw 42; }
  };
  auto recorder = std::make_shared<Recorder>();
  manager_->add_listener(std::make_shared<Failing>());
  manager_->add_listener(recorder);
  auto j = job("observed", [](ProgressMonitor&) { return Status::ok(); });
  j->schedule();
  EXPECT_TRUE(j->join(patience));
  EXPECT_TRUE(j->result().is_ok());
  ASSERT_TRUE(recorder->dones.wait_for(1)) << "the listeners after the failing one were told";
}

// ---------------------------------------------------------------------------------------------
// Sleeping, delays and rules

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

TEST_F(JobTest, TheRuleCanChangeOnlyInStateNone) {
  const Rule a = rules::mutex("a"), b = rules::mutex("b");
  Gate in_run, release;
  auto j = job("ruled", [&](ProgressMonitor&) {
    in_run.open();
    release.wait();
    return Status::ok();
  });
  j->set_rule(a);
  j->schedule(std::chrono::hours(1));
  EXPECT_THROW(j->set_rule(b), TaskletActive);
  j->wake_up();
  ASSERT_TRUE(in_run.wait());
  EXPECT_THROW(j->set_rule(b), TaskletActive);
  EXPECT_THROW(j->set_group(std::make_shared<JobGroup>("g")), TaskletActive);
  release.open();
  EXPECT_TRUE(j->join(patience));
  j->set_rule(b);
  EXPECT_EQ(j->rule(), b);
  j->set_rule(nullptr);
  EXPECT_EQ(j->rule(), nullptr);
}

TEST_F(JobTest, ARuleBegunInAJobAndNotEndedIsReleasedWhenTheRunEnds) {
  const Rule rule = rules::path("/left/open");
  auto j = job("forgetful", [&](ProgressMonitor&) {
    manager_->begin_rule(rule);
    return Status::ok();
  });
  j->schedule();
  EXPECT_TRUE(j->join(patience));
  EXPECT_EQ(manager_->rule_stats().held, 0u) << "released by the time join() returns";
  const Status result = j->result();
  EXPECT_TRUE(result.is_error());
  EXPECT_NE(result.message.find("/left/open"), std::string::npos) << result.message;
  EXPECT_THROW(std::rethrow_exception(result.exception), RuleMismatch);
  RuleScope scope(*manager_, rule);  // free again: does not wait
  EXPECT_EQ(manager_->current_rule(), rule);
}

TEST_F(JobTest, YieldRuleOutsideTheJobsRunThrows) {
  auto j = job("idle", [](ProgressMonitor&) { return Status::ok(); });
  try {
    j->yield_rule();
    ADD_FAILURE() << "yield_rule outside run() did not throw";
  } catch (const IllegalState& error) {
    EXPECT_NE(std::string(error.what()).find("'idle'"), std::string::npos) << error.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Rules between jobs (Eclipse's IJobManagerTest.testMutexRule)

TEST_F(JobTest, OneOfTenJobsOnAMutexRuleRunsAndCancelingOneLetsTheNextGo) {
  const Rule rule = rules::mutex("one at a time");
  std::vector<std::unique_ptr<Gate>> releases;
  std::vector<std::unique_ptr<Gate>> entered;
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 10; ++i) {
    releases.push_back(std::make_unique<Gate>());
    entered.push_back(std::make_unique<Gate>());
    Gate& release = *releases.back();
    Gate& in = *entered.back();
    jobs.push_back(job("m" + std::to_string(i), [&release, &in](ProgressMonitor&) {
      in.open();
      release.wait();
      return Status::ok();
    }));
    jobs.back()->set_rule(rule);
    jobs.back()->schedule();
  }
  ASSERT_TRUE(entered[0]->wait());
  EXPECT_EQ(jobs[0]->state(), JobState::running);
  for (int i = 1; i < 10; ++i) EXPECT_EQ(jobs[static_cast<std::size_t>(i)]->state(), JobState::waiting);
  EXPECT_TRUE(jobs[1]->cancel());
  releases[0]->open();
  ASSERT_TRUE(entered[2]->wait()) << "the canceled job's successor runs next";
  EXPECT_FALSE(entered[1]->is_open());
  for (auto& release : releases) release->open();
  EXPECT_TRUE(manager_->join(nullptr, patience));
  EXPECT_TRUE(jobs[1]->result().is_canceled());
}

// ---------------------------------------------------------------------------------------------
// Families

struct Member final : Job {
  Member(std::string name, Family family, std::shared_ptr<JobManager> manager)
      : Job(std::move(name), std::move(manager)), family_(family) {}
  bool belongs_to(Family family) const override { return family == family_; }
  Status run(ProgressMonitor&) override {
    const int done = runs.fetch_add(1) + 1;
    if (done < repeat) schedule();
    return Status::ok();
  }
  Family family_;
  int repeat = 1;
  std::atomic<int> runs{0};
};

TEST_F(JobTest, JoiningAFamilyWaitsForEveryRunOfARepeatingMember) {
  static const int family = 0;
  auto repeating = std::make_shared<Member>("repeating", &family, manager_);
  repeating->repeat = 25;
  repeating->schedule();
  EXPECT_TRUE(manager_->join(&family, patience));
  EXPECT_EQ(repeating->runs.load(), 25);
}

TEST_F(JobTest, FamilyOperationsSkipEndedJobsAndAnEmptyFamilyJoinsAtOnce) {
  static const int family = 0, nobody = 0;
  const Rule rule = rules::mutex("held");
  manager_->begin_rule(rule);
  std::vector<std::shared_ptr<Member>> members;
  for (int i = 0; i < 5; ++i) {
    members.push_back(std::make_shared<Member>("member" + std::to_string(i), &family, manager_));
    members.back()->set_rule(rule);
    members.back()->schedule();
  }
  EXPECT_TRUE(manager_->join(&nobody, 0ms));
  EXPECT_TRUE(manager_->find(&nobody).empty());
  manager_->cancel(&family);
  EXPECT_TRUE(manager_->find(&family).empty());
  manager_->sleep(&family);
  manager_->wake_up(&family);
  for (auto& member : members) {
    EXPECT_EQ(member->state(), JobState::none) << member->name();
    EXPECT_TRUE(member->result().is_canceled());
  }
  manager_->end_rule(rule);
  EXPECT_TRUE(manager_->join(&family, patience));
  for (auto& member : members) EXPECT_EQ(member->runs.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// Suspend and resume

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

// ---------------------------------------------------------------------------------------------
// Groups

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

// ---------------------------------------------------------------------------------------------
// Listener event order

TEST_F(JobTest, ListenerEventSequencesForEachWayAJobEnds) {
  auto recorder = std::make_shared<Recorder>();
  manager_->add_listener(recorder);
  const Rule rule = rules::mutex("held");
  manager_->begin_rule(rule);
  auto canceled = job("canceled while waiting", [](ProgressMonitor&) { return Status::ok(); });
  canceled->set_rule(rule);
  canceled->schedule();
  canceled->cancel();
  auto napper = job("slept and woken", [](ProgressMonitor&) { return Status::ok(); });
  napper->set_rule(rule);
  napper->schedule();
  napper->sleep();
  napper->wake_up();
  manager_->end_rule(rule);
  auto vetoed = std::make_shared<Vetoing>(true, false, manager_);
  vetoed->schedule();
  ASSERT_TRUE(recorder->dones.wait_for(3));
  EXPECT_EQ(recorder->of("canceled while waiting"), (std::vector<std::string>{"scheduled", "done"}));
  EXPECT_EQ(recorder->of("slept and woken"),
            (std::vector<std::string>{"scheduled", "sleeping", "awake", "about_to_run", "running", "done"}));
  EXPECT_EQ(recorder->of("veto"), (std::vector<std::string>{"scheduled", "done"}));
}

TEST_F(JobTest, ManagerListenersHearEachEventBeforeTheJobsOwn) {
  struct Labeled final : JobListener {
    Labeled(std::string tag, std::vector<std::string>& log, std::mutex& mutex)
        : tag_(std::move(tag)), log_(log), mutex_(mutex) {}
    void scheduled(const JobEvent&) override { note("scheduled"); }
    void running(const JobEvent&) override { note("running"); }
    void done(const JobEvent&) override {
      note("done");
      dones.add();
    }
    void note(const char* what) {
      std::lock_guard lock(mutex_);
      log_.push_back(tag_ + " " + what);
    }
    Counter dones;

   private:
    std::string tag_;
    std::vector<std::string>& log_;
    std::mutex& mutex_;
  };
  std::vector<std::string> log;
  std::mutex mutex;
  auto own = std::make_shared<Labeled>("job", log, mutex);
  manager_->add_listener(std::make_shared<Labeled>("manager", log, mutex));
  auto j = job("told twice", [](ProgressMonitor&) { return Status::ok(); });
  j->add_listener(own);
  j->schedule();
  ASSERT_TRUE(own->dones.wait_for(1));
  std::lock_guard lock(mutex);
  EXPECT_EQ(log, (std::vector<std::string>{"manager scheduled", "job scheduled", "manager running",
                                           "job running", "manager done", "job done"}));
}

}  // namespace
}  // namespace tasklet
