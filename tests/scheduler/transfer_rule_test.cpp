// transfer_rule: a thread hands the rule it began to another thread, which ends it or nests in it
// (Eclipse's IJobManager.transferRule and its tests, written anew).
#include <future>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

using TransferRuleTest = test::ManagerTest;

// A thread that waits to be told what to do with the manager, and reports what happened.
class Destination {
 public:
  template <class F>
  explicit Destination(F work)
      : thread_([this, work = std::move(work)]() mutable {
          id_.set_value(std::this_thread::get_id());
          go_.get_future().wait();
          work();
        }) {}
  ~Destination() {
    if (thread_.joinable()) thread_.join();
  }
  std::thread::id id() { return id_future_.get(); }
  void go() { go_.set_value(); }
  void join() { thread_.join(); }

 private:
  std::promise<std::thread::id> id_;
  std::shared_future<std::thread::id> id_future_ = id_.get_future().share();
  std::promise<void> go_;
  std::thread thread_;
};

TEST_F(TransferRuleTest, TheDestinationEndsTheRuleItWasHanded) {
  const Rule rule = rules::path("/tree");
  std::promise<Rule> seen;
  Destination destination([&] {
    manager_->begin_rule(rules::path("/tree/leaf"));  // nests in the handed rule, without waiting
    seen.set_value(manager_->current_rule());
    manager_->end_rule(manager_->current_rule());
    manager_->end_rule(rule);
  });
  manager_->begin_rule(rule);
  manager_->transfer_rule(rule, destination.id());
  EXPECT_EQ(manager_->current_rule(), nullptr) << "the caller no longer holds it";
  EXPECT_EQ(manager_->rule_stats().held, 1u) << "it was never free in between";
  EXPECT_THROW(manager_->end_rule(rule), RuleMismatch);
  destination.go();
  EXPECT_EQ(seen.get_future().get()->to_string(), "path(/tree/leaf)");
  destination.join();
}

TEST_F(TransferRuleTest, AThreadWaitingForAPartOfTheRuleTakesItAtOnce) {
  const Rule rule = rules::path("/a");
  const Rule part = rules::path("/a/b");
  std::latch waiting(1);
  std::promise<void> ended;
  manager_->begin_rule(rule);
  Destination destination([&] {
    waiting.count_down();
    manager_->begin_rule(part);  // waits: this thread's rule holds /a
    manager_->end_rule(part);
    manager_->end_rule(rule);  // the handed one
    ended.set_value();
  });
  destination.go();
  waiting.wait();
  // It may not wait yet: the transfer then finds it when it does, or at its begin_rule.
  manager_->transfer_rule(rule, destination.id());
  ended.get_future().wait();
  destination.join();
}

TEST_F(TransferRuleTest, SomeoneWaitingForTheRuleGetsItWhenTheDestinationEndsIt) {
  const Rule rule = rules::mutex("handed");
  manager_->begin_rule(rule);
  std::promise<void> other_got_it;
  std::thread other([&] {
    manager_->begin_rule(rule);  // waits for the rule, whoever holds it
    other_got_it.set_value();
    manager_->end_rule(rule);
  });
  Destination destination([&] { manager_->end_rule(rule); });
  manager_->transfer_rule(rule, destination.id());
  destination.go();
  other_got_it.get_future().wait();
  other.join();
}

TEST_F(TransferRuleTest, OnlyTheOutermostRuleWithNothingOpenInsideCanBeHanded) {
  const Rule rule = rules::path("/x");
  const Rule inner = rules::path("/x/y");
  Destination destination([] {});
  const std::thread::id there = destination.id();
  EXPECT_THROW(manager_->transfer_rule(rule, there), RuleMismatch) << "not held";
  manager_->begin_rule(rule);
  manager_->begin_rule(inner);
  EXPECT_THROW(manager_->transfer_rule(inner, there), RuleMismatch) << "not the outermost";
  try {
    manager_->transfer_rule(rule, there);
    FAIL() << "handed with a rule open inside it";
  } catch (const IllegalState& error) {
    EXPECT_NE(std::string(error.what()).find("path(/x)"), std::string::npos) << error.what();
  }
  manager_->end_rule(inner);
  manager_->transfer_rule(rule, std::this_thread::get_id());  // to itself: nothing happens
  EXPECT_EQ(manager_->current_rule(), rule);
  manager_->end_rule(rule);
  destination.go();
}

TEST_F(TransferRuleTest, ADestinationThatHasNotTakenItsRuleYetIsRefusedAnother) {
  const Rule first = rules::mutex("first");
  const Rule second = rules::mutex("second");
  Destination destination([&] { manager_->end_rule(first); });
  manager_->begin_rule(first);
  manager_->transfer_rule(first, destination.id());
  std::promise<void> done;
  std::thread other([&] {
    manager_->begin_rule(second);
    EXPECT_THROW(manager_->transfer_rule(second, destination.id()), IllegalState);
    EXPECT_EQ(manager_->current_rule(), second) << "a refused transfer leaves the rule where it was";
    manager_->end_rule(second);
    done.set_value();
  });
  done.get_future().wait();
  other.join();
  destination.go();
}

