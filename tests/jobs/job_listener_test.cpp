// Listeners and progress: the events of each way a job's run goes, their order between the
// manager's listeners and the job's own, failing listeners, progress monitors and their provider.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

using test::Counter;
using test::JobTest;
using test::patience;
using test::Recorder;
using test::Vetoing;

TEST_F(JobTest, ListenerEventsArriveInOrder) {
  auto recorder = std::make_shared<Recorder>();
  manager_->add_listener(recorder);
  auto j = job("observed", [](ProgressMonitor&) { return Status::ok(); });
  j->schedule();
  j->join();
  auto sleepy = job("sleepy", [](ProgressMonitor&) { return Status::ok(); });
  sleepy->schedule(std::chrono::hours(1));
  sleepy->wake_up();
  sleepy->join();
  EXPECT_TRUE(manager_->join(nullptr, 30s));
  // join() returns when the run is over; the done events may still be on their way.
  ASSERT_TRUE(recorder->dones.wait_for(2));
  manager_->remove_listener(recorder);
  EXPECT_EQ(recorder->of("observed"),
            (std::vector<std::string>{"scheduled", "about_to_run", "running", "done"}));
  EXPECT_EQ(recorder->of("sleepy"),
            (std::vector<std::string>{"scheduled", "awake", "about_to_run", "running", "done"}));
}

TEST_F(JobTest, ListenerEventSequencesForEachWayAJobEnds) {
  auto recorder = std::make_shared<Recorder>();
  manager_->add_listener(recorder);
  const Rule rule = rules::mutex("held");
  manager_->begin_rule(rule);
  auto canceled = job("canceled while waiting", [](ProgressMonitor&) { return Status::ok(); });
  canceled->set_rule(rule);
  canceled->schedule();
  canceled->cancel();
  auto napper = job("slept and woken", [](ProgressMonitor&) { return Status::ok(); });
  napper->set_rule(rule);
  napper->schedule();
  napper->sleep();
  napper->wake_up();
  manager_->end_rule(rule);
  auto vetoed = std::make_shared<Vetoing>(true, false, manager_);
  vetoed->schedule();
  ASSERT_TRUE(recorder->dones.wait_for(3));
  EXPECT_EQ(recorder->of("canceled while waiting"), (std::vector<std::string>{"scheduled", "done"}));
  EXPECT_EQ(recorder->of("slept and woken"),
            (std::vector<std::string>{"scheduled", "sleeping", "awake", "about_to_run", "running", "done"}));
  EXPECT_EQ(recorder->of("veto"), (std::vector<std::string>{"scheduled", "done"}));
}

TEST_F(JobTest, ManagerListenersHearEachEventBeforeTheJobsOwn) {
  struct Labeled final : JobListener {
    Labeled(std::string tag, std::vector<std::string>& log, std::mutex& mutex)
        : tag_(std::move(tag)), log_(log), mutex_(mutex) {}
    void scheduled(const JobEvent&) override { note("scheduled"); }
    void running(const JobEvent&) override { note("running"); }
    void done(const JobEvent&) override {
      note("done");
      dones.add();
    }
    void note(const char* what) {
      std::lock_guard lock(mutex_);
      log_.push_back(tag_ + " " + what);
    }
    Counter dones;

   private:
    std::string tag_;
    std::vector<std::string>& log_;
    std::mutex& mutex_;
  };
  std::vector<std::string> log;
  std::mutex mutex;
  auto own = std::make_shared<Labeled>("job", log, mutex);
  manager_->add_listener(std::make_shared<Labeled>("manager", log, mutex));
  auto j = job("told twice", [](ProgressMonitor&) { return Status::ok(); });
  j->add_listener(own);
  j->schedule();
  ASSERT_TRUE(own->dones.wait_for(1));
  std::lock_guard lock(mutex);
  EXPECT_EQ(log, (std::vector<std::string>{"manager scheduled", "job scheduled", "manager running",
                                           "job running", "manager done", "job done"}));
}

TEST_F(JobTest, AFailingDoneListenerDoesNotHangJoin) {
  struct Failing final : JobListener {
    void running(const JobEvent&) override { throw std::runtime_error("listener broken"); }
    void done(const JobEvent&) override { throw 42; }
  };
  auto recorder = std::make_shared<Recorder>();
  manager_->add_listener(std::make_shared<Failing>());
  manager_->add_listener(recorder);
  auto j = job("observed", [](ProgressMonitor&) { return Status::ok(); });
  j->schedule();
  EXPECT_TRUE(j->join(patience));
  EXPECT_TRUE(j->result().is_ok());
  ASSERT_TRUE(recorder->dones.wait_for(1)) << "the listeners after the failing one were told";
}

