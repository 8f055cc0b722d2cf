// The scheduler core: directives, the run loop, threads, and the Java library's own tests.
#include <atomic>
#include <future>
#include <latch>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using test::WorkerCountTest;

class SchedulerTest : public WorkerCountTest {};
TASKLET_WORKER_COUNTS(SchedulerTest);

// The seed's motivating example: build a request on the synchronous thread, make the blocking call
// on a worker, merge the response back on the synchronous thread.
class RequestResponse final : public Tasklet {
 public:
  Directive task() override {
    switch (state_) {
      case 0:
        request_thread = std::this_thread::get_id();
        request_ = 20;
        state_ = 1;
        return Directive::async;
      case 1:
        call_thread = std::this_thread::get_id();
        response_ = request_ + 22;
        state_ = 2;
        return Directive::sync;
      default:
        merge_thread = std::this_thread::get_id();
        merged = response_;
        return Directive::done;
    }
  }
  std::thread::id request_thread, call_thread, merge_thread;
  int merged = 0;

 private:
  int state_ = 0;
  int request_ = 0;
  int response_ = 0;
};

TEST_P(SchedulerTest, RequestResponseExampleRunsPhasesOnTheRightThreads) {
  auto tasklet = std::make_shared<RequestResponse>();
  scheduler().schedule(tasklet, Directive::sync).run();
  const auto sync_thread = std::this_thread::get_id();
  EXPECT_EQ(tasklet->merged, 42);
  EXPECT_EQ(tasklet->request_thread, sync_thread);
  EXPECT_NE(tasklet->call_thread, sync_thread);
  EXPECT_NE(tasklet->call_thread, std::thread::id{});
  EXPECT_EQ(tasklet->merge_thread, sync_thread);
  EXPECT_FALSE(tasklet->is_active());
  EXPECT_EQ(tasklet.use_count(), 1) << "a done tasklet must not be referenced by the scheduler";
}

TEST_P(SchedulerTest, RunOnAnEmptySchedulerReturns) {
  scheduler().run();
  scheduler().run();
  EXPECT_TRUE(scheduler().failures().empty());
}

TEST_P(SchedulerTest, SyncTaskletsQueueUntilRun) {
  int runs = 0;
  scheduler().schedule(make_tasklet([&] {
                         ++runs;
                         return Directive::done;
                       }),
                       Directive::sync);
  EXPECT_EQ(runs, 0) << "an explicit scheduler runs nothing before run()";
  EXPECT_EQ(scheduler().active_count(), 1u);
  scheduler().run();
  EXPECT_EQ(runs, 1);
}

TEST_P(SchedulerTest, AsyncPhasesSeeTheSpawningSchedulerAsCurrent) {
  Scheduler* seen = nullptr;
  std::thread::id phase_thread;
  auto tasklet = make_tasklet([&, phase = 0]() mutable {
    if (phase++ == 0) return Directive::async;
    seen = &api::current();
    phase_thread = std::this_thread::get_id();
    return Directive::done;
  });
  scheduler().schedule(tasklet, Directive::sync).run();
  EXPECT_EQ(seen, &scheduler());
  EXPECT_NE(phase_thread, std::this_thread::get_id());
}

TEST_P(SchedulerTest, SyncPhasesSeeTheirSchedulerAsCurrent) {
  Scheduler* seen = nullptr;
  scheduler().schedule(make_tasklet([&] {
                         seen = &api::current();
                         return Directive::done;
                       }),
                       Directive::sync);
  scheduler().run();
  EXPECT_EQ(seen, &scheduler());
}

