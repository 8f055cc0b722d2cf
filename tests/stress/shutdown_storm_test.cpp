// The shutdown storm of the reliability lanes: managers destroyed with many jobs in every state
// (running, waiting for a rule, queued for a runner, sleeping, delayed, throttled by a group, held
// by a suspension, done), round after round. Each round checks that the destruction returns (the
// running jobs see their monitors canceled), that it ends every job exactly once (one done event
// each, to the manager's listener and to the job's own, state none, a cancel result for what had
// not run, no schedule() afterwards), and that the manager is gone; ASan's leak check covers what
// is left. Sizes scale with TASKLET_STRESS_SCALE: 2,000 jobs a round by default, 10^5 at 50.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "support/test_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;
using test::patience;

enum class Kind { done_before, blocker, on_rule, queued, delayed, slept, grouped, count };
constexpr int kind_count = static_cast<int>(Kind::count);

// What one round shares with its jobs: whether the running ones were told to stop, and the done
// events each job got.
class Round {
 public:
  explicit Round(int jobs) : dones_(static_cast<std::size_t>(jobs)) {}

  void canceled() {
    std::lock_guard lock(mutex_);
    changed_.notify_all();
  }
  // A running job's run: until its monitor is canceled (false: it never was).
  bool wait_canceled(const ProgressMonitor& monitor) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, patience, [&] { return monitor.is_canceled(); });
  }
  void started() { started_.add(); }
  bool wait_started(int n) { return started_.wait_for(n); }

  void done(int index) { dones_[static_cast<std::size_t>(index)].fetch_add(1); }
  int dones(int index) const { return dones_[static_cast<std::size_t>(index)].load(); }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  test::Counter started_;
  std::vector<std::atomic<int>> dones_;
};

class StormJob final : public Job {
 public:
  StormJob(int index, Kind kind, Round& round, std::shared_ptr<JobManager> manager)
      : Job("storm" + std::to_string(index), std::move(manager)), index_(index), kind_(kind), round_(round) {}
  int index() const { return index_; }
  Kind kind() const { return kind_; }

 protected:
  Status run(ProgressMonitor& monitor) override {
    if (kind_ != Kind::blocker) return Status::ok();
    round_.started();
    return round_.wait_canceled(monitor) ? Status::cancel("told to stop") : Status::error("never canceled");
  }

 private:
  int index_;
  Kind kind_;
  Round& round_;
};

// Tells the round when a blocker's monitor is canceled.
class Announcing final : public ProgressMonitor {
 public:
  explicit Announcing(Round& round) : round_(round) {}

 protected:
  void on_canceled(bool canceled) override {
    if (canceled) round_.canceled();
  }

 private:
  Round& round_;
};

// Counts done events per job (the manager's listener, and the own listener of some jobs).
class DoneCounter final : public JobListener {
 public:
  explicit DoneCounter(Round& round) : round_(round) {}
  void done(const JobEvent& event) override { round_.done(static_cast<const StormJob&>(*event.job).index()); }

 private:
  Round& round_;
};

