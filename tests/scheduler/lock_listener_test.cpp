// The lock listener: a thread about to wait in begin_rule is told whom it waits for and when it got
// the rule, and a scheduler's synchronous thread may keep running its sync phases meanwhile
// (Eclipse's LockListener and its UI-thread tests, written anew).
#include <functional>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

// Records what it is told; `on_wait` runs on the waiting thread before it answers.
class RecordingListener final : public LockListener {
 public:
  struct Wait {
    std::string rule;
    std::thread::id thread;
    std::vector<std::string> blockers;
  };
  explicit RecordingListener(Waiting answer) : answer_(answer) {}

  Waiting about_to_wait(const Rule& rule, const std::vector<RuleBlocker>& blockers) override {
    Wait wait{rule->to_string(), std::this_thread::get_id(), {}};
    for (const RuleBlocker& blocker : blockers) wait.blockers.push_back(blocker.to_string());
    {
      std::lock_guard lock(mutex_);
      waits_.push_back(wait);
    }
    if (on_wait) on_wait(wait);
    return answer_;
  }
  void got_it(const Rule& rule) override {
    std::lock_guard lock(mutex_);
    got_.push_back({rule->to_string(), std::this_thread::get_id(), {}});
  }
  std::vector<Wait> waits() const {
    std::lock_guard lock(mutex_);
    return waits_;
  }
  std::vector<Wait> got() const {
    std::lock_guard lock(mutex_);
    return got_;
  }

  std::function<void(const Wait&)> on_wait;

 private:
  const Waiting answer_;
  mutable std::mutex mutex_;
  std::vector<Wait> waits_;
  std::vector<Wait> got_;
};

class LockListenerTest : public test::WorkerCountTest {
 protected:
  void TearDown() override {
    test::WorkerCountTest::TearDown();
    EXPECT_EQ(manager_->rule_stats().held, 0u);
    EXPECT_EQ(manager_->rule_stats().waiting, 0u);
  }
  std::shared_ptr<RecordingListener> listen(LockListener::Waiting answer) {
    auto listener = std::make_shared<RecordingListener>(answer);
    manager_->set_lock_listener(listener);
    return listener;
  }
};

TEST_P(LockListenerTest, AWaitingThreadIsToldWhichJobHoldsTheRuleAndWhenItGotIt) {
  auto listener = listen(LockListener::Waiting::block);
  test::HoldingJob holder(manager_, "holder", rules::path("/x"));
  listener->on_wait = [&](const RecordingListener::Wait&) { holder.release(); };
  const Rule rule = rules::path("/x/y");
  manager_->begin_rule(rule);
  manager_->end_rule(rule);
  holder.job->join();

  const auto waits = listener->waits();
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(waits[0].rule, "path(/x/y)");
  EXPECT_EQ(waits[0].thread, std::this_thread::get_id()) << "told on the thread that waits";
  ASSERT_EQ(waits[0].blockers.size(), 1u);
  EXPECT_EQ(waits[0].blockers[0], "job 'holder' holds path(/x)");
  const auto got = listener->got();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].rule, "path(/x/y)");
  EXPECT_EQ(got[0].thread, std::this_thread::get_id());
}

TEST_P(LockListenerTest, ABeginRuleThatDoesNotWaitIsNotReported) {
  auto listener = listen(LockListener::Waiting::block);
  const Rule rule = rules::path("/free");
  manager_->begin_rule(rule);
  manager_->begin_rule(rules::path("/free/nested"));  // nested: no request at all
  manager_->end_rule(manager_->current_rule());
  manager_->end_rule(rule);
  EXPECT_TRUE(listener->waits().empty());
  EXPECT_TRUE(listener->got().empty());
}

