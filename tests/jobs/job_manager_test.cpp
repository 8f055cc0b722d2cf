// The job manager's life and its runners: a manager dies when its users drop it (jobs refer to it
// without owning it), a job that waits frees its runner, and a removed listener stays removed.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <oneapi/tbb/task_arena.h>

#include "jobs/jobs.hpp"
#include "support/job_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;
using test::Counter;
using test::eventually;
using test::Gate;
using test::patience;
using test::Recorder;

bool names_job(const std::exception& error, const std::string& name) {
  return std::string(error.what()).find("'" + name + "'") != std::string::npos;
}

// ---------------------------------------------------------------------------------------------
// Lifetime

// A monitor that opens a gate when it is canceled.
class Announcing final : public ProgressMonitor {
 public:
  explicit Announcing(Gate& canceled) : canceled_(canceled) {}

 protected:
  void on_canceled(bool canceled) override {
    if (canceled) canceled_.open();
  }

 private:
  Gate& canceled_;
};

TEST(JobManagerLifetime, DroppingAManagerCancelsWhatWaitsAndWaitsForWhatRuns) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  const std::weak_ptr<JobManager> watch = manager;
  auto recorder = std::make_shared<Recorder>();
  manager->add_listener(recorder);
  Gate running_canceled;
  manager->set_progress_provider([&](Job& job) -> std::unique_ptr<ProgressMonitor> {
    if (job.name() == "running") return std::make_unique<Announcing>(running_canceled);
    return nullptr;
  });

  const Rule disk = rules::mutex("disk");
  Gate started, release;
  auto running = make_job(
      "running",
      [&](ProgressMonitor& monitor) {
        started.open();
        release.wait();
        return monitor.is_canceled() ? Status::cancel("told to stop") : Status::ok();
      },
      manager);
  running->set_rule(disk);
  running->schedule();
  ASSERT_TRUE(started.wait());

  std::atomic<int> ran{0};
  const auto count_run = [&](ProgressMonitor&) {
    ran.fetch_add(1);
    return Status::ok();
  };
  std::vector<std::shared_ptr<Job>> waiting;
  for (int i = 0; i < 1000; ++i) {
    auto job = make_job("waiting" + std::to_string(i), count_run, manager);
    job->set_rule(disk);
    job->schedule();
    waiting.push_back(job);
  }
  auto delayed = make_job("delayed", count_run, manager);
  delayed->schedule(std::chrono::hours(1));
  EXPECT_EQ(manager->rule_stats().waiting, 1000u);

  // Dropped from another thread while the running job is blocked.
  std::atomic<bool> destroyed{false};
  std::thread dropper([doomed = std::move(manager), &destroyed]() mutable {
    doomed.reset();
    destroyed = true;
  });
  // Everything that had not started ends canceled while the destructor waits for the running job,
  // whose monitor is canceled.
  const bool all_done = recorder->dones.wait_for(1001);
  const bool told = running_canceled.wait();
  EXPECT_TRUE(all_done);
  EXPECT_TRUE(told);
  EXPECT_FALSE(destroyed.load()) << "the destructor returned before the running job ended";
  EXPECT_EQ(running->state(), JobState::running);
  release.open();
  dropper.join();
  EXPECT_TRUE(destroyed.load());
  EXPECT_TRUE(watch.expired());

  EXPECT_EQ(ran.load(), 0);
  for (auto& job : waiting) {
    EXPECT_EQ(job->state(), JobState::none) << job->name();
    EXPECT_TRUE(job->result().is_canceled()) << job->name();
    EXPECT_TRUE(job->join(0ms));
  }
  EXPECT_TRUE(delayed->result().is_canceled());
  EXPECT_EQ(running->state(), JobState::none);
  EXPECT_TRUE(running->result().is_canceled());
  EXPECT_EQ(recorder->dones.get(), 1002) << "every job's done event was delivered, the running one's too";
  EXPECT_EQ(running->manager(), nullptr);
  try {
    running->schedule();
    ADD_FAILURE() << "an orphaned job was scheduled";
  } catch (const IllegalState& error) {
    EXPECT_TRUE(names_job(error, "running")) << error.what();
  }
}

