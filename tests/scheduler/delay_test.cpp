// Delays on the manager's timer: schedule_after starts a tasklet, resume_after resumes one, once
// their delay has passed.
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using test::WorkerCountTest;

class DelayTest : public WorkerCountTest {};
TASKLET_WORKER_COUNTS(DelayTest);

TEST_P(DelayTest, ScheduleAfterStartsNoSoonerThanTheDelay) {
  const auto scheduled = Clock::now();
  std::optional<Clock::time_point> started;
  scheduler().schedule_after(30ms, make_tasklet([&] {
                               started = Clock::now();
                               return Directive::done;
                             }),
                             Directive::sync);
  EXPECT_EQ(scheduler().active_count(), 1u) << "active while its delay runs";
  scheduler().run();  // waits for it
  ASSERT_TRUE(started);
  EXPECT_GE(*started - scheduled, 30ms);
}

TEST_P(DelayTest, DelayedTaskletsStartInTheOrderTheyAreDue) {
  std::vector<int> order;
  const auto add = [&](int id, Clock::duration delay) {
    scheduler().schedule_after(delay, make_tasklet([&order, id] {
                                 order.push_back(id);
                                 return Directive::done;
                               }),
                               Directive::sync);
  };
  add(3, 60ms);
  add(1, 20ms);
  add(2, 40ms);
  add(4, 60ms);  // due with 3, scheduled after it
  scheduler().run();
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3, 4}));
}

TEST_P(DelayTest, ADelayedAsyncStartRunsOnAWorker) {
  const auto sync_thread = std::this_thread::get_id();
  std::optional<std::thread::id> ran_on;
  scheduler().schedule(make_tasklet([&] {
                         // From a phase, while run() is active (async needs it).
                         scheduler().schedule_after(10ms, make_tasklet([&] {
                                                      ran_on = std::this_thread::get_id();
                                                      return Directive::done;
                                                    }),
                                                    Directive::async);
                         return Directive::done;
                       }),
                       Directive::sync);
  scheduler().run();
  ASSERT_TRUE(ran_on);
  EXPECT_NE(*ran_on, sync_thread);
}

TEST_P(DelayTest, ScheduleAfterRefusesWhatScheduleRefuses) {
  auto tasklet = make_tasklet([] { return Directive::done; });
  EXPECT_THROW(scheduler().schedule_after(1h, tasklet, Directive::async), SchedulerNotRunning);
  EXPECT_FALSE(tasklet->is_active());
  EXPECT_THROW(scheduler().schedule_after(1h, nullptr, Directive::sync), std::invalid_argument);
  scheduler().schedule_after(10ms, tasklet, Directive::sync);
  EXPECT_THROW(scheduler().schedule_after(10ms, tasklet, Directive::sync), AlreadyScheduled);
  EXPECT_THROW(scheduler().schedule(tasklet, Directive::sync), AlreadyScheduled);
  scheduler().run();
}

TEST_P(DelayTest, ADelayedTaskletTakesItsRuleOnlyWhenItsDelayIsOver) {
  const Rule rule = rules::mutex("later");
  std::weak_ptr<Tasklet> dropped;
  {
    auto local = Scheduler::create(SchedulerOptions{.manager = manager_});
    auto tasklet = make_tasklet([] { return Directive::done; }, rule);
    dropped = tasklet;
    local->schedule_after(1h, std::move(tasklet), Directive::sync);
    manager_->begin_rule(rule);  // would wait for the hour if the tasklet held the rule already
    manager_->end_rule(rule);
  }  // destroying the scheduler drops the tasklet unrun
  EXPECT_TRUE(dropped.expired());
}

TEST_P(DelayTest, ResumeAfterResumesNoSoonerThanTheDelay) {
  std::optional<Clock::time_point> suspended, resumed;
  auto tasklet = make_tasklet([&, phase = 0](Tasklet& self) mutable {
    if (phase++ == 0) {
      suspended = Clock::now();
      // The Rescheduler goes at once: the delay keeps the suspension going.
      api::current().suspend(self).resume_after(30ms, Directive::async);
      return Directive::wait;
    }
    resumed = Clock::now();
    return Directive::done;
  });
  scheduler().schedule(std::move(tasklet), Directive::sync).run();
  ASSERT_TRUE(suspended && resumed);
  EXPECT_GE(*resumed - *suspended, 30ms);
}

TEST_P(DelayTest, AResumeBeforeTheDelayWinsAndTheDelayedOneDoesNothing) {
  std::optional<Rescheduler> kept;
  std::vector<int> phases;
  auto waits = make_tasklet([&, phase = 0](Tasklet& self) mutable {
    phases.push_back(phase);
    if (phase++ > 0) return Directive::done;
    kept = api::current().suspend(self);
    kept->resume_after(1h, Directive::done);  // a timeout
    return Directive::wait;
  });
  // Runs after `waits` parked (sync phases run in order): the event comes before the timeout.
  auto event = make_tasklet([&] {
    kept->resume(Directive::sync);
    return Directive::done;
  });
  scheduler().schedule(std::move(waits), Directive::sync).schedule(std::move(event), Directive::sync).run();
  EXPECT_EQ(phases, (std::vector<int>{0, 1})) << "resumed by the event, with its directive";
  EXPECT_THROW(kept->resume_after(1ms, Directive::sync), AlreadyResumed) << "the suspension is over";
}

TEST_P(DelayTest, ResumeAfterRefusesWhatResumeRefuses) {
  auto tasklet = make_tasklet([] { return Directive::done; });
  Rescheduler rescheduler = scheduler().suspend(*tasklet);
  EXPECT_THROW(rescheduler.resume_after(1ms, Directive::async), SchedulerNotRunning);
  rescheduler.resume(Directive::sync);
  EXPECT_THROW(rescheduler.resume_after(1ms, Directive::sync), AlreadyResumed);
  EXPECT_THROW(Rescheduler().resume_after(1ms, Directive::sync), AlreadyResumed);
  scheduler().run();
}

TEST_P(DelayTest, ZeroDelaysStartAndResumeAtOnce) {
  int phases = 0;
  auto tasklet = make_tasklet([&](Tasklet& self) {
    if (phases++ == 0) {
      api::current().suspend(self).resume_after(0ms, Directive::sync);
      return Directive::wait;
    }
    return Directive::done;
  });
  scheduler().schedule_after(0ms, std::move(tasklet), Directive::sync).run();
  EXPECT_EQ(phases, 2);
}

TEST_P(DelayTest, ATimeoutAndAResumeRacingResumeItOnce) {
  // A timeout of 0-2 ms against a resume from another thread: exactly one continues the tasklet.
  for (int round = 0; round < 100; ++round) {
    std::atomic<int> continued{0};
    std::promise<Rescheduler> handed;
    auto tasklet = make_tasklet([&, phase = 0](Tasklet& self) mutable {
      if (phase++ == 0) {
        Rescheduler later = api::current().suspend(self);
        later.resume_after(std::chrono::microseconds{round * 20}, Directive::sync);
        handed.set_value(later);
        return Directive::wait;
      }
      continued.fetch_add(1);
      return Directive::done;
    });
    std::thread event([future = handed.get_future()]() mutable {
      try {
        future.get().resume(Directive::sync);
      } catch (const AlreadyResumed&) {
        // the timeout came first
      }
    });
    scheduler().schedule(std::move(tasklet), Directive::sync).run();
    event.join();
    ASSERT_EQ(continued.load(), 1) << "round " << round;
  }
}

}  // namespace
}  // namespace tasklet
