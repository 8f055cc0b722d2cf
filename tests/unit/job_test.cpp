// The job manager: Eclipse Jobs semantics on the tasklet engine (tests written anew in our API,
// after the spirit of Eclipse's org.eclipse.core.tests.runtime jobs suite).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <latch>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

// A gate a job can wait at, opened by the test (bounded wait so a bug fails instead of hanging).
class Gate {
 public:
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  bool wait() {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, 30s, [this] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
};

class JobTest : public ::testing::Test {
 protected:
  void TearDown() override {
    const bool joined = manager_->join(nullptr, 30s);
    EXPECT_TRUE(joined);
    if (!joined) {
      for (auto& j : manager_->find(nullptr)) {
        ADD_FAILURE() << "left behind: " << j->name() << " state " << static_cast<int>(j->state());
      }
    }
    EXPECT_TRUE(manager_->is_idle());
    EXPECT_EQ(manager_->rule_stats().held, 0u);
    EXPECT_EQ(manager_->rule_stats().waiting, 0u);
  }
  std::shared_ptr<JobManager> manager_ = JobManager::create(JobManager::Options{2, nullptr});

  std::shared_ptr<Job> job(std::string name, std::function<Status(ProgressMonitor&)> fn) {
    return make_job(std::move(name), std::move(fn), manager_);
  }
};

// Records every event of the jobs it listens to, in order.
class Recorder final : public JobListener {
 public:
  void scheduled(const JobEvent& e) override { note(e, "scheduled"); }
  void about_to_run(const JobEvent& e) override { note(e, "about_to_run"); }
  void running(const JobEvent& e) override { note(e, "running"); }
  void done(const JobEvent& e) override { note(e, "done"); }
  void sleeping(const JobEvent& e) override { note(e, "sleeping"); }
  void awake(const JobEvent& e) override { note(e, "awake"); }
  std::vector<std::string> of(const std::string& name) {
    std::lock_guard lock(mutex_);
    std::vector<std::string> events;
    for (const auto& [job, event] : events_) {
      if (job == name) events.push_back(event);
    }
    return events;
  }

 private:
  void note(const JobEvent& e, const char* what) {
    std::lock_guard lock(mutex_);
    events_.emplace_back(e.job->name(), what);
  }
  std::mutex mutex_;
  std::vector<std::pair<std::string, std::string>> events_;
};

TEST_F(JobTest, StatesThroughAJobsLife) {
  Gate in_run, release;
  auto j = job("life", [&](ProgressMonitor&) {
    in_run.open();
    release.wait();
    return Status::ok();
  });
  EXPECT_EQ(j->state(), JobState::none);
  j->schedule();
  ASSERT_TRUE(in_run.wait());
  EXPECT_EQ(j->state(), JobState::running);
  EXPECT_EQ(manager_->find(nullptr).size(), 1u);
  release.open();
  j->join();
  EXPECT_EQ(j->state(), JobState::none);
  EXPECT_TRUE(j->result().is_ok());
}

TEST_F(JobTest, ScheduleWhileRunningRunsOnceMoreAndWhileWaitingDoesNothing) {
  Gate in_run, release;
  std::atomic<int> runs{0};
  auto j = job("again", [&](ProgressMonitor&) {
    if (runs.fetch_add(1) == 0) {
      in_run.open();
      release.wait();
    }
    return Status::ok();
  });
  j->schedule();
  ASSERT_TRUE(in_run.wait());
  j->schedule();  // running: once more after it ends
  j->schedule();  // still just once more
  release.open();
  EXPECT_TRUE(manager_->join(nullptr, 30s));
  EXPECT_EQ(runs.load(), 2);

  // Waiting behind a held rule: scheduling again changes nothing.
  const Rule rule = rules::mutex("busy");
  j->set_rule(rule);
  manager_->begin_rule(rule);
  j->schedule();
  j->schedule();
  EXPECT_EQ(j->state(), JobState::waiting);
  manager_->end_rule(rule);
  j->join();
  EXPECT_EQ(runs.load(), 3);
}

TEST_F(JobTest, DelayedJobSleepsThenRuns) {
  std::atomic<bool> ran{false};
  auto j = job("later", [&](ProgressMonitor&) {
    ran = true;
    return Status::ok();
  });
  j->schedule(20ms);
  EXPECT_EQ(j->state(), JobState::sleeping);
  j->join();
  EXPECT_TRUE(ran.load());
}

TEST_F(JobTest, CancelingASleepingJobRemovesItAtOnce) {
  std::atomic<bool> ran{false};
  auto j = job("never", [&](ProgressMonitor&) {
    ran = true;
    return Status::ok();
  });
  j->schedule(std::chrono::hours(1));
  EXPECT_TRUE(j->cancel());
  EXPECT_EQ(j->state(), JobState::none);
  EXPECT_TRUE(j->result().is_canceled());
  EXPECT_TRUE(j->join(0ms));
  EXPECT_FALSE(ran.load());
}

TEST_F(JobTest, CancelingAWaitingJob) {
  const Rule rule = rules::path("/busy");
  std::atomic<bool> ran{false};
  auto j = job("waiting", [&](ProgressMonitor&) {
    ran = true;
    return Status::ok();
  });
  j->set_rule(rule);
  manager_->begin_rule(rule);
  j->schedule();
  EXPECT_EQ(j->state(), JobState::waiting);
  EXPECT_EQ(manager_->rule_stats().waiting, 1u);
  EXPECT_TRUE(j->cancel());
  EXPECT_EQ(j->state(), JobState::none);
  EXPECT_TRUE(j->result().is_canceled());
  EXPECT_EQ(manager_->rule_stats().waiting, 0u) << "its request left the rule table";
  manager_->end_rule(rule);
  EXPECT_FALSE(ran.load());
}

class CancelAwareJob final : public Job {
 public:
  using Job::Job;
  Gate in_run;
  std::atomic<int> canceling_calls{0};

