// The serial executor: a strand built on a mutex rule.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "support/test_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

class SerialExecutorTest : public ::testing::TestWithParam<int> {
 protected:
  void TearDown() override {
    EXPECT_EQ(manager_->rule_stats().held, 0u);
    EXPECT_EQ(manager_->rule_stats().waiting, 0u);
  }
  std::shared_ptr<JobManager> manager_ = JobManager::create(JobManager::Options{GetParam(), nullptr});
};
TASKLET_WORKER_COUNTS(SerialExecutorTest);

TEST_P(SerialExecutorTest, RunsTasksOneAtATimeInPostOrder) {
  SerialExecutor strand(manager_, "strand");
  std::vector<int> order;  // touched only by the strand's tasks
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  const int count = 5000;
  for (int i = 0; i < count; ++i) {
    strand.post([&, i] {
      if (inside.fetch_add(1) != 0) overlapped = true;
      order.push_back(i);
      inside.fetch_sub(1);
    });
  }
  strand.wait();
  ASSERT_EQ(order.size(), static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);
  EXPECT_FALSE(overlapped.load());
  EXPECT_EQ(strand.outstanding(), 0u);
}

TEST_P(SerialExecutorTest, PostsFromManyThreadsNeverOverlap) {
  SerialExecutor strand(manager_);
  std::atomic<int> inside{0}, ran{0};
  std::atomic<bool> overlapped{false};
  std::vector<std::thread> posters;
  for (int t = 0; t < 4; ++t) {
    posters.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        strand.post([&] {
          if (inside.fetch_add(1) != 0) overlapped = true;
          ran.fetch_add(1);
          inside.fetch_sub(1);
        });
      }
    });
  }
  for (auto& poster : posters) poster.join();
  strand.wait();
  EXPECT_EQ(ran.load(), 4000);
  EXPECT_FALSE(overlapped.load());
}

// A strand on a rule of the caller's: two strands on one named mutex are one order, and a thread
// that begins a rule inside it waits for the running task.
TEST_P(SerialExecutorTest, StrandsOnOneNamedMutexShareTheirOrderWithHoldersOfIt) {
  SerialExecutor first(manager_, rules::named_mutex("tenant"));
  SerialExecutor second(manager_, rules::named_mutex("tenant"));
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  const auto task = [&] {
    if (inside.fetch_add(1) != 0) overlapped = true;
    inside.fetch_sub(1);
  };
  std::promise<void> entered;
  std::promise<void> go_on;
  first.post([&] {
    entered.set_value();
    go_on.get_future().wait();
  });
  entered.get_future().wait();
  std::atomic<bool> thread_held{false};
  std::thread thread([&] {
    const RuleScope scope(*manager_, rules::named_mutex("tenant"));
    thread_held = true;
  });
  for (int i = 0; i < 200; ++i) (i % 2 == 0 ? first : second).post(task);
  EXPECT_FALSE(thread_held.load()) << "the first task still runs";
  go_on.set_value();
  thread.join();
  first.wait();
  second.wait();
  EXPECT_TRUE(thread_held.load());
  EXPECT_FALSE(overlapped.load());
}

TEST_P(SerialExecutorTest, AStrandsRuleMustExcludeItself) {
  EXPECT_THROW(SerialExecutor(manager_, Rule()), InvalidRule);
  EXPECT_THROW(SerialExecutor(manager_, rules::read_path("/shared")), InvalidRule);
  SerialExecutor on_path(manager_, rules::path("/dir"));
  EXPECT_EQ(on_path.rule()->to_string(), "path(/dir)");
  EXPECT_EQ(on_path.submit([] { return 7; }).get(), 7);
}