// A run taken by a worker while the manager is suspended holds its job back until resume(). A
// resume() between the run's look at the suspension and the hold must still let the job in
// (without it the job waited for the next resume; found by the jobs fuzzer, fuzz/jobs_fuzz.cpp).
TEST(JobManagerSuspension, AResumeJustBeforeARunHoldsItsJobBackStillLetsItIn) {
  auto manager = JobManager::create(JobManager::Options{1, nullptr});
  struct Seam {
    Seam() {
      detail::before_holding_back = [](Job& job) { job.manager()->resume(); };
    }
    ~Seam() { detail::before_holding_back = nullptr; }
  } seam;
  Gate in_run, release;
  auto blocker = make_job(
      "blocker",
      [&](ProgressMonitor&) {
        in_run.open();
        release.wait();
        return Status::ok();
      },
      manager);
  blocker->schedule();
  ASSERT_TRUE(in_run.wait());
  std::atomic<bool> ran{false};
  auto held = make_job(
      "held",
      [&](ProgressMonitor&) {
        ran = true;
        return Status::ok();
      },
      manager);
  held->schedule();  // handed to the job scheduler while its only worker is busy
  manager->suspend();
  release.open();  // the worker takes held's run, finds the manager suspended; the seam resumes it
  EXPECT_TRUE(held->join(patience)) << "the job waits for a resume() that came already";
  EXPECT_TRUE(ran.load());
}

// The shutdown cancels jobs in the order they were scheduled: canceling a running job frees its
// runner before the jobs queued behind it are canceled. The runner must not start one of them.
// Found by the shutdown storm (tests/stress/shutdown_storm_test.cpp).
TEST(JobManagerLifetime, ARunnerFreedDuringTheShutdownStartsNothing) {
  auto manager = JobManager::create(JobManager::Options{1, nullptr});
  auto recorder = std::make_shared<Recorder>();
  manager->add_listener(recorder);
  Gate started, stop;
  // The running job's monitor, when the shutdown cancels it, lets the job end and holds the
  // shutdown until the queued job has ended one way or the other.
  class StopsAndWaits final : public ProgressMonitor {
   public:
    StopsAndWaits(Gate& stop, Recorder& recorder) : stop_(stop), recorder_(recorder) {}

   protected:
    void on_canceled(bool canceled) override {
      if (!canceled) return;
      stop_.open();
      recorder_.dones.wait_for(2);  // the running job's end, then the queued one's
    }

   private:
    Gate& stop_;
    Recorder& recorder_;
  };
  manager->set_progress_provider([&](Job& job) -> std::unique_ptr<ProgressMonitor> {
    if (job.name() == "running") return std::make_unique<StopsAndWaits>(stop, *recorder);
    return nullptr;
  });
  auto running = make_job(
      "running",
      [&](ProgressMonitor&) {
        started.open();
        stop.wait();
        return Status::cancel("told to stop");
      },
      manager);
  running->schedule();
  ASSERT_TRUE(started.wait());
  std::atomic<int> ran{0};
  auto queued = make_job(
      "queued",
      [&](ProgressMonitor&) {
        ran.fetch_add(1);
        return Status::ok();
      },
      manager);
  queued->schedule();

  manager.reset();
  EXPECT_EQ(ran.load(), 0) << "a job started while its manager shut down";
  EXPECT_TRUE(queued->result().is_canceled()) << queued->result().message;
  EXPECT_EQ(recorder->dones.get(), 2);
}

TEST(JobManagerLifetime, AJobDoesNotKeepItsManagerAlive) {
  auto manager = JobManager::create(JobManager::Options{1, nullptr});
  const std::weak_ptr<JobManager> watch = manager;
  auto ran = make_job(
      "ran", [](ProgressMonitor&) { return Status::error("kept"); }, manager);
  auto idle = make_job(
      "idle", [](ProgressMonitor&) { return Status::ok(); }, manager);
  idle->set_property("key", 7);
  ran->schedule();
  ran->join();
  EXPECT_EQ(idle->manager(), manager);
  manager.reset();
  EXPECT_TRUE(watch.expired()) << "the jobs kept their manager alive";

  // Orphans stay usable: state, result and settings read, cancel/join/sleep are no-ops.
  EXPECT_EQ(ran->manager(), nullptr);
  EXPECT_EQ(ran->state(), JobState::none);
  EXPECT_EQ(ran->result().message, "kept");
  EXPECT_EQ(std::any_cast<int>(idle->property("key")), 7);
  EXPECT_TRUE(idle->cancel());
  EXPECT_TRUE(idle->join(0ms));
  idle->join();
  EXPECT_TRUE(idle->sleep());
  idle->wake_up();
  idle->set_priority(Priority::short_job);
  EXPECT_THROW(idle->yield_rule(), IllegalState);
  try {
    idle->schedule(10ms);
    ADD_FAILURE() << "an orphaned job was scheduled";
  } catch (const IllegalState& error) {
    EXPECT_TRUE(names_job(error, "idle")) << error.what();
  }
  EXPECT_EQ(idle->state(), JobState::none);
}