TEST_P(SchedulerTest, ManyTaskletsHopBetweenSyncAndAsync) {
  const int count = 100'000;
  const int hops = 3;
  const auto sync_thread = std::this_thread::get_id();
  std::atomic<int> done{0};
  std::atomic<int> sync_phases_elsewhere{0};
  std::atomic<int> async_phases_on_sync_thread{0};
  std::atomic<int> sync_phases{0};
  scheduler().schedule(make_tasklet([&] {
                         for (int i = 0; i < count; ++i) {
                           auto hopper = make_tasklet([&, hop = 0]() mutable {
                             const bool on_sync = std::this_thread::get_id() == sync_thread;
                             if (hop % 2 == 0) {  // a sync phase
                               sync_phases.fetch_add(1, std::memory_order_relaxed);
                               if (!on_sync) sync_phases_elsewhere.fetch_add(1, std::memory_order_relaxed);
                             } else if (on_sync) {
                               async_phases_on_sync_thread.fetch_add(1, std::memory_order_relaxed);
                             }
                             if (hop++ == 2 * hops) {
                               done.fetch_add(1, std::memory_order_relaxed);
                               return Directive::done;
                             }
                             return hop % 2 == 1 ? Directive::async : Directive::sync;
                           });
                           api::current().schedule(hopper, Directive::sync);
                         }
                         return Directive::done;
                       }),
                       Directive::sync);
  scheduler().run();
  EXPECT_EQ(done.load(), count);
  EXPECT_EQ(sync_phases.load(), count * (hops + 1));
  EXPECT_EQ(sync_phases_elsewhere.load(), 0);
  EXPECT_EQ(async_phases_on_sync_thread.load(), 0);
}

TEST_P(SchedulerTest, AsyncTaskletsScheduledFromAnotherThreadWhileRunning) {
  std::atomic<int> ran{0};
  std::latch running(1);
  std::optional<Rescheduler> hold;
  auto holder = make_tasklet([&](Tasklet& self) {
    hold = api::current().suspend(self);
    running.count_down();
    return Directive::wait;
  });
  scheduler().schedule(holder, Directive::sync);
  std::thread outsider([&] {
    running.wait();
    for (int i = 0; i < 1000; ++i) {
      scheduler().schedule(make_tasklet([&] {
                             ran.fetch_add(1);
                             return Directive::done;
                           }),
                           Directive::async);
    }
    hold->resume(Directive::done);
  });
  scheduler().run();
  outsider.join();
  EXPECT_EQ(ran.load(), 1000);
}

TEST_P(SchedulerTest, ChainsOfAsyncPhasesStayOffTheSyncThread) {
  const auto sync_thread = std::this_thread::get_id();
  std::atomic<int> on_sync{0};
  for (int i = 0; i < 100; ++i) {
    scheduler().schedule(make_tasklet([&, n = 0]() mutable {
                           if (n > 0 && std::this_thread::get_id() == sync_thread) on_sync.fetch_add(1);
                           return ++n < 50 ? Directive::async : Directive::done;
                         }),
                         Directive::sync);
  }
  scheduler().run();
  EXPECT_EQ(on_sync.load(), 0);
}

