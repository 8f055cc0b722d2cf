// Fault injection: out of memory at every allocation a public operation makes on the calling thread.
// Each operation runs again and again with its 1st, 2nd, 3rd ... allocation failing (operator new,
// replaced in this binary, and the library's pooled allocator through its test seam), until a run
// makes fewer allocations than the one that would fail. After each run the operation either threw
// std::bad_alloc and left nothing behind, or completed, and what it started either ran or ended
// with the error where its owner hears of it (the job's result, run()'s or wait()'s exception);
// either way the rule table is left clear and every job can be scheduled again and runs. LSan (the
// ASan lane) checks that nothing leaked.
//
// The worker side is injected too: a job's body (or a tasklet's phase) arms the n-th allocation of
// its worker from then on, so that it fails in what follows the body there: the run's end, the
// release of its rule, the grants that release delivers, the listeners' events and the group's
// bookkeeping.
#include <atomic>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/exclusion_check.hpp"
#include "support/failing_allocation.hpp"
#include "support/job_support.hpp"
#include "tasklet.hpp"
#include "tasklet/coroutine.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;
using test::FailLater;
using test::FailNth;
using test::patience;

// Runs `operation` with its n-th allocation failing, for n = 1, 2, ... until it makes no n-th
// allocation. `prepare()` runs before each attempt and `after(n, threw, fired)` after it, both
// outside the injection. Returns how many allocations the operation makes.
long sweep(const std::function<void()>& prepare, const std::function<void()>& operation,
           const std::function<void(long, bool, bool)>& after) {
  for (long n = 1; n < 10'000; ++n) {
    prepare();
    bool threw = false;
    bool fired = false;
    {
      const FailNth failing(n);
      try {
        operation();
      } catch (const std::bad_alloc&) {
        threw = true;
      }
      fired = failing.fired();
    }
    after(n, threw, fired);
    if (::testing::Test::HasFatalFailure()) return n;
    if (!fired) return n - 1;
  }
  ADD_FAILURE() << "the operation never stopped allocating";
  return 0;
}

// Whatever an attempt did, the job can be scheduled again once it is over, and then runs.
void expect_runs_again(Job& job, long n) {
  ASSERT_TRUE(job.join(patience)) << job.name() << ", allocation " << n;
  job.schedule();
  ASSERT_TRUE(job.join(patience)) << job.name() << ", allocation " << n;
  EXPECT_TRUE(job.result().is_ok()) << job.result().message;
}

class FaultInjectionTest : public ::testing::Test {
 protected:
  void expect_table_clear(long n) {
    const auto stats = manager_->rule_stats();
    EXPECT_EQ(stats.held, 0u) << "allocation " << n;
    EXPECT_EQ(stats.waiting, 0u) << "allocation " << n;
    EXPECT_EQ(manager_->current_rule(), nullptr) << "allocation " << n;
  }

  std::shared_ptr<JobManager> manager_ = JobManager::create(JobManager::Options{2, nullptr});
};

// With one worker, everything after the first job's body runs on the armed worker: that job's end,
// and the next jobs' starts (should_run, the progress monitor, the about_to_run and running events
// of their listeners), runs and ends.
class OneWorkerFaultTest : public FaultInjectionTest {
 protected:
  OneWorkerFaultTest() { manager_ = JobManager::create(JobManager::Options{1, nullptr}); }
};

