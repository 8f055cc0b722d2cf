// Waits that could never end are reported at the moment of the wait: code that holds a rule and
// waits for work that needs a conflicting rule (join, SerialExecutor::wait) gets WaitCycle naming
// the cycle. Without the detection each of the first four tests would hang (the test's timeout
// fails it).
#include <chrono>
#include <future>
#include <latch>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

using WaitCycleTest = test::ManagerTest;

using test::this_thread_name;

std::shared_ptr<Job> job_on(const std::shared_ptr<JobManager>& manager, std::string name, Rule rule) {
  auto job = make_job(
      std::move(name), [](ProgressMonitor&) {}, manager);
  job->set_rule(std::move(rule));
  return job;
}

TEST_F(WaitCycleTest, JoiningAJobThatWaitsForARuleTheCallerHolds) {
  const Rule held = rules::path("/a");
  manager_->begin_rule(held);
  auto job = job_on(manager_, "B", rules::path("/a/x"));
  job->schedule();
  try {
    job->join();
    ADD_FAILURE() << "join returned while the job waits for this thread's rule";
  } catch (const WaitCycle& error) {
    EXPECT_EQ(std::string(error.what()),
              "join(job 'B') would never return: job 'B' waits for path(/a/x), which conflicts with "
              "path(/a), held by " +
                  this_thread_name() + ", the caller");
  }
  manager_->end_rule(held);
  job->join();  // no cycle any more
  EXPECT_TRUE(job->result().is_ok());
}

TEST_F(WaitCycleTest, JoiningAJobQueuedBehindAWaiterForTheCallersRule) {
  const Rule held = rules::path("/a");
  manager_->begin_rule(held);
  auto first = job_on(manager_, "C", rules::combine(rules::path("/a"), rules::path("/b")));
  first->schedule();  // waits for /a, which this thread holds
  auto second = job_on(manager_, "B", rules::path("/b/y"));
  second->schedule();  // /b is free, but C asked for it first: strict FIFO puts B behind C
  try {
    second->join();
    ADD_FAILURE() << "join returned";
  } catch (const WaitCycle& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("job 'B' waits for path(/b/y), behind job 'C' (waiting for "), std::string::npos)
        << text;
    EXPECT_NE(text.find("which conflicts with path(/a), held by " + this_thread_name()), std::string::npos)
        << text;
  }
  manager_->end_rule(held);
  first->join();
  second->join();
}

TEST_F(WaitCycleTest, AJobJoiningAJobThatNeedsItsOwnRule) {
  std::promise<std::string> caught;
  auto inner = job_on(manager_, "inner", rules::path("/p/q"));
  auto outer = make_job(
      "outer",
      [&](ProgressMonitor&) {
        inner->schedule();  // waits for /p, which this run holds
        try {
          inner->join();
          caught.set_value("join returned");
        } catch (const WaitCycle& error) {
          caught.set_value(error.what());
        }
      },
      manager_);
  outer->set_rule(rules::path("/p"));
  outer->schedule();
  EXPECT_EQ(caught.get_future().get(),
            "join(job 'inner') would never return: job 'inner' waits for path(/p/q), which conflicts with "
            "path(/p), "
            "held by job 'outer', the caller");
  outer->join();
  inner->join();
  EXPECT_TRUE(inner->result().is_ok());
}

TEST_F(WaitCycleTest, WaitingForASerialExecutorWhoseRuleTheCallerHolds) {
  SerialExecutor strand(manager_, "log writer");
  manager_->begin_rule(strand.rule());
  bool ran = false;
  strand.post([&] { ran = true; });
  EXPECT_THROW(strand.wait(), WaitCycle);
  EXPECT_FALSE(ran);
  manager_->end_rule(strand.rule());
  strand.wait();
  EXPECT_TRUE(ran);
}

TEST_F(WaitCycleTest, RunningASchedulerWhoseTaskletNeedsARuleTheCallerHolds) {
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  const Rule rule = rules::path("/s");
  manager_->begin_rule(rule);
  bool ran = false;
  bool other_ran = false;
  auto tasklet = make_tasklet(
      [&] {
        ran = true;
        return Directive::done;
      },
      rules::path("/s/t"));
  tasklet->set_name("needs /s/t");
  auto other = make_tasklet(
      [&] {
        other_ran = true;
        return Directive::done;
      },
      rules::path("/elsewhere"));
  scheduler->schedule(other, Directive::sync);
  scheduler->schedule(tasklet, Directive::sync);
  try {
    scheduler->run();
    ADD_FAILURE() << "run() returned";
  } catch (const WaitCycle& error) {
    EXPECT_EQ(
        std::string(error.what()),
        "run() would never return: tasklet 'needs /s/t' waits for path(/s/t), which conflicts with path(/s), "
        "held by " +
            this_thread_name() + ", the caller");
  }
  EXPECT_FALSE(scheduler->is_running());
  EXPECT_FALSE(ran);
  manager_->end_rule(rule);
  scheduler->run();  // the tasklet got its rule meanwhile
  EXPECT_TRUE(ran);
  EXPECT_TRUE(other_ran);
}

TEST_F(WaitCycleTest, RunningASchedulerWhileHoldingAnUnrelatedRuleIsNoCycle) {
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  const Rule rule = rules::path("/mine");
  manager_->begin_rule(rule);
  int phases = 0;
  auto tasklet =
      make_tasklet([&] { return ++phases < 3 ? Directive::async : Directive::done; }, rules::path("/theirs"));
  scheduler->schedule(tasklet, Directive::sync);
  scheduler->run();
  EXPECT_EQ(phases, 3);
  manager_->end_rule(rule);
}

// What is not detected: work that has not asked for its rule yet (a delayed job) is not in the
// table, so the join waits (here bounded by its timeout) instead of throwing.
TEST_F(WaitCycleTest, AJobThatHasNotAskedForItsRuleYetIsNotSeen) {
  const Rule held = rules::path("/d");
  manager_->begin_rule(held);
  auto job = job_on(manager_, "later", rules::path("/d/e"));
  job->schedule(std::chrono::hours(1));
  EXPECT_FALSE(job->join(20ms)) << "a timed join of a job that did not start yet times out";
  manager_->end_rule(held);
  job->cancel();
  job->join();
}

TEST_F(WaitCycleTest, AJobWaitingForSomebodyElsesRuleIsNoCycle) {
  const Rule rule = rules::path("/other");
  std::latch holding(1);
  std::promise<void> release;
  std::thread holder([&] {
    manager_->begin_rule(rule);
    holding.count_down();
    release.get_future().wait();
    manager_->end_rule(rule);
  });
  holding.wait();
  const Rule mine = rules::path("/mine");
  manager_->begin_rule(mine);  // unrelated to what the job needs
  auto job = job_on(manager_, "B", rules::path("/other/x"));
  job->schedule();
  EXPECT_FALSE(job->join(20ms)) << "waits, without a WaitCycle";
  release.set_value();
  job->join();
  manager_->end_rule(mine);
  holder.join();
}

}  // namespace
}  // namespace tasklet