TEST_P(SchedulerTest, SecondRunOnAnotherThreadWaitsForTheFirst) {
  // Both threads call run() while tasklets hop; at no time do two threads run sync phases.
  std::atomic<int> in_sync{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> finished{0};
  std::latch both_started(2);
  for (int i = 0; i < 2000; ++i) {
    scheduler().schedule(make_tasklet([&, n = 0]() mutable {
                           if (n % 2 == 0) {
                             if (in_sync.fetch_add(1) != 0) overlaps.fetch_add(1);
                             in_sync.fetch_sub(1);
                           }
                           if (++n == 6) {
                             finished.fetch_add(1);
                             return Directive::done;
                           }
                           return n % 2 == 1 ? Directive::async : Directive::sync;
                         }),
                         Directive::sync);
  }
  auto runner = [&] {
    both_started.arrive_and_wait();
    scheduler().run();
  };
  std::thread a(runner), b(runner);
  a.join();
  b.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(finished.load(), 2000);
}

TEST_P(SchedulerTest, RunDoesNotReturnWhileATaskletIsParked) {
  std::optional<Rescheduler> parked;
  std::atomic<bool> resumed{false};
  std::atomic<bool> finished_after_resume{false};
  auto sleeper = make_tasklet([&, phase = 0](Tasklet& self) mutable {
    if (phase++ == 0) {
      parked = api::current().suspend(self);
      return Directive::wait;
    }
    finished_after_resume = resumed.load();
    return Directive::done;
  });
  // A sync tasklet that, once the sleeper is parked, lets another thread resume it.
  std::latch parked_latch(1);
  scheduler().schedule(sleeper, Directive::sync);
  scheduler().schedule(make_tasklet([&] {
                         parked_latch.count_down();
                         return Directive::done;
                       }),
                       Directive::sync);
  std::thread waker([&] {
    parked_latch.wait();
    resumed = true;
    parked->resume(Directive::sync);
  });
  scheduler().run();
  waker.join();
  EXPECT_TRUE(finished_after_resume.load());
}

TEST_P(SchedulerTest, SuspendingAnIdleTaskletParksIt) {
  int ran = 0;
  auto tasklet = make_tasklet([&] {
    ++ran;
    return Directive::done;
  });
  Rescheduler rescheduler = scheduler().suspend(*tasklet);
  EXPECT_TRUE(tasklet->is_active());
  EXPECT_EQ(scheduler().active_count(), 1u);
  EXPECT_THROW(scheduler().schedule(tasklet, Directive::sync), AlreadyScheduled);
  std::thread waker([&] { rescheduler.resume(Directive::sync); });
  waker.join();
  scheduler().run();
  EXPECT_EQ(ran, 1);
}

TEST_P(SchedulerTest, ResumeBeforeWaitIsNotLost) {
  // The phase resumes itself before returning wait: the resume must stick.
  int phases = 0;
  auto tasklet = make_tasklet([&](Tasklet& self) {
    if (phases++ == 0) {
      api::current().suspend(self).resume(Directive::async);
      return Directive::wait;
    }
    return Directive::done;
  });
  scheduler().schedule(tasklet, Directive::sync).run();
  EXPECT_EQ(phases, 2);
}

TEST_P(SchedulerTest, ResumeRacingWithWaitIsNeverLost) {
  const int rounds = 2000 * test::stress_scale();
  std::atomic<int> completed{0};
  scheduler().schedule(make_tasklet([&] {
                         for (int i = 0; i < rounds; ++i) {
                           api::current().schedule(make_tasklet([&, phase = 0](Tasklet& self) mutable {
                                                     if (phase++ == 0) {
                                                       Rescheduler r = api::current().suspend(self);
                                                       // Resume from a worker while this phase is still
                                                       // returning.
                                                       api::current().schedule(make_tasklet([r] {
                                                                                 r.resume(Directive::sync);
                                                                                 return Directive::done;
                                                                               }),
                                                                               Directive::async);
                                                       return Directive::wait;
                                                     }
                                                     completed.fetch_add(1);
                                                     return Directive::done;
                                                   }),
                                                   i % 2 ? Directive::async : Directive::sync);
                         }
                         return Directive::done;
                       }),
                       Directive::sync);
  scheduler().run();
  EXPECT_EQ(completed.load(), rounds);
}

TEST_P(SchedulerTest, ResumingTwiceThrows) {
  std::optional<Rescheduler> kept;
  auto tasklet = make_tasklet([&, phase = 0](Tasklet& self) mutable {
    if (phase++ == 0) {
      kept = api::current().suspend(self);
      kept->resume(Directive::sync);
      EXPECT_THROW(kept->resume(Directive::sync), AlreadyResumed);
      return Directive::wait;
    }
    return Directive::done;
  });
  scheduler().schedule(tasklet, Directive::sync).run();
  EXPECT_THROW(kept->resume(Directive::done), AlreadyResumed) << "after it ran on";
}

TEST_P(SchedulerTest, ResumeAfterTheSuspensionEndedThrows) {
  std::optional<Rescheduler> kept;
  auto tasklet = make_tasklet([&](Tasklet& self) {
    kept = api::current().suspend(self);
    return Directive::done;  // changed its mind: the suspension ends unused
  });
  scheduler().schedule(tasklet, Directive::sync).run();
  EXPECT_THROW(kept->resume(Directive::sync), AlreadyResumed);
}

TEST_P(SchedulerTest, ResumedButNotWaitingIsTheTaskletsFailure) {
  auto tasklet = make_tasklet([&](Tasklet& self) {
    api::current().suspend(self).resume(Directive::sync);
    return Directive::done;
  });
  scheduler().schedule(tasklet, Directive::sync);
  EXPECT_THROW(scheduler().run(), AlreadyResumed);
}

TEST_P(SchedulerTest, SchedulingAnActiveTaskletThrows) {
  std::latch in_async(1), checked(1);
  auto tasklet = make_tasklet([&, phase = 0]() mutable {
    if (phase++ == 0) return Directive::async;
    in_async.count_down();
    checked.wait();
    return Directive::done;
  });
  scheduler().schedule(tasklet, Directive::sync);
  EXPECT_THROW(scheduler().schedule(tasklet, Directive::sync), AlreadyScheduled) << "while queued";
  std::thread checker([&] {
    in_async.wait();
    EXPECT_THROW(scheduler().schedule(tasklet, Directive::sync), AlreadyScheduled) << "while running";
    EXPECT_THROW(scheduler().suspend(*tasklet), AlreadyScheduled) << "suspended by a stranger";
    checked.count_down();
  });
  scheduler().run();
  checker.join();
  // Idle again: may be scheduled anew.
  EXPECT_FALSE(tasklet->is_active());
}

TEST_P(SchedulerTest, ConcurrentSchedulesOfOneTaskletAdmitExactlyOne) {
  for (int round = 0; round < 200; ++round) {
    std::atomic<int> ran{0};
    auto tasklet = make_tasklet([&] {
      ran.fetch_add(1);
      return Directive::done;
    });
    std::atomic<int> accepted{0}, refused{0};
    std::latch go(4);
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i) {
      threads.emplace_back([&] {
        go.arrive_and_wait();
        try {
          scheduler().schedule(tasklet, Directive::sync);
          accepted.fetch_add(1);
        } catch (const AlreadyScheduled&) {
          refused.fetch_add(1);
        }
      });
    }
    for (auto& thread : threads) thread.join();
    scheduler().run();
    ASSERT_EQ(accepted.load(), 1);
    ASSERT_EQ(refused.load(), 3);
    ASSERT_EQ(ran.load(), 1);
  }
}

