// Tasklets with rules: serialised against conflicting holders in request order, parallel
// otherwise, holding no worker while they wait.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "scheduler/scheduler_impl.hpp"
#include "support/test_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

class DispatcherTest : public test::WorkerCountTest {
 protected:
  void TearDown() override {
    WorkerCountTest::TearDown();
    const auto stats = manager_->rule_stats();
    EXPECT_EQ(stats.held, 0u) << "a rule is still held";
    EXPECT_EQ(stats.waiting, 0u) << "a request is still waiting";
  }
  // A tasklet that runs `work` in one async phase while holding `rule`.
  static std::shared_ptr<Tasklet> async_job(Rule rule, std::function<void()> work) {
    return make_tasklet(
        [work = std::move(work), phase = 0]() mutable {
          if (phase++ == 0) return Directive::async;
          work();
          return Directive::done;
        },
        std::move(rule));
  }
};
TASKLET_WORKER_COUNTS(DispatcherTest);

// Counts holders of one resource and remembers whether two ever overlapped.
struct ExclusionProbe {
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  void enter() {
    if (inside.fetch_add(1) != 0) overlapped = true;
  }
  void leave() { inside.fetch_sub(1); }
};

TEST_P(DispatcherTest, LightSwitchAlwaysEndsOff) {
  const int repetitions = 10'000;
  struct Light {
    Rule rule = rules::mutex("light");
    std::atomic<bool> on{false};
  };
  std::vector<Light> lights(static_cast<std::size_t>(repetitions));
  scheduler().schedule(
      make_tasklet([&] {
        for (Light& light : lights) {
          api::current().schedule(async_job(light.rule, [&light] { light.on = true; }), Directive::async);
          api::current().schedule(async_job(light.rule, [&light] { light.on = false; }), Directive::async);
        }
        return Directive::done;
      }),
      Directive::sync);
  scheduler().run();
  int left_on = 0;
  for (const Light& light : lights) left_on += light.on ? 1 : 0;
  EXPECT_EQ(left_on, 0);
}

TEST_P(DispatcherTest, ConflictingTaskletsRunInScheduleOrder) {
  const Rule rule = rules::mutex("fifo");
  std::vector<int> order;  // guarded by the rule itself
  ExclusionProbe probe;
  for (int i = 0; i < 500; ++i) {
    scheduler().schedule(async_job(rule,
                                   [&, i] {
                                     probe.enter();
                                     order.push_back(i);
                                     probe.leave();
                                   }),
                         Directive::sync);
  }
  scheduler().run();
  ASSERT_EQ(order.size(), 500u);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);
  EXPECT_FALSE(probe.overlapped.load());
}

TEST_P(DispatcherTest, DirectoryExcludesItsFiles) {
  std::atomic<int> files_inside{0};
  std::atomic<bool> file_with_directory{false};
  std::atomic<bool> directory_inside{false};
  for (int round = 0; round < 50; ++round) {
    scheduler().schedule(async_job(rules::path("/project"),
                                   [&] {
                                     directory_inside = true;
                                     if (files_inside.load() != 0) file_with_directory = true;
                                     directory_inside = false;
                                   }),
                         Directive::sync);
    for (int file = 0; file < 4; ++file) {
      scheduler().schedule(async_job(rules::path("/project/src/f" + std::to_string(file) + ".cpp"),
                                     [&] {
                                       files_inside.fetch_add(1);
                                       if (directory_inside.load()) file_with_directory = true;
                                       files_inside.fetch_sub(1);
                                     }),
                           Directive::sync);
    }
  }
  scheduler().run();
  EXPECT_FALSE(file_with_directory.load());
}

TEST(DispatcherOverlapTest, SiblingsRunInParallel) {
  // Two workers; each sibling waits (bounded) until the other has started: only parallel running
  // lets both see each other.
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  auto scheduler = Scheduler::create(SchedulerOptions{manager, nullptr, 0});
  std::mutex mutex;
  std::condition_variable changed;
  int started = 0;
  bool both_seen[2] = {false, false};
  const auto sibling = [&](int index) {
    return make_tasklet(
        [&, index, phase = 0]() mutable {
          if (phase++ == 0) return Directive::async;
          std::unique_lock lock(mutex);
          ++started;
          changed.notify_all();
          both_seen[index] = changed.wait_for(lock, 30s, [&] { return started == 2; });
          return Directive::done;
        },
        rules::path(index == 0 ? "/project/src" : "/project/docs"));
  };
  scheduler->schedule(sibling(0), Directive::sync).schedule(sibling(1), Directive::sync).run();
  EXPECT_TRUE(both_seen[0] && both_seen[1]) << "/project/src and /project/docs did not overlap";
}

