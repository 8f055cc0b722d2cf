// Fixtures for the job manager's tests: gates, counters and event recorders that rendezvous through
// condition variables (bounded waits, so a bug fails the test instead of hanging it), the JobTest
// fixture the tests in tests/jobs share, and the hooked jobs more than one of them uses.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tasklet.hpp"

namespace tasklet::test {

/// Generous: only a bug makes a test wait this long.
inline constexpr std::chrono::seconds patience{30};

/// A gate a job can wait at, opened by the test.
class Gate {
 public:
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  /// False when it stayed closed for `patience`.
  bool wait() {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, patience, [this] { return open_; });
  }
  bool is_open() {
    std::lock_guard lock(mutex_);
    return open_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
};

/// A job body whose first run opens `in_run` and waits for `release`; later runs return at once.
inline auto first_run_waits(std::atomic<int>& runs, Gate& in_run, Gate& release) {
  return [&runs, &in_run, &release](ProgressMonitor&) {
    if (runs.fetch_add(1) == 0) {
      in_run.open();
      release.wait();
    }
    return Status::ok();
  };
}

/// A count that can be waited for.
class Counter {
 public:
  int add(int n = 1) {
    std::lock_guard lock(mutex_);
    count_ += n;
    changed_.notify_all();
    return count_;
  }
  int get() {
    std::lock_guard lock(mutex_);
    return count_;
  }
  /// False when it did not reach `n` within `patience`.
  bool wait_for(int n) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, patience, [&] { return count_ >= n; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int count_ = 0;
};

/// Spins (yielding) until `done()`; false after `patience`. For states nothing notifies, such as
/// the rule table's counts.
inline bool eventually(const std::function<bool()>& done) {
  const auto give_up = std::chrono::steady_clock::now() + patience;
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

/// Records every event of the jobs it hears about, in order, and counts done events.
class Recorder final : public JobListener {
 public:
  void scheduled(const JobEvent& e) override { note(e, "scheduled"); }
  void about_to_run(const JobEvent& e) override { note(e, "about_to_run"); }
  void running(const JobEvent& e) override { note(e, "running"); }
  void done(const JobEvent& e) override {
    note(e, "done");
    dones.add();
  }
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

  Counter dones;

 private:
  void note(const JobEvent& e, const char* what) {
    std::lock_guard lock(mutex_);
    events_.emplace_back(e.job->name(), what);
  }
  std::mutex mutex_;
  std::vector<std::pair<std::string, std::string>> events_;
};

/// A manager with two runners; TearDown checks that every job has ended and no rule is left held
/// or waited for.
class JobTest : public ::testing::Test {
 protected:
  void TearDown() override {
    const bool joined = manager_->join(nullptr, patience);
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

/// A job named "veto" whose should_schedule() and should_run() answer as told.
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

/// A job named "hooked" whose should_run() does what the test asks of it; counts its runs and
/// notes whether two ever overlapped.
class Hooked final : public Job {
 public:
  Hooked(std::function<bool(Job&)> should_run, std::shared_ptr<JobManager> manager)
      : Job("hooked", std::move(manager)), should_run_(std::move(should_run)) {}
  std::atomic<int> runs{0};
  std::atomic<int> running{0};
  std::atomic<bool> overlapped{false};

 protected:
  Status run(ProgressMonitor&) override {
    if (running.fetch_add(1) != 0) overlapped = true;
    runs.fetch_add(1);
    running.fetch_sub(1);
    return Status::ok();
  }
  bool should_run() override { return should_run_(*this); }

 private:
  std::function<bool(Job&)> should_run_;
};

}  // namespace tasklet::test