TEST_P(SerialExecutorTest, CancelRemovesOnePendingTask) {
  SerialExecutor strand(manager_);
  std::latch started(1), release(1);
  std::vector<int> ran;
  strand.post([&] {
    started.count_down();
    release.wait();
    ran.push_back(0);
  });
  auto second = strand.post([&] { ran.push_back(1); });
  strand.post([&] { ran.push_back(2); });
  started.wait();
  EXPECT_EQ(strand.outstanding(), 3u) << "the running task and two pending ones";
  EXPECT_TRUE(strand.cancel(second));
  EXPECT_FALSE(strand.cancel(second)) << "canceled already";
  EXPECT_EQ(strand.outstanding(), 2u) << "a canceled task is no longer counted";
  release.count_down();
  strand.wait();
  EXPECT_EQ(ran, (std::vector<int>{0, 2}));
  EXPECT_EQ(strand.outstanding(), 0u);
  EXPECT_FALSE(strand.cancel(second));
}

TEST_P(SerialExecutorTest, CancelAllRemovesEveryPendingTask) {
  SerialExecutor strand(manager_);
  std::latch started(1), release(1);
  std::atomic<int> ran{0};
  strand.post([&] {
    started.count_down();
    release.wait();
    ran.fetch_add(1);
  });
  for (int i = 0; i < 100; ++i) strand.post([&] { ran.fetch_add(1); });
  started.wait();
  EXPECT_EQ(strand.cancel_all(), 100u);
  release.count_down();
  strand.wait();
  EXPECT_EQ(ran.load(), 1) << "only the task that had started";
  strand.post([&] { ran.fetch_add(1); });
  strand.wait();
  EXPECT_EQ(ran.load(), 2) << "usable after cancel_all";
}

// submit() hands back each task's outcome: a value, nothing (void), or the exception it threw
// (which wait() then does not rethrow); a task canceled before it ran leaves its future broken.
TEST_P(SerialExecutorTest, SubmitHandsBackTheTasksResult) {
  SerialExecutor strand(manager_);
  std::vector<int> order;
  std::future<int> answer = strand.submit([&] {
    order.push_back(1);
    return 42;
  });
  std::future<void> nothing = strand.submit([&] { order.push_back(2); });
  std::future<std::string> thrown = strand.submit([&]() -> std::string {
    order.push_back(3);
    throw std::runtime_error("submitted and failed");
  });
  auto move_only = std::make_unique<int>(7);
  std::future<int> owned = strand.submit([p = std::move(move_only)] { return *p; });
  // Every task is destroyed by the time wait() returns: the promises are let go before the futures
  // are read (TSan cannot see libstdc++'s own reference counts on the exception they carry).
  EXPECT_NO_THROW(strand.wait()) << "the exception went to the future";
  EXPECT_EQ(answer.get(), 42);
  nothing.get();
  try {
    thrown.get();
    FAIL() << "the task's exception is in its future";
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "submitted and failed");
  }
  EXPECT_EQ(owned.get(), 7);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));

  std::latch started(1), release(1);
  strand.post([&] {
    started.count_down();
    release.wait();
  });
  std::future<int> canceled = strand.submit([] { return 1; });
  started.wait();
  EXPECT_EQ(strand.cancel_all(), 1u);
  release.count_down();
  strand.wait();
  try {
    canceled.get();
    FAIL() << "a canceled task's future holds no value";
  } catch (const std::future_error& error) {
    EXPECT_EQ(error.code(), std::future_errc::broken_promise);
  }
}

TEST_P(SerialExecutorTest, CancelAllLeavesOtherExecutorsAlone) {
  SerialExecutor a(manager_), b(manager_);
  std::latch started(1), release(1);
  std::atomic<int> b_ran{0};
  a.post([&] {
    started.count_down();
    release.wait();
  });
  b.post([&] { b_ran.fetch_add(1); });
  started.wait();
  EXPECT_EQ(a.cancel_all(), 0u);
  release.count_down();
  a.wait();
  b.wait();
  EXPECT_EQ(b_ran.load(), 1);
}

TEST_P(SerialExecutorTest, WaitRethrowsTheFirstExceptionAndTheStrandGoesOn) {
  SerialExecutor strand(manager_);
  std::atomic<int> ran{0};
  strand.post([] { throw std::runtime_error("first"); });
  strand.post([&] { ran.fetch_add(1); });
  strand.post([] { throw std::runtime_error("second"); });
  try {
    strand.wait();
    FAIL();
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "first");
  }
  EXPECT_EQ(ran.load(), 1);
  strand.wait();  // reported once
}