TEST_P(SchedulerTest, AsyncWithoutRunThrowsSchedulerNotRunning) {
  auto tasklet = make_tasklet([] { return Directive::done; });
  EXPECT_THROW(scheduler().schedule(tasklet, Directive::async), SchedulerNotRunning);
  EXPECT_FALSE(tasklet->is_active()) << "a refused schedule leaves the tasklet idle";
  EXPECT_EQ(scheduler().active_count(), 0u);
}

TEST_P(SchedulerTest, ExceptionsEndOnlyTheirTaskletAndRunRethrowsTheFirst) {
  std::atomic<int> survivors{0};
  for (int i = 0; i < 50; ++i) {
    scheduler().schedule(make_tasklet([&, phase = 0]() mutable {
                           if (phase++ == 0) return Directive::async;
                           survivors.fetch_add(1);
                           return Directive::done;
                         }),
                         Directive::sync);
  }
  auto sync_thrower = make_tasklet([]() -> Directive { throw std::runtime_error("sync boom"); });
  sync_thrower->set_name("sync-thrower");
  auto async_thrower = make_tasklet([phase = 0]() mutable -> Directive {
    if (phase++ == 0) return Directive::async;
    throw std::runtime_error("async boom");
  });
  async_thrower->set_name("async-thrower");
  scheduler().schedule(sync_thrower, Directive::sync);
  scheduler().schedule(async_thrower, Directive::sync);
  try {
    scheduler().run();
    FAIL() << "run() must rethrow";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "sync boom");
  }
  EXPECT_EQ(survivors.load(), 50);
  const auto failures = scheduler().failures();
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_EQ(failures[0].tasklet, "sync-thrower");
  EXPECT_EQ(failures[1].tasklet, "async-thrower");
  EXPECT_FALSE(sync_thrower->is_active());
  EXPECT_FALSE(async_thrower->is_active());
  // The next run starts clean.
  scheduler().run();
  EXPECT_TRUE(scheduler().failures().empty());
}