// make_job, set_rule and schedule() of a job that waits for a rule this thread holds.
TEST_F(FaultInjectionTest, MakingAndSchedulingAJobThatWaitsForARule) {
  const Rule held = rules::path("/data");
  std::atomic<int> runs{0};
  std::shared_ptr<Job> job;
  bool scheduled = false;
  const long allocations = sweep(
      [&] {
        job = nullptr;
        scheduled = false;
        manager_->begin_rule(held);
      },
      [&] {
        job = make_job(
            "victim",
            [&](ProgressMonitor&) {
              runs.fetch_add(1);
              return Status::ok();
            },
            manager_);
        job->set_rule(rules::path("/data/a/b"));
        job->schedule();
        scheduled = true;
      },
      [&](long n, bool threw, bool fired) {
        EXPECT_EQ(threw, fired && !scheduled) << "allocation " << n;
        if (job != nullptr && !scheduled) {
          EXPECT_EQ(job->state(), JobState::none)
              << "schedule() threw and left the job scheduled, allocation " << n;
        }
        const int before = runs.load();  // it cannot run before the rule is free
        manager_->end_rule(held);
        if (job != nullptr && scheduled) {
          // It ran, or it ended for lack of memory on the way, saying so in its result.
          ASSERT_TRUE(job->join(patience)) << "allocation " << n;
          const Status result = job->result();
          if (result.is_ok()) {
            EXPECT_EQ(runs.load(), before + 1) << "allocation " << n;
          } else {
            EXPECT_NE(result.message.find("out of memory"), std::string::npos) << result.message;
            EXPECT_EQ(runs.load(), before) << "allocation " << n;
          }
        }
        if (job != nullptr) expect_runs_again(*job, n);
        expect_table_clear(n);
      });
  EXPECT_GT(allocations, 3);
}

// schedule() of a job with a group, a delay and a listener of its own.
TEST_F(FaultInjectionTest, SchedulingAJobWithAGroupADelayAndAListener) {
  auto group = std::make_shared<JobGroup>("g", 1, 0);
  auto listener = std::make_shared<test::Recorder>();
  std::shared_ptr<Job> job;
  bool scheduled = false;
  const long allocations = sweep(
      [&] {
        job = make_job(
            "grouped", [](ProgressMonitor&) { return Status::ok(); }, manager_);
        job->set_group(group);
        job->add_listener(listener);
        job->set_rule(rules::read_path("/shared/file"));
        scheduled = false;
      },
      [&] {
        job->schedule(1ms);
        scheduled = true;
      },
      [&](long n, bool threw, bool fired) {
        EXPECT_EQ(threw, fired && !scheduled) << "allocation " << n;
        if (!scheduled) {
          EXPECT_EQ(job->state(), JobState::none) << "allocation " << n;
        }
        const int dones = listener->dones.get();
        ASSERT_TRUE(job->join(patience)) << "allocation " << n;
        if (scheduled) {
          EXPECT_TRUE(job->result().is_ok()) << job->result().message;
          EXPECT_TRUE(listener->dones.wait_for(dones + 1)) << "allocation " << n;
        }
        expect_runs_again(*job, n);
        expect_table_clear(n);
      });
  EXPECT_GE(allocations, 2);
}

// begin_rule / end_rule, nested, on this thread.
TEST_F(FaultInjectionTest, BeginningAndEndingNestedRules) {
  const Rule outer = rules::path("/x");
  const long allocations = sweep([] {},
                                 [&] {
                                   manager_->begin_rule(outer);  // on failure it holds nothing
                                   try {
                                     const Rule inner = rules::path("/x/y");
                                     manager_->begin_rule(inner);
                                     manager_->end_rule(inner);
                                   } catch (...) {
                                     manager_->end_rule(outer);
                                     throw;
                                   }
                                   manager_->end_rule(outer);
                                 },
                                 [&](long n, bool threw, bool fired) {
                                   EXPECT_EQ(threw, fired) << "allocation " << n;
                                   expect_table_clear(n);
                                 });
  EXPECT_GE(allocations, 2);
}