TEST_P(SerialExecutorTest, DestructionCancelsPendingAndWaitsForTheRunningTask) {
  // Each pending task owns a Gone, destroyed with the task whether it runs or is canceled. The
  // running task is let go only once all of them are gone, so that none can be granted before the
  // destructor has canceled it (a bounded wait: if they never go, the test fails instead of hanging).
  struct Gone {
    Gone(std::mutex& m, std::condition_variable& c, int& n) : mutex(m), changed(c), count(n) {}
    Gone(const Gone&) = delete;
    Gone& operator=(const Gone&) = delete;
    std::mutex& mutex;
    std::condition_variable& changed;
    int& count;
    ~Gone() {
      std::lock_guard lock(mutex);
      ++count;
      changed.notify_all();
    }
  };
  std::mutex mutex;
  std::condition_variable changed;
  int gone = 0;
  std::latch started(1), release(1);
  std::atomic<int> ran{0};
  std::atomic<bool> finished{false};
  bool all_gone = false;
  std::thread releaser;
  {
    SerialExecutor strand(manager_);
    strand.post([&] {
      started.count_down();
      release.wait();
      finished = true;
    });
    for (int i = 0; i < 10; ++i) {
      strand.post([&, guard = std::make_shared<Gone>(mutex, changed, gone)] { ran.fetch_add(1); });
    }
    started.wait();
    releaser = std::thread([&] {
      {
        std::unique_lock lock(mutex);
        all_gone = changed.wait_for(lock, std::chrono::seconds(60), [&] { return gone == 10; });
      }
      release.count_down();
    });
  }
  releaser.join();
  EXPECT_TRUE(all_gone) << "the destructor canceled the pending tasks";
  EXPECT_TRUE(finished.load()) << "the destructor waited for the running task";
  EXPECT_EQ(ran.load(), 0) << "pending tasks were canceled";
}

TEST(SerialExecutorOnOneWorker, AJobWaitingForTheExecutorDoesNotHoldTheOnlyWorker) {
  // The job's runner is the only worker; the executor's tasks need a worker too.
  auto manager = JobManager::create(JobManager::Options{1, nullptr});
  SerialExecutor strand(manager, "one worker");
  std::atomic<int> ran{0};
  auto job = make_job(
      "waits for the strand",
      [&](ProgressMonitor&) {
        for (int i = 0; i < 10; ++i) strand.post([&] { ran.fetch_add(1); });
        strand.wait();
        return ran.load() == 10 ? Status::ok() : Status::error("wait() returned early");
      },
      manager);
  job->schedule();
  ASSERT_TRUE(job->join(std::chrono::seconds(60))) << "the job and the executor deadlocked";
  EXPECT_TRUE(job->result().is_ok()) << job->result().message;
  EXPECT_EQ(ran.load(), 10);
}

TEST_P(SerialExecutorTest, TaskletsTakingTheExecutorsRuleJoinItsOrder) {
  SerialExecutor strand(manager_);
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  std::vector<std::string> order;
  std::latch started(1), release(1);
  strand.post([&] {
    started.count_down();
    release.wait();
    order.push_back("task 1");
  });
  started.wait();
  scheduler->schedule(make_tasklet(
                          [&] {
                            order.push_back("tasklet");
                            return Directive::done;
                          },
                          strand.rule()),
                      Directive::sync);
  strand.post([&] { order.push_back("task 2"); });
  release.count_down();
  scheduler->run();
  strand.wait();
  EXPECT_EQ(order, (std::vector<std::string>{"task 1", "tasklet", "task 2"}));
}