TEST_F(TransferRuleTest, ADestinationWaitingForARuleThisOneDoesNotContainIsRefused) {
  const Rule unrelated = rules::path("/unrelated");
  const Rule tree = rules::path("/tree");
  struct Waits final : LockListener {
    std::latch waiting{1};
    Waiting about_to_wait(const Rule&, const std::vector<RuleBlocker>&) override {
      waiting.count_down();  // noted as waiting by now
      return Waiting::block;
    }
  };
  auto listener = std::make_shared<Waits>();
  manager_->set_lock_listener(listener);
  manager_->begin_rule(unrelated);
  Destination destination([&] {
    manager_->begin_rule(unrelated);  // waits for the main thread
    manager_->end_rule(unrelated);
  });
  std::thread::id destination_id = destination.id();
  destination.go();
  listener->waiting.wait();
  std::promise<std::string> refusal;
  std::thread giver([&] {
    manager_->begin_rule(tree);
    try {
      manager_->transfer_rule(tree, destination_id);
      refusal.set_value("handed over");
    } catch (const IllegalState& error) {
      refusal.set_value(error.what());
    }
    EXPECT_EQ(manager_->current_rule(), tree) << "a refused transfer leaves the rule where it was";
    manager_->end_rule(tree);
  });
  const std::string refused = refusal.get_future().get();
  giver.join();
  EXPECT_NE(refused.find("waits in begin_rule for path(/unrelated), which this rule does not contain"),
            std::string::npos)
      << refused;
  manager_->end_rule(unrelated);
  destination.join();
}

TEST_F(TransferRuleTest, RulesTheDestinationBeginsMustNestInTheHandedRule) {
  const Rule handed = rules::path("/handed");
  const Rule elsewhere = rules::path("/elsewhere");
  std::promise<bool> refused;
  Destination destination([&] {
    try {
      manager_->begin_rule(elsewhere);  // takes the handed rule first, then nests in it: no
      refused.set_value(false);
    } catch (const RuleNotContained&) {
      refused.set_value(true);
    }
    manager_->end_rule(elsewhere);  // begin_rule's frame is ended even when it threw
    manager_->end_rule(handed);
  });
  manager_->begin_rule(handed);
  manager_->transfer_rule(handed, destination.id());
  destination.go();
  EXPECT_TRUE(refused.get_future().get());
}

TEST_F(TransferRuleTest, AJobHandsItsRuleToAThreadAndNoLongerReleasesItAtItsEnd) {
  const Rule rule = rules::path("/job");
  std::promise<void> ended;
  Destination destination([&] {
    manager_->begin_rule(rules::path("/job/part"));  // nests in the handed rule
    manager_->end_rule(manager_->current_rule());
    manager_->end_rule(rule);
    ended.set_value();
  });
  Rule after_transfer = rule;
  auto job = make_job(
      "giver",
      [&](ProgressMonitor&) {
        manager_->transfer_rule(rule, destination.id());
        after_transfer = manager_->current_rule();
        manager_->begin_rule(rules::path("/elsewhere"));  // holds nothing now: waits for no one
        manager_->end_rule(manager_->current_rule());
      },
      manager_);
  job->set_rule(rule);
  job->schedule();
  job->join();
  EXPECT_TRUE(job->result().is_ok()) << job->result().message;
  EXPECT_EQ(after_transfer, nullptr) << "the run holds nothing once it handed its rule over";
  EXPECT_EQ(manager_->rule_stats().held, 1u) << "the job's end did not release it";

  auto next = make_job(
      "next", [](ProgressMonitor&) {}, manager_);
  next->set_rule(rules::path("/job/leaf"));
  next->schedule();
  EXPECT_EQ(next->state(), JobState::waiting) << "the destination holds the rule";
  destination.go();
  ended.get_future().wait();
  next->join();
  EXPECT_TRUE(next->result().is_ok());
  destination.join();
}

TEST_F(TransferRuleTest, ATaskletHandsItsRuleAndRunsItsLaterPhasesWithoutIt) {
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  const Rule rule = rules::mutex();
  Destination destination([&] { manager_->end_rule(rule); });
  std::vector<bool> holds;
  int phase = 0;
  auto tasklet = make_tasklet(
      [&] {
        holds.push_back(manager_->current_rule() == rule);
        if (++phase == 1) {
          manager_->transfer_rule(rule, destination.id());
          holds.push_back(manager_->current_rule() == rule);
          return Directive::async;
        }
        return Directive::done;
      },
      rule);
  scheduler->schedule(tasklet, Directive::sync);
  scheduler->run();
  EXPECT_EQ(holds, (std::vector<bool>{true, false, false}));
  EXPECT_EQ(tasklet->rule(), rule) << "the tasklet keeps its rule for its next run";
  EXPECT_EQ(manager_->rule_stats().held, 1u);
  destination.go();
  destination.join();
  EXPECT_EQ(manager_->rule_stats().held, 0u);
  // Scheduled again, it takes its rule as before.
  phase = 1;
  holds.clear();
  scheduler->schedule(tasklet, Directive::sync);
  scheduler->run();
  EXPECT_EQ(holds, std::vector<bool>{true});
}

