// Jobs that finish later (Eclipse's ASYNC_FINISH): run() returns Status::finish_later(), the job
// keeps its rule and stays running until done() gives its result, from any thread.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

using test::Gate;
using test::patience;
using test::Recorder;

class FinishLaterTest : public test::JobTest {};

TEST_F(FinishLaterTest, AJobThatFinishesLaterStaysRunningHoldingItsRuleUntilDone) {
  const Rule rule = rules::mutex("finishing");
  Gate returned;
  auto later = job("later", [&](ProgressMonitor&) {
    returned.open();
    return Status::finish_later();
  });
  later->set_rule(rule);
  std::atomic<bool> next_ran{false};
  auto next = job("next", [&](ProgressMonitor&) {
    next_ran = true;
    return Status::ok();
  });
  next->set_rule(rule);
  later->schedule();
  ASSERT_TRUE(returned.wait());
  next->schedule();
  EXPECT_FALSE(later->join(std::chrono::milliseconds{50})) << "join waits for done()";
  EXPECT_EQ(later->state(), JobState::running);
  EXPECT_FALSE(next_ran.load()) << "the rule is still held";
  std::thread([&] { later->done(Status::error("finished elsewhere")); }).join();
  ASSERT_TRUE(later->join(patience));
  EXPECT_EQ(later->result().message, "finished elsewhere");
  ASSERT_TRUE(next->join(patience));
  EXPECT_TRUE(next_ran.load());
}

TEST_F(FinishLaterTest, DoneBeforeRunReturnsIsKeptForIt) {
  std::shared_ptr<Job> self;
  auto later = job("early", [&](ProgressMonitor&) {
    self->done(Status::cancel("done first"));  // the work finished before run() returned
    return Status::finish_later();
  });
  self = later;
  later->schedule();
  ASSERT_TRUE(later->join(patience));
  EXPECT_TRUE(later->result().is_canceled());
  EXPECT_EQ(later->result().message, "done first");
  self.reset();
}

TEST_F(FinishLaterTest, ListenersAndGroupsHearTheEndOnlyAtDone) {
  auto recorder = std::make_shared<Recorder>();
  auto group = std::make_shared<JobGroup>("batch", 2, 1);
  Gate returned;
  auto later = job("heard", [&](ProgressMonitor&) {
    returned.open();
    return Status::finish_later();
  });
  later->add_listener(recorder);
  later->set_group(group);
  later->schedule();
  ASSERT_TRUE(returned.wait());
  EXPECT_FALSE(group->join(std::chrono::milliseconds{50}));
  EXPECT_EQ(recorder->dones.get(), 0);
  later->done(Status::ok());
  ASSERT_TRUE(group->join(patience));
  ASSERT_TRUE(recorder->dones.wait_for(1));
  EXPECT_EQ(recorder->of("heard"),
            (std::vector<std::string>{"scheduled", "about_to_run", "running", "done"}));
}

TEST_F(FinishLaterTest, ASecondDoneAndADoneWithoutFinishLaterAreErrorsNamingTheJob) {
  Gate returned;
  auto later = job("twice", [&](ProgressMonitor&) {
    returned.open();
    return Status::finish_later();
  });
  later->schedule();
  ASSERT_TRUE(returned.wait());
  later->done(Status::ok());
  try {
    later->done(Status::ok());
    FAIL() << "a second done() was accepted";
  } catch (const IllegalState& error) {
    EXPECT_NE(std::string(error.what()).find("twice"), std::string::npos) << error.what();
  }
  ASSERT_TRUE(later->join(patience));
  auto plain = job("plain", [](ProgressMonitor&) { return Status::ok(); });
  EXPECT_THROW(plain->done(Status::ok()), IllegalState) << "never ran";
  plain->schedule();
  ASSERT_TRUE(plain->join(patience));
  EXPECT_THROW(plain->done(Status::ok()), IllegalState) << "ended already";
  EXPECT_THROW(later->done(Status::finish_later()), IllegalState);
}

