// A scheduler driven by an application's loop: poll(), run_for(), run_until(), wake_loop and
// has_work().
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <latch>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;
using test::WorkerCountTest;

class PollTest : public WorkerCountTest {};
TASKLET_WORKER_COUNTS(PollTest);

// A tasklet that returns `sync` `phases` times, then ends.
std::shared_ptr<Tasklet> sync_steps(int phases, std::vector<int>& log, int id) {
  return make_tasklet([&log, id, left = phases]() mutable {
    log.push_back(id);
    return --left > 0 ? Directive::sync : Directive::done;
  });
}

TEST_P(PollTest, PollRunsTheReadySyncPhasesAndSaysHowMany) {
  std::vector<int> log;
  for (int id = 0; id < 3; ++id) scheduler().schedule(sync_steps(1, log, id), Directive::sync);
  EXPECT_EQ(scheduler().poll(), 3u);
  EXPECT_EQ(log, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(scheduler().poll(), 0u);
  EXPECT_FALSE(scheduler().has_work());
}

TEST_P(PollTest, APhaseThatBecomesReadyDuringAPollWaitsForTheNextOne) {
  std::vector<int> log;
  scheduler().schedule(sync_steps(3, log, 1), Directive::sync);
  scheduler().schedule(sync_steps(2, log, 2), Directive::sync);
  EXPECT_EQ(scheduler().poll(), 2u);
  EXPECT_EQ(scheduler().poll(), 2u);
  EXPECT_EQ(scheduler().poll(), 1u);
  EXPECT_EQ(scheduler().poll(), 0u);
  EXPECT_EQ(log, (std::vector<int>{1, 2, 1, 2, 1})) << "FIFO across polls";
}

TEST_P(PollTest, PollDoesNotWaitForAsyncPhases) {
  std::latch go(1);
  std::thread::id async_thread;
  int phase = 0;
  scheduler().schedule(make_tasklet([&] {
                         switch (phase++) {
                           case 0:
                             return Directive::async;
                           case 1:
                             async_thread = std::this_thread::get_id();
                             go.wait();
                             return Directive::sync;
                           default:
                             return Directive::done;
                         }
                       }),
                       Directive::sync);
  EXPECT_EQ(scheduler().poll(), 1u);
  EXPECT_TRUE(scheduler().has_work()) << "the async phase is waiting on the latch";
  EXPECT_TRUE(scheduler().is_running()) << "the poll's turn goes on until nothing is active";
  EXPECT_EQ(scheduler().poll(), 0u);
  go.count_down();
  scheduler().run();  // the last sync phase
  EXPECT_EQ(phase, 3);
  EXPECT_NE(async_thread, std::this_thread::get_id());
  EXPECT_FALSE(scheduler().has_work());
}

TEST_P(PollTest, RunForReturnsAtItsDeadlineWithWorkLeftAndAtOnceWhenNothingIsLeft) {
  std::shared_ptr<Tasklet> parked = make_tasklet([] { return Directive::done; });
  const Rescheduler rescheduler = scheduler().suspend(*parked);
  EXPECT_TRUE(scheduler().has_work());
  EXPECT_EQ(scheduler().active_count(), 1u);
  EXPECT_EQ(scheduler().run_for(1ms), 0u) << "the parked tasklet keeps it busy until the deadline";
  EXPECT_EQ(scheduler().run_until(std::chrono::steady_clock::now() - 1s), 0u);
  rescheduler.resume(Directive::sync);
  // Returns once nothing is active, long before an hour.
  EXPECT_EQ(scheduler().run_for(std::chrono::hours(1)), 1u);
  EXPECT_FALSE(scheduler().has_work());
}

TEST_P(PollTest, PollReportsAPhasesFailureOnce) {
  scheduler().schedule(make_tasklet([]() -> Directive { throw std::runtime_error("broken phase"); }),
                       Directive::sync);
  EXPECT_THROW(scheduler().poll(), std::runtime_error);
  ASSERT_EQ(scheduler().failures().size(), 1u);
  EXPECT_EQ(scheduler().poll(), 0u) << "reported once";
  EXPECT_TRUE(scheduler().failures().empty());
}

TEST_P(PollTest, PollFromOneOfItsOwnPhasesIsRefused) {
  std::string refused;
  scheduler().schedule(make_tasklet([&] {
                         try {
                           scheduler().poll();
                         } catch (const IllegalState& error) {
                           refused = error.what();
                         }
                         return Directive::done;
                       }),
                       Directive::sync);
  EXPECT_EQ(scheduler().poll(), 1u);
  EXPECT_EQ(refused, "poll() called from inside one of its own scheduler's phases would wait for itself");
}

TEST_P(PollTest, PollWhileHoldingWhatATaskletWaitsForIsAWaitCycle) {
  const Rule held = rules::path("/loop");
  manager_->begin_rule(held);
  bool ran = false;
  auto tasklet = make_tasklet(
      [&] {
        ran = true;
        return Directive::done;
      },
      rules::path("/loop/file"));
  tasklet->set_name("needs /loop/file");
  scheduler().schedule(tasklet, Directive::sync);
  EXPECT_THROW(scheduler().poll(), WaitCycle);
  EXPECT_FALSE(ran);
  manager_->end_rule(held);
  scheduler().run();
  EXPECT_TRUE(ran);
}

// What an application's loop does: wait for a wake call, poll, and go on while there is work.
class LoopTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    manager_ = JobManager::create(JobManager::Options{GetParam(), nullptr});
    SchedulerOptions options{manager_, nullptr, 0};
    options.wake_loop = [this] {
      {
        std::lock_guard lock(mutex_);
        ++wakes_;
      }
      woken_.notify_one();
    };
    scheduler_ = Scheduler::create(std::move(options));
  }
  void TearDown() override {
    EXPECT_FALSE(scheduler_->has_work());
    EXPECT_TRUE(scheduler_->is_running()) << "a loop-driven scheduler is always running";
  }

  // The loop: polls after each wake call until the scheduler has no work; returns the polls.
  int loop() {
    int polls = 0;
    std::size_t seen = 0;
    while (scheduler_->has_work()) {
      {
        std::unique_lock lock(mutex_);
        woken_.wait(lock, [&] { return wakes_ != seen; });
        seen = wakes_;
      }
      scheduler_->poll();
      ++polls;
    }
    return polls;
  }
  std::size_t wakes() {
    std::lock_guard lock(mutex_);
    return wakes_;
  }
  std::size_t wait_for_wakes(std::size_t count) {
    std::unique_lock lock(mutex_);
    woken_.wait(lock, [&] { return wakes_ >= count; });
    return wakes_;
  }

  // Declared before the scheduler, so they outlive it: its destructor waits for the workers,
  // which may be inside wake_loop.
  std::mutex mutex_;
  std::condition_variable woken_;
  std::size_t wakes_ = 0;
  std::shared_ptr<JobManager> manager_;
  std::shared_ptr<Scheduler> scheduler_;
};
INSTANTIATE_TEST_SUITE_P(Workers, LoopTest, ::testing::Values(1, 2, 4), test::worker_count_name);