void storm(int round_number, int jobs_per_round) {
  constexpr int runners = 2;
  const bool suspended = round_number % 2 == 1;
  auto manager = JobManager::create(JobManager::Options{runners, nullptr});
  const std::weak_ptr<JobManager> watch = manager;
  Round round(jobs_per_round);
  manager->add_listener(std::make_shared<DoneCounter>(round));
  manager->set_progress_provider([&round](Job& job) -> std::unique_ptr<ProgressMonitor> {
    if (static_cast<StormJob&>(job).kind() == Kind::blocker) return std::make_unique<Announcing>(round);
    return nullptr;
  });
  const Rule disk = rules::mutex("disk");
  auto group = std::make_shared<JobGroup>("throttled", 1, 0);
  auto own_listener = std::make_shared<DoneCounter>(round);

  // Every kind in turn: the first jobs of each round run to the end, then one blocker per runner
  // (the first holds `disk`) takes every runner, and the rest pile up behind them.
  std::vector<std::shared_ptr<StormJob>> jobs;
  jobs.reserve(static_cast<std::size_t>(jobs_per_round));
  const int done_before = jobs_per_round / kind_count;
  for (int i = 0; i < jobs_per_round; ++i) {
    Kind kind = static_cast<Kind>(i % (kind_count - 2) + 2);  // the pending kinds, after the first two
    if (i < done_before) kind = Kind::done_before;
    if (i >= done_before && i < done_before + runners) kind = Kind::blocker;
    auto job = std::make_shared<StormJob>(i, kind, round, manager);
    if (i % 10 == 0) job->add_listener(own_listener);
    jobs.push_back(job);
  }
  for (int i = 0; i < done_before; ++i) jobs[static_cast<std::size_t>(i)]->schedule();
  for (int i = 0; i < done_before; ++i) ASSERT_TRUE(jobs[static_cast<std::size_t>(i)]->join(patience));
  jobs[static_cast<std::size_t>(done_before)]->set_rule(disk);
  for (int b = 0; b < runners; ++b) jobs[static_cast<std::size_t>(done_before + b)]->schedule();
  ASSERT_TRUE(round.wait_started(runners)) << "the blockers never ran";
  if (suspended) manager->suspend();

  for (int i = done_before + runners; i < jobs_per_round; ++i) {
    StormJob& job = *jobs[static_cast<std::size_t>(i)];
    switch (job.kind()) {
      case Kind::on_rule:
        job.set_rule(disk);
        job.schedule();
        break;
      case Kind::queued:
        job.schedule();
        break;
      case Kind::delayed:
        job.schedule(1h);
        break;
      case Kind::slept:
        job.schedule();
        job.sleep();  // put to sleep while it waits (or left waiting if its run was taken already)
        break;
      case Kind::grouped:
        job.set_group(group);
        job.schedule();
        break;
      default:
        FAIL() << "unexpected kind";
    }
  }
  for (int i = done_before; i < jobs_per_round; ++i) {
    const StormJob& job = *jobs[static_cast<std::size_t>(i)];
    ASSERT_NE(job.state(), JobState::none) << job.name() << " ended before the manager was dropped";
    ASSERT_EQ(round.dones(i), 0) << job.name();
  }
  if (!suspended) {
    EXPECT_GE(manager->rule_stats().waiting, static_cast<std::size_t>(jobs_per_round / kind_count / 2));
  }

  manager.reset();  // returns once the blockers, told to stop, have ended
  EXPECT_TRUE(watch.expired());
  int wrong_state = 0, wrong_dones = 0, wrong_result = 0, scheduled_after = 0;
  for (const auto& job : jobs) {
    const int index = job->index();
    if (job->state() != JobState::none) ++wrong_state;
    if (round.dones(index) != (index % 10 == 0 ? 2 : 1)) ++wrong_dones;
    const Status result = job->result();
    if ((job->kind() == Kind::done_before ? !result.is_ok() : !result.is_canceled()) && ++wrong_result <= 3) {
      ADD_FAILURE() << job->name() << " (kind " << static_cast<int>(job->kind()) << ") ended with '"
                    << result.message << "'";
    }
    if (!job->join(0ms)) ++wrong_state;
    try {
      job->schedule();
      ++scheduled_after;
    } catch (const IllegalState&) {
    }
  }
  EXPECT_EQ(wrong_state, 0) << "jobs not ended by the manager's destruction";
  EXPECT_EQ(wrong_dones, 0) << "jobs without exactly one done event per listener";
  EXPECT_EQ(wrong_result, 0) << "jobs whose result is not ok (ran before) or canceled (pending)";
  EXPECT_EQ(scheduled_after, 0) << "schedule() accepted by a destroyed manager";
}

TEST(ShutdownStorm, ManagersDroppedWithJobsInEveryStateEndEachJobOnce) {
  const int jobs_per_round = 2000 * test::stress_scale();
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const auto started = std::chrono::steady_clock::now();
    storm(round, jobs_per_round);
    if (HasFatalFailure()) return;
    const auto elapsed =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    std::cout << "[ storm    ] round " << round << (round % 2 == 1 ? " (suspended)" : "") << ": "
              << jobs_per_round << " jobs, " << elapsed.count() << " ms\n";
  }
}

}  // namespace
}  // namespace tasklet
