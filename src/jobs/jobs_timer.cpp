// Delayed schedules and wake-ups: the jobs keep them in time order and set one alarm of the
// manager's timer for the earliest.
#include "jobs/jobs.hpp"

namespace tasklet::detail {

void Jobs::arm_timer(JobCore& job, Clock::time_point when) {
  disarm_timer(job);
  JobExtras& extras = job.extras();
  const auto at = timers_.emplace(when, &job);
  if (at == timers_.begin() && !timer_closed_) {
    try {
      timer_->set(due_alarm_, when);
    } catch (...) {
      timers_.erase(at);
      throw;
    }
  }
  extras.timer = at;
  extras.has_timer = true;
}

void Jobs::disarm_timer(JobCore& job) {
  JobExtras* extras = job.made_extras();
  if (extras == nullptr || !extras->has_timer) return;
  timers_.erase(extras->timer);  // the alarm may ring for nothing: it is set again for the next
  extras->has_timer = false;
}

void Jobs::timer_rang() noexcept {
  std::unique_lock lock(mutex);
  while (!timer_closed_ && !timers_.empty()) {
    const Clock::time_point due = timers_.begin()->first;
    if (Clock::now() < due) {
      timer_->set(due_alarm_, due);  // set before (arm_timer), so it cannot throw
      return;
    }
    JobCore& job = *timers_.begin()->second;
    timers_.erase(timers_.begin());
    job.extras().has_timer = false;
    ToStart to_start;
    if (job.state() == JobState::sleeping) enter_waiting(job, to_start);
    lock.unlock();
    start(to_start);  // posts no event: those of the schedule() that armed it are told already
    lock.lock();
  }
}

}  // namespace tasklet::detail