// After begin_rule/end_rule, a thread keeps its request parked in the table: held but idle, so that
// its next begin_rule of that rule is quick. Posts skip the table's lock while their rule has a
// request in the table that will leave under it; the parked one will not (a conflicting entry
// takes it back), so a post that finds only it must enter itself, and run.
TEST_P(SerialExecutorTest, APostAfterABeginRuleOfItsRuleRuns) {
  SerialExecutor strand(manager_, "parked");
  for (int round = 0; round < 3; ++round) {
    manager_->begin_rule(strand.rule());
    manager_->end_rule(strand.rule());
    std::promise<void> ran;
    std::future<void> done = ran.get_future();
    strand.post([&] { ran.set_value(); });
    ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "round " << round << ": the post was left behind the parked request";
    strand.wait();
  }
}

TEST_P(SerialExecutorTest, ATasksCurrentRuleOwnsTheExecutorsRule) {
  // What current_rule() hands out inside a task owns the executor's rule, and outlives the
  // executor. (A release of the last task's rule may still be on its way through the rule table
  // when the executor is gone: it lets go of the rule shortly after.)
  Rule seen;
  Rule nested;
  bool not_contained = false;
  std::weak_ptr<const SchedulingRule> executors;
  {
    SerialExecutor strand(manager_, "owned");
    executors = strand.rule();
    strand.post([&] {
      seen = manager_->current_rule();
      // A rule begun inside the task is checked against the task's rule.
      manager_->begin_rule(strand.rule());
      nested = manager_->current_rule();
      manager_->end_rule(strand.rule());
      try {
        manager_->begin_rule(rules::mutex("elsewhere"));
      } catch (const RuleNotContained&) {
        not_contained = true;
      }
    });
    strand.wait();
    EXPECT_EQ(seen, strand.rule());
    EXPECT_EQ(nested, strand.rule());
    EXPECT_FALSE(seen.owner_before(strand.rule()) || strand.rule().owner_before(seen))
        << "current_rule() shares ownership with the executor's rule";
  }
  EXPECT_TRUE(not_contained) << "a rule the task's rule does not contain was refused";
  ASSERT_FALSE(executors.expired()) << "the rule current_rule() returned keeps it alive";
  EXPECT_TRUE(test::eventually([&] { return seen.use_count() == 2; }))
      << "held by `seen` and `nested` only, once the executor and its tasks are gone";
  EXPECT_EQ(seen->key().kind, RuleKey::Kind::identity);
  seen.reset();
  nested.reset();
  EXPECT_TRUE(executors.expired());
}

TEST_P(SerialExecutorTest, ExecutorsComeAndGoWhileWorkersContendForTheTable) {
  // Releases that find the table's lock taken by a busy worker are handed to it, and finished
  // after the task (and perhaps its executor) is gone: the hand-back must own the rule. Many short
  // executors die right after their tasks are done while tasklets with path rules keep the workers
  // in the table (the sanitizer lanes see any use of a freed rule).
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  std::atomic<bool> stop{false};
  std::atomic<long> busy_ran{0};
  std::thread busy([&] {
    const std::vector<Rule> paths = {rules::path("/x"), rules::path("/x/a"), rules::path("/x/b"),
                                     rules::path("/y"), rules::path("/y/a")};
    while (!stop.load()) {
      scheduler->schedule(make_tasklet([&] {
                            for (int i = 0; i < 200; ++i) {
                              scheduler->schedule(make_tasklet(
                                                      [&] {
                                                        busy_ran.fetch_add(1);
                                                        return Directive::done;
                                                      },
                                                      paths[static_cast<std::size_t>(i) % paths.size()]),
                                                  Directive::async);
                            }
                            return Directive::done;
                          }),
                          Directive::sync);
      scheduler->run();
    }
  });
  int ran = 0;  // touched by the executors' tasks only, one executor at a time
  const int executors = 300, posts = 20;
  for (int e = 0; e < executors; ++e) {
    SerialExecutor strand(manager_, "short-lived");
    for (int i = 0; i < posts; ++i) strand.post([&ran] { ++ran; });
    strand.wait();
  }
  stop = true;
  busy.join();
  EXPECT_EQ(ran, executors * posts);
  EXPECT_GT(busy_ran.load(), 0);
}

}  // namespace
}  // namespace tasklet