TEST(JobManagerLifetime, JobsOfTheGlobalManagerRun) {
  std::atomic<bool> ran{false};
  auto job = make_job("on the global manager", [&](ProgressMonitor&) {
    ran = true;
    return Status::ok();
  });
  EXPECT_EQ(job->manager(), JobManager::global());
  job->schedule();
  EXPECT_TRUE(job->join(patience));
  EXPECT_TRUE(ran.load());
  EXPECT_TRUE(job->result().is_ok());
}

// Destroys a gate's owner: tells when the manager's listeners were dropped (its last step).
class Farewell final : public JobListener {
 public:
  explicit Farewell(Gate& gone) : gone_(gone) {}
  ~Farewell() override { gone_.open(); }

 private:
  Gate& gone_;
};

TEST(JobManagerLifetime, AManagerDroppedInsideOneOfItsJobsIsDestroyedAfterThatRun) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  const std::weak_ptr<JobManager> watch = manager;
  Gate gone;
  manager->add_listener(std::make_shared<Farewell>(gone));
  const Rule rule = rules::mutex("held by the dropper");
  Gate both_scheduled;
  std::shared_ptr<JobManager> last = std::move(manager);
  auto dropper = make_job(
      "dropper",
      [&](ProgressMonitor& monitor) {
        both_scheduled.wait();
        last.reset();  // the last reference, inside the manager's own job
        return monitor.is_canceled() ? Status::cancel("shut down") : Status::ok();
      },
      last);
  dropper->set_rule(rule);
  std::atomic<bool> behind_ran{false};
  auto behind = make_job(
      "behind",
      [&](ProgressMonitor&) {
        behind_ran = true;
        return Status::ok();
      },
      last);
  behind->set_rule(rule);
  dropper->schedule();
  behind->schedule();
  both_scheduled.open();
  ASSERT_TRUE(gone.wait()) << "the manager was not destroyed";
  EXPECT_TRUE(watch.expired());
  EXPECT_TRUE(dropper->join(patience));
  EXPECT_TRUE(dropper->result().is_canceled()) << "its manager's shutdown canceled it";
  EXPECT_TRUE(behind->result().is_canceled());
  EXPECT_FALSE(behind_ran.load());
  EXPECT_THROW(behind->schedule(), IllegalState);
}

TEST(JobManagerLifetime, AManagerOwnedOnlyByItsJobIsDestroyedWhenTheJobIs) {
  Gate gone, in_run, release;
  std::weak_ptr<JobManager> watch;
  {
    auto manager = JobManager::create(JobManager::Options{1, nullptr});
    watch = manager;
    manager->add_listener(std::make_shared<Farewell>(gone));
    auto owner = make_job(
        "owner",
        [&in_run, &release, manager](ProgressMonitor&) {  // the job's body owns the manager
          in_run.open();
          release.wait();
          return manager->current_job() ? Status::ok() : Status::error("no current job");
        },
        manager);
    owner->schedule();
    ASSERT_TRUE(in_run.wait());
  }
  EXPECT_FALSE(watch.expired()) << "alive while its job runs";
  release.open();  // the run ends, the job is dropped on its runner, and the manager with it
  EXPECT_TRUE(gone.wait());
  EXPECT_TRUE(watch.expired());
}

TEST(JobManagerLifetime, AManagerDroppedInADoneListenerIsDestroyed) {
  struct Dropper final : JobListener {
    void done(const JobEvent&) override {
      std::lock_guard lock(mutex);
      manager.reset();
    }
    std::mutex mutex;
    std::shared_ptr<JobManager> manager;
  };
  Gate gone;
  auto dropper = std::make_shared<Dropper>();
  auto manager = JobManager::create(JobManager::Options{1, nullptr});
  const std::weak_ptr<JobManager> watch = manager;
  manager->add_listener(std::make_shared<Farewell>(gone));
  auto j = make_job(
      "told", [](ProgressMonitor&) { return Status::ok(); }, manager);
  j->add_listener(dropper);
  dropper->manager = std::move(manager);
  j->schedule();
  EXPECT_TRUE(gone.wait());
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(j->state(), JobState::none);
  EXPECT_TRUE(j->result().is_ok());
}

// A delayed job canceled while the timer thread hands its run to the job scheduler: the cancel
// cannot take back a run that is in no queue yet (it returns false), and the hand-over ends the
// job. That end's done listener drops the manager, whose shutdown joins the timer thread, so it
// must not run there. The cancel is made from the hand-over itself (a test seam), which puts it in
// that window every time.
namespace hand_over {
std::atomic<int> cancels{0};
std::atomic<int> taken_back{0};
void cancel_delayed(Job& job) {
  if (job.name() != "delayed") return;
  cancels.fetch_add(1);
  if (job.cancel()) taken_back.fetch_add(1);
}
}  // namespace hand_over

