// The manager's timer: delayed schedules and wake-ups, and the timed waits of suspended tasks, on
// one thread that sleeps until the earliest is due.
#include "jobs.hpp"

#include <algorithm>

namespace tasklet::detail {

void Jobs::start_timer_thread() {
  if (!timer_.joinable() && !timer_stopping_) timer_ = std::thread([this] { timer_loop(); });
  timer_changed_.notify_all();
}

void Jobs::arm_timer(JobCore& job, Clock::time_point when) {
  disarm_timer(job);
  JobExtras& extras = job.extras();
  extras.timer = timers_.emplace(when, &job);
  extras.has_timer = true;
  start_timer_thread();
}

void Jobs::disarm_timer(JobCore& job) {
  JobExtras* extras = job.made_extras();
  if (extras == nullptr || !extras->has_timer) return;
  timers_.erase(extras->timer);
  extras->has_timer = false;
}

std::optional<WaitTimer::Alarms::iterator> Jobs::wake_at(Clock::time_point when, Wakeup& wakeup) {
  std::lock_guard lock(mutex);
  if (timer_stopping_) return std::nullopt;
  auto alarm = alarms_.emplace(when, &wakeup);
  wakeup.alarm_armed = true;
  start_timer_thread();
  return alarm;
}

void Jobs::cancel_wake(Wakeup& wakeup, Alarms::iterator alarm) noexcept {
  std::lock_guard lock(mutex);
  if (!wakeup.alarm_armed) return;  // it fired (under this lock, so the wakeup is done with)
  alarms_.erase(alarm);
  wakeup.alarm_armed = false;
}

void Jobs::timer_loop() {
  timer_thread_of = this;
  std::unique_lock lock(mutex);
  while (!timer_stopping_) {
    Clock::time_point due = Clock::time_point::max();
    if (!timers_.empty()) due = timers_.begin()->first;
    if (!alarms_.empty()) due = std::min(due, alarms_.begin()->first);
    if (due == Clock::time_point::max()) {
      timer_changed_.wait(lock);
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (now < due) {
      timer_changed_.wait_until(lock, due);
      continue;
    }
    // Timed waits whose time is up: woken under the lock, which they take before they end.
    while (!alarms_.empty() && alarms_.begin()->first <= now) {
      Wakeup* wakeup = alarms_.begin()->second;
      alarms_.erase(alarms_.begin());
      wakeup->alarm_armed = false;
      wakeup->wake();
    }
    if (timers_.empty() || timers_.begin()->first > now) continue;
    JobCore& job = *timers_.begin()->second;
    timers_.erase(timers_.begin());
    job.extras().has_timer = false;
    ToStart to_start;
    if (job.state() == JobState::sleeping) enter_waiting(job, to_start);
    lock.unlock();
    start(to_start);  // posts no event: those of the schedule() that armed it are told already
    lock.lock();
  }
  // Stopped: the timed waits still armed go on as thread waits (TaskCondition::wait_until).
  for (auto& [when, wakeup] : alarms_) {
    wakeup->alarm_armed = false;
    wakeup->wake();
  }
  alarms_.clear();
}

}  // namespace tasklet::detail