TEST_P(LoopTest, TheLoopThreadIsTheSynchronousThreadAndHearsOfEveryReadyPhase) {
  constexpr int tasklets = 50;
  std::atomic<int> done{0};
  std::atomic<int> off_loop{0};
  const auto loop_thread = std::this_thread::get_id();
  for (int i = 0; i < tasklets; ++i) {
    scheduler_->schedule(make_tasklet([&, phase = 0]() mutable {
                           const bool sync = phase % 2 == 0;
                           if (sync != (std::this_thread::get_id() == loop_thread)) ++off_loop;
                           if (++phase < 5) return sync ? Directive::async : Directive::sync;
                           ++done;
                           return Directive::done;
                         }),
                         Directive::sync);
  }
  EXPECT_GE(wakes(), 1u);
  EXPECT_GE(loop(), 1);
  EXPECT_EQ(done.load(), tasklets);
  EXPECT_EQ(off_loop.load(), 0) << "sync phases on the loop's thread, async ones on workers";
}

TEST_P(LoopTest, AsyncWorkMayStartAtAnyTimeAndTheLoopHearsWhenItBeginsAndEnds) {
  EXPECT_TRUE(scheduler_->is_running());
  std::latch go(1);
  std::promise<void> ran;
  scheduler_->schedule(make_tasklet([&] {
                         go.wait();
                         ran.set_value();
                         return Directive::done;
                       }),
                       Directive::async);
  EXPECT_EQ(wakes(), 1u) << "from nothing active to something active";
  go.count_down();
  ran.get_future().get();
  EXPECT_EQ(wait_for_wakes(2), 2u) << "and back";
}

TEST_P(LoopTest, AKeepAliveGuardKeepsTheLoopGoing) {
  Scheduler::KeepAlive guard = scheduler_->keep_alive();
  EXPECT_TRUE(scheduler_->has_work());
  EXPECT_EQ(scheduler_->active_count(), 0u) << "a guard is not a tasklet";
  std::atomic<bool> released{false};
  std::promise<bool> ended_after_release;
  std::thread loop_thread([&] {
    loop();
    ended_after_release.set_value(released.load());
  });
  std::promise<std::thread::id> synced;
  scheduler_->schedule(make_tasklet([&] {
                         synced.set_value(std::this_thread::get_id());
                         return Directive::done;
                       }),
                       Directive::sync);
  EXPECT_EQ(synced.get_future().get(), loop_thread.get_id());
  released = true;
  guard.reset();
  EXPECT_TRUE(ended_after_release.get_future().get()) << "the loop ends only once the guard is gone";
  loop_thread.join();
}

}  // namespace
}  // namespace tasklet