TEST(JobManagerLifetime, AManagerDroppedByADelayedJobCanceledInItsHandOverIsDestroyed) {
  struct Dropper final : JobListener {
    void done(const JobEvent& e) override {
      if (e.job->name() != "delayed") return;
      on_a_worker =
          oneapi::tbb::this_task_arena::current_thread_index() != oneapi::tbb::task_arena::not_initialized;
      release->open();  // the holder's run ends, so the manager's shutdown can wait for it
      manager.reset();
    }
    std::shared_ptr<JobManager> manager;
    Gate* release = nullptr;
    std::atomic<bool> on_a_worker{false};
  };
  hand_over::cancels = 0;  // counted afresh in each run of the test (--gtest_repeat)
  hand_over::taken_back = 0;
  struct Seam {
    Seam() { detail::before_hand_over = &hand_over::cancel_delayed; }
    ~Seam() { detail::before_hand_over = nullptr; }
  } seam;
  Gate gone, holding, release;
  auto manager = JobManager::create(JobManager::Options{2, nullptr});  // a runner beside the holder
  const std::weak_ptr<JobManager> watch = manager;
  manager->add_listener(std::make_shared<Farewell>(gone));
  const Rule rule = rules::mutex("contended");
  auto holder = make_job(
      "holder",
      [&](ProgressMonitor&) {
        holding.open();
        release.wait();
        return Status::ok();
      },
      manager);
  holder->set_rule(rule);
  std::atomic<bool> delayed_ran{false};
  auto delayed = make_job(
      "delayed",
      [&](ProgressMonitor&) {
        delayed_ran = true;
        return Status::ok();
      },
      manager);
  delayed->set_rule(rule);  // held: the hand-over takes its request out of the rule table
  auto dropper = std::make_shared<Dropper>();
  dropper->release = &release;
  delayed->add_listener(dropper);
  holder->schedule();
  ASSERT_TRUE(holding.wait());
  dropper->manager = std::move(manager);
  delayed->schedule(1ms);  // the timer thread hands it over, and the seam cancels it there
  ASSERT_TRUE(gone.wait()) << "the manager was not destroyed";
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(hand_over::cancels.load(), 1);
  EXPECT_EQ(hand_over::taken_back.load(), 0) << "cancel() returns false in the hand-over window";
  EXPECT_TRUE(dropper->on_a_worker.load()) << "the done listener ran off the job scheduler";
  EXPECT_TRUE(delayed->join(patience));
  EXPECT_TRUE(delayed->result().is_canceled());
  EXPECT_FALSE(delayed_ran.load());
  EXPECT_TRUE(holder->join(patience));
  EXPECT_TRUE(holder->result().is_ok());
}

// Managers dropped with random mixes of running, waiting, sleeping and grouped jobs: every job
// ends, none runs after the manager is gone, nothing hangs.
TEST(JobManagerLifetime, ManagersDroppedWithMixedPendingWorkEndEveryJob) {
  std::mt19937 random(20261122);
  for (int round = 0; round < 30; ++round) {
    auto manager = JobManager::create(JobManager::Options{1 + round % 3, nullptr});
    const std::weak_ptr<JobManager> watch = manager;
    auto recorder = std::make_shared<Recorder>();
    manager->add_listener(recorder);
    const std::vector<Rule> rules_used{rules::path("/a"), rules::path("/a/b"), rules::mutex("m"), nullptr};
    auto group = std::make_shared<JobGroup>("g", 1, 0);
    std::vector<std::shared_ptr<Job>> jobs;
    const int count = 20 + static_cast<int>(random() % 40);
    for (int i = 0; i < count; ++i) {
      auto j = make_job(
          "r" + std::to_string(round) + "j" + std::to_string(i),
          [](ProgressMonitor& monitor) { return monitor.is_canceled() ? Status::cancel() : Status::ok(); },
          manager);
      j->set_rule(rules_used[random() % rules_used.size()]);
      if (random() % 4 == 0) j->set_group(group);
      switch (random() % 3) {
        case 0:
          j->schedule();
          break;
        case 1:
          j->schedule(std::chrono::milliseconds(random() % 3));
          break;
        default:
          j->schedule(std::chrono::hours(1));
          break;
      }
      jobs.push_back(j);
    }
    manager.reset();
    ASSERT_TRUE(watch.expired());
    for (auto& j : jobs) {
      EXPECT_EQ(j->state(), JobState::none) << j->name();
      EXPECT_THROW(j->schedule(), IllegalState);
    }
    EXPECT_EQ(recorder->dones.get(), count) << "one done event per job";
  }
}

