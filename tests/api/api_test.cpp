// The per-thread API: the implicit scheduler, with(), configure() and reset().
#include <atomic>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

#include "tasklet.hpp"

namespace tasklet {
namespace {

class ApiTest : public ::testing::Test {
 protected:
  void TearDown() override { api::reset(); }
};

TEST_F(ApiTest, ImplicitSchedulerRunsSyncTaskletsInline) {
  std::thread::id ran_on;
  bool ran = false;
  api::current().schedule(make_tasklet([&] {
                            ran_on = std::this_thread::get_id();
                            ran = true;
                            return Directive::done;
                          }),
                          Directive::sync);
  EXPECT_TRUE(ran) << "ran before schedule() returned";
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(api::current().active_count(), 0u);
}

TEST_F(ApiTest, ImplicitSchedulerRunsChainedSyncPhasesInOrder) {
  std::vector<int> order;
  api::current().schedule(make_tasklet([&, n = 0]() mutable {
                            order.push_back(n);
                            if (n == 0) {
                              // Scheduled from inside a phase: runs after this tasklet's phase,
                              // still inside the outer schedule().
                              api::current().schedule(make_tasklet([&] {
                                                        order.push_back(100);
                                                        return Directive::done;
                                                      }),
                                                      Directive::sync);
                            }
                            return ++n < 3 ? Directive::sync : Directive::done;
                          }),
                          Directive::sync);
  EXPECT_EQ(order, (std::vector<int>{0, 100, 1, 2}));
}

TEST_F(ApiTest, ImplicitSchedulerRefusesAsync) {
  auto tasklet = make_tasklet([] { return Directive::done; });
  EXPECT_THROW(api::current().schedule(tasklet, Directive::async), SchedulerNotRunning);
  // A phase that asks for async while no run() is active fails, and schedule() reports it.
  EXPECT_THROW(api::current().schedule(make_tasklet([] { return Directive::async; }), Directive::sync),
               SchedulerNotRunning);
  EXPECT_EQ(api::current().active_count(), 0u);
}

TEST_F(ApiTest, ImplicitSchedulerRethrowsPhaseExceptionsFromSchedule) {
  EXPECT_THROW(api::current().schedule(make_tasklet([]() -> Directive { throw std::out_of_range("inline"); }),
                                       Directive::sync),
               std::out_of_range);
  EXPECT_EQ(api::current().active_count(), 0u);
}

TEST_F(ApiTest, ImplicitSchedulerKeepsItsInlineModeAfterRun) {
  Scheduler& implicit = api::current();
  auto parked = make_tasklet([] { return Directive::async; });  // owned here, so it stays parked
  implicit.schedule(parked, Directive::wait);
  EXPECT_EQ(implicit.active_count(), 1u);
  api::reset();  // dropped with the implicit scheduler
  bool ran = false;
  Scheduler& fresh = api::current();
  // Resumed from another thread, a tasklet only queues; run() takes it, and it hops to a worker.
  auto hopper =
      make_tasklet([&, phase = 0]() mutable { return phase++ == 0 ? Directive::async : Directive::done; });
  Rescheduler rescheduler = fresh.suspend(*hopper);
  std::thread([&] { rescheduler.resume(Directive::sync); }).join();
  EXPECT_EQ(fresh.active_count(), 1u);
  fresh.run();  // the async phase needed run()
  fresh.schedule(make_tasklet([&] {
                   ran = true;
                   return Directive::done;
                 }),
                 Directive::sync);
  EXPECT_TRUE(ran) << "inline again after run() returned (unlike the Java original)";
}

TEST_F(ApiTest, ResetDropsTheImplicitScheduler) {
  std::weak_ptr<Scheduler> first = api::current().weak_from_this();
  api::reset();
  EXPECT_TRUE(first.expired());
  EXPECT_NE(&api::current(), nullptr);
}

TEST_F(ApiTest, EachThreadHasItsOwnImplicitScheduler) {
  Scheduler* here = &api::current();
  Scheduler* there = nullptr;
  std::thread other([&] {
    there = &api::current();
    api::reset();
  });
  other.join();
  EXPECT_NE(here, there);
}

TEST_F(ApiTest, WithMakesTheSchedulerCurrentOnlyDuringThePhase) {
  auto scheduler = api::new_scheduler();
  Scheduler* during = nullptr;
  api::with(*scheduler, make_tasklet([&] {
    during = &api::current();
    return Directive::done;
  }));
  EXPECT_EQ(during, scheduler.get());
  EXPECT_NE(&api::current(), scheduler.get());
}

TEST_F(ApiTest, ConfigureChoosesWorkersForNewSchedulers) {
  auto workers = Workers::create(3);
  api::configure(SchedulerOptions{nullptr, workers, 0});
  auto scheduler = api::new_scheduler();
  std::atomic<int> ran{0};
  scheduler->schedule(make_tasklet([&, phase = 0]() mutable {
                        if (phase++ == 0) return Directive::async;
                        ran.fetch_add(1);
                        return Directive::done;
                      }),
                      Directive::sync);
  scheduler->run();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(api::options().workers, workers);
  EXPECT_EQ(workers->concurrency(), 3);
}

TEST_F(ApiTest, ConfiguredConcurrencyBecomesOneSharedPool) {
  api::configure(SchedulerOptions{nullptr, nullptr, 2});
  const auto options = api::options();
  ASSERT_TRUE(options.workers);
  EXPECT_EQ(options.workers->concurrency(), 2);
}

TEST_F(ApiTest, PerSchedulerConcurrencyGetsAPrivatePool) {
  auto scheduler = api::new_scheduler(SchedulerOptions{nullptr, nullptr, 3});
  std::atomic<int> ran{0};
  for (int i = 0; i < 10; ++i) {
    scheduler->schedule(make_tasklet([&, phase = 0]() mutable {
                          if (phase++ == 0) return Directive::async;
                          ran.fetch_add(1);
                          return Directive::done;
                        }),
                        Directive::sync);
  }
  scheduler->run();
  EXPECT_EQ(ran.load(), 10);
}

TEST_F(ApiTest, SchedulersUseTheGlobalManagerByDefault) {
  EXPECT_EQ(api::new_scheduler()->manager(), JobManager::global());
  auto manager = JobManager::create();
  api::configure(SchedulerOptions{manager, nullptr, 0});
  EXPECT_EQ(api::new_scheduler()->manager(), manager);
}

}  // namespace
}  // namespace tasklet