TEST_P(DispatcherTest, BroadRuleIsNotStarvedByNarrowOnes) {
  // /a waits behind earlier /a/x jobs and every later /a/... job waits behind it.
  std::atomic<int> sequence{0};
  std::vector<int> narrow_done(200, -1), narrow_start(200, -1);
  int broad_start = -1, broad_done = -1;
  const int broad_at = 100;
  scheduler().schedule(make_tasklet([&] {
                         for (int i = 0; i < 200; ++i) {
                           if (i == broad_at) {
                             api::current().schedule(async_job(rules::path("/a"),
                                                               [&] {
                                                                 broad_start = sequence++;
                                                                 broad_done = sequence++;
                                                               }),
                                                     Directive::async);
                           }
                           api::current().schedule(
                               async_job(rules::path("/a/x" + std::to_string(i)),
                                         [&, i] {
                                           narrow_start[static_cast<std::size_t>(i)] = sequence++;
                                           narrow_done[static_cast<std::size_t>(i)] = sequence++;
                                         }),
                               Directive::async);
                         }
                         return Directive::done;
                       }),
                       Directive::sync);
  scheduler().run();
  ASSERT_GE(broad_start, 0);
  for (int i = 0; i < 200; ++i) {
    if (i < broad_at) {
      EXPECT_LT(narrow_done[static_cast<std::size_t>(i)], broad_start) << "earlier /a/x" << i;
    } else {
      EXPECT_GT(narrow_start[static_cast<std::size_t>(i)], broad_done) << "later /a/x" << i;
    }
  }
}

TEST_P(DispatcherTest, ARuleIsHeldAcrossAllPhases) {
  // sync -> async -> sync under one rule: a conflicting tasklet never runs in between.
  const Rule rule = rules::path("/shared");
  ExclusionProbe probe;
  std::atomic<bool> interleaved{false};
  for (int i = 0; i < 100; ++i) {
    scheduler().schedule(make_tasklet(
                             [&, phase = 0]() mutable {
                               switch (phase++) {
                                 case 0:
                                   probe.enter();
                                   return Directive::async;
                                 case 1:
                                   if (probe.inside.load() != 1) interleaved = true;
                                   return Directive::sync;
                                 default:
                                   probe.leave();
                                   return Directive::done;
                               }
                             },
                             rule),
                         Directive::sync);
  }
  scheduler().run();
  EXPECT_FALSE(probe.overlapped.load());
  EXPECT_FALSE(interleaved.load());
}

TEST_P(DispatcherTest, WaitingTaskletsHoldNoWorker) {
  // The holder parks with the rule held; a hundred tasklets wait for it; a rule-less tasklet still
  // gets a worker (with one worker, a waiter sitting on it would hang this test) and lets the
  // holder finish.
  const Rule rule = rules::mutex("busy");
  std::optional<Rescheduler> holder_rescheduler;
  std::atomic<int> waiters_ran{0};
  auto holder = make_tasklet(
      [&, phase = 0](Tasklet& self) mutable {
        if (phase++ == 0) {
          holder_rescheduler = api::current().suspend(self);
          return Directive::wait;
        }
        return Directive::done;
      },
      rule);
  scheduler().schedule(holder, Directive::sync);
  scheduler().schedule(make_tasklet([&] {
                         for (int i = 0; i < 100; ++i) {
                           api::current().schedule(async_job(rule, [&] { waiters_ran.fetch_add(1); }),
                                                   Directive::async);
                         }
                         api::current().schedule(async_job(nullptr,
                                                           [&] {
                                                             EXPECT_EQ(waiters_ran.load(), 0);
                                                             holder_rescheduler->resume(Directive::done);
                                                           }),
                                                 Directive::async);
                         return Directive::done;
                       }),
                       Directive::sync);
  scheduler().run();
  EXPECT_EQ(waiters_ran.load(), 100);
}

