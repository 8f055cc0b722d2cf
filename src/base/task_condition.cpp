#include "base/task_condition.hpp"

#include "base/context.hpp"
#include "base/trace.hpp"

namespace tasklet::detail {

bool waits_suspend() noexcept { return runs_on_workers(); }

void Wakeup::wait() noexcept {
  TaskState* mine = running_state();
  if (mine == nullptr || mine->worker_of == nullptr) {
    std::unique_lock lock(mutex_);
    woken_.wait(lock, [this] { return done_; });
    return;
  }
  // What this task knows leaves the thread with it and comes back on the thread that resumes it.
  if (mine->traced_phase != nullptr) mine->traced_phase->cut();
  context().state = mine->outer;
  oneapi::tbb::task::suspend([this](oneapi::tbb::task::suspend_point point) {
    std::unique_lock lock(mutex_);
    if (done_) {
      lock.unlock();
      oneapi::tbb::task::resume(point);
    } else {
      suspended_ = point;
    }
  });
  auto& resumed_on = context();
  mine->outer = resumed_on.state;
  resumed_on.state = mine;
  if (mine->traced_phase != nullptr) mine->traced_phase->go_on();
  std::lock_guard lock(mutex_);  // what the waker wrote before wake() is visible from here on
}

void Wakeup::wake() noexcept {
  std::unique_lock lock(mutex_);
  if (done_) return;
  done_ = true;
  if (oneapi::tbb::task::suspend_point point = suspended_) {
    lock.unlock();
    oneapi::tbb::task::resume(point);
  } else {
    woken_.notify_one();
  }
}

void Wakeup::reset() noexcept {
  done_ = false;
  suspended_ = nullptr;
}

void TaskCondition::notify_all() noexcept {
  threads_.notify_all();
  for (Wakeup* wakeup : tasks_) wakeup->wake();
  tasks_.clear();
}

}  // namespace tasklet::detail
