// Jobs whose runs happen on a scheduler's synchronous thread (Job::set_sync_scheduler, Eclipse's
// UIJob): states, listeners, FIFO with worker jobs on one rule, cancel, join, finishing later,
// coroutine jobs, and the scheduler's destruction.
#include <atomic>
#include <chrono>
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
#include "tasklet/coroutine.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

using test::eventually;
using test::Gate;
using test::patience;
using test::Recorder;

class SyncThreadJobTest : public test::JobTest {
 protected:
  // The application's thread: this test's, in run() or poll().
  std::shared_ptr<Scheduler> ui_ = Scheduler::create({.manager = manager_});

  std::shared_ptr<Job> ui_job(std::string name, std::function<Status(ProgressMonitor&)> fn) {
    auto made = job(std::move(name), std::move(fn));
    made->set_sync_scheduler(ui_);
    return made;
  }
  // A worker job holding `rule` until release_ opens; returns once it holds it.
  std::shared_ptr<Job> holding(const Rule& rule) {
    auto made = job("holder", [this](ProgressMonitor&) {
      in_holder_.open();
      release_.wait();
      return Status::ok();
    });
    made->set_rule(rule);
    made->schedule();
    EXPECT_TRUE(in_holder_.wait());
    return made;
  }
  Gate in_holder_;
  Gate release_;

  // Order of runs, from any thread.
  std::mutex order_mutex_;
  std::vector<std::string> order_;
  void note(const std::string& what) {
    std::lock_guard lock(order_mutex_);
    order_.push_back(what);
  }
};

TEST_F(SyncThreadJobTest, ItsRunHappensOnTheSynchronousThreadWithStatesAndListeners) {
  const auto recorder = std::make_shared<Recorder>();
  manager_->add_listener(recorder);
  std::thread::id ran_on;
  JobState state_in_run = JobState::none;
  std::shared_ptr<Job> self;
  auto ui = ui_job("ui", [&](ProgressMonitor&) {
    ran_on = std::this_thread::get_id();
    state_in_run = self->state();
    return Status::ok();
  });
  self = ui;
  EXPECT_EQ(ui->sync_scheduler(), ui_);
  ui->schedule();
  EXPECT_TRUE(ui_->has_work()) << "a run waiting for the synchronous thread keeps run() going";
  ui_->run();
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  EXPECT_EQ(state_in_run, JobState::running);
  ASSERT_TRUE(ui->join(patience));
  EXPECT_TRUE(ui->result().is_ok());
  ASSERT_TRUE(recorder->dones.wait_for(1));
  EXPECT_EQ(recorder->of("ui"), (std::vector<std::string>{"scheduled", "about_to_run", "running", "done"}));
}

TEST_F(SyncThreadJobTest, ItIsFifoWithWorkerJobsOnTheSameRule) {
  const Rule rule = rules::mutex("shared");
  Gate in_first;
  Gate release;
  auto first = job("first", [&](ProgressMonitor&) {
    note("first");
    in_first.open();
    release.wait();
    return Status::ok();
  });
  auto on_ui = ui_job("ui", [&](ProgressMonitor&) {
    note("ui");
    return Status::ok();
  });
  auto last = job("last", [&](ProgressMonitor&) {
    note("last");
    return Status::ok();
  });
  for (const auto& each : {first, on_ui, last}) each->set_rule(rule);
  first->schedule();
  ASSERT_TRUE(in_first.wait());
  on_ui->schedule();
  ASSERT_TRUE(eventually([&] { return manager_->rule_stats().waiting == 1; }));
  last->schedule();
  ASSERT_TRUE(eventually([&] { return manager_->rule_stats().waiting == 2; }));
  release.open();
  ui_->run();
  ASSERT_TRUE(last->join(patience));
  EXPECT_EQ(order_, (std::vector<std::string>{"first", "ui", "last"}));
}

