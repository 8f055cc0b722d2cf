// Fault injection: out of memory at every allocation a public operation makes on the calling thread.
// Each operation runs again and again with its 1st, 2nd, 3rd ... allocation failing (operator new,
// replaced in this binary, and the library's pooled allocator through its test seam), until a run
// makes fewer allocations than the one that would fail. After each run the operation either threw
// std::bad_alloc and left nothing behind, or completed, and what it started either ran or ended
// with the error where its owner hears of it (the job's result, run()'s or wait()'s exception);
// either way the rule table is left clear and every job can be scheduled again and runs. LSan (the
// ASan lane) checks that nothing leaked.
//
// Only the calling thread's allocations fail: grants delivered on it are injected, those delivered
// on the workers (and the runs and ends there) are not.
#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <string>

#include <gtest/gtest.h>

#include "support/failing_allocation.hpp"
#include "support/job_support.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;
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
        if (job != nullptr) {  // whatever happened, it can run again
          ASSERT_TRUE(job->join(patience)) << "allocation " << n;
          job->schedule();
          ASSERT_TRUE(job->join(patience)) << "allocation " << n;
          EXPECT_TRUE(job->result().is_ok()) << job->result().message;
        }
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
        job->schedule();
        ASSERT_TRUE(job->join(patience)) << "allocation " << n;
        EXPECT_TRUE(job->result().is_ok()) << job->result().message;
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

}  // namespace
}  // namespace tasklet