 protected:
  Status run(ProgressMonitor& monitor) override {
    in_run.open();
    while (!monitor.is_canceled()) std::this_thread::yield();
    return Status::cancel();
  }
  void canceling() override { canceling_calls.fetch_add(1); }
};

TEST_F(JobTest, CancelingARunningJobIsSeenThroughItsMonitor) {
  auto j = std::make_shared<CancelAwareJob>("spinner", manager_);
  j->schedule();
  ASSERT_TRUE(j->in_run.wait());
  EXPECT_FALSE(j->cancel()) << "a running job is only asked to stop";
  EXPECT_FALSE(j->cancel());
  j->join();
  EXPECT_TRUE(j->result().is_canceled());
  EXPECT_EQ(j->canceling_calls.load(), 1) << "canceling() once per run";
}

class Vetoing final : public Job {
 public:
  Vetoing(bool schedule, bool run, std::shared_ptr<JobManager> manager)
      : Job("veto", std::move(manager)), schedule_(schedule), run_(run) {}
  std::atomic<bool> ran{false};

 protected:
  Status run(ProgressMonitor&) override {
    ran = true;
    return Status::ok();
  }
  bool should_schedule() override { return schedule_; }
  bool should_run() override { return run_; }

 private:
  bool schedule_, run_;
};

TEST_F(JobTest, HooksCanVetoSchedulingAndRunning) {
  auto no_schedule = std::make_shared<Vetoing>(false, true, manager_);
  no_schedule->schedule();
  EXPECT_EQ(no_schedule->state(), JobState::none);
  auto no_run = std::make_shared<Vetoing>(true, false, manager_);
  no_run->schedule();
  no_run->join();
  EXPECT_FALSE(no_run->ran.load());
  EXPECT_TRUE(no_run->result().is_canceled());
}

TEST_F(JobTest, JoinWithTimeoutAndSelfJoin) {
  const Rule rule = rules::mutex("m");
  manager_->begin_rule(rule);
  std::atomic<bool> self_join_refused{false};
  std::shared_ptr<Job> j;
  j = job("joiner", [&](ProgressMonitor&) {
    try {
      j->join();
    } catch (const IllegalState&) {
      self_join_refused = true;
    }
    return Status::ok();
  });
  j->set_rule(rule);
  j->schedule();
  EXPECT_FALSE(j->join(20ms)) << "still waiting for its rule";
  manager_->end_rule(rule);
  EXPECT_TRUE(j->join(30s));
  EXPECT_TRUE(self_join_refused.load());
}

TEST_F(JobTest, ExceptionsBecomeErrorResults) {
  auto j = job("thrower", [](ProgressMonitor&) -> Status { throw std::runtime_error("broken"); });
  j->schedule();
  j->join();
  const Status result = j->result();
  ASSERT_TRUE(result.is_error());
  EXPECT_EQ(result.message, "broken");
  EXPECT_THROW(std::rethrow_exception(result.exception), std::runtime_error);
}

TEST_F(JobTest, ConflictingJobsFinishInScheduleOrder) {
  const Rule rule = rules::path("/shared");
  std::vector<int> order;  // guarded by the rule
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 500; ++i) {
    auto j = job("j" + std::to_string(i), [&, i](ProgressMonitor&) {
      order.push_back(i);
      return Status::ok();
    });
    j->set_rule(rule);
    jobs.push_back(j);
  }
  for (auto& j : jobs) j->schedule();
  EXPECT_TRUE(manager_->join(nullptr, 60s));
  ASSERT_EQ(order.size(), 500u);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);
}

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
  while (recorder->of("sleepy").size() < 5 || recorder->of("observed").size() < 4) std::this_thread::yield();
  manager_->remove_listener(recorder);
  EXPECT_EQ(recorder->of("observed"),
            (std::vector<std::string>{"scheduled", "about_to_run", "running", "done"}));
  EXPECT_EQ(recorder->of("sleepy"),
            (std::vector<std::string>{"scheduled", "awake", "about_to_run", "running", "done"}));
}