TEST_F(SyncThreadJobTest, WaitingForItsRuleDoesNotBlockTheLoop) {
  const Rule rule = rules::path("/doc");
  std::atomic<bool> ui_ran{false};
  auto on_ui = ui_job("ui", [&](ProgressMonitor&) {
    ui_ran = true;
    return Status::ok();
  });
  on_ui->set_rule(rules::path("/doc/page"));
  holding(rule);
  on_ui->schedule();
  int other = 0;
  ui_->schedule(make_tasklet([&] {
                  ++other;
                  return Directive::done;
                }),
                Directive::sync);
  EXPECT_EQ(ui_->poll(), 1u) << "the loop's other work runs while the job waits for its rule";
  EXPECT_EQ(other, 1);
  EXPECT_FALSE(ui_ran.load());
  EXPECT_EQ(on_ui->state(), JobState::waiting);
  release_.open();
  ui_->run();
  EXPECT_TRUE(ui_ran.load());
  EXPECT_TRUE(on_ui->join(patience));
}

TEST_F(SyncThreadJobTest, CancelWhileItWaitsForItsRuleOrForTheLoop) {
  const Rule rule = rules::mutex("shared");
  std::atomic<int> runs{0};
  auto for_rule = ui_job("waits for the rule", [&](ProgressMonitor&) {
    ++runs;
    return Status::ok();
  });
  for_rule->set_rule(rule);
  const auto holder = holding(rule);
  for_rule->schedule();
  ASSERT_TRUE(eventually([&] { return manager_->rule_stats().waiting == 1; }));
  EXPECT_TRUE(for_rule->cancel());
  ASSERT_TRUE(for_rule->join(patience));
  EXPECT_TRUE(for_rule->result().is_canceled());
  release_.open();
  ASSERT_TRUE(holder->join(patience));

  // Granted and queued for the synchronous thread, which has not polled yet.
  auto for_loop = ui_job("waits for the loop", [&](ProgressMonitor&) {
    ++runs;
    return Status::ok();
  });
  for_loop->set_rule(rule);
  for_loop->schedule();
  ASSERT_TRUE(eventually([&] { return manager_->rule_stats().held == 1; }));
  EXPECT_TRUE(for_loop->cancel()) << "taken out of the synchronous thread's queue";
  ASSERT_TRUE(for_loop->join(patience));
  EXPECT_TRUE(for_loop->result().is_canceled());
  EXPECT_EQ(manager_->rule_stats().held, 0u);
  EXPECT_EQ(ui_->poll(), 0u);
  EXPECT_FALSE(ui_->has_work());
  EXPECT_EQ(runs.load(), 0);
}

TEST_F(SyncThreadJobTest, JoinOnTheSynchronousThreadItNeedsThrows) {
  auto waiting = ui_job("waiting", [](ProgressMonitor&) { return Status::ok(); });
  std::string refused;
  auto joiner = ui_job("joiner", [&](ProgressMonitor&) {
    try {
      waiting->join();
    } catch (const IllegalState& error) {
      refused = error.what();
    }
    EXPECT_FALSE(waiting->join(std::chrono::milliseconds{1})) << "a timed join just times out";
    return Status::ok();
  });
  joiner->schedule();
  waiting->schedule();
  ui_->run();
  EXPECT_NE(refused.find("join(job 'waiting')"), std::string::npos) << refused;
  EXPECT_TRUE(waiting->join(patience));
}

TEST_F(SyncThreadJobTest, AJobFinishingLaterEndsOnTheSynchronousThread) {
  const Rule rule = rules::mutex("finishing");
  std::shared_ptr<Job> self;
  std::thread elsewhere;
  auto later = ui_job("later", [&](ProgressMonitor&) {
    // The work goes on elsewhere and reports back from there.
    elsewhere = std::thread([&] { self->done(Status::error("finished elsewhere")); });
    return Status::finish_later();
  });
  self = later;
  later->set_rule(rule);
  later->schedule();
  ui_->run();  // returns once done() has ended the run on this thread
  elsewhere.join();
  EXPECT_EQ(later->state(), JobState::none);
  EXPECT_EQ(later->result().message, "finished elsewhere");
  EXPECT_EQ(manager_->rule_stats().held, 0u);
}