// ---------------------------------------------------------------------------------------------
// Runners: a job that waits (join, begin_rule, yield_rule, a group or family join) frees its runner

class JobRunnerTest : public ::testing::TestWithParam<int> {
 protected:
  void TearDown() override {
    EXPECT_TRUE(manager_->join(nullptr, patience));
    EXPECT_TRUE(manager_->is_idle());
    EXPECT_EQ(manager_->rule_stats().held, 0u);
    EXPECT_EQ(manager_->rule_stats().waiting, 0u);
  }
  int runners() const { return GetParam(); }
  std::shared_ptr<Job> job(std::string name, std::function<Status(ProgressMonitor&)> fn) {
    return make_job(std::move(name), std::move(fn), manager_);
  }
  std::shared_ptr<JobManager> manager_ = JobManager::create(JobManager::Options{GetParam(), nullptr});
};

// Every runner is taken by a job that joins a job scheduled after it: the joined jobs still run.
TEST_P(JobRunnerTest, JobsJoiningLaterJobsOnEveryRunnerDoNotDeadlock) {
  std::vector<std::shared_ptr<Job>> joiners;
  Counter joined;
  for (int i = 0; i < runners(); ++i) {
    joiners.push_back(job("joiner" + std::to_string(i), [&, i](ProgressMonitor&) {
      auto later = job("later" + std::to_string(i), [](ProgressMonitor&) { return Status::ok(); });
      later->schedule();
      const bool in_time = later->join(patience);
      joined.add();
      if (!in_time) return Status::error("the joined job never ran");
      auto untimed = job("untimed" + std::to_string(i), [](ProgressMonitor&) { return Status::ok(); });
      untimed->schedule();
      untimed->join();
      return untimed->result();
    }));
  }
  for (auto& joiner : joiners) joiner->schedule();
  for (auto& joiner : joiners) {
    EXPECT_TRUE(joiner->join(patience + patience)) << joiner->name();
    EXPECT_TRUE(joiner->result().is_ok()) << joiner->name() << ": " << joiner->result().message;
  }
}

// Job i schedules job i+1 and joins it: `depth` jobs wait at once, each freeing its runner.
TEST_P(JobRunnerTest, AChainOfJobsEachJoiningTheNextCompletes) {
  constexpr int depth = 40;
  std::atomic<int> deepest{0};
  std::function<Status(int)> link = [&](int i) {
    deepest = std::max(deepest.load(), i);
    if (i == depth) return Status::ok();
    auto next = job("link" + std::to_string(i + 1), [&link, i](ProgressMonitor&) { return link(i + 1); });
    next->schedule();
    next->join();
    return next->result();
  };
  auto first = job("link0", [&](ProgressMonitor&) { return link(0); });
  first->schedule();
  EXPECT_TRUE(first->join(patience));
  EXPECT_TRUE(first->result().is_ok()) << first->result().message;
  EXPECT_EQ(deepest.load(), depth);
}

TEST_P(JobRunnerTest, TimedJoinInAJobTimesOutWithoutHoldingItsRunner) {
  const Rule rule = rules::mutex("held by the test");
  manager_->begin_rule(rule);
  auto blocked = job("blocked", [](ProgressMonitor&) { return Status::ok(); });
  blocked->set_rule(rule);
  blocked->schedule();
  std::vector<std::shared_ptr<Job>> joiners;
  for (int i = 0; i < runners(); ++i) {
    joiners.push_back(job("joiner" + std::to_string(i), [&](ProgressMonitor&) {
      return blocked->join(5ms) ? Status::error("joined a job that cannot run") : Status::ok();
    }));
    joiners.back()->schedule();
  }
  // While they wait, their runners are free for other jobs.
  auto other = job("other", [](ProgressMonitor&) { return Status::ok(); });
  other->schedule();
  EXPECT_TRUE(other->join(patience));
  for (auto& joiner : joiners) {
    EXPECT_TRUE(joiner->join(patience)) << joiner->name();
    EXPECT_TRUE(joiner->result().is_ok()) << joiner->result().message;
  }
  manager_->end_rule(rule);
  EXPECT_TRUE(blocked->join(patience));
}

