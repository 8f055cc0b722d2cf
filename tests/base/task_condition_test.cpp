// Waits that hold no worker: on an ordinary thread a Wakeup or TaskCondition blocks; in one of the
// engine's oneTBB tasks it suspends the task, so that the task it waits for can run even on the
// only worker.
#include "base/task_condition.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <latch>
#include <memory>
#include <mutex>
#include <thread>

#include "base/context.hpp"
#include "base/timer.hpp"
#include "base/workers_impl.hpp"

namespace tasklet::detail {
namespace {

using namespace std::chrono_literals;

// What the scheduler layer installs for each of its oneTBB tasks: a state of the task's own that
// names the workers running it, so that its waits suspend.
class OurTask {
 public:
  explicit OurTask(WorkersImpl& workers) noexcept {
    ThreadContext& ctx = context();
    mine_.outer = ctx.state;
    mine_.worker_of = &workers;
    ctx.state = &mine_;
  }
  ~OurTask() { context().state = mine_.outer; }
  OurTask(const OurTask&) = delete;
  OurTask& operator=(const OurTask&) = delete;

 private:
  TaskState mine_;
};

TEST(WakeupTest, OnAThreadAWakeBeforeTheWaitIsNotLostAndOneAfterItEndsIt) {
  EXPECT_FALSE(waits_suspend());
  Wakeup early;
  early.wake();
  early.wait();  // returns at once

  Wakeup later;
  std::thread waker([&] { later.wake(); });
  later.wait();
  waker.join();

  later.reset();
  later.wake();
  later.wake();  // a second wake does nothing
  later.wait();
}

TEST(WakeupTest, AWaitInOneOfOurTasksSuspendsItAndFreesTheOnlyWorker) {
  WorkersImpl workers(1);
  Wakeup wakeup;
  std::latch done(2);
  bool suspended_here = false;
  bool state_came_back = false;
  workers.arena().enqueue([&] {
    OurTask task(workers);
    suspended_here = waits_suspend();
    wakeup.wait();  // blocking here would keep the task below from ever running
    state_came_back = state().worker_of == &workers;
    done.count_down();
  });
  workers.arena().enqueue([&] {
    wakeup.wake();
    done.count_down();
  });
  done.wait();
  EXPECT_TRUE(suspended_here);
  EXPECT_TRUE(state_came_back) << "the task's state did not travel with it";
}

constexpr FrameKind test_frame{"test frame"};

TEST(WakeupTest, ARoomsFrameTravelsWithTheSuspendedTaskAndNoOtherTaskSeesIt) {
  WorkersImpl workers(1);
  Wakeup wakeup;
  std::latch done(2);
  int owner = 0;
  const TaskFrame unset{&test_frame, nullptr, nullptr};
  const TaskFrame* seen_meanwhile = &unset;
  bool seen_after = false;  // the frame, with its owner, once the task came back
  bool popped = false;
  workers.arena().enqueue([&] {
    OurTask task(workers);
    {
      const FrameScope frame(test_frame, &owner);
      wakeup.wait();  // the task below runs on the only worker meanwhile
      const TaskFrame* after = find_frame(state(), test_frame);  // read while the frame lives
      seen_after = after != nullptr && after->owner == &owner;
    }
    popped = find_frame(state(), test_frame) == nullptr;
    done.count_down();
  });
  workers.arena().enqueue([&] {
    OurTask task(workers);
    seen_meanwhile = find_frame(state(), test_frame);
    wakeup.wake();
    done.count_down();
  });
  done.wait();
  EXPECT_EQ(seen_meanwhile, nullptr) << "another task saw the suspended task's frame";
  EXPECT_TRUE(seen_after) << "the frame did not travel with the task";
  EXPECT_TRUE(popped);
  EXPECT_EQ(find_frame(state(), test_frame), nullptr);
}

TEST(TaskConditionTest, OnAThreadItWaitsForThePredicateAndATimedWaitRunsOut) {
  std::mutex mutex;
  TaskCondition condition;
  bool ready = false;
  std::thread notifier([&] {
    std::lock_guard lock(mutex);
    ready = true;
    condition.notify_all();
  });
  {
    std::unique_lock lock(mutex);
    condition.wait(lock, [&] { return ready; });
    EXPECT_TRUE(lock.owns_lock());
  }
  notifier.join();

  std::unique_lock lock(mutex);
  const Clock::time_point deadline = Clock::now() + 5ms;
  EXPECT_FALSE(condition.wait_until(lock, deadline, [] { return false; }));
  EXPECT_GE(Clock::now(), deadline);
  EXPECT_TRUE(condition.wait_until(lock, Clock::now() - 1s, [] { return true; }));
}

TEST(TaskConditionTest, ATaskWaitingOnTheOnlyWorkerLetsTheTaskItWaitsForRun) {
  WorkersImpl workers(1);
  auto timer = std::make_shared<Timer>();
  std::mutex mutex;
  TaskCondition condition;
  bool ready = false;
  bool satisfied = false;
  std::latch done(2);
  workers.arena().enqueue([&] {
    OurTask task(workers);
    std::unique_lock lock(mutex);
    // A deadline far away: only the task below can end this wait.
    satisfied = condition.wait_until(
        lock, Clock::now() + 1h, [&] { return ready; }, timer.get());
    done.count_down();
  });
  workers.arena().enqueue([&] {
    std::lock_guard lock(mutex);
    ready = true;
    condition.notify_all();
    done.count_down();
  });
  done.wait();
  EXPECT_TRUE(satisfied);
  timer->stop();
}

TEST(TaskConditionTest, ASuspendedTasksTimedWaitEndsAtItsDeadlineThroughTheTimer) {
  WorkersImpl workers(1);
  auto timer = std::make_shared<Timer>();
  std::mutex mutex;
  TaskCondition condition;
  bool satisfied = true;
  Clock::time_point deadline{};
  Clock::time_point ended{};
  std::latch done(1);
  workers.arena().enqueue([&] {
    OurTask task(workers);
    std::unique_lock lock(mutex);
    deadline = Clock::now() + 20ms;
    satisfied = condition.wait_until(
        lock, deadline, [] { return false; }, timer.get());
    ended = Clock::now();
    done.count_down();
  });
  done.wait();
  EXPECT_FALSE(satisfied);
  EXPECT_GE(ended, deadline);
  timer->stop();
}

}  // namespace
}  // namespace tasklet::detail