// A tasklet with a path rule scheduled from outside run(), then run.
TEST_F(FaultInjectionTest, SchedulingATaskletWithARule) {
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  int runs = 0;
  bool scheduled = false;
  const long allocations = sweep([&] { scheduled = false; },
                                 [&] {
                                   scheduler->schedule(make_tasklet(
                                                           [&] {
                                                             ++runs;
                                                             return Directive::done;
                                                           },
                                                           rules::path("/t/a")),
                                                       Directive::sync);
                                   scheduled = true;
                                 },
                                 [&](long n, bool threw, bool fired) {
                                   EXPECT_EQ(threw, fired && !scheduled) << "allocation " << n;
                                   const int before = runs;
                                   // Scheduled, it runs, or it ended for lack of memory on the way
                                   // and run() reports that.
                                   bool reported = false;
                                   try {
                                     scheduler->run();
                                   } catch (const std::bad_alloc&) {
                                     reported = true;
                                   }
                                   EXPECT_EQ(runs + (reported ? 1 : 0), before + (scheduled ? 1 : 0))
                                       << "allocation " << n;
                                   EXPECT_EQ(scheduler->active_count(), 0u) << "allocation " << n;
                                   expect_table_clear(n);
                                 });
  EXPECT_GE(allocations, 3);
}

// suspend() and resume_after() of an idle tasklet, then schedule_after() of another: out of
// memory, each leaves nothing behind that could keep run() waiting.
TEST_F(FaultInjectionTest, SuspendingAndDelayingTasklets) {
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  int runs = 0;
  std::shared_ptr<Tasklet> suspended;
  bool delayed = false;
  const auto counted = [&runs] {
    return make_tasklet([&runs] {
      ++runs;
      return Directive::done;
    });
  };
  const long allocations = sweep(
      [&] {
        suspended = counted();
        delayed = false;
      },
      [&] {
        scheduler->suspend(*suspended).resume_after(1ms, Directive::sync);
        delayed = true;
        scheduler->schedule_after(1ms, counted(), Directive::sync);
      },
      [&](long n, bool threw, bool fired) {
        EXPECT_EQ(threw, fired) << "allocation " << n;
        const int before = runs;
        // A failed resume_after leaves it parked without a Rescheduler: lost once we let go.
        suspended.reset();
        bool lost = false;
        try {
          scheduler->run();
        } catch (const TaskletLost&) {
          lost = true;
        }
        if (!threw) {
          EXPECT_EQ(runs, before + 2) << "allocation " << n;
        } else {
          EXPECT_EQ(runs, before + (delayed ? 1 : 0)) << "allocation " << n;
          EXPECT_FALSE(delayed && lost) << "allocation " << n;
        }
        EXPECT_EQ(scheduler->active_count(), 0u) << "allocation " << n;
      });
  EXPECT_GE(allocations, 3);
}

// A phase that suspends itself and returns wait, run here by api::with: out of memory, it ends
// (its Rescheduler finds the suspension over, run() reports the failure) or it parks and resumes.
TEST_F(FaultInjectionTest, ParkingATaskletThatSuspendedItself) {
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  std::optional<Rescheduler> kept;
  int resumed = 0;
  const long allocations = sweep([&] { kept.reset(); },
                                 [&] {
                                   api::with(*scheduler, make_tasklet([&, phase = 0](Tasklet& self) mutable {
                                     if (phase++ > 0) {
                                       ++resumed;
                                       return Directive::done;
                                     }
                                     kept = api::current().suspend(self);
                                     return Directive::wait;
                                   }));
                                 },
                                 [&](long n, bool threw, bool) {
                                   const int before = resumed;
                                   bool parked = false;
                                   if (kept) {
                                     try {
                                       kept->resume(Directive::sync);
                                       parked = true;
                                     } catch (const AlreadyResumed&) {
                                     }
                                   }
                                   bool failed = false;
                                   try {
                                     scheduler->run();
                                   } catch (const std::bad_alloc&) {
                                     failed = true;
                                   }
                                   EXPECT_EQ(resumed, before + (parked ? 1 : 0)) << "allocation " << n;
                                   EXPECT_TRUE(parked || failed || threw)
                                       << "allocation " << n << ": it neither ran on nor failed";
                                   EXPECT_EQ(scheduler->active_count(), 0u) << "allocation " << n;
                                 });
  EXPECT_GE(allocations, 2);
}

