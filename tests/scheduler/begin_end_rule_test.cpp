// begin_rule / end_rule: two-phase locking on threads and inside tasklet phases (Eclipse's
// BeginEndRuleTest cases, written anew).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <future>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "support/test_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

class BeginEndRuleTest : public ::testing::Test {
 protected:
  void TearDown() override {
    const auto stats = manager_->rule_stats();
    EXPECT_EQ(stats.held, 0u);
    EXPECT_EQ(stats.waiting, 0u);
    EXPECT_EQ(manager_->current_rule(), nullptr);
  }
  std::shared_ptr<JobManager> manager_ = JobManager::create(JobManager::Options{2, nullptr});
  JobManager& manager() { return *manager_; }
};

void wait_until_waiting(JobManager& manager, std::size_t count) {
  while (manager.rule_stats().waiting < count) std::this_thread::yield();
}

TEST_F(BeginEndRuleTest, SimpleRuleIsHeldUntilEnded) {
  const Rule a = rules::path("/a");
  manager().begin_rule(a);
  EXPECT_EQ(manager().current_rule(), a);
  EXPECT_EQ(manager().rule_stats().held, 1u);
  manager().end_rule(a);
  EXPECT_EQ(manager().rule_stats().held, 0u);
}

TEST_F(BeginEndRuleTest, NestedContainedRulesArePushedWithoutWaiting) {
  const Rule a = rules::path("/a"), ab = rules::path("/a/b"), abc = rules::read_path("/a/b/c");
  manager().begin_rule(a);
  manager().begin_rule(ab);
  manager().begin_rule(abc);
  EXPECT_EQ(manager().current_rule(), abc) << "the innermost rule";
  EXPECT_EQ(manager().rule_stats().held, 1u) << "only the outermost rule is acquired";
  manager().end_rule(abc);
  EXPECT_EQ(manager().current_rule(), ab);
  manager().end_rule(ab);
  manager().end_rule(a);
}

TEST_F(BeginEndRuleTest, NestedRuleNotContainedThrowsAndStillBalances) {
  const Rule a = rules::path("/a"), b = rules::path("/b");
  manager().begin_rule(a);
  try {
    manager().begin_rule(b);
    FAIL();
  } catch (const RuleNotContained& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("path(/b)"), std::string::npos) << message;
    EXPECT_NE(message.find("path(/a)"), std::string::npos) << message;
  }
  manager().end_rule(b);  // the failed begin was pushed: end it like Eclipse's try/finally
  manager().end_rule(a);
}

TEST_F(BeginEndRuleTest, ReadRuleDoesNotUpgradeByNesting) {
  const Rule read = rules::read_path("/data"), write = rules::path("/data/x");
  manager().begin_rule(read);
  EXPECT_THROW(manager().begin_rule(write), RuleNotContained);
  manager().end_rule(write);
  manager().end_rule(read);
}

TEST_F(BeginEndRuleTest, MismatchedEndThrowsAndChangesNothing) {
  const Rule a = rules::path("/a"), b = rules::path("/a");  // equal paths, different objects
  manager().begin_rule(a);
  EXPECT_THROW(manager().end_rule(b), RuleMismatch);
  EXPECT_EQ(manager().current_rule(), a);
  manager().end_rule(a);
  EXPECT_THROW(manager().end_rule(a), RuleMismatch) << "nothing left to end";
}

// Two rule objects that print alike: the message tells them apart (their addresses), and says
// what end_rule needs; two that print differently are named as they print.
TEST_F(BeginEndRuleTest, AMismatchOfRulesThatPrintAlikeTellsThemApart) {
  const Rule begun = rules::path("/a"), ended = rules::path("/a"), other = rules::path("/b");
  manager().begin_rule(begun);
  try {
    manager().end_rule(ended);
    FAIL() << "end_rule accepted another object";
  } catch (const RuleMismatch& error) {
    const std::string message = error.what();
    char begun_at[40], ended_at[40];
    std::snprintf(begun_at, sizeof begun_at, "%p", static_cast<const void*>(begun.get()));
    std::snprintf(ended_at, sizeof ended_at, "%p", static_cast<const void*>(ended.get()));
    EXPECT_NE(message.find(begun_at), std::string::npos) << message;
    EXPECT_NE(message.find(ended_at), std::string::npos) << message;
    EXPECT_NE(message.find("the object begin_rule was given"), std::string::npos) << message;
  }
  try {
    manager().end_rule(other);
    FAIL() << "end_rule accepted another rule";
  } catch (const RuleMismatch& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("end_rule(path(/b)) does not match the most recent begin_rule(path(/a))"),
              std::string::npos)
        << message;
  }
  manager().end_rule(begun);
}

