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

// A room's own per-task state, as the scheduler's RunState: this room's TaskState and more.
struct RoomState : TaskState {
  const int* mark = nullptr;
};

// What the scheduler layer installs for each of its oneTBB tasks: a state of the task's own that
// names the workers running it, so that its waits suspend.
class OurTask {
 public:
  OurTask(WorkersImpl& workers, const int* mark = nullptr) noexcept {
    ThreadContext& ctx = context();
    mine_.outer = ctx.state;
    mine_.worker_of = &workers;
    mine_.mark = mark;
    ctx.state = &mine_;
  }
  ~OurTask() { context().state = mine_.outer; }
  OurTask(const OurTask&) = delete;
  OurTask& operator=(const OurTask&) = delete;

 private:
  RoomState mine_;
};

// The mark of the room state running here, or null.
const int* running_mark() noexcept {
  const TaskState* state = running_state();
  return state != nullptr ? static_cast<const RoomState*>(state)->mark : nullptr;
}

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
    state_came_back = runs_on_workers(&workers);
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

TEST(WakeupTest, ARoomsStateTravelsWithTheSuspendedTaskAndNoOtherTaskSeesIt) {
  WorkersImpl workers(1);
  Wakeup wakeup;
  std::latch done(2);
  const int first = 1, second = 2;
  const int* seen_meanwhile = nullptr;
  const int* seen_after = nullptr;
  workers.arena().enqueue([&] {
    OurTask task(workers, &first);
    wakeup.wait();  // the task below runs on the only worker meanwhile
    seen_after = running_mark();
    done.count_down();
  });
  workers.arena().enqueue([&] {
    OurTask task(workers, &second);
    seen_meanwhile = running_mark();
    wakeup.wake();
    done.count_down();
  });
  done.wait();
  EXPECT_EQ(seen_meanwhile, &second) << "another task saw the suspended task's state";
  EXPECT_EQ(seen_after, &first) << "the state did not travel with the task";
  EXPECT_EQ(running_state(), nullptr) << "this thread ran nothing of ours";
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