TEST_P(DispatcherTest, AFailingTaskletReleasesItsRule) {
  const Rule rule = rules::mutex("fragile");
  std::atomic<int> after{0};
  scheduler().schedule(make_tasklet([]() -> Directive { throw std::runtime_error("boom"); }, rule),
                       Directive::sync);
  scheduler().schedule(async_job(rule, [&] { after.fetch_add(1); }), Directive::sync);
  scheduler().schedule(make_tasklet(
                           [phase = 0]() mutable -> Directive {
                             if (phase++ == 0) return Directive::async;
                             throw std::runtime_error("async boom");
                           },
                           rule),
                       Directive::sync);
  scheduler().schedule(async_job(rule, [&] { after.fetch_add(1); }), Directive::sync);
  EXPECT_THROW(scheduler().run(), std::runtime_error);
  EXPECT_EQ(after.load(), 2);
  EXPECT_EQ(scheduler().failures().size(), 2u);
}

TEST_P(DispatcherTest, RuleCannotChangeWhileActive) {
  auto tasklet = make_tasklet([] { return Directive::done; }, rules::mutex("a"));
  scheduler().schedule(tasklet, Directive::sync);
  try {
    tasklet->set_rule(rules::mutex("b"));
    FAIL();
  } catch (const TaskletActive& error) {
    EXPECT_NE(std::string(error.what()).find("mutex(b)"), std::string::npos) << error.what();
  }
  scheduler().run();
  tasklet->set_rule(rules::mutex("b"));
}

TEST_P(DispatcherTest, InvalidRulesAreRejectedWhenSet) {
  struct GreedyRule final : SchedulingRule {
    bool contains(const SchedulingRule&) const override { return true; }
    bool is_conflicting(const SchedulingRule&) const override { return true; }
    std::string to_string() const override { return "greedy"; }
  };
  auto tasklet = make_tasklet([] { return Directive::done; });
  try {
    tasklet->set_rule(std::make_shared<GreedyRule>());
    FAIL();
  } catch (const InvalidRule& error) {
    EXPECT_NE(std::string(error.what()).find("greedy"), std::string::npos) << error.what();
  }
}

TEST_P(DispatcherTest, ThreadRulesExcludeTasklets) {
  // A path locked with begin_rule on another thread excludes tasklets under it until end_rule.
  const Rule project = rules::path("/project");
  std::latch locked(1), may_end(1);
  std::atomic<bool> ended{false};
  std::atomic<bool> ran_too_early{false};
  std::thread locker([&] {
    RuleScope scope(*manager_, project);
    locked.count_down();
    may_end.wait();
    ended = true;
  });
  locked.wait();
  scheduler().schedule(async_job(rules::path("/project/a.cpp"), [&] { ran_too_early = !ended.load(); }),
                       Directive::sync);
  scheduler().schedule(make_tasklet([&] {
                         may_end.count_down();
                         return Directive::done;
                       }),
                       Directive::sync);
  scheduler().run();
  locker.join();
  EXPECT_FALSE(ran_too_early.load());
}

TEST_P(DispatcherTest, DroppingASchedulerEndsItsWaitingTaskletsUnrun) {
  // Every tasklet owns a Counted; its destruction shows that the tasklet was let go.
  struct Counted {
    explicit Counted(std::atomic<int>& n) : count(n) {}
    Counted(const Counted&) = delete;
    Counted& operator=(const Counted&) = delete;
    ~Counted() { count.fetch_add(1); }
    std::atomic<int>& count;
  };
  std::atomic<int> released{0};
  std::atomic<int> ran{0};
  const Rule rule = rules::mutex("held by the test");
  manager_->begin_rule(rule);
  {
    auto dropped = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
    for (int i = 0; i < 100; ++i) {
      dropped->schedule(make_tasklet(
                            [&ran, counted = std::make_shared<Counted>(released)] {
                              ran.fetch_add(1);
                              return Directive::done;
                            },
                            rule),
                        Directive::sync);
    }
    EXPECT_EQ(manager_->rule_stats().waiting, 100u);
  }
  EXPECT_EQ(manager_->rule_stats().waiting, 0u) << "the scheduler withdrew its requests";
  EXPECT_EQ(released.load(), 100) << "and let go of every tasklet";
  manager_->end_rule(rule);
  EXPECT_EQ(ran.load(), 0);
}

