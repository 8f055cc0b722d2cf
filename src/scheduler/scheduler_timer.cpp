// Delays: tasklets that start, and suspensions that are resumed, once a delay has passed. They
// wait in one time-ordered map per scheduler, which sets one alarm of the manager's timer for its
// earliest entry; the timer thread starts or resumes them as schedule() and resume() would.
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "scheduler/scheduler_impl.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/error.hpp"

namespace tasklet {

using detail::TaskletAccess;
namespace st = detail::word;

void detail::SchedulerImpl::schedule_after(Clock::duration delay, TaskletPtr tasklet, Directive directive) {
  if (!tasklet) throw std::invalid_argument("schedule_after: null tasklet");
  if (delay <= Clock::duration::zero() || directive == Directive::done) {
    schedule(std::move(tasklet), directive);
    return;
  }
  const Clock::time_point when = Clock::now() + delay;
  claim(*tasklet, "schedule_after");
  count_claimed(*tasklet, directive, "schedule_after");  // now: run() waits for the delay and the run
  try {
    add_delayed(when, Delayed{tasklet, nullptr, directive});
  } catch (...) {
    uncount_active();
    unclaim(*tasklet);
    throw;
  }
}

void detail::SchedulerImpl::resume_after(const TaskletPtr& tasklet,
                                         std::shared_ptr<const Suspension> suspension, Clock::duration delay,
                                         Directive directive) {
  if (delay <= Clock::duration::zero()) {
    resume(tasklet, suspension->generation, directive);
    return;
  }
  const Clock::time_point when = Clock::now() + delay;
  check_resumable(*tasklet, TaskletAccess::state(*tasklet).load(std::memory_order_acquire),
                  suspension->generation, directive);
  add_delayed(when, Delayed{nullptr, std::move(suspension), directive});
}

void detail::SchedulerImpl::add_delayed(Clock::time_point when, Delayed entry) {
  std::lock_guard lock(delayed_mutex_);
  const auto at = delayed_.emplace(when, std::move(entry));
  if (at != delayed_.begin()) return;  // the alarm is set for an earlier one already
  bool set = false;
  try {
    set = !delays_closed_ && domain_.timer_->set(delay_alarm_, when);
  } catch (...) {
    delayed_.erase(at);
    throw;
  }
  if (!set) {
    delayed_.erase(at);
    throw IllegalState("a delay on a scheduler whose job manager has shut down would never end");
  }
}

void detail::SchedulerImpl::delays_due() noexcept {
  // A start or resume may let go of the scheduler's last owner: the scheduler then goes after this
  // ring, not during it (its destructor waits for the ring on any other thread).
  const std::shared_ptr<Scheduler> keep = self_.weak_from_this().lock();
  if (!keep) return;  // being destroyed: its destructor takes what is left
  std::unique_lock lock(delayed_mutex_);
  while (!delays_closed_ && !delayed_.empty()) {
    const auto first = delayed_.begin();
    if (Clock::now() < first->first) {
      domain_.timer_->set(delay_alarm_, first->first);  // set before, so it cannot throw
      return;
    }
    Delayed entry = std::move(first->second);
    delayed_.erase(first);
    lock.unlock();
    fire(entry);
    lock.lock();
  }
}

void detail::SchedulerImpl::fire(Delayed& entry) noexcept {
  if (entry.tasklet) {
    try {
      start(entry.tasklet, entry.directive);
    } catch (...) {
      abandon(std::move(entry.tasklet), std::current_exception());  // out of memory taking its rule
    }
    return;
  }
  if (TaskletPtr tasklet = entry.suspension->tasklet.lock()) {
    try {
      resume(tasklet, entry.suspension->generation, entry.directive);
    } catch (...) {
      // Resumed sooner by someone else, or over: a timeout that lost the race does nothing. (If it
      // stays parked, the suspension ends with `entry` unless a Rescheduler of it lives.)
    }
  }
}

void detail::SchedulerImpl::close_delays() noexcept {
  std::multimap<Clock::time_point, Delayed> left;
  {
    std::lock_guard lock(delayed_mutex_);
    delays_closed_ = true;
    left.swap(delayed_);
  }
  domain_.timer_->cancel(delay_alarm_);  // waits for a ring in progress, which then finds them closed
  // Tasklets that were to start are dropped idle, as queued ones are (they hold no rule yet).
  for (auto& [when, entry] : left) {
    if (!entry.tasklet) continue;
    unclaim(*entry.tasklet);
    if (!background_) active_.fetch_sub(1, std::memory_order_acq_rel);
  }
}  // users' destructors run here, outside every lock

}  // namespace tasklet
