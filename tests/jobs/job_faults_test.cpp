// User code that throws, at every place the jobs layer calls it: should_schedule, canceling, the
// progress provider, listeners (every event), a group's should_cancel and compute_group_result,
// and belongs_to. Each throw gives the documented answer (rethrown to the caller, dropped, or a
// failed or canceled job naming the cause), loses no job, and leaves the rule table empty and the
// manager usable: the fixture joins every job, checks the table and runs a short oracle pass.
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/exclusion_check.hpp"
#include "support/job_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;
using test::Gate;
using test::JobTest;
using test::patience;
using test::Recorder;

// JobTest, and afterwards the rule table still excludes what it must.
class UserCodeFaultTest : public JobTest {
 protected:
  void TearDown() override {
    JobTest::TearDown();
    test::expect_rules_still_exclude(manager_);
  }
};

struct Broken : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A job whose hooks throw while `broken` is set.
class Fragile final : public Job {
 public:
  Fragile(std::string name, std::shared_ptr<JobManager> manager) : Job(std::move(name), std::move(manager)) {}
  std::atomic<bool> schedule_breaks{false};
  std::atomic<bool> canceling_breaks{false};
  std::atomic<bool> family_breaks{false};
  std::atomic<int> runs{0};
  Gate started, release;
  bool waits = false;  // its run waits for `release` (or a cancel)

 protected:
  Status run(ProgressMonitor& monitor) override {
    runs.fetch_add(1);
    if (waits) {
      started.open();
      release.wait();
      if (monitor.is_canceled()) return Status::cancel("canceled while running");
    }
    return Status::ok();
  }
  bool should_schedule() override {
    if (schedule_breaks) throw Broken("should_schedule broke");
    return true;
  }
  void canceling() override {
    release.open();
    if (canceling_breaks) throw Broken("canceling broke");
  }
  bool belongs_to(Family family) const override {
    if (family_breaks) throw Broken("belongs_to broke");
    return family == this;
  }
};

TEST_F(UserCodeFaultTest, ShouldScheduleThatThrowsReachesTheCallerAndSchedulesNothing) {
  auto job = std::make_shared<Fragile>("fragile", manager_);
  auto recorder = std::make_shared<Recorder>();
  job->add_listener(recorder);
  job->schedule_breaks = true;
  EXPECT_THROW(job->schedule(), Broken);
  EXPECT_EQ(job->state(), JobState::none);
  EXPECT_TRUE(recorder->of("fragile").empty()) << "no event for a schedule() that threw";
  job->schedule_breaks = false;
  job->schedule();
  ASSERT_TRUE(job->join(patience));
  EXPECT_EQ(job->runs.load(), 1);
  EXPECT_TRUE(job->result().is_ok());
}

TEST_F(UserCodeFaultTest, CancelingThatThrowsIsDroppedAndTheRunStillSeesTheCancel) {
  auto job = std::make_shared<Fragile>("fragile", manager_);
  job->waits = true;
  job->canceling_breaks = true;
  job->set_rule(rules::path("/fragile"));
  job->schedule();
  ASSERT_TRUE(job->started.wait());
  EXPECT_FALSE(job->cancel()) << "a running job is not ended by cancel()";
  ASSERT_TRUE(job->join(patience));
  EXPECT_TRUE(job->result().is_canceled()) << job->result().message;
}

TEST_F(UserCodeFaultTest, AProgressProviderThatThrowsGivesThePlainMonitor) {
  std::atomic<int> asked{0};
  manager_->set_progress_provider([&](Job&) -> std::unique_ptr<ProgressMonitor> {
    asked.fetch_add(1);
    throw Broken("provider broke");
  });
  std::atomic<bool> had_monitor{false};
  auto j = job("provided", [&](ProgressMonitor& monitor) {
    monitor.begin_task("work", 2);
    monitor.worked(2);
    had_monitor = monitor.work_done() == 2;
    return Status::ok();
  });
  j->schedule();
  ASSERT_TRUE(j->join(patience));
  EXPECT_EQ(asked.load(), 1);
  EXPECT_TRUE(j->result().is_ok()) << j->result().message;
  EXPECT_TRUE(had_monitor.load());
}

// Throws from every event; the listener after it still hears every event, in order.
class ThrowingListener final : public JobListener {
 public:
  void scheduled(const JobEvent&) override { throw Broken("scheduled"); }
  void about_to_run(const JobEvent&) override { throw Broken("about_to_run"); }
  void running(const JobEvent&) override { throw Broken("running"); }
  void done(const JobEvent&) override { throw Broken("done"); }
  void sleeping(const JobEvent&) override { throw Broken("sleeping"); }
  void awake(const JobEvent&) override { throw Broken("awake"); }
};