TEST_P(JobRunnerTest, BeginRuleInJobsOnEveryRunnerLetsTheRuleHolderRun) {
  const Rule rule = rules::mutex("contended");
  manager_->begin_rule(rule);
  std::vector<std::string> order;  // guarded by the rule
  auto holder = job("holder", [&](ProgressMonitor&) {
    order.push_back("holder");
    return Status::ok();
  });
  holder->set_rule(rule);
  holder->schedule();  // waits for the test's rule, first in line
  std::vector<std::shared_ptr<Job>> lockers;
  for (int i = 0; i < runners(); ++i) {
    lockers.push_back(job("locker" + std::to_string(i), [&, i](ProgressMonitor&) {
      RuleScope scope(*manager_, rule);  // behind the holder; the runner is free meanwhile
      order.push_back("locker" + std::to_string(i));
      return Status::ok();
    }));
    lockers.back()->schedule();
  }
  ASSERT_TRUE(
      eventually([&] { return manager_->rule_stats().waiting == static_cast<std::size_t>(runners()) + 1; }));
  manager_->end_rule(rule);  // the holder is granted, but every runner is in begin_rule
  EXPECT_TRUE(holder->join(patience));
  for (auto& locker : lockers) EXPECT_TRUE(locker->join(patience)) << locker->name();
  ASSERT_FALSE(order.empty());
  EXPECT_EQ(order.front(), "holder") << "FIFO: the holder asked first";
  EXPECT_EQ(order.size(), static_cast<std::size_t>(runners()) + 1);
}

TEST_P(JobRunnerTest, YieldRuleLetsTheWaitingJobRunOnTheFreedRunner) {
  const Rule rule = rules::mutex("yielded");
  std::vector<std::string> order;  // guarded by the rule
  Gate yielder_in;
  std::atomic<bool> yielded{false};
  // Every other runner is busy until the end, so the waiting job can only run on the yielder's.
  Gate release_fillers;
  std::vector<std::shared_ptr<Job>> fillers;
  Counter fillers_in;
  for (int i = 1; i < runners(); ++i) {
    fillers.push_back(job("filler" + std::to_string(i), [&](ProgressMonitor&) {
      fillers_in.add();
      release_fillers.wait();
      return Status::ok();
    }));
    fillers.back()->schedule();
  }
  ASSERT_TRUE(fillers_in.wait_for(runners() - 1));
  auto yielder = job("yielder", [&](ProgressMonitor&) {
    order.push_back("yielder starts");
    yielder_in.open();
    if (!eventually([&] { return manager_->rule_stats().waiting == 1; })) return Status::error("nobody came");
    yielded = manager_->current_job()->yield_rule();
    order.push_back("yielder resumes");
    return Status::ok();
  });
  auto waiter = job("waiter", [&](ProgressMonitor&) {
    order.push_back("waiter runs");
    return Status::ok();
  });
  yielder->set_rule(rule);
  waiter->set_rule(rule);
  yielder->schedule();
  ASSERT_TRUE(yielder_in.wait());
  waiter->schedule();
  EXPECT_TRUE(yielder->join(patience));
  EXPECT_TRUE(waiter->join(patience));
  release_fillers.open();
  for (auto& filler : fillers) filler->join();
  EXPECT_TRUE(yielded.load());
  EXPECT_EQ(order, (std::vector<std::string>{"yielder starts", "waiter runs", "yielder resumes"}));
}

TEST_P(JobRunnerTest, JobsJoiningAGroupAndAFamilyFreeTheirRunners) {
  static const int family_tag = 0;
  struct Member final : Job {
    using Job::Job;
    bool belongs_to(Family family) const override { return family == &family_tag; }
    Status run(ProgressMonitor&) override { return Status::ok(); }
  };
  auto group = std::make_shared<JobGroup>("group", 1, 3);
  std::vector<std::shared_ptr<Job>> joiners;
  for (int i = 0; i < runners(); ++i) {
    joiners.push_back(job("joiner" + std::to_string(i), [&, i](ProgressMonitor&) {
      if (i == 0) {
        for (int g = 0; g < 3; ++g) {
          auto member = job("grouped" + std::to_string(g), [](ProgressMonitor&) { return Status::ok(); });
          member->set_group(group);
          member->schedule();
        }
        if (!group->join(patience)) return Status::error("the group never finished");
      }
      for (int f = 0; f < 3; ++f)
        std::make_shared<Member>("member" + std::to_string(f), manager_)->schedule();
      return manager_->join(&family_tag, patience) ? Status::ok()
                                                   : Status::error("the family never finished");
    }));
  }
  for (auto& joiner : joiners) joiner->schedule();
  for (auto& joiner : joiners) {
    EXPECT_TRUE(joiner->join(patience + patience)) << joiner->name();
    EXPECT_TRUE(joiner->result().is_ok()) << joiner->name() << ": " << joiner->result().message;
  }
  EXPECT_TRUE(group->result().is_ok());
}