// A tasklet granted its rule at once and queued for its sync phase holds the rule; a scheduler
// dropped before run() ends it unrun, and that must release the rule (TearDown checks that nothing
// is held), or every later request for it would wait forever.
TEST_P(DispatcherTest, DroppingASchedulerReleasesTheRulesOfItsQueuedTasklets) {
  const Rule rule = rules::path("/dropped/with/rule");
  std::atomic<int> ran{0};
  {
    auto dropped = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
    dropped->schedule(make_tasklet(
                          [&ran] {
                            ran.fetch_add(1);
                            return Directive::done;
                          },
                          rule),
                      Directive::sync);
    EXPECT_EQ(manager_->rule_stats().held, 1u) << "granted at once, queued for the sync thread";
  }
  EXPECT_EQ(manager_->rule_stats().held, 0u) << "dropping the scheduler released the rule";
  EXPECT_EQ(ran.load(), 0);
  const RuleScope scope(*manager_, rule);  // would wait forever on a leaked hold
}

TEST_P(DispatcherTest, SyncPhasesWithRulesRunOnTheSyncThread) {
  const auto sync_thread = std::this_thread::get_id();
  std::atomic<int> elsewhere{0};
  const Rule shared[] = {rules::mutex("m0"), rules::mutex("m1"), rules::mutex("m2")};
  for (int i = 0; i < 200; ++i) {
    scheduler().schedule(make_tasklet(
                             [&, phase = 0]() mutable {
                               if (phase % 2 == 0 && std::this_thread::get_id() != sync_thread) {
                                 elsewhere.fetch_add(1);
                               }
                               return ++phase < 4 ? (phase % 2 ? Directive::async : Directive::sync)
                                                  : Directive::done;
                             },
                             shared[i % 3]),
                         Directive::sync);
  }
  scheduler().run();
  EXPECT_EQ(elsewhere.load(), 0);
}

// Past about a thousand waiting tasklets the synchronous thread lets the workers catch up before it
// starts more. Here nothing can catch up: every tasklet waits for a rule the synchronous thread
// itself holds (as its tasklet's rule, or begun in the phase), so it must go on after a while
// instead of waiting for them (a regression hangs here).
TEST_P(DispatcherTest, TaskletsWaitingForTheSyncThreadDoNotHoldItBack) {
  constexpr int count = 5'000;
  const Rule rule = rules::mutex("held by the sync thread");
  for (const bool own_rule : {true, false}) {
    std::vector<int> order;  // guarded by the rule
    std::atomic<bool> sync_done{false};
    std::atomic<int> ran_early{0};
    auto seed = make_tasklet([&] {
      std::optional<RuleScope> scope;
      if (!own_rule) scope.emplace(*manager_, rule);
      for (int i = 0; i < count; ++i) {
        api::current().schedule(async_job(rule,
                                          [&, i] {
                                            if (!sync_done.load()) ran_early.fetch_add(1);
                                            order.push_back(i);
                                          }),
                                Directive::async);
      }
      sync_done = true;
      return Directive::done;
    });
    if (own_rule) seed->set_rule(rule);
    scheduler().schedule(std::move(seed), Directive::sync);
    scheduler().run();
    EXPECT_EQ(ran_early.load(), 0) << "own rule: " << own_rule;
    ASSERT_EQ(order.size(), static_cast<std::size_t>(count)) << "own rule: " << own_rule;
    for (int i = 0; i < count; ++i)
      ASSERT_EQ(order[static_cast<std::size_t>(i)], i) << "own rule: " << own_rule;
  }
}

// Flow control counts only the synchronous thread's own tasklets: here a worker leaves 3,000
// tasklets waiting (for a rule another thread holds), and the synchronous thread, starting a few
// of its own, never holds back for them (it did when it counted every tasklet of the scheduler,
// for as long as such a backlog took to drain).
TEST_P(DispatcherTest, OtherThreadsWaitingTaskletsDoNotHoldTheSyncThreadBack) {
  constexpr int waiting = 3'000;
  const Rule busy = rules::mutex("held by another thread");
  const Rule free = rules::mutex("free");
  std::latch held(1), posted(1), may_release(1);
  std::thread holder([&] {
    RuleScope scope(*manager_, busy);
    held.count_down();
    may_release.wait();
  });
  held.wait();
  std::atomic<int> ran{0};
  scheduler().schedule(
      make_tasklet([&, phase = 0]() mutable {
        if (phase++ == 0) {
          api::current().schedule(make_tasklet([&] {  // on a worker
                                    for (int i = 0; i < waiting; ++i) {
                                      api::current().schedule(async_job(busy, [&] { ran.fetch_add(1); }),
                                                              Directive::async);
                                    }
                                    posted.count_down();
                                    return Directive::done;
                                  }),
                                  Directive::async);
          return Directive::sync;
        }
        posted.wait();
        for (int i = 0; i < 64; ++i) {
          api::current().schedule(async_job(free, [&] { ran.fetch_add(1); }), Directive::async);
        }
        may_release.count_down();
        return Directive::done;
      }),
      Directive::sync);
  scheduler().run();
  holder.join();
  EXPECT_EQ(ran.load(), waiting + 64);
  EXPECT_EQ(detail::impl(scheduler()).sync_catch_up_.waits, 0u) << "held back for other threads' tasklets";
}