TEST_F(SyncThreadJobTest, ACoroutineJobGoesOnInSyncAndAsyncPhases) {
  std::vector<std::thread::id> threads;
  auto coroutine = make_job(
      "coroutine",
      [&](ProgressMonitor&) -> Task<Status> {
        threads.push_back(test::current_thread_id());  // see there why not std::this_thread::get_id()
        co_await async();
        threads.push_back(test::current_thread_id());
        co_await sync();
        threads.push_back(test::current_thread_id());
        co_return Status::ok();
      },
      manager_);
  coroutine->set_sync_scheduler(ui_);
  coroutine->set_rule(rules::path("/coroutine"));
  coroutine->schedule();
  ui_->run();
  ASSERT_TRUE(coroutine->join(patience));
  EXPECT_TRUE(coroutine->result().is_ok()) << coroutine->result().message;
  ASSERT_EQ(threads.size(), 3u);
  EXPECT_EQ(threads[0], std::this_thread::get_id());
  EXPECT_NE(threads[1], std::this_thread::get_id());
  EXPECT_EQ(threads[2], std::this_thread::get_id());
}

TEST_F(SyncThreadJobTest, DestroyingTheSchedulerEndsTheRunsWaitingThere) {
  const Rule rule = rules::mutex("shared");
  auto queued = ui_job("queued", [](ProgressMonitor&) { return Status::ok(); });
  auto for_rule = ui_job("waits for the rule", [](ProgressMonitor&) { return Status::ok(); });
  for_rule->set_rule(rule);
  const auto holder = holding(rule);
  queued->schedule();
  for_rule->schedule();
  ASSERT_TRUE(eventually([&] { return manager_->rule_stats().waiting == 1; }));
  ui_.reset();  // nobody ran it
  ASSERT_TRUE(queued->join(patience));
  EXPECT_TRUE(queued->result().is_canceled()) << queued->result().message;
  ASSERT_TRUE(for_rule->join(patience));
  EXPECT_TRUE(for_rule->result().is_canceled()) << for_rule->result().message;
  EXPECT_EQ(queued->sync_scheduler(), nullptr);
  queued->schedule();  // the scheduler is gone: it ends at once, with an error
  ASSERT_TRUE(queued->join(patience));
  EXPECT_TRUE(queued->result().is_error());
  EXPECT_NE(queued->result().message.find("destroyed"), std::string::npos) << queued->result().message;
  release_.open();
  ASSERT_TRUE(holder->join(patience));
}

TEST_F(SyncThreadJobTest, OnlyASchedulerOfTheSameManagerInStateNone) {
  auto other_manager = JobManager::create(JobManager::Options{1, nullptr});
  auto foreign = Scheduler::create({.manager = other_manager});
  auto on_ui = ui_job("ui", [](ProgressMonitor&) { return Status::ok(); });
  EXPECT_THROW(on_ui->set_sync_scheduler(foreign), std::invalid_argument);
  EXPECT_EQ(on_ui->sync_scheduler(), ui_);
  on_ui->schedule();
  EXPECT_THROW(on_ui->set_sync_scheduler(nullptr), TaskletActive);
  ui_->run();
  ASSERT_TRUE(on_ui->join(patience));
  on_ui->set_sync_scheduler(nullptr);  // back to the workers
  EXPECT_EQ(on_ui->sync_scheduler(), nullptr);
  on_ui->schedule();
  ASSERT_TRUE(on_ui->join(patience)) << "no run() needed";
  EXPECT_FALSE(ui_->has_work());
}

}  // namespace
}  // namespace tasklet