// The same rule object begun on one manager and ended on another.
TEST_F(BeginEndRuleTest, EndingOnAnotherManagerSaysSo) {
  const Rule rule = rules::path("/m");
  auto elsewhere = JobManager::create(JobManager::Options{1, nullptr});
  manager().begin_rule(rule);
  try {
    elsewhere->end_rule(rule);
    FAIL() << "end_rule accepted the other manager";
  } catch (const RuleMismatch& error) {
    EXPECT_NE(std::string(error.what()).find("job manager other than"), std::string::npos) << error.what();
  }
  manager().end_rule(rule);
}

TEST_F(BeginEndRuleTest, EndOnAnotherThreadFails) {
  const Rule a = rules::path("/a");
  manager().begin_rule(a);
  std::thread other([&] { EXPECT_THROW(manager().end_rule(a), RuleMismatch); });
  other.join();
  manager().end_rule(a);
}

TEST_F(BeginEndRuleTest, NullRulesPushNoOpScopes) {
  const Rule a = rules::path("/a");
  manager().begin_rule(nullptr);
  EXPECT_EQ(manager().current_rule(), nullptr);
  manager().begin_rule(a);
  manager().begin_rule(nullptr);
  EXPECT_EQ(manager().current_rule(), a);
  manager().end_rule(nullptr);
  manager().end_rule(a);
  manager().end_rule(nullptr);
  EXPECT_EQ(manager().rule_stats().held, 0u);
}

TEST_F(BeginEndRuleTest, InvalidRuleIsRejectedAndBalanced) {
  struct NoSelf final : SchedulingRule {
    bool contains(const SchedulingRule&) const override { return false; }
    bool is_conflicting(const SchedulingRule&) const override { return false; }
    std::string to_string() const override { return "no-self"; }
  };
  const Rule bad = std::make_shared<NoSelf>();
  EXPECT_THROW(manager().begin_rule(bad), InvalidRule);
  manager().end_rule(bad);
}

TEST_F(BeginEndRuleTest, RuleScopeEndsEvenWhenBeginThrows) {
  const Rule a = rules::path("/a"), b = rules::path("/b");
  RuleScope outer(manager(), a);
  EXPECT_THROW(RuleScope inner(manager(), b), RuleNotContained);
  EXPECT_EQ(manager().current_rule(), a) << "the failed scope was ended";
}

TEST_F(BeginEndRuleTest, SecondThreadWaitsForAConflictingRule) {
  const Rule a = rules::path("/a");
  std::vector<std::string> events;
  std::mutex events_mutex;
  const auto note = [&](std::string event) {
    std::lock_guard lock(events_mutex);
    events.push_back(std::move(event));
  };
  manager().begin_rule(a);
  std::thread other([&] {
    RuleScope scope(manager(), rules::path("/a/b"));
    note("other acquired");
  });
  wait_until_waiting(manager(), 1);
  note("main ends");
  manager().end_rule(a);
  other.join();
  EXPECT_EQ(events, (std::vector<std::string>{"main ends", "other acquired"}));
}

TEST_F(BeginEndRuleTest, ThreadsAndTaskletsShareOneFifo) {
  // main holds m; a thread asks next; a tasklet asks after it: the thread goes first.
  const Rule m = rules::mutex("m");
  std::vector<std::string> order;
  std::mutex order_mutex;
  const auto note = [&](std::string event) {
    std::lock_guard lock(order_mutex);
    order.push_back(std::move(event));
  };
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  manager().begin_rule(m);
  std::thread thread([&] {
    RuleScope scope(manager(), m);
    note("thread");
  });
  wait_until_waiting(manager(), 1);
  scheduler->schedule(make_tasklet(
                          [&] {
                            note("tasklet");
                            return Directive::done;
                          },
                          m),
                      Directive::sync);
  wait_until_waiting(manager(), 2);
  manager().end_rule(m);
  thread.join();
  scheduler->run();
  EXPECT_EQ(order, (std::vector<std::string>{"thread", "tasklet"}));
}

