// Private: waiting without holding a worker. A job that joins another job, waits for a group or
// for its rule must not keep a worker busy while it waits: the job it waits for may need that very
// worker. In one of our oneTBB tasks a wait suspends the task instead (tbb::task::suspend), and
// the worker runs other work meanwhile (Eclipse grows its worker pool for the same reason).
#pragma once

#include <condition_variable>
#include <mutex>
#include <vector>

#include <oneapi/tbb/task.h>

#include "base/timer.hpp"

namespace tasklet::detail {

/// One wait of the calling code until wake(). On an ordinary thread it blocks on a condition
/// variable; in one of our oneTBB tasks it suspends the task (the worker runs other work until the
/// task goes on).
class Wakeup {
 public:
  void wait() noexcept;
  /// Ends the wait; later calls do nothing. Unless the caller holds a lock that the waiter takes
  /// after waking, the waiter may be gone once this returns: touch nothing of it afterwards.
  void wake() noexcept;
  /// Makes it usable for another wait. Only while nobody else can reach it (no lock: it is on the
  /// uncontended begin_rule path).
  void reset() noexcept;

 private:
  std::mutex mutex_;
  std::condition_variable woken_;
  bool done_ = false;
  oneapi::tbb::task::suspend_point suspended_ = nullptr;
};

/// True when waits of the calling code suspend a oneTBB task rather than block the thread.
bool waits_suspend() noexcept;

/// A condition variable over a std::mutex whose waiters in our oneTBB tasks suspend (see Wakeup)
/// instead of blocking their worker.
class TaskCondition {
 public:
  /// Wakes every waiter. Call it holding the waiters' mutex.
  void notify_all() noexcept;

  /// With `lock` held on entry and on return: waits until `done()` or until `deadline`
  /// (Clock::time_point::max() for none); false when the time ran out first. A suspended task's
  /// timed wait needs `timer` (a manager's) to wake it; without one, or once that timer has
  /// stopped, it blocks its thread.
  template <class Predicate>
  bool wait_until(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, Predicate done,
                  Timer* timer = nullptr);

  template <class Predicate>
  void wait(std::unique_lock<std::mutex>& lock, Predicate done) {
    wait_until(lock, Clock::time_point::max(), std::move(done));
  }

 private:
  std::condition_variable threads_;
  std::vector<Wakeup*> tasks_;
};

template <class Predicate>
bool TaskCondition::wait_until(std::unique_lock<std::mutex>& lock, Clock::time_point deadline, Predicate done,
                               Timer* timer) {
  const bool timed = deadline != Clock::time_point::max();
  bool suspend = waits_suspend() && (!timed || timer != nullptr);
  for (;;) {
    if (done()) return true;
    if (timed && Clock::now() >= deadline) return false;
    if (!suspend) {
      if (timed) {
        threads_.wait_until(lock, deadline);
      } else {
        threads_.wait(lock);
      }
      continue;
    }
    Wakeup wakeup;
    tasks_.push_back(&wakeup);
    lock.unlock();
    struct WakeAlarm final : Timer::Alarm {
      explicit WakeAlarm(Wakeup& woken) : wakeup(woken) {}
      void ring() noexcept override { wakeup.wake(); }
      Wakeup& wakeup;
    } alarm(wakeup);
    bool set = false;
    try {
      set = timed && timer != nullptr && timer->set(alarm, deadline);
    } catch (...) {
      // No room for the alarm: this wait blocks the thread instead (below).
    }
    if (!timed || set) wakeup.wait();
    if (set) timer->cancel(alarm);  // waits for a ring in progress: the wakeup is ours until then
    lock.lock();
    std::erase(tasks_, &wakeup);
    if (timed && !set) suspend = false;  // the timer has stopped: block the thread from now on
  }
}

}  // namespace tasklet::detail
