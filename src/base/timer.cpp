#include "base/timer.hpp"

#include <utility>

namespace tasklet::detail {

namespace {
thread_local const Timer* timer_of_thread = nullptr;
}  // namespace

Timer::~Timer() { stop(); }

bool Timer::set(Alarm& alarm, Clock::time_point when) {
  std::lock_guard lock(mutex_);
  if (stopping_) return false;
  if (!thread_.joinable()) {
    // The thread owns the timer while it runs, so that it may stop from its own thread.
    thread_ = std::thread([self = shared_from_this()] { self->loop(); });
  }
  const bool earliest = alarms_.empty() || when < alarms_.begin()->first;
  if (alarm.set_) alarm.place_ = alarms_.extract(alarm.at_);
  if (alarm.place_) {
    alarm.place_.key() = when;
    alarm.at_ = alarms_.insert(std::move(alarm.place_));
  } else {
    alarm.at_ = alarms_.emplace(when, &alarm);
  }
  alarm.set_ = true;
  if (earliest) changed_.notify_all();
  return true;
}

bool Timer::cancel(Alarm& alarm) noexcept {
  std::unique_lock lock(mutex_);
  if (!runs_here()) rung_.wait(lock, [&] { return ringing_ != &alarm; });
  if (!alarm.set_) return false;
  alarm.place_ = alarms_.extract(alarm.at_);
  alarm.set_ = false;
  return true;
}

void Timer::stop() noexcept {
  std::thread thread;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  changed_.notify_all();
  if (!thread.joinable()) return;
  if (runs_here()) {
    thread.detach();  // stopped from an alarm: the thread ends after it, keeping the timer alive
  } else {
    thread.join();
  }
}

bool Timer::runs_here() const noexcept { return timer_of_thread == this; }

void Timer::ring(std::unique_lock<std::mutex>& lock, Alarm& alarm) noexcept {
  alarm.place_ = alarms_.extract(alarm.at_);
  alarm.set_ = false;
  ringing_ = &alarm;
  lock.unlock();
  alarm.ring();
  lock.lock();
  ringing_ = nullptr;
  rung_.notify_all();
}

void Timer::loop() {
  timer_of_thread = this;
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (alarms_.empty()) {
      changed_.wait(lock);
      continue;
    }
    const auto [due, alarm] = *alarms_.begin();
    if (Clock::now() < due) {
      changed_.wait_until(lock, due);
      continue;
    }
    ring(lock, *alarm);
  }
  // Stopped: what is still set rings once more (a timed wait then goes on as a thread's wait).
  while (!alarms_.empty()) ring(lock, *alarms_.begin()->second);
}

}  // namespace tasklet::detail