TEST_F(FinishLaterTest, DoneDuringARunThatThenReturnsNormallyFailsTheRun) {
  std::shared_ptr<Job> self;
  auto misused = job("misused", [&](ProgressMonitor&) {
    self->done(Status::ok());  // accepted for now: run() might still return finish_later()
    return Status::ok();
  });
  self = misused;
  misused->schedule();
  ASSERT_TRUE(misused->join(patience));
  EXPECT_TRUE(misused->result().is_error());
  EXPECT_NE(misused->result().message.find("misused"), std::string::npos) << misused->result().message;
  self.reset();
}

// Finishes later, and says when the manager's shutdown has reached it (canceling()).
class FinishesLater final : public Job {
 public:
  FinishesLater(std::string name, std::shared_ptr<JobManager> manager)
      : Job(std::move(name), std::move(manager)) {}
  Gate returned;
  Gate canceled;

 protected:
  Status run(ProgressMonitor&) override {
    returned.open();
    return Status::finish_later();
  }
  void canceling() override { canceled.open(); }
};

TEST_F(FinishLaterTest, TheManagersShutdownWaitsForDone) {
  auto manager = JobManager::create(JobManager::Options{.concurrency = 1});
  auto later = std::make_shared<FinishesLater>("shutdown", manager);
  later->schedule();
  ASSERT_TRUE(later->returned.wait());
  std::atomic<bool> destroyed{false};
  std::thread destroyer([&] {
    manager.reset();
    destroyed = true;
  });
  // The shutdown cancels the running job and waits for its end, which only done() brings.
  ASSERT_TRUE(later->canceled.wait());
  EXPECT_FALSE(destroyed.load());
  EXPECT_EQ(later->state(), JobState::running);
  later->done(Status::cancel());
  destroyer.join();
  EXPECT_TRUE(destroyed.load());
  EXPECT_EQ(later->state(), JobState::none);
}

TEST_F(FinishLaterTest, AJobFinishingLaterHoldsNoWorker) {
  // One worker: the job that finishes later must leave it to the job that calls done().
  auto manager = JobManager::create(JobManager::Options{.concurrency = 1});
  std::shared_ptr<Job> later = make_job(
      "parked", [](ProgressMonitor&) { return Status::finish_later(); }, manager);
  auto finisher = make_job(
      "finisher",
      [&](ProgressMonitor&) {
        later->done(Status::ok());
        return Status::ok();
      },
      manager);
  later->schedule();
  finisher->schedule();
  ASSERT_TRUE(finisher->join(patience));
  ASSERT_TRUE(later->join(patience));
  EXPECT_TRUE(later->result().is_ok());
}

TEST_F(FinishLaterTest, DoneFromAnotherThreadRacesTheRunsReturnAndEachJobEndsOnce) {
  // done() comes from a thread the run starts, before or after run() has returned.
  constexpr std::size_t jobs_count = 200;
  std::vector<std::thread> finishers;
  std::mutex finishers_mutex;
  std::vector<std::shared_ptr<Job>> jobs;
  std::atomic<std::size_t> runs{0};
  for (std::size_t i = 0; i < jobs_count; ++i) {
    auto self = std::make_shared<std::weak_ptr<Job>>();  // weak: the job's callable must not own it
    auto made = job("racer " + std::to_string(i), [&, self, i](ProgressMonitor&) {
      runs.fetch_add(1);
      std::lock_guard lock(finishers_mutex);
      finishers.emplace_back(
          [job = self->lock(), i] { job->done(i % 2 == 0 ? Status::ok() : Status::cancel()); });
      return Status::finish_later();
    });
    *self = made;
    jobs.push_back(made);
  }
  for (auto& j : jobs) j->schedule();
  for (std::size_t i = 0; i < jobs_count; ++i) {
    ASSERT_TRUE(jobs[i]->join(patience)) << jobs[i]->name();
    EXPECT_EQ(jobs[i]->result().is_ok(), i % 2 == 0) << jobs[i]->name() << ": " << jobs[i]->result().message;
  }
  EXPECT_EQ(runs.load(), jobs_count);
  std::lock_guard lock(finishers_mutex);
  for (auto& finisher : finishers) finisher.join();
}

}  // namespace
}  // namespace tasklet