TEST_F(JobTest, SleepAndWakeUp) {
  const Rule rule = rules::mutex("held");
  manager_->begin_rule(rule);
  std::atomic<int> runs{0};
  auto j = job("napper", [&](ProgressMonitor&) {
    runs.fetch_add(1);
    return Status::ok();
  });
  j->set_rule(rule);
  j->schedule();
  EXPECT_TRUE(j->sleep());
  EXPECT_EQ(j->state(), JobState::sleeping);
  manager_->end_rule(rule);
  EXPECT_EQ(runs.load(), 0);
  j->wake_up();
  j->join();
  EXPECT_EQ(runs.load(), 1);
}

struct Tagged final : Job {
  Tagged(std::string name, Family family, std::shared_ptr<JobManager> manager)
      : Job(std::move(name), std::move(manager)), family_(family) {}
  bool belongs_to(Family family) const override { return family == family_; }
  Status run(ProgressMonitor& monitor) override {
    while (!monitor.is_canceled() && blocked && !released->load()) std::this_thread::yield();
    return monitor.is_canceled() ? Status::cancel() : Status::ok();
  }
  Family family_;
  bool blocked = false;
  std::atomic<bool>* released = nullptr;
};

TEST_F(JobTest, FamiliesFindCancelJoinSleepAndWake) {
  static const int builds = 0, docs = 0;
  std::atomic<bool> released{false};
  std::vector<std::shared_ptr<Tagged>> build_jobs;
  for (int i = 0; i < 3; ++i) {
    auto j = std::make_shared<Tagged>("build" + std::to_string(i), &builds, manager_);
    j->blocked = true;
    j->released = &released;
    build_jobs.push_back(j);
  }
  auto doc = std::make_shared<Tagged>("doc", &docs, manager_);
  doc->schedule(std::chrono::hours(1));
  for (auto& j : build_jobs) j->schedule();
  EXPECT_EQ(manager_->find(&builds).size(), 3u);
  EXPECT_EQ(manager_->find(&docs).size(), 1u);
  EXPECT_FALSE(manager_->join(&builds, 20ms));
  manager_->cancel(&builds);
  EXPECT_TRUE(manager_->join(&builds, 30s));
  for (auto& j : build_jobs) EXPECT_TRUE(j->result().is_canceled()) << j->name();
  EXPECT_EQ(doc->state(), JobState::sleeping) << "other families are left alone";
  manager_->wake_up(&docs);
  EXPECT_TRUE(manager_->join(&docs, 30s));
  EXPECT_TRUE(doc->result().is_ok());
}