TEST_F(TransferRuleTest, AJobThatTookItsRuleBackAfterYieldingCanHandItOver) {
  const Rule rule = rules::mutex();
  struct Waits final : LockListener {
    std::latch waiting{1};
    Waiting about_to_wait(const Rule&, const std::vector<RuleBlocker>&) override {
      waiting.count_down();
      return Waiting::block;
    }
  };
  auto listener = std::make_shared<Waits>();
  manager_->set_lock_listener(listener);
  std::promise<void> ended;
  Destination destination([&] {
    manager_->end_rule(rule);
    ended.set_value();
  });
  std::thread other;
  auto job = make_job(
      "yielder",
      [&](ProgressMonitor& monitor) {
        other = std::thread([&] {
          manager_->begin_rule(rule);  // waits for the job
          manager_->end_rule(rule);
        });
        listener->waiting.wait();
        EXPECT_TRUE(manager_->current_job()->yield_rule());  // the thread goes first, then the job again
        manager_->transfer_rule(rule, destination.id());
        static_cast<void>(monitor);
      },
      manager_);
  job->set_rule(rule);
  job->schedule();
  job->join();
  other.join();
  EXPECT_TRUE(job->result().is_ok()) << job->result().message;
  EXPECT_EQ(manager_->rule_stats().held, 1u);
  destination.go();
  ended.get_future().wait();
  destination.join();
}

TEST_F(TransferRuleTest, AJobWithRulesOpenInsideItsOwnCannotHandItsRule) {
  const Rule rule = rules::path("/open");
  std::string refused;
  auto job = make_job(
      "nester",
      [&](ProgressMonitor&) {
        const Rule inner = rules::path("/open/inner");
        manager_->begin_rule(inner);
        try {
          manager_->transfer_rule(rule, std::thread::id{});
        } catch (const IllegalState& error) {
          refused = error.what();
        }
        manager_->end_rule(inner);
      },
      manager_);
  job->set_rule(rule);
  job->schedule();
  job->join();
  EXPECT_NE(refused.find("end the rules begun inside it first"), std::string::npos) << refused;
  EXPECT_EQ(manager_->rule_stats().held, 0u) << "the job kept its rule and released it at its end";
}

TEST_F(TransferRuleTest, ADestinationHoldingARuleOfItsOwnGetsTheErrorAndTheHandedRuleIsReleased) {
  const Rule handed = rules::mutex("handed");
  const Rule own = rules::mutex("own");
  std::latch holds(1);
  std::promise<std::string> error;
  std::promise<void> handed_over;
  Destination destination([&] {
    manager_->begin_rule(own);
    holds.count_down();
    handed_over.get_future().wait();
    try {
      manager_->end_rule(own);  // takes the handed rule first: it holds one already
      error.set_value("");
    } catch (const IllegalState& failure) {
      error.set_value(failure.what());
    }
    EXPECT_THROW(manager_->end_rule(own), RuleMismatch);  // the throwing end_rule ended it all the same
  });
  destination.go();
  holds.wait();
  manager_->begin_rule(handed);
  manager_->transfer_rule(handed, destination.id());
  handed_over.set_value();
  const std::string message = error.get_future().get();
  EXPECT_NE(message.find("mutex(handed)"), std::string::npos) << message;
  destination.join();
  for (const Rule& rule : {handed, own}) {  // both free again
    manager_->begin_rule(rule);
    manager_->end_rule(rule);
  }
  EXPECT_EQ(manager_->rule_stats().held, 0u);
}

TEST_F(TransferRuleTest, ADestinationHoldingARuleGetsTheErrorFromABeginRuleThatStillPushes) {
  const Rule handed = rules::path("/dst/z");
  const Rule own = rules::path("/dst/own");
  const Rule inner = rules::path("/dst/own/inner");
  std::latch holds(1);
  std::promise<std::string> error;
  std::promise<void> handed_over;
  Destination destination([&] {
    const RuleScope outer(*manager_, own);
    holds.count_down();
    handed_over.get_future().wait();
    try {
      const RuleScope scope(*manager_, inner);  // takes the handed rule first: it holds one already
      error.set_value("");
    } catch (const IllegalState& failure) {
      error.set_value(failure.what());
    } catch (const std::exception& other) {
      error.set_value(std::string("not IllegalState: ") + other.what());
    }
    // The begin_rule that threw pushed its frame and the scope ended it: the outer scope is on top.
    EXPECT_EQ(manager_->current_rule(), own);
  });
  destination.go();
  holds.wait();
  manager_->begin_rule(handed);
  manager_->transfer_rule(handed, destination.id());
  handed_over.set_value();
  const std::string message = error.get_future().get();
  EXPECT_NE(message.find("/dst/z"), std::string::npos) << message;
  EXPECT_NE(message.find("holds a rule already"), std::string::npos) << message;
  destination.join();
  EXPECT_EQ(manager_->rule_stats().held, 0u);
}

}  // namespace
}  // namespace tasklet