TEST_F(UserCodeFaultTest, ListenersThatThrowFromEveryEventAreDroppedAndOthersHearEverything) {
  manager_->add_listener(std::make_shared<ThrowingListener>());
  auto recorder = std::make_shared<Recorder>();
  manager_->add_listener(recorder);
  auto j = job("heard", [](ProgressMonitor&) { return Status::ok(); });
  j->add_listener(std::make_shared<ThrowingListener>());
  j->schedule(1h);
  EXPECT_EQ(j->state(), JobState::sleeping);
  EXPECT_TRUE(j->sleep());
  j->wake_up();
  ASSERT_TRUE(j->join(patience));
  ASSERT_TRUE(recorder->dones.wait_for(1));
  const std::vector<std::string> expected{"scheduled", "awake", "about_to_run", "running", "done"};
  EXPECT_EQ(recorder->of("heard"), expected);
  EXPECT_TRUE(j->result().is_ok());
}

class BrokenGroup final : public JobGroup {
 public:
  BrokenGroup(bool cancel_breaks, bool result_breaks)
      : JobGroup("broken", 1, 0), cancel_breaks_(cancel_breaks), result_breaks_(result_breaks) {}

 protected:
  bool should_cancel(const Status& last, int failed, int canceled) override {
    if (cancel_breaks_) throw Broken("should_cancel broke");
    return JobGroup::should_cancel(last, failed, canceled);
  }
  Status compute_group_result(const std::vector<Status>& results) override {
    if (result_breaks_) throw Broken("compute_group_result broke");
    return JobGroup::compute_group_result(results);
  }

 private:
  bool cancel_breaks_, result_breaks_;
};

TEST_F(UserCodeFaultTest, AGroupWhoseShouldCancelThrowsIsCanceled) {
  auto group = std::make_shared<BrokenGroup>(true, false);
  Gate all_scheduled;  // the first job fails only once the others wait behind it
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 6; ++i) {
    auto j = job("member" + std::to_string(i), [i, &all_scheduled](ProgressMonitor&) {
      if (i != 0) return Status::ok();
      all_scheduled.wait();
      return Status::error("first fails");
    });
    j->set_group(group);
    jobs.push_back(j);
  }
  for (auto& j : jobs) j->schedule();
  all_scheduled.open();
  ASSERT_TRUE(group->join(patience));
  EXPECT_TRUE(jobs[0]->result().is_error());
  // max_threads 1: the others were throttled when the first failed, and a throwing should_cancel
  // counts as "cancel the group".
  for (std::size_t i = 1; i < jobs.size(); ++i) {
    EXPECT_TRUE(jobs[i]->result().is_canceled()) << jobs[i]->name() << ": " << jobs[i]->result().message;
  }
}

TEST_F(UserCodeFaultTest, AGroupWhoseComputeGroupResultThrowsEndsWithAnErrorNamingIt) {
  auto group = std::make_shared<BrokenGroup>(false, true);
  auto j = job("member", [](ProgressMonitor&) { return Status::ok(); });
  j->set_group(group);
  j->schedule();
  ASSERT_TRUE(group->join(patience));
  const Status result = group->result();
  EXPECT_TRUE(result.is_error());
  EXPECT_NE(result.message.find("compute_group_result"), std::string::npos) << result.message;
  EXPECT_TRUE(j->result().is_ok());
}

TEST_F(UserCodeFaultTest, BelongsToThatThrowsLeavesTheJobOutOfTheFamily) {
  auto fragile = std::make_shared<Fragile>("fragile", manager_);
  fragile->waits = true;
  fragile->family_breaks = true;
  fragile->schedule();
  ASSERT_TRUE(fragile->started.wait());
  const Family family = fragile.get();
  EXPECT_TRUE(manager_->find(family).empty());
  EXPECT_NO_THROW(manager_->cancel(family));
  EXPECT_EQ(fragile->state(), JobState::running) << "a job whose belongs_to throws is in no family";
  EXPECT_EQ(manager_->find(nullptr).size(), 1u) << "the null family has every job, without asking";
  fragile->release.open();
  ASSERT_TRUE(fragile->join(patience));
  EXPECT_TRUE(fragile->result().is_ok());
}

}  // namespace
}  // namespace tasklet
