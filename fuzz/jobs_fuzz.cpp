// Fuzzes a real JobManager with sequences of operations, checked against the jobs' contract.
//
// Each input is a program: every byte pair is one operation on one of eight jobs (or the manager),
// run on this thread against a manager with two workers: schedule (at once, or after 1 ms),
// cancel, sleep, wake_up, join with a timeout of 0 or 1 ms, set_rule and set_group (while the job
// is in state none; the group lets one job run at a time), begin_rule / end_rule on this thread
// (nested, balanced at the end), suspend / resume, and adding or removing a job's own listener.
// The odd jobs' runs yield their rule once (yield_rule) to whoever waits for it. The last byte
// chooses how the manager goes: joined first and then dropped, or dropped with whatever is pending.
//
// What is checked (a model of what each job may do, not of when the workers do it):
//  - rules: a job never runs while a job or this thread holds a conflicting rule (checked inside
//    every run, against the holders that the runs and this thread announce);
//  - events: each job's listener events follow the job's life (scheduled, then sleeping / awake,
//    then about_to_run and running, then done; a job that never ran goes from scheduled to done),
//    and the manager's listener hears exactly one done per scheduling, as does a job's own
//    listener while it is registered;
//  - results: a run that ran returns ok (or, when the manager shut down while its yield_rule took
//    the rule back, the cancel it returns for that); every run ends; a job canceled before it ran
//    ends with a cancel result; a job that ran last has an ok result;
//  - the end: once the manager is gone every job is in state none, join() returns at once, and
//    schedule() throws IllegalState; nothing hangs (libFuzzer's -timeout) and nothing leaks (LSan).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tasklet.hpp"

namespace {

using namespace std::chrono_literals;
using tasklet::Job;
using tasklet::JobEvent;
using tasklet::JobManager;
using tasklet::JobState;
using tasklet::Rule;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "jobs_fuzz: %s\n", what.c_str());
  std::abort();
}

void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

constexpr std::size_t job_count = 8;

// How a run ends whose yield_rule could not take the rule back because the manager shut down.
constexpr const char* refused_back = "its rule was not given back: the manager shut down";

// The rules a job or this thread may take; index 0 is no rule.
struct Pool {
  std::array<Rule, 7> rules{nullptr,
                            tasklet::rules::mutex("m"),
                            tasklet::rules::path("/a"),
                            tasklet::rules::path("/a/b"),
                            tasklet::rules::read_path("/a"),
                            tasklet::rules::read_path("/a/b"),
                            tasklet::rules::path("/c")};
  static bool conflict(const Rule& a, const Rule& b) {
    return a && b && (a->is_conflicting(*b) || b->is_conflicting(*a));
  }
};

// Who holds which rule right now: the runs announce theirs inside the run, this thread its
// outermost begun rule once begin_rule returned.
class Holders {
 public:
  void enter(const Rule& rule, const std::string& who) {
    if (!rule) return;
    std::lock_guard lock(mutex_);
    for (const auto& [held, holder] : held_) {
      check(!Pool::conflict(rule, held),
            who + " runs with " + rule->to_string() + " while " + holder + " holds " + held->to_string());
    }
    held_.emplace_back(rule, who);
  }
  void leave(const Rule& rule, const std::string& who) {
    if (!rule) return;
    std::lock_guard lock(mutex_);
    for (auto it = held_.begin(); it != held_.end(); ++it) {
      if (it->first == rule && it->second == who) {
        held_.erase(it);
        return;
      }
    }
    fail(who + " left a rule it did not hold");
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<Rule, std::string>> held_;
};

// One job's life as its events tell it.
enum class Stage { idle, scheduled, sleeping, about_to_run, running };

class Tracker final : public tasklet::JobListener {
 public:
  // `from_start`: registered before any job was scheduled. A job's own listener, registered at any
  // time, follows a job from the first scheduled event it hears.
  Tracker(std::string who, bool from_start) : who_(std::move(who)) { following_.fill(from_start); }
  void scheduled(const JobEvent& e) override { step(e, {Stage::idle}, Stage::scheduled, "scheduled"); }
  // From sleeping too: a delayed wake_up lets the job wait again without an event (docs/jobs.md §6).
  void sleeping(const JobEvent& e) override {
    step(e, {Stage::scheduled, Stage::sleeping}, Stage::sleeping, "sleeping");
  }
  // From scheduled too: a job scheduled with a delay sleeps without a sleeping event.
  void awake(const JobEvent& e) override {
    step(e, {Stage::sleeping, Stage::scheduled}, Stage::scheduled, "awake");
  }
  // From sleeping too: a delayed schedule, or a delayed wake_up, goes on without an event.
  void about_to_run(const JobEvent& e) override {
    step(e, {Stage::scheduled, Stage::sleeping}, Stage::about_to_run, "about_to_run");
  }
  void running(const JobEvent& e) override { step(e, {Stage::about_to_run}, Stage::running, "running"); }
  void done(const JobEvent& e) override {
    std::lock_guard lock(mutex_);
    if (!following_[index_of(e)]) return;
    Stage& stage = stage_of(e);
    logs_[index_of(e)] += " done(" + e.result.message + ")";
    check(stage != Stage::idle,
          who_ + ": done of " + e.job->name() + " that was not scheduled, after" + logs_[index_of(e)]);
    const bool ran_ok = e.result.is_ok() || e.result.message == refused_back;
    check(stage == Stage::running ? ran_ok : !e.result.is_ok(),
          who_ + ": done of " + e.job->name() + " with a result that does not match the events, after" +
              logs_[index_of(e)]);
    stage = Stage::idle;
    ++dones_[index_of(e)];
  }
  int dones(std::size_t job) {
    std::lock_guard lock(mutex_);
    return dones_[job];
  }
  bool idle(std::size_t job) {
    std::lock_guard lock(mutex_);
    return stages_[job] == Stage::idle;
  }