// An ASYNC tasklet phase on the manager's only worker joins a job, a family and a group: it is
// suspended rather than holding the worker the jobs need.
TEST(JobJoinFromATasklet, AnAsyncPhaseJoiningJobsDoesNotHoldTheOnlyWorker) {
  static const int family = 0;
  struct Member final : Job {
    using Job::Job;
    bool belongs_to(Family f) const override { return f == &family; }
    Status run(ProgressMonitor&) override { return Status::ok(); }
  };
  auto manager = JobManager::create(JobManager::Options{1, nullptr});
  auto scheduler = Scheduler::create(SchedulerOptions{manager, nullptr, 0});
  std::vector<std::string> outcome;
  auto tasklet = make_tasklet([&, phase = 0]() mutable {
    if (phase++ == 0) return Directive::async;
    auto a = make_job(
        "joined untimed", [](ProgressMonitor&) { return Status::ok(); }, manager);
    a->schedule();
    a->join();
    outcome.push_back(a->result().is_ok() ? "job" : "job failed");
    auto b = make_job(
        "joined timed", [](ProgressMonitor&) { return Status::ok(); }, manager);
    b->schedule();
    outcome.push_back(b->join(patience) ? "timed job" : "timed job timed out");
    std::make_shared<Member>("member", manager)->schedule();
    outcome.push_back(manager->join(&family, patience) ? "family" : "family timed out");
    auto group = std::make_shared<JobGroup>("group", 1, 1);
    auto c = make_job(
        "grouped", [](ProgressMonitor&) { return Status::ok(); }, manager);
    c->set_group(group);
    c->schedule();
    outcome.push_back(group->join(patience) ? "group" : "group timed out");
    return Directive::done;
  });
  scheduler->schedule(tasklet, Directive::sync).run();
  EXPECT_EQ(outcome, (std::vector<std::string>{"job", "timed job", "family", "group"}));
  EXPECT_TRUE(manager->join(nullptr, patience));
}

std::string runner_count_name(const ::testing::TestParamInfo<int>& param) {
  return "Runners" + std::to_string(param.param);
}

INSTANTIATE_TEST_SUITE_P(Runners, JobRunnerTest, ::testing::Values(1, 2), runner_count_name);

// ---------------------------------------------------------------------------------------------
// Removing listeners

// Blocks in its first done() until released.
class BlockingListener final : public JobListener {
 public:
  void done(const JobEvent&) override {
    if (calls.add() == 1) {
      in_call.open();
      release.wait();
    }
  }
  Counter calls;
  Gate in_call, release;
};

TEST(JobListenerRemoval, RemoveWaitsForTheCallInProgressAndNoCallFollows) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  auto blocking = std::make_shared<BlockingListener>();
  auto recorder = std::make_shared<Recorder>();
  manager->add_listener(blocking);
  manager->add_listener(recorder);
  auto first = make_job(
      "first", [](ProgressMonitor&) { return Status::ok(); }, manager);
  first->schedule();
  ASSERT_TRUE(blocking->in_call.wait());
  auto removal = std::async(std::launch::async, [&] { manager->remove_listener(blocking); });
  EXPECT_NE(removal.wait_for(0s), std::future_status::ready) << "returned while its listener was in a call";
  blocking->release.open();
  ASSERT_EQ(removal.wait_for(patience), std::future_status::ready);
  removal.get();
  auto second = make_job(
      "second", [](ProgressMonitor&) { return Status::ok(); }, manager);
  second->schedule();
  ASSERT_TRUE(recorder->dones.wait_for(2));
  EXPECT_EQ(blocking->calls.get(), 1) << "called after remove_listener returned";
}

// Blocks in scheduled() until released.
class SlowScheduled final : public JobListener {
 public:
  void scheduled(const JobEvent&) override {
    in_call.open();
    release.wait();
  }
  Gate in_call, release;
};

class CountingListener final : public JobListener {
 public:
  void scheduled(const JobEvent&) override { calls.add(); }
  void done(const JobEvent&) override { calls.add(); }
  Counter calls;
};

