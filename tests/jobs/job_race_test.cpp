// cancel(), sleep() and wake_up() racing schedule() and the runners, on one thread and from
// another: whichever each call hits, every run ends, join() returns with the job's rule free, and
// the job never runs twice at once.
#include <atomic>
#include <latch>
#include <memory>
#include <thread>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using test::Hooked;
using test::JobTest;
using test::patience;

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

// A job with a listener is scheduled here while another thread cancels it over and over: each
// schedule is told before its end (a cancel that came between the job becoming waiting and its
// queueing ended it, and then it was queued as well: done came before scheduled, and the job ran
// after its end; found by the jobs fuzzer).
TEST_F(JobTest, ACancelRacingTheScheduleOfAJobWithListenersComesAfterItsScheduledEvent) {
  class Alternation final : public JobListener {
   public:
    void scheduled(const JobEvent&) override {
      if (open_.exchange(true)) broken_ = true;
      scheduleds.fetch_add(1);
    }
    void done(const JobEvent&) override {
      if (!open_.exchange(false)) broken_ = true;
      dones.fetch_add(1);
    }
    bool broken() const { return broken_.load(); }
    std::atomic<int> scheduleds{0}, dones{0};

   private:
    std::atomic<bool> open_{false};
    std::atomic<bool> broken_{false};
  };
  auto listener = std::make_shared<Alternation>();
  auto j = job("told", [](ProgressMonitor&) { return Status::ok(); });
  j->add_listener(listener);
  std::atomic<bool> stop{false};
  std::latch canceling{1};
  std::thread canceler([&] {
    canceling.count_down();
    while (!stop.load()) j->cancel();
  });
  canceling.wait();
  bool ok = true;
  for (int i = 0; i < 2'000 && ok; ++i) {
    j->schedule();  // may be dropped by a cancel while the last end is told: no events then
    ok = j->join(patience) && test::eventually([&] { return listener->dones == listener->scheduleds; });
    EXPECT_TRUE(ok) << "round " << i << ": a schedule that never ended";
    if (listener->broken()) {
      ADD_FAILURE() << "round " << i << ": a done without its scheduled, or the reverse";
      ok = false;
    }
  }
  stop.store(true);
  canceler.join();
}

// Another thread moves a job in and out of a group (max_threads 1) over and over while this one
// schedules and joins it: whenever a set_group() succeeds between the end of a run and its leaving
// the group, the group must still get its slot back, or it would let no job in again (found by
// the jobs fuzzer).
TEST_F(JobTest, SetGroupRacingTheEndOfARunLeavesTheGroupsSlotsRight) {
  auto group = std::make_shared<JobGroup>("one at a time", 1, 0);
  auto j = job("moved", [](ProgressMonitor&) { return Status::ok(); });
  std::atomic<bool> stop{false};
  std::latch moving{1};
  std::thread mover([&] {
    moving.count_down();
    for (bool in = true; !stop.load(); in = !in) {
      try {
        j->set_group(in ? group : nullptr);
      } catch (const TaskletActive&) {
      }
    }
  });
  moving.wait();
  bool ok = true;
  for (int i = 0; i < 2'000 && ok; ++i) {
    j->schedule();
    ok = j->join(patience);
    EXPECT_TRUE(ok) << "round " << i;
  }
  stop.store(true);
  mover.join();
  // The group lets a job in: no slot was lost.
  auto probe = job("probe", [](ProgressMonitor&) { return Status::ok(); });
  probe->set_group(group);
  probe->schedule();
  EXPECT_TRUE(probe->join(patience)) << "the group lost a slot";
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

}  // namespace
}  // namespace tasklet