 private:
  static std::size_t index_of(const JobEvent& e) {
    return static_cast<std::size_t>(e.job->name().back() - '0');  // named "job0" ... "job7"
  }
  Stage& stage_of(const JobEvent& e) { return stages_[index_of(e)]; }
  void step(const JobEvent& e, std::initializer_list<Stage> from, Stage to, const char* what) {
    std::lock_guard lock(mutex_);
    if (!following_[index_of(e)]) {
      if (to != Stage::scheduled || *from.begin() != Stage::idle) return;
      following_[index_of(e)] = true;
    }
    Stage& stage = stage_of(e);
    logs_[index_of(e)] += std::string(" ") + what;
    check(std::find(from.begin(), from.end(), stage) != from.end(),
          who_ + ": " + what + " of " + e.job->name() + " out of order, after" + logs_[index_of(e)]);
    stage = to;
  }

  std::string who_;
  std::mutex mutex_;
  std::array<Stage, job_count> stages_{};
  std::array<std::string, job_count> logs_;  // the events heard, for the report of a failure
  std::array<bool, job_count> following_{};
  std::array<int, job_count> dones_{};
};

struct Record {
  std::shared_ptr<Job> job;
  Rule rule;                     // what its runs hold (set while it is in state none)
  std::atomic<int> runs{0};      // started
  std::atomic<int> ended{0};     // returned
  int schedules = 0;             // schedule() calls that returned normally
  std::shared_ptr<Tracker> own;  // its own listener, while registered
};

class Program {
 public:
  Program(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  void run() {
    manager_ = JobManager::create(JobManager::Options{2, nullptr});
    tracker_ = std::make_shared<Tracker>("manager listener", true);
    manager_->add_listener(tracker_);
    group_ = std::make_shared<tasklet::JobGroup>("group", 1, 0);
    for (std::size_t i = 0; i < job_count; ++i) {
      Record& record = records_[i];
      record.job = tasklet::make_job(
          "job" + std::to_string(i),
          [this, &record, i](tasklet::ProgressMonitor&) {
            const std::string who = "job" + std::to_string(i);
            record.runs.fetch_add(1);
            const Rule rule = record.job->rule();
            holders_.enter(rule, who);
            if (i % 2 == 1) {
              holders_.leave(rule, who);  // before yield_rule lets it go
              try {
                record.job->yield_rule();
              } catch (const tasklet::IllegalState&) {
                // The manager shut down while the run waited to take its rule back (documented).
                record.ended.fetch_add(1);
                return tasklet::Status::cancel(refused_back);
              }
              holders_.enter(rule, who);  // it holds the rule again once yield_rule returns
            }
            holders_.leave(rule, who);
            record.ended.fetch_add(1);
            return tasklet::Status::ok();
          },
          manager_);
    }
    std::size_t at = 0;
    while (at + 2 <= size_ && at < 2 * 64) {
      step(data_[at], data_[at + 1]);
      at += 2;
    }
    while (!begun_.empty()) end_one();
    if (suspended_) manager_->resume();
    const bool join_first = at < size_ && (data_[at] & 1) != 0;
    if (join_first) {
      for (Record& record : records_) {
        record.job->wake_up();  // a job put to sleep stays asleep until woken
        check(record.job->join(30s), record.job->name() + " never ended");
      }
    }
    manager_.reset();  // cancels what is pending, waits for what runs
    finish(join_first);
  }

 private:
  void step(std::uint8_t op, std::uint8_t arg) {
    Record& record = records_[arg % job_count];
    Job& job = *record.job;
    switch (op % 12) {
      case 0:
      case 1:  // the commonest: schedule
        job.schedule(op % 12 == 1 && (arg & 8) != 0 ? 1ms : 0ms);
        ++record.schedules;
        break;
      case 2:
        job.cancel();
        break;
      case 3:
        job.sleep();
        break;
      case 4:
        job.wake_up((arg & 8) != 0 ? 1ms : 0ms);
        break;
      case 5:
        job.join((arg & 8) != 0 ? 1ms : 0ms);
        break;
      case 6:  // a rule, while the job is in state none
        try {
          job.set_rule(pool_.rules[(arg >> 3) % pool_.rules.size()]);
        } catch (const tasklet::TaskletActive&) {
        }
        break;
      case 7:
        try {
          job.set_group((arg & 8) != 0 ? group_ : nullptr);
        } catch (const tasklet::TaskletActive&) {
        }
        break;
      case 8:
        begin_one(pool_.rules[(arg >> 3) % pool_.rules.size()]);
        break;
      case 9:
        if (!begun_.empty()) end_one();
        break;
      case 10:
        if (suspended_) {
          manager_->resume();
        } else {
          manager_->suspend();
        }
        suspended_ = !suspended_;
        break;
      case 11:
        if (record.own) {
          job.remove_listener(record.own);
          record.own = nullptr;
        } else {
          record.own = std::make_shared<Tracker>(job.name() + "'s own listener", false);
          job.add_listener(record.own);
        }
        break;
    }
  }

  // begin_rule on this thread: a rule nested in the one it holds, or, holding none, any rule (it
  // waits for the runs that hold conflicting rules, which never wait for this thread).
  void begin_one(const Rule& rule) {
    const bool outermost = outermost_ == nullptr;
    try {
      manager_->begin_rule(rule);
    } catch (const tasklet::RuleNotContained&) {
      begun_.push_back(rule);  // balanced by end_rule all the same
      return;
    }
    begun_.push_back(rule);
    if (outermost && rule) {
      outermost_ = rule;
      outermost_depth_ = begun_.size();
      holders_.enter(rule, "this thread");
    }
  }
  void end_one() {
    const Rule rule = begun_.back();
    if (outermost_ != nullptr && begun_.size() == outermost_depth_) {
      holders_.leave(outermost_, "this thread");  // before the release: a run may start at once
      outermost_ = nullptr;
    }
    manager_->end_rule(rule);
    begun_.pop_back();
  }

  void finish(bool joined) {
    for (std::size_t i = 0; i < job_count; ++i) {
      Record& record = records_[i];
      Job& job = *record.job;
      check(job.state() == JobState::none, job.name() + " not ended by its manager's destruction");
      check(job.join(0ms), job.name() + ": join() waits after the manager is gone");
      check(record.runs.load() == record.ended.load(), job.name() + " has a run that never returned");
      check(tracker_->idle(i), job.name() + ": its events stop in the middle of a life");
      check(tracker_->dones(i) >= (record.schedules > 0 ? 1 : 0) && tracker_->dones(i) <= record.schedules,
            job.name() + ": " + std::to_string(tracker_->dones(i)) + " done events for " +
                std::to_string(record.schedules) + " schedules");
      check(record.runs.load() <= tracker_->dones(i), job.name() + " ran more often than it ended");
      if (joined && record.schedules > 0 && record.runs.load() == tracker_->dones(i)) {
        check(job.result().is_ok(), job.name() + " ran every time but its result is not ok");
      }
      try {
        job.schedule();
        fail(job.name() + " was scheduled on a destroyed manager");
      } catch (const tasklet::IllegalState&) {
      }
    }
  }

  const std::uint8_t* data_;
  std::size_t size_;
  Pool pool_;
  Holders holders_;
  std::shared_ptr<JobManager> manager_;
  std::shared_ptr<Tracker> tracker_;
  std::shared_ptr<tasklet::JobGroup> group_;
  std::array<Record, job_count> records_;
  std::vector<Rule> begun_;
  Rule outermost_;
  std::size_t outermost_depth_ = 0;
  bool suspended_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Program program(data, size);
  program.run();
  return 0;
}