TEST_P(SchedulerTest, AsyncExceptionDoesNotHangRun) {
  scheduler().schedule(make_tasklet([phase = 0]() mutable -> Directive {
                         if (phase++ == 0) return Directive::async;
                         throw std::logic_error("only this one");
                       }),
                       Directive::sync);
  EXPECT_THROW(scheduler().run(), std::logic_error);
  EXPECT_EQ(scheduler().failures().size(), 1u);
}

TEST_P(SchedulerTest, RunCalledFromItsOwnPhaseIsRefused) {
  scheduler().schedule(make_tasklet([&] {
                         scheduler().run();
                         return Directive::done;
                       }),
                       Directive::sync);
  EXPECT_THROW(scheduler().run(), IllegalState);
  scheduler().schedule(make_tasklet([&, phase = 0]() mutable {
                         if (phase++ == 0) return Directive::async;
                         scheduler().run();
                         return Directive::done;
                       }),
                       Directive::sync);
  EXPECT_THROW(scheduler().run(), IllegalState);
}

TEST_P(SchedulerTest, RuleCannotChangeWhileActive) {
  auto tasklet = make_tasklet([] { return Directive::done; });
  scheduler().schedule(tasklet, Directive::sync);
  EXPECT_THROW(tasklet->set_name("renamed"), TaskletActive);
  scheduler().run();
  tasklet->set_name("renamed");
  EXPECT_EQ(tasklet->name(), "renamed");
}

TEST_P(SchedulerTest, ErrorMessagesNameTheTasklet) {
  auto tasklet = make_tasklet([] { return Directive::done; });
  tasklet->set_name("light-switch");
  try {
    scheduler().schedule(tasklet, Directive::async);
    FAIL();
  } catch (const SchedulerNotRunning& error) {
    EXPECT_NE(std::string(error.what()).find("light-switch"), std::string::npos) << error.what();
  }
  scheduler().schedule(tasklet, Directive::sync);
  try {
    scheduler().schedule(tasklet, Directive::sync);
    FAIL();
  } catch (const AlreadyScheduled& error) {
    EXPECT_NE(std::string(error.what()).find("light-switch"), std::string::npos) << error.what();
  }
  scheduler().run();
}

TEST_P(SchedulerTest, DestroyingASchedulerDropsParkedAndQueuedTasklets) {
  std::weak_ptr<Tasklet> parked_ref, queued_ref;
  std::optional<Rescheduler> rescheduler;
  {
    auto local = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
    auto parked = make_tasklet([] { return Directive::done; });
    auto queued = make_tasklet([] { return Directive::done; });
    parked_ref = parked;
    queued_ref = queued;
    rescheduler = local->suspend(*parked);
    local->schedule(queued, Directive::sync);
  }
  EXPECT_TRUE(parked_ref.expired());
  EXPECT_TRUE(queued_ref.expired());
  EXPECT_THROW(rescheduler->resume(Directive::sync), AlreadyResumed);
}

TEST_P(SchedulerTest, ATaskletHoldingItsOwnReschedulerDoesNotLeak) {
  std::weak_ptr<Tasklet> ref;
  {
    auto local = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
    struct SelfSuspending final : Tasklet {
      Directive task() override { return Directive::done; }
      Rescheduler mine;
    };
    auto tasklet = std::make_shared<SelfSuspending>();
    tasklet->mine = local->suspend(*tasklet);
    ref = tasklet;
  }
  EXPECT_TRUE(ref.expired());
}

TEST_P(SchedulerTest, TaskletsCanBeRescheduledAfterDone) {
  int runs = 0;
  auto tasklet = make_tasklet([&] {
    ++runs;
    return Directive::done;
  });
  for (int i = 0; i < 3; ++i) scheduler().schedule(tasklet, Directive::sync).run();
  EXPECT_EQ(runs, 3);
}