TEST_P(LockListenerTest, HoldersComeFirstThenTheEarlierWaitersItQueuesBehind) {
  auto listener = listen(LockListener::Waiting::block);
  const Rule held = rules::path("/tree");
  manager_->begin_rule(held);
  const std::string holder_text = test::this_thread_name();

  // An earlier waiter for a conflicting rule (a soft block for the one after it).
  std::latch first_waits(1);
  listener->on_wait = [&](const RecordingListener::Wait& wait) {
    if (wait.rule == "path(/tree/a)") first_waits.count_down();
  };
  std::promise<std::thread::id> first_id;
  std::thread first([&] {
    first_id.set_value(std::this_thread::get_id());
    const Rule rule = rules::path("/tree/a");
    manager_->begin_rule(rule);
    manager_->end_rule(rule);
  });
  const std::thread::id first_thread = first_id.get_future().get();
  first_waits.wait();

  std::latch second_waits(1);
  listener->on_wait = [&](const RecordingListener::Wait& wait) {
    if (wait.rule == "path(/tree)") second_waits.count_down();
  };
  std::thread second([&] {
    const Rule rule = rules::path("/tree");
    manager_->begin_rule(rule);
    manager_->end_rule(rule);
  });
  second_waits.wait();
  manager_->end_rule(held);
  first.join();
  second.join();

  const auto waits = listener->waits();
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_EQ(waits[0].blockers, std::vector<std::string>{holder_text + " holds path(/tree)"});
  std::ostringstream first_text;
  first_text << "thread " << first_thread;
  EXPECT_EQ(waits[1].blockers,
            (std::vector<std::string>{holder_text + " holds path(/tree)",
                                      first_text.str() + " waits for path(/tree/a) (asked earlier)"}));
  EXPECT_EQ(listener->got().size(), 2u);
}

// The case: the synchronous thread waits in begin_rule for a rule that a sync tasklet of its
// own scheduler holds. Blocking would never end (that tasklet's next phase runs on this very
// thread); serving, it runs that phase, and others, and then gets the rule.
TEST_P(LockListenerTest, ASynchronousThreadWaitingForARuleKeepsRunningOtherSyncTasklets) {
  auto listener = listen(LockListener::Waiting::serve);
  const Rule rule = rules::mutex();
  std::vector<std::string> order;
  const std::thread::id sync_thread = std::this_thread::get_id();
  int holder_phase = 0;
  bool bystander_ran = false;
  auto holder = make_tasklet(
      [&] {
        EXPECT_EQ(std::this_thread::get_id(), sync_thread);
        order.push_back("holder " + std::to_string(++holder_phase));
        // Keeps the rule until the bystander, queued after it, has run.
        return bystander_ran ? Directive::done : Directive::sync;
      },
      rule);
  holder->set_name("holder");
  auto bystander = make_tasklet([&] {
    EXPECT_EQ(std::this_thread::get_id(), sync_thread);
    EXPECT_EQ(manager_->current_rule(), nullptr)
        << "a phase run meanwhile holds nothing of the waiting thread's";
    order.push_back("bystander");
    bystander_ran = true;
    return Directive::done;
  });
  auto waiter = make_tasklet([&] {
    scheduler().schedule(bystander, Directive::sync);
    order.push_back("waiter begins");
    manager_->begin_rule(rule);
    order.push_back("waiter holds");
    EXPECT_EQ(manager_->current_rule(), rule);
    manager_->end_rule(rule);
    return Directive::done;
  });
  scheduler().schedule(holder, Directive::sync);
  scheduler().schedule(waiter, Directive::sync);
  scheduler().run();  // without serving, this never returns (the test's timeout fails it)

  EXPECT_EQ(order, (std::vector<std::string>{"holder 1", "waiter begins", "holder 2", "bystander", "holder 3",
                                             "waiter holds"}));
  const auto waits = listener->waits();
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(waits[0].thread, sync_thread);
  EXPECT_EQ(waits[0].blockers, std::vector<std::string>{"tasklet 'holder' holds " + rule->to_string()});
  EXPECT_EQ(listener->got().size(), 1u);
}

TEST_P(LockListenerTest, ATaskletThatNeedsTheRuleWaitsItsTurnBehindTheServingThread) {
  listen(LockListener::Waiting::serve);
  const Rule rule = rules::path("/r");
  std::vector<std::string> order;
  test::HoldingJob holder(manager_, "holder", rule);
  auto later = make_tasklet(
      [&] {
        order.push_back("later");
        return Directive::done;
      },
      rules::path("/r/child"));
  auto waiter = make_tasklet([&] {
    manager_->begin_rule(rule);  // queued before `later`, which conflicts: FIFO puts it first
    order.push_back("waiter holds");
    manager_->end_rule(rule);
    return Directive::done;
  });
  auto releaser = make_tasklet([&] {
    scheduler().schedule(later, Directive::sync);  // requests /r/child behind the waiting /r
    holder.release();
    return Directive::done;
  });
  scheduler().schedule(waiter, Directive::sync);
  scheduler().schedule(releaser, Directive::sync);
  scheduler().run();
  holder.job->join();
  EXPECT_EQ(order, (std::vector<std::string>{"waiter holds", "later"}));
}