// SerialExecutor::post.
TEST_F(FaultInjectionTest, PostingToASerialExecutor) {
  SerialExecutor executor(manager_, "log");
  std::atomic<int> runs{0};
  int before = 0;
  bool posted = false;
  const long allocations = sweep(
      [&] {
        posted = false;
        before = runs.load();  // the executor is idle: the last attempt waited for it
      },
      [&] {
        executor.post([&] { runs.fetch_add(1); });
        posted = true;
      },
      [&](long n, bool threw, bool fired) {
        EXPECT_EQ(threw, fired && !posted) << "allocation " << n;
        // Posted, it runs, or it ended for lack of memory on the way and
        // wait() reports that.
        bool reported = false;
        try {
          executor.wait();
        } catch (const std::bad_alloc&) {
          reported = true;
        }
        EXPECT_EQ(runs.load() + (reported ? 1 : 0), before + (posted ? 1 : 0)) << "allocation " << n;
        EXPECT_EQ(executor.outstanding(), 0u) << "allocation " << n;
      });
  EXPECT_GE(allocations, 3);
}

// Runs `round(n)` with the n-th allocation after the body that arms it failing, for n = 1, 2, ...
// until the armed allocation no longer fails. Returns how many allocations followed the body.
long sweep_worker(const std::function<void(long)>& round) {
  for (long n = 1; n < 10'000; ++n) {
    round(n);
    const bool fired = FailLater::disarm();
    if (::testing::Test::HasFatalFailure() || !fired) return n - 1;
  }
  ADD_FAILURE() << "the end of a run never stopped allocating";
  return 0;
}

// The result a job ended with, after a run whose end may have run out of memory.
void expect_ran_or_out_of_memory(const Job& job, long n) {
  const Status result = job.result();
  if (result.is_ok()) return;
  EXPECT_NE(result.message.find("out of memory"), std::string::npos)
      << job.name() << ", allocation " << n << ": " << result.message;
}

// when_all's task parks, and its worker runs out of memory from then on (parking the task, resuming
// it, ending it). The manager's background scheduler runs it beside a serial executor's tasks: a
// task the engine abandons there is told so as what it is, so when_all's awaiter goes on (with the
// error, or the value) and the executor hears of nothing. With one worker, `after_park` (scheduled
// before the park) runs only once the park is over, so the test resumes a task that has parked or
// was abandoned, never one still on its way to the park.
Task<void> parks_once(std::promise<Rescheduler>& handed, Job& after_park, long n) {
  co_await wait([&handed, &after_park, n](Rescheduler resume) {
    after_park.schedule();
    handed.set_value(std::move(resume));
    FailLater::arm(n);
  });
}

TEST_F(OneWorkerFaultTest, AWhenAllTaskAbandonedBesideASerialExecutor) {
  SerialExecutor executor(manager_, "beside");
  const auto after_park = make_job(
      "after the park", [](ProgressMonitor&) { return Status::ok(); }, manager_);
  int abandoned = 0;  // rounds in which the task could not park: its Rescheduler found it ended
  sweep_worker([&](long n) {
    std::promise<Rescheduler> handed;
    auto job = make_job(
        "fans out",
        [&handed, &after_park, n](ProgressMonitor&) -> Task<Status> {
          try {
            co_await when_all(parks_once(handed, *after_park, n));
          } catch (const std::bad_alloc&) {
            co_return Status::error("out of memory in when_all");
          }
          co_return Status::ok();
        },
        manager_);
    job->schedule();
    const Rescheduler parked = handed.get_future().get();
    ASSERT_TRUE(after_park->join(patience)) << "allocation " << n;
    try {
      parked.resume(Directive::async);
    } catch (const AlreadyResumed&) {
      ++abandoned;
    }
    ASSERT_TRUE(job->join(patience)) << "allocation " << n << ": when_all's awaiter never went on";
    expect_ran_or_out_of_memory(*job, n);
    executor.post([] {});
    EXPECT_NO_THROW(executor.wait()) << "allocation " << n;
  });
  EXPECT_GE(abandoned, 1);
  expect_table_clear(0);
}