TEST_F(BeginEndRuleTest, RulesInsideATaskletWithARule) {
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  const Rule job_rule = rules::path("/job");
  Rule seen_current;
  bool nested_ok = false, unrelated_refused = false;
  scheduler->schedule(make_tasklet(
                          [&, phase = 0]() mutable {
                            if (phase++ == 0) return Directive::async;
                            seen_current = manager().current_rule();
                            const Rule inner = rules::path("/job/part");
                            manager().begin_rule(inner);
                            nested_ok = manager().current_rule() == inner && manager().rule_stats().held == 1;
                            manager().end_rule(inner);
                            const Rule unrelated = rules::path("/elsewhere");
                            try {
                              manager().begin_rule(unrelated);
                            } catch (const RuleNotContained& error) {
                              unrelated_refused =
                                  std::string(error.what()).find("does not match the outer scope rule") !=
                                  std::string::npos;
                            }
                            manager().end_rule(unrelated);
                            return Directive::done;
                          },
                          job_rule),
                      Directive::sync);
  scheduler->run();
  EXPECT_EQ(seen_current, job_rule);
  EXPECT_TRUE(nested_ok);
  EXPECT_TRUE(unrelated_refused);
}

TEST_F(BeginEndRuleTest, RuleLeftOpenInAPhaseFailsTheTaskletAndIsReleased) {
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  const Rule leaked = rules::path("/leaked");
  auto careless = make_tasklet([&] {
    manager().begin_rule(leaked);
    return Directive::done;
  });
  careless->set_name("careless");
  scheduler->schedule(careless, Directive::sync);
  try {
    scheduler->run();
    FAIL();
  } catch (const RuleMismatch& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("careless"), std::string::npos) << message;
    EXPECT_NE(message.find("path(/leaked)"), std::string::npos) << message;
  }
  EXPECT_EQ(manager().rule_stats().held, 0u) << "released";
  RuleScope again(manager(), leaked);  // and free for others
}

TEST_F(BeginEndRuleTest, EndingARuleBegunOutsideThePhaseIsRefusedInside) {
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  const Rule outer = rules::path("/outer");
  manager().begin_rule(outer);
  scheduler->schedule(make_tasklet([&] {
                        EXPECT_THROW(manager().end_rule(outer), RuleMismatch);
                        return Directive::done;
                      }),
                      Directive::sync);
  scheduler->run();
  manager().end_rule(outer);
}

TEST_F(BeginEndRuleTest, BlockedCallersOnWorkersDoNotStarveThePool) {
  // One worker, 64 async phases blocked in begin_rule on a rule held by another thread. Only if
  // blocked phases give their worker back can the probe below see all 64 waiting and run the
  // rule-less tasklet that lets the holder go.
  auto one_worker = JobManager::create(JobManager::Options{1, nullptr});
  auto scheduler = Scheduler::create(SchedulerOptions{one_worker, nullptr, 0});
  const Rule contended = rules::mutex("contended");
  const int blocked = 64;
  std::mutex mutex;
  std::condition_variable released_cv;
  bool may_release = false;
  bool timed_out = false;
  std::latch holding(1);
  std::thread holder([&] {
    one_worker->begin_rule(contended);
    holding.count_down();
    std::unique_lock lock(mutex);
    timed_out = !released_cv.wait_for(lock, 60s, [&] { return may_release; });
    lock.unlock();
    one_worker->end_rule(contended);
  });
  holding.wait();
  std::atomic<int> finished{0};
  for (int i = 0; i < blocked; ++i) {
    scheduler->schedule(make_tasklet([&, phase = 0]() mutable {
                          if (phase++ == 0) return Directive::async;
                          RuleScope scope(*one_worker, contended);
                          finished.fetch_add(1);
                          return Directive::done;
                        }),
                        Directive::sync);
  }
  scheduler->schedule(make_tasklet([&, phase = 0]() mutable {
                        if (phase == 0) {  // sync probe: wait, politely, for every caller to block
                          if (one_worker->rule_stats().waiting < static_cast<std::size_t>(blocked)) {
                            return Directive::sync;
                          }
                          phase = 1;
                          return Directive::async;  // needs a free worker
                        }
                        std::lock_guard lock(mutex);
                        may_release = true;
                        released_cv.notify_all();
                        return Directive::done;
                      }),
                      Directive::sync);
  scheduler->run();
  holder.join();
  EXPECT_FALSE(timed_out) << "the worker was starved by blocked begin_rule callers";
  EXPECT_EQ(finished.load(), blocked);
  EXPECT_EQ(one_worker->rule_stats().held, 0u);
}

// ---------------------------------------------------------------------------------------------
// Parking: end_rule leaves a thread's request in the table, idle, for its next begin_rule of the
// same rule. Nobody may notice, except that the next begin_rule is cheaper.