TEST_F(JobTest, ProgressMonitorCountsWorkAndSplits) {
  std::shared_ptr<ProgressMonitor> seen;
  auto j = job("progress", [&](ProgressMonitor& monitor) {
    monitor.begin_task("copy", 100);
    monitor.worked(40);
    auto half = monitor.split(60);
    half->begin_task("inner", 3);
    half->worked(1);
    EXPECT_NEAR(monitor.work_done(), 60.0, 1e-9);
    half->done();
    EXPECT_NEAR(monitor.work_done(), 100.0, 1e-9);
    monitor.subtask("finishing");
    EXPECT_EQ(monitor.subtask_name(), "finishing");
    return Status::ok();
  });
  j->schedule();
  j->join();
  EXPECT_TRUE(j->result().is_ok());
}

TEST_F(JobTest, ProgressProviderChoosesTheMonitor) {
  struct Counting final : ProgressMonitor {
    std::atomic<int>* begun;
    void on_begin_task(std::string_view, int) override { begun->fetch_add(1); }
  };
  std::atomic<int> begun{0};
  manager_->set_progress_provider([&](Job&) {
    auto monitor = std::make_unique<Counting>();
    monitor->begun = &begun;
    return monitor;
  });
  auto j = job("watched", [](ProgressMonitor& monitor) {
    monitor.begin_task("work", 1);
    return Status::ok();
  });
  j->schedule();
  j->join();
  EXPECT_EQ(begun.load(), 1);
}

// A group whose compute_group_result (run while a job's end is being told, before its done event)
// schedules that job once more.
class Rescheduling final : public JobGroup {
 public:
  Rescheduling() : JobGroup("rescheduling", 0, 0) {}
  std::shared_ptr<Job> again;  // scheduled once more from the first end (set before it runs)
  std::atomic<bool> rescheduled{false};
  bool then_cancel = false;  // and that schedule canceled at once
  test::Gate joining;        // the test joins the job before the end goes on

 protected:
  Status compute_group_result(const std::vector<Status>& results) override {
    if (auto job = std::exchange(again, nullptr)) {
      job->schedule();
      rescheduled = true;
      if (then_cancel) {
        joining.wait();
        job->cancel();
      }
    }
    return JobGroup::compute_group_result(results);
  }
};

// A job in a Rescheduling group, heard by a Recorder, counting its runs.
struct RescheduledJob {
  RescheduledJob(const std::shared_ptr<JobManager>& manager, const std::string& name, bool then_cancel)
      : job(make_job(
            name,
            [this](ProgressMonitor&) {
              runs.fetch_add(1);
              return Status::ok();
            },
            manager)) {
    group->then_cancel = then_cancel;
    job->add_listener(recorder);
    job->set_group(group);
    group->again = job;
  }

  std::shared_ptr<Rescheduling> group = std::make_shared<Rescheduling>();
  std::shared_ptr<Recorder> recorder = std::make_shared<Recorder>();
  std::atomic<int> runs{0};
  std::shared_ptr<Job> job;
};

const std::vector<std::string> one_life{"scheduled", "about_to_run", "running", "done"};

// A schedule() made after a run has ended but before its listeners were told (here: from the
// group's compute_group_result, which runs in between) runs the job again after the done event,
// so that listeners hear this end before the next schedule. Found by the jobs fuzzer.
TEST_F(JobTest, AScheduleWhileAnEndIsBeingToldComesAfterItsDoneEvent) {
  RescheduledJob again(manager_, "again", false);
  again.job->schedule();
  ASSERT_TRUE(again.recorder->dones.wait_for(2));
  EXPECT_TRUE(again.job->join(patience));
  EXPECT_EQ(again.runs.load(), 2);
  std::vector<std::string> twice = one_life;
  twice.insert(twice.end(), one_life.begin(), one_life.end());
  EXPECT_EQ(again.recorder->of("again"), twice);
}

// The same schedule() canceled before it runs: a join() that waits for it returns (the cancel is
// the last word), and the listeners hear one life.
TEST_F(JobTest, AJoinWaitingForAScheduleThatACancelDroppedReturns) {
  RescheduledJob dropped(manager_, "dropped", true);
  dropped.job->schedule();
  // Once the end is being told (the group's hook runs), join: it waits for the schedule made
  // there until the cancel drops it.
  ASSERT_TRUE(test::eventually([&] { return dropped.group->rescheduled.load(); }));
  dropped.group->joining.open();  // mostly, join() below waits before the cancel comes
  EXPECT_TRUE(dropped.job->join(patience));
  ASSERT_TRUE(dropped.recorder->dones.wait_for(1));
  EXPECT_EQ(dropped.runs.load(), 1);
  EXPECT_EQ(dropped.recorder->of("dropped"), one_life);
}

}  // namespace
}  // namespace tasklet