// When part of its backlog cannot move (it waits for the synchronous thread's own rule) and the
// rest can, the synchronous thread gives up holding back at most once per 512 deliveries since
// it last gave up: re-arming after every delivery cost it 64 yields at every batch.
TEST_P(DispatcherTest, APartlyStuckBacklogCostsFewGiveUps) {
  constexpr int pairs = 3'000;
  const Rule mine = rules::mutex("the sync thread's");
  const Rule free = rules::mutex("free");
  std::atomic<int> stuck_ran{0}, free_ran{0};
  std::atomic<bool> seed_done{false};
  auto seed = make_tasklet([&] {
    for (int i = 0; i < pairs; ++i) {
      api::current().schedule(async_job(mine,
                                        [&] {
                                          if (seed_done.load()) stuck_ran.fetch_add(1);
                                        }),
                              Directive::async);
      api::current().schedule(async_job(free, [&] { free_ran.fetch_add(1); }), Directive::async);
    }
    seed_done = true;
    return Directive::done;
  });
  seed->set_rule(mine);
  scheduler().schedule(std::move(seed), Directive::sync);
  scheduler().run();
  EXPECT_EQ(stuck_ran.load(), pairs);
  EXPECT_EQ(free_ran.load(), pairs);
  // At most `pairs` holds were delivered while the seed ran (the stuck ones wait for it).
  const auto& impl = detail::impl(scheduler());
  EXPECT_GE(impl.sync_catch_up_.give_ups, 1u) << "the stuck half alone passes the limit";
  EXPECT_LE(impl.sync_catch_up_.give_ups, 1u + pairs / 512u);
}

// The synchronous thread's requests are entered by a task on the workers, but a sync tasklet must
// not wait for a worker to be free: here the only worker waits for that very tasklet, and the
// synchronous thread enters what it submitted itself before it waits for work.
TEST(DispatcherBusyWorkersTest, ASyncTaskletWithARuleDoesNotWaitForABusyWorker) {
  auto manager = JobManager::create(JobManager::Options{1, nullptr});
  auto scheduler = Scheduler::create(SchedulerOptions{manager, nullptr, 0});
  const Rule rule = rules::mutex("sync side");
  std::latch blocker_started{1};
  std::promise<void> ran;
  std::shared_future<void> sync_ran = ran.get_future().share();
  std::atomic<bool> blocker_saw_it{false};
  scheduler->schedule(make_tasklet([&, phase = 0]() mutable {
                        if (phase++ == 0) {
                          api::current().schedule(make_tasklet([&] {
                                                    blocker_started.count_down();
                                                    // Bounded only so that a regression fails instead of
                                                    // hanging.
                                                    blocker_saw_it =
                                                        sync_ran.wait_for(60s) == std::future_status::ready;
                                                    return Directive::done;
                                                  }),
                                                  Directive::async);
                          return Directive::sync;  // the blocker starts when this turn ends
                        }
                        blocker_started.wait();  // the only worker is busy from now on
                        api::current().schedule(make_tasklet(
                                                    [&] {
                                                      ran.set_value();
                                                      return Directive::done;
                                                    },
                                                    rule),
                                                Directive::sync);
                        return Directive::done;
                      }),
                      Directive::sync);
  scheduler->run();
  EXPECT_TRUE(blocker_saw_it.load()) << "the sync tasklet waited for the busy worker";
  EXPECT_EQ(manager->rule_stats().held, 0u);
}

}  // namespace
}  // namespace tasklet