// Runs `body` on a new thread; false when it did not finish within the patience (a hang).
bool finishes_on_another_thread(const std::function<void()>& body) {
  auto done = std::async(std::launch::async, body);
  const bool finished = done.wait_for(test::patience) == std::future_status::ready;
  if (finished) done.get();
  return finished;
}

TEST_F(BeginEndRuleTest, AnEndedRuleIsFreeForOthersAtOnce) {
  const Rule m = rules::mutex("m");
  const Rule dir = rules::path("/p/q");
  for (int round = 0; round < 3; ++round) {
    manager().begin_rule(m);
    manager().end_rule(m);
    manager().begin_rule(dir);
    manager().end_rule(dir);
    EXPECT_EQ(manager().rule_stats().held, 0u) << "an ended rule is not held";
    EXPECT_TRUE(manager().is_idle());
    EXPECT_TRUE(finishes_on_another_thread([&] {
      { RuleScope scope(manager(), m); }
      { RuleScope scope(manager(), rules::combine(m, rules::path("/p"))); }
    })) << "round "
        << round;
    std::atomic<int> runs{0};
    auto job = make_job(
        "needs /p",
        [&](ProgressMonitor&) {
          ++runs;
          return Status::ok();
        },
        manager_);
    job->set_rule(rules::path("/p"));
    job->schedule();
    ASSERT_TRUE(job->join(std::chrono::duration_cast<std::chrono::milliseconds>(test::patience)));
    EXPECT_EQ(runs.load(), 1);
  }
}

TEST_F(BeginEndRuleTest, ThreadsTakingTurnsOnOneRuleNeverOverlap) {
  // Two threads, and a job now and then, on one rule: each end_rule parks the request, and the
  // other side's begin_rule either revokes it or, while it is held, waits for a real release.
  const Rule m = rules::mutex("turns");
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  const auto critical = [&] {
    if (inside.fetch_add(1) != 0) ++overlaps;
    inside.fetch_sub(1);
  };
  const int rounds = 20'000 * test::stress_scale();
  std::latch start(2);
  const auto side = [&] {
    start.arrive_and_wait();
    for (int i = 0; i < rounds; ++i) {
      RuleScope scope(manager(), m);
      critical();
    }
  };
  std::thread a(side), b(side);
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 50; ++i) {
    auto job = make_job(
        "turn",
        [&](ProgressMonitor&) {
          critical();
          return Status::ok();
        },
        manager_);
    job->set_rule(m);
    job->schedule();
    jobs.push_back(std::move(job));
  }
  a.join();
  b.join();
  for (auto& job : jobs)
    ASSERT_TRUE(job->join(std::chrono::duration_cast<std::chrono::milliseconds>(test::patience)));
  EXPECT_EQ(overlaps.load(), 0);
}

TEST_F(BeginEndRuleTest, AThreadThatEndsLeavesItsParkedRuleFree) {
  const Rule m = rules::mutex("m");
  std::thread([&] {
    manager().begin_rule(m);
    manager().end_rule(m);
  }).join();
  EXPECT_EQ(manager().rule_stats().held, 0u);
  manager().begin_rule(m);
  EXPECT_EQ(manager().rule_stats().held, 1u);
  manager().end_rule(m);
}

TEST_F(BeginEndRuleTest, AParkedRuleOutlivesItsManagerHarmlessly) {
  // One thread parks a request in a manager that then goes away, and goes on with another manager
  // (perhaps made where the first one was), with the same rule and with another.
  const Rule m = rules::mutex("m");
  const Rule other = rules::path("/x");
  EXPECT_TRUE(finishes_on_another_thread([&] {
    for (int round = 0; round < 3; ++round) {
      auto first = JobManager::create(JobManager::Options{1, nullptr});
      first->begin_rule(m);
      first->end_rule(m);
      first.reset();
      auto second = JobManager::create(JobManager::Options{1, nullptr});
      for (const Rule& rule : {m, other, m}) {
        second->begin_rule(rule);
        EXPECT_EQ(second->rule_stats().held, 1u);
        second->end_rule(rule);
      }
      EXPECT_TRUE(finishes_on_another_thread([&] {
        { RuleScope scope(*second, m); }
        { RuleScope scope(*second, rules::path("/")); }
      }));
      EXPECT_EQ(second->rule_stats().held, 0u);
    }
  }));
}