// `count` jobs on `rule`, named `name` and their number: the first arms the n-th allocation of its
// worker from then on (n read from `arm`) and fails; the others end ok. `runs` counts their runs.
std::vector<std::shared_ptr<Job>> first_arms_and_fails(const std::string& name, int count, const Rule& rule,
                                                       const std::atomic<long>& arm, std::atomic<int>& runs,
                                                       const std::shared_ptr<JobManager>& manager) {
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < count; ++i) {
    jobs.push_back(make_job(
        name + " " + std::to_string(i),
        [&arm, &runs, i](ProgressMonitor&) {
          runs.fetch_add(1);
          if (i != 0) return Status::ok();
          FailLater::arm(arm.load());
          return Status::error("the body failed");
        },
        manager));
    jobs.back()->set_rule(rule);
  }
  return jobs;
}

// A job's run fails and ends on a worker that runs out of memory on the way: the copy of the
// result the job keeps, the release of its mutex rule and the grant of the jobs queued behind it.
// Plain jobs, without listeners or groups (a plain job that ends ok allocates nothing there).
TEST_F(FaultInjectionTest, EndingAFailedJobAndGrantingTheNextOnAWorker) {
  const Rule rule = rules::mutex();
  std::atomic<long> arm{0};
  std::atomic<int> runs{0};
  const auto jobs = first_arms_and_fails("queued", 3, rule, arm, runs, manager_);
  const long allocations = sweep_worker([&](long n) {
    arm.store(n);
    manager_->begin_rule(rule);  // so that the other two queue behind the first
    for (const auto& job : jobs) job->schedule();
    manager_->end_rule(rule);
    for (const auto& job : jobs) {
      ASSERT_TRUE(job->join(patience)) << job->name() << ", allocation " << n;
      EXPECT_EQ(job->state(), JobState::none) << job->name();
    }
    EXPECT_TRUE(jobs[0]->result().is_error()) << "allocation " << n;
    for (std::size_t i = 1; i < jobs.size(); ++i) expect_ran_or_out_of_memory(*jobs[i], n);
    expect_table_clear(n);
  });
  EXPECT_GE(allocations, 1);
  // Every job still runs.
  FailLater::disarm();
  arm.store(0);
  for (const auto& job : jobs) job->schedule();
  for (const auto& job : jobs) {
    ASSERT_TRUE(job->join(patience)) << job->name();
    EXPECT_EQ(job->result().is_ok(), job != jobs[0]) << job->result().message;
  }
  expect_table_clear(0);
}

// The same with a listener and a group: the failed job's result is kept and counted by its group,
// which then cancels itself (the other jobs end canceled, or ran if they were faster), on the
// worker; the done events are made there.
TEST_F(FaultInjectionTest, EndingAGroupedJobWithAListenerOnAWorker) {
  const Rule rule = rules::path("/grouped");
  auto group = std::make_shared<JobGroup>("g", 0, 0);
  auto listener = std::make_shared<test::Recorder>();
  std::atomic<long> arm{0};
  std::atomic<int> runs{0};
  const auto jobs = first_arms_and_fails("grouped", 3, rule, arm, runs, manager_);
  for (const auto& job : jobs) {
    job->set_group(group);
    job->add_listener(listener);
  }
  const long allocations = sweep_worker([&](long n) {
    arm.store(n);
    const int dones = listener->dones.get();
    manager_->begin_rule(rule);
    for (const auto& job : jobs) job->schedule();
    manager_->end_rule(rule);
    for (const auto& job : jobs) ASSERT_TRUE(job->join(patience)) << job->name() << ", allocation " << n;
    ASSERT_TRUE(group->join(patience)) << "allocation " << n;
    // A listener that runs out of memory itself misses one.
    EXPECT_TRUE(listener->dones.wait_for(dones + 2)) << "allocation " << n;
    EXPECT_TRUE(jobs[0]->result().is_error()) << "allocation " << n;
    for (std::size_t i = 1; i < jobs.size(); ++i) {
      if (!jobs[i]->result().is_canceled()) expect_ran_or_out_of_memory(*jobs[i], n);
    }
    expect_table_clear(n);
  });
  EXPECT_GE(allocations, 1);
}