TEST_F(JobTest, SuspendedManagerStartsNoJob) {
  std::atomic<bool> ran{false};
  manager_->suspend();
  auto j = job("held", [&](ProgressMonitor&) {
    ran = true;
    return Status::ok();
  });
  j->schedule();
  EXPECT_TRUE(manager_->join(nullptr, 30s)) << "while suspended, join waits only for running jobs";
  EXPECT_FALSE(ran.load());
  EXPECT_EQ(j->state(), JobState::waiting);
  EXPECT_FALSE(manager_->is_idle());
  manager_->resume();
  j->join();
  EXPECT_TRUE(ran.load());
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

TEST_F(JobTest, CurrentJobIsTheRunningJob) {
  std::shared_ptr<Job> seen;
  std::shared_ptr<Job> j;
  j = job("me", [&](ProgressMonitor&) {
    seen = manager_->current_job();
    return Status::ok();
  });
  j->schedule();
  j->join();
  EXPECT_EQ(seen, j);
  EXPECT_EQ(manager_->current_job(), nullptr);
}

TEST_F(JobTest, JobGroupThrottlesAndCombinesResults) {
  auto group = std::make_shared<JobGroup>("pair", 2, 6);
  std::atomic<int> running{0}, most{0};
  for (int i = 0; i < 6; ++i) {
    auto j = job("g" + std::to_string(i), [&](ProgressMonitor&) {
      const int now = running.fetch_add(1) + 1;
      int seen = most.load();
      while (now > seen && !most.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(2ms);  // long enough for siblings to overlap if allowed
      running.fetch_sub(1);
      return Status::ok();
    });
    j->set_group(group);
    j->schedule();
  }
  EXPECT_TRUE(group->join(30s));
  EXPECT_LE(most.load(), 2);
  EXPECT_TRUE(group->result().is_ok());
  EXPECT_EQ(group->state(), JobGroup::State::none);
}

TEST_F(JobTest, AFailedJobCancelsItsGroup) {
  auto group = std::make_shared<JobGroup>("fragile", 1, 4);
  std::atomic<int> ran{0};
  std::vector<std::shared_ptr<Job>> jobs;
  jobs.push_back(job("fails", [](ProgressMonitor&) { return Status::error("no"); }));
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(job("after" + std::to_string(i), [&](ProgressMonitor&) {
      ran.fetch_add(1);
      return Status::ok();
    }));
  }
  for (auto& j : jobs) {
    j->set_group(group);
    j->schedule();
  }
  const bool joined = group->join(30s);
  EXPECT_TRUE(joined);
  if (!joined) {
    for (auto& j : group->active_jobs()) {
      ADD_FAILURE() << "still active: " << j->name() << " state " << static_cast<int>(j->state());
    }
  }
  EXPECT_EQ(ran.load(), 0) << "throttled behind the failure, then canceled";
  const Status result = group->result();
  EXPECT_TRUE(result.is_error());
  EXPECT_EQ(result.children.size(), 4u);
}

TEST_F(JobTest, YieldRuleLetsAConflictingJobGoFirst) {
  const Rule rule = rules::mutex("shared");
  std::vector<std::string> order;
  std::mutex order_mutex;
  const auto note = [&](std::string what) {
    std::lock_guard lock(order_mutex);
    order.push_back(std::move(what));
  };
  Gate b_waiting;
  std::atomic<bool> yielded{false};
  auto a = job("a", [&](ProgressMonitor&) {
    note("a starts");
    while (manager_->rule_stats().waiting == 0) std::this_thread::yield();
    yielded = manager_->current_job()->yield_rule();
    note("a resumes");
    return Status::ok();
  });
  auto b = job("b", [&](ProgressMonitor&) {
    note("b runs");
    return Status::ok();
  });
  a->set_rule(rule);
  b->set_rule(rule);
  a->schedule();
  b->schedule();
  EXPECT_TRUE(manager_->join(nullptr, 30s));
  EXPECT_TRUE(yielded.load());
  EXPECT_EQ(order, (std::vector<std::string>{"a starts", "b runs", "a resumes"}));
  auto lone = job("lone", [&](ProgressMonitor&) {
    return manager_->current_job()->yield_rule() ? Status::error("nobody waited") : Status::ok();
  });
  lone->set_rule(rule);
  lone->schedule();
  lone->join();
  EXPECT_TRUE(lone->result().is_ok());
}

TEST_F(JobTest, PrioritiesOrderTheStartOfNonConflictingJobs) {
  auto one = JobManager::create(JobManager::Options{1, nullptr});
  Gate blocker_in, release;
  std::vector<std::string> order;
  std::mutex order_mutex;
  auto blocker = make_job(
      "blocker",
      [&](ProgressMonitor&) {
        blocker_in.open();
        release.wait();
        return Status::ok();
      },
      one);
  blocker->schedule();
  ASSERT_TRUE(blocker_in.wait());
  const auto recorder = [&](std::string name) {
    return [&, name](ProgressMonitor&) {
      std::lock_guard lock(order_mutex);
      order.push_back(name);
      return Status::ok();
    };
  };
  auto slow = make_job("decorate", recorder("decorate"), one);
  slow->set_priority(Priority::decorate);
  auto fast = make_job("interactive", recorder("interactive"), one);
  fast->set_priority(Priority::interactive);
  slow->schedule();
  fast->schedule();
  release.open();
  EXPECT_TRUE(one->join(nullptr, 30s));
  EXPECT_EQ(order, (std::vector<std::string>{"interactive", "decorate"}));
}

TEST_F(JobTest, DelayedJobsWakeOnTimeWhileEveryWorkerIsBusy) {
  // Eclipse woke sleeping jobs only when a worker looked for work; here a timer does it, so a
  // delayed job is waiting on time even while every worker is busy, and runs when one frees up.
  Gate release;
  std::vector<std::shared_ptr<Job>> busy;
  for (int i = 0; i < 2; ++i) {
    busy.push_back(job("busy" + std::to_string(i), [&](ProgressMonitor&) {
      release.wait();
      return Status::ok();
    }));
    busy.back()->schedule();
  }
  for (auto& b : busy) {
    while (b->state() != JobState::running) std::this_thread::yield();
  }
  auto delayed = job("delayed", [](ProgressMonitor&) { return Status::ok(); });
  delayed->schedule(5ms);
  while (delayed->state() == JobState::sleeping) std::this_thread::yield();
  EXPECT_EQ(delayed->state(), JobState::waiting) << "woken while both workers were busy";
  release.open();
  delayed->join();
  for (auto& b : busy) b->join();  // they use `release`, which dies with this scope
  EXPECT_TRUE(delayed->result().is_ok());
}

TEST_F(JobTest, DestroyingAManagerCancelsWhatHasNotStarted) {
  std::atomic<int> ran{0};
  std::vector<std::shared_ptr<Job>> jobs;
  {
    auto local = JobManager::create(JobManager::Options{1, nullptr});
    const Rule rule = rules::mutex("m");
    local->begin_rule(rule);
    for (int i = 0; i < 10; ++i) {
      auto j = make_job(
          "pending" + std::to_string(i),
          [&](ProgressMonitor&) {
            ran.fetch_add(1);
            return Status::ok();
          },
          local);
      j->set_rule(rule);
      j->schedule();
      jobs.push_back(j);
    }
    auto sleeper = make_job(
        "sleeper",
        [&](ProgressMonitor&) {
          ran.fetch_add(1);
          return Status::ok();
        },
        local);
    sleeper->schedule(std::chrono::hours(1));
    jobs.push_back(sleeper);
    local->end_rule(rule);
    local->suspend();  // nothing new starts; the destructor cancels the rest
    local.reset();     // the jobs keep their manager alive ...
  }
  for (auto& j : jobs) {
    // ... so cancel them through it: nothing must hang or leak.
    j->cancel();
  }
  for (auto& j : jobs) EXPECT_NE(j->state(), JobState::running);
}

}  // namespace
}  // namespace tasklet