TEST_F(BeginEndRuleTest, ACustomRuleIsNotHeldUpByParkedRules) {
  // A custom rule cannot be asked about a parked request (its rule may be gone): it takes every
  // parked request out of its way instead.
  class Everything final : public SchedulingRule {  // conflicts with every built-in rule
   public:
    bool contains(const SchedulingRule& other) const override { return &other == this; }
    // Every built-in rule, and itself.
    bool is_conflicting(const SchedulingRule& other) const override {
      return &other == this || other.key().kind != RuleKey::Kind::custom;
    }
  };
  const Rule everything = std::make_shared<Everything>();
  {
    const Rule gone = rules::path("/gone");
    manager().begin_rule(gone);
    manager().end_rule(gone);
  }  // the parked request's rule dies here
  EXPECT_TRUE(finishes_on_another_thread([&] { RuleScope scope(manager(), everything); }));
  manager().begin_rule(everything);
  std::atomic<int> runs{0};
  auto job = make_job(
      "after everything",
      [&](ProgressMonitor&) {
        ++runs;
        return Status::ok();
      },
      manager_);
  job->set_rule(rules::mutex("any"));
  job->schedule();
  EXPECT_EQ(runs.load(), 0) << "held back by the custom rule";
  manager().end_rule(everything);
  EXPECT_TRUE(job->join(std::chrono::duration_cast<std::chrono::milliseconds>(test::patience)));
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(manager().current_rule(), nullptr);
}

TEST_F(BeginEndRuleTest, ASynchronousThreadsRequestsKeepProgramOrder) {
  // The synchronous thread enters its tasklets' requests in batches; a begin_rule it makes after
  // scheduling them must still come after them.
  const Rule m = rules::mutex("order");
  std::vector<std::string> order;
  std::mutex order_mutex;
  const auto note = [&](std::string event) {
    std::lock_guard lock(order_mutex);
    order.push_back(std::move(event));
  };
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  scheduler->schedule(make_tasklet([&] {
                        for (int i = 0; i < 3; ++i) {
                          scheduler->schedule(make_tasklet(
                                                  [&, i] {
                                                    note("tasklet " + std::to_string(i));
                                                    return Directive::done;
                                                  },
                                                  m),
                                              Directive::async);
                        }
                        RuleScope scope(manager(), m);
                        note("begin_rule");
                        return Directive::done;
                      }),
                      Directive::sync);
  scheduler->run();
  EXPECT_EQ(order, (std::vector<std::string>{"tasklet 0", "tasklet 1", "tasklet 2", "begin_rule"}));
}

TEST_F(BeginEndRuleTest, AParkedRuleIsNotResumedPastATaskThisThreadPostedBefore) {
  // A post from a thread that is not a synchronous one is left for the holder of the table's lock
  // when it is taken. The posting thread's next begin_rule of the same rule must still come after
  // it, so it may not take back its parked request without the lock.
  class Watch final : public SchedulingRule {  // conflicts with itself only; can hold the table's lock
   public:
    bool contains(const SchedulingRule& other) const override { return &other == this; }
    bool is_conflicting(const SchedulingRule& other) const override {
      if (armed.exchange(false)) {  // called under the table's lock
        inside.count_down();
        go.wait();
      }
      return &other == this;
    }
    mutable std::atomic<bool> armed{false};
    mutable std::latch inside{1}, go{1};
  };
  const auto watch = std::make_shared<Watch>();
  std::latch watched{1}, done_watching{1};
  std::thread watcher([&] {  // a live custom rule is asked about every request that enters
    RuleScope scope(manager(), watch);
    watched.count_down();
    done_watching.wait();
  });
  watched.wait();
  SerialExecutor executor(manager_, "posted first");
  manager().begin_rule(executor.rule());
  manager().end_rule(executor.rule());  // parked: the next begin_rule takes it back without the lock
  watch->armed = true;
  std::thread locker([&] { RuleScope scope(manager(), rules::mutex("elsewhere")); });
  watch->inside.wait();  // the locker's request is being checked: it holds the table's lock
  std::atomic<bool> task_ran{false};
  executor.post([&] { task_ran = true; });
  std::thread opener([&] { watch->go.count_down(); });
  manager().begin_rule(executor.rule());
  EXPECT_TRUE(task_ran.load()) << "the task posted before the begin_rule runs before it";
  manager().end_rule(executor.rule());
  opener.join();
  locker.join();
  done_watching.count_down();
  watcher.join();
  executor.wait();
}

}  // namespace
}  // namespace tasklet