TEST(JobListenerRemoval, AListenerRemovedWhileItsEventIsQueuedIsNotCalled) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  auto recorder = std::make_shared<Recorder>();
  auto slow = std::make_shared<SlowScheduled>();
  auto removed = std::make_shared<CountingListener>();
  manager->add_listener(recorder);
  manager->add_listener(slow);
  manager->add_listener(removed);  // after `slow` for every event
  auto job = make_job(
      "queued", [](ProgressMonitor&) { return Status::ok(); }, manager);
  std::thread scheduler([&] { job->schedule(); });  // delivers `scheduled` on that thread
  ASSERT_TRUE(slow->in_call.wait());
  manager->remove_listener(removed);  // nothing of it is in progress: returns at once
  slow->release.open();
  scheduler.join();
  ASSERT_TRUE(recorder->dones.wait_for(1));
  EXPECT_EQ(removed->calls.get(), 0);
}

class SelfRemoving final : public JobListener, public std::enable_shared_from_this<SelfRemoving> {
 public:
  explicit SelfRemoving(std::shared_ptr<JobManager> manager) : manager_(std::move(manager)) {}
  void done(const JobEvent&) override {
    calls.add();
    manager_->remove_listener(shared_from_this());  // must not wait for this very call
    removed.open();
  }
  Counter calls;
  Gate removed;

 private:
  std::shared_ptr<JobManager> manager_;
};

TEST(JobListenerRemoval, AListenerCanRemoveItselfFromItsOwnCall) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  auto recorder = std::make_shared<Recorder>();
  auto self_removing = std::make_shared<SelfRemoving>(manager);
  manager->add_listener(self_removing);
  manager->add_listener(recorder);
  auto first = make_job(
      "first", [](ProgressMonitor&) { return Status::ok(); }, manager);
  first->schedule();
  ASSERT_TRUE(self_removing->removed.wait());
  auto second = make_job(
      "second", [](ProgressMonitor&) { return Status::ok(); }, manager);
  second->schedule();
  ASSERT_TRUE(recorder->dones.wait_for(2));
  EXPECT_EQ(self_removing->calls.get(), 1);
}

// Listeners are added and removed while other threads deliver events: none is called after its
// remove_listener returned.
TEST(JobListenerRemoval, NoCallAfterRemovalWhileEventsAreDelivered) {
  struct Watched final : JobListener {
    void scheduled(const JobEvent&) override { check(); }
    void about_to_run(const JobEvent&) override { check(); }
    void running(const JobEvent&) override { check(); }
    void done(const JobEvent&) override { check(); }
    void check() {
      calls.fetch_add(1);
      if (removed.load()) late.fetch_add(1);
    }
    std::atomic<bool> removed{false};
    std::atomic<int> calls{0};
    std::atomic<int> late{0};
  };
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  std::atomic<bool> stop{false};
  std::vector<std::thread> schedulers;
  for (int t = 0; t < 2; ++t) {
    schedulers.emplace_back([&, t] {
      auto busy = make_job(
          "busy" + std::to_string(t), [](ProgressMonitor&) { return Status::ok(); }, manager);
      while (!stop.load()) {
        busy->schedule();
        busy->join();
      }
    });
  }
  int calls = 0, late = 0;
  for (int round = 0; round < 200; ++round) {
    auto watched = std::make_shared<Watched>();
    manager->add_listener(watched);
    // Let it hear something before it goes (bounded: the schedulers keep events coming).
    eventually([&] { return watched->calls.load() > 0; });
    manager->remove_listener(watched);
    watched->removed = true;
    calls += watched->calls.load();
    late += watched->late.load();
  }
  stop = true;
  for (auto& thread : schedulers) thread.join();
  EXPECT_TRUE(manager->join(nullptr, patience));
  EXPECT_GT(calls, 0);
  EXPECT_EQ(late, 0) << "a listener was called after remove_listener returned";
}

TEST(JobListenerRemoval, AJobsOwnListenerIsRemovedTheSameWay) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  auto blocking = std::make_shared<BlockingListener>();
  auto recorder = std::make_shared<Recorder>();
  auto job = make_job(
      "observed", [](ProgressMonitor&) { return Status::ok(); }, manager);
  job->add_listener(blocking);
  job->add_listener(recorder);
  job->schedule();
  ASSERT_TRUE(blocking->in_call.wait());
  auto removal = std::async(std::launch::async, [&] { job->remove_listener(blocking); });
  EXPECT_NE(removal.wait_for(0s), std::future_status::ready);
  blocking->release.open();
  ASSERT_EQ(removal.wait_for(patience), std::future_status::ready);
  ASSERT_TRUE(recorder->dones.wait_for(1));
  job->schedule();
  ASSERT_TRUE(recorder->dones.wait_for(2));
  EXPECT_EQ(blocking->calls.get(), 1);
}

}  // namespace
}  // namespace tasklet