TEST_P(SchedulerTest, WithRunsTheTaskletWithTheGivenSchedulerCurrent) {
  Scheduler* seen = nullptr;
  int phases = 0;
  auto tasklet = make_tasklet([&] {
    seen = &api::current();
    return ++phases == 1 ? Directive::sync : Directive::done;
  });
  api::with(scheduler(), tasklet);
  EXPECT_EQ(seen, &scheduler());
  EXPECT_EQ(phases, 1);
  EXPECT_TRUE(tasklet->is_active()) << "continued on the scheduler with sync";
  scheduler().run();
  EXPECT_EQ(phases, 2);
}

TEST_P(SchedulerTest, WithRethrowsThePhasesException) {
  auto tasklet = make_tasklet([]() -> Directive { throw std::runtime_error("with boom"); });
  EXPECT_THROW(api::with(scheduler(), tasklet), std::runtime_error);
  EXPECT_FALSE(tasklet->is_active());
}

// A phase run by with() that goes on async while run() is not active: with() says so at once (the
// tasklet ends, its rule free), instead of a failure that only a later run() would report.
TEST_P(SchedulerTest, WithThrowsWhenThePhaseGoesAsyncWithoutRun) {
  const Rule rule = rules::path("/with");
  auto tasklet = make_tasklet([] { return Directive::async; }, rule);
  tasklet->set_name("goes-async");
  try {
    api::with(scheduler(), tasklet);
    FAIL() << "with() returned";
  } catch (const SchedulerNotRunning& error) {
    EXPECT_NE(std::string(error.what()).find("goes-async"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(tasklet->is_active());
  EXPECT_EQ(scheduler().active_count(), 0u);
  EXPECT_EQ(manager_->rule_stats().held, 0u);
  EXPECT_NO_THROW(scheduler().run()) << "nothing left for run() to report";
}

// An event loop: run() on its own thread stays for work that other threads schedule later, sync
// and async, as long as a KeepAlive guard lives; it returns once the guard is let go.
TEST_P(SchedulerTest, AKeepAliveGuardKeepsRunGoingForWorkThatComesLater) {
  Scheduler::KeepAlive guard = scheduler().keep_alive();
  EXPECT_EQ(scheduler().active_count(), 0u) << "a guard is not a tasklet";
  std::promise<void> returned;
  std::thread loop([&] {
    scheduler().run();
    returned.set_value();
  });
  for (int round = 0; round < 3; ++round) {
    std::promise<std::thread::id> synced;
    scheduler().schedule(make_tasklet([&] {
                           synced.set_value(std::this_thread::get_id());
                           return Directive::done;
                         }),
                         Directive::sync);
    EXPECT_EQ(synced.get_future().get(), loop.get_id()) << "sync phases run on run()'s thread";
    // run() is still active (the guard), so async work from this plain thread is accepted.
    std::promise<void> ran;
    scheduler().schedule(make_tasklet([&] {
                           ran.set_value();
                           return Directive::done;
                         }),
                         Directive::async);
    ran.get_future().get();
  }
  EXPECT_TRUE(scheduler().is_running());
  Scheduler::KeepAlive moved = std::move(guard);
  EXPECT_FALSE(guard);
  EXPECT_TRUE(moved);
  moved.reset();
  returned.get_future().get();  // returns once the guard is gone
  loop.join();
  EXPECT_FALSE(scheduler().is_running());
  EXPECT_EQ(scheduler().active_count(), 0u);
}

TEST_P(SchedulerTest, NewSchedulersInsideAsyncPhasesInheritTheirWorkers) {
  std::shared_ptr<Scheduler> inner;
  scheduler().schedule(make_tasklet([&, phase = 0]() mutable {
                         if (phase++ == 0) return Directive::async;
                         inner = api::new_scheduler();
                         return Directive::done;
                       }),
                       Directive::sync);
  scheduler().run();
  ASSERT_TRUE(inner);
  EXPECT_EQ(inner->manager(), manager_);
}

}  // namespace
}  // namespace tasklet