TEST_F(OneWorkerFaultTest, StartingRunningAndEndingJobsOnTheArmedWorker) {
  const Rule rule = rules::mutex();
  auto listener = std::make_shared<test::Recorder>();
  std::atomic<long> arm{0};
  std::atomic<int> runs{0};
  const auto jobs = first_arms_and_fails("one worker", 4, rule, arm, runs, manager_);
  for (std::size_t i = 1; i < jobs.size(); i += 2) jobs[i]->add_listener(listener);
  const long allocations = sweep_worker([&](long n) {
    arm.store(n);
    runs.store(0);
    manager_->begin_rule(rule);
    for (const auto& job : jobs) job->schedule();
    manager_->end_rule(rule);
    for (const auto& job : jobs) ASSERT_TRUE(job->join(patience)) << job->name() << ", allocation " << n;
    EXPECT_TRUE(jobs[0]->result().is_error()) << "allocation " << n;
    int unrun = 0;
    for (std::size_t i = 1; i < jobs.size(); ++i) {
      expect_ran_or_out_of_memory(*jobs[i], n);
      if (!jobs[i]->result().is_ok()) ++unrun;
    }
    // A job that ended for lack of memory ran or not; none ran twice, none was lost.
    EXPECT_LE(runs.load(), static_cast<int>(jobs.size())) << "allocation " << n;
    EXPECT_GE(runs.load(), static_cast<int>(jobs.size()) - unrun) << "allocation " << n;
    expect_table_clear(n);
  });
  EXPECT_GE(allocations, 4);  // the failed result's copy and three progress monitors at least
}

// A tasklet's async phase ends on a worker that runs out of memory on the way: its rule's release
// and the grants of the tasklets queued behind it (readers under the path it writes: one release
// grants them all). run() returns, reporting the error if one of them could not run.
TEST_F(FaultInjectionTest, EndingATaskletPhaseAndGrantingTheNextOnAWorker) {
  constexpr int readers = 8;
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  std::atomic<int> runs{0};
  const long allocations = sweep_worker([&](long n) {
    runs.store(0);
    int lost = 0;
    scheduler->schedule(make_tasklet([&] {
                          for (int i = 0; i <= readers; ++i) {
                            Rule rule =
                                i == 0 ? rules::path("/t") : rules::read_path("/t/" + std::to_string(i));
                            scheduler->schedule(make_tasklet(
                                                    [&, i] {
                                                      if (i == 0) FailLater::arm(n);
                                                      runs.fetch_add(1);
                                                      return Directive::done;
                                                    },
                                                    std::move(rule)),
                                                Directive::async);
                          }
                          return Directive::done;
                        }),
                        Directive::sync);
    for (;;) {
      try {
        scheduler->run();
        break;
      } catch (const std::bad_alloc&) {
        ++lost;  // reported, once per tasklet that ended unrun
      }
    }
    EXPECT_EQ(runs.load() + lost, readers + 1) << "allocation " << n;
    EXPECT_EQ(scheduler->active_count(), 0u) << "allocation " << n;
    expect_table_clear(n);
  });
  EXPECT_GE(allocations, 1);
}

}  // namespace
}  // namespace tasklet