TEST_P(LockListenerTest, APhaseRunWhileServingCannotWaitForTheRuleItsThreadWaitsFor) {
  listen(LockListener::Waiting::serve);
  const Rule rule = rules::path("/r");
  test::HoldingJob holder(manager_, "holder", rule);
  std::string refused;
  auto inner = make_tasklet([&] {
    const Rule part = rules::path("/r/part");
    try {
      manager_->begin_rule(part);  // would wait behind its own thread's request
    } catch (const IllegalState& error) {
      refused = error.what();
    }
    manager_->end_rule(part);
    holder.release();
    return Directive::done;
  });
  auto waiter = make_tasklet([&] {
    scheduler().schedule(inner, Directive::sync);
    manager_->begin_rule(rule);
    manager_->end_rule(rule);
    return Directive::done;
  });
  scheduler().schedule(waiter, Directive::sync);
  scheduler().run();
  holder.job->join();
  EXPECT_NE(refused.find("begin_rule(path(/r/part))"), std::string::npos) << refused;
  EXPECT_NE(refused.find("waits for path(/r)"), std::string::npos) << refused;
}

TEST_P(LockListenerTest, BlockOnTheSynchronousThreadRunsNothingMeanwhile) {
  auto listener = listen(LockListener::Waiting::block);
  const Rule rule = rules::mutex();
  test::HoldingJob holder(manager_, "holder", rule);
  std::vector<std::string> order;
  auto other = make_tasklet([&] {
    order.push_back("other");
    return Directive::done;
  });
  listener->on_wait = [&](const RecordingListener::Wait&) { holder.release(); };
  auto waiter = make_tasklet([&] {
    scheduler().schedule(other, Directive::sync);
    manager_->begin_rule(rule);
    order.push_back("waiter holds");
    manager_->end_rule(rule);
    return Directive::done;
  });
  scheduler().schedule(waiter, Directive::sync);
  scheduler().run();
  holder.job->join();
  EXPECT_EQ(order, (std::vector<std::string>{"waiter holds", "other"}));
  EXPECT_EQ(listener->got().size(), 1u);
}

TEST_P(LockListenerTest, AJobWaitingInBeginRuleIsReportedAndServeMeansBlockOnAWorker) {
  auto listener = listen(LockListener::Waiting::serve);
  const Rule rule = rules::path("/w");
  manager_->begin_rule(rule);
  std::latch waits(1);
  listener->on_wait = [&](const RecordingListener::Wait&) { waits.count_down(); };
  auto job = make_job(
      "worker-side",
      [&](ProgressMonitor&) {
        manager_->begin_rule(rule);
        manager_->end_rule(rule);
      },
      manager_);
  job->schedule();
  waits.wait();
  manager_->end_rule(rule);
  job->join();
  EXPECT_TRUE(job->result().is_ok());
  ASSERT_EQ(listener->waits().size(), 1u);
  EXPECT_EQ(listener->got().size(), 1u);
}

TEST_P(LockListenerTest, AListenerThatThrowsWithdrawsTheRequestAndTheErrorComesOutOfBeginRule) {
  auto listener = listen(LockListener::Waiting::block);
  listener->on_wait = [](const RecordingListener::Wait&) { throw std::runtime_error("listener refuses"); };
  const Rule rule = rules::mutex();
  manager_->begin_rule(rule);
  std::thread other([&] {
    try {
      manager_->begin_rule(rule);
      ADD_FAILURE() << "begin_rule returned";
    } catch (const std::runtime_error& error) {
      EXPECT_STREQ(error.what(), "listener refuses");
    }
    EXPECT_EQ(manager_->rule_stats().held, 1u) << "the frame holds nothing";
    manager_->end_rule(rule);  // the frame is still there to end
  });
  other.join();
  EXPECT_EQ(manager_->rule_stats().waiting, 0u) << "its request was withdrawn";
  manager_->end_rule(rule);
  EXPECT_TRUE(listener->got().empty());
}

TEST_P(LockListenerTest, RemovingTheListenerStopsTheCalls) {
  auto listener = listen(LockListener::Waiting::block);
  manager_->set_lock_listener(nullptr);
  const Rule rule = rules::mutex();
  manager_->begin_rule(rule);
  std::thread other([&] {
    manager_->begin_rule(rule);
    manager_->end_rule(rule);
  });
  while (manager_->rule_stats().waiting == 0) std::this_thread::yield();
  manager_->end_rule(rule);
  other.join();
  EXPECT_TRUE(listener->waits().empty());
}

TASKLET_WORKER_COUNTS(LockListenerTest);

}  // namespace
}  // namespace tasklet
