// Private: a manager's one timer. One thread sleeps until the earliest alarm is due and rings it;
// delayed jobs, delayed tasklets and resumes, and the timed waits of suspended tasks all share it.
// The thread is started on the first alarm and runs no user code of its own: an alarm's owner
// does only engine work in ring().
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace tasklet::detail {

using Clock = std::chrono::steady_clock;

class Timer : public std::enable_shared_from_this<Timer> {
 public:
  /// What is rung: its owner keeps it alive until it has rung or cancel() returned.
  class Alarm {
   public:
    /// On the timer thread, without the timer's lock, once it is due, or when the timer stops
    /// while it is set (set() then fails, so its owner knows). Must not block for long.
    virtual void ring() noexcept = 0;

   protected:
    Alarm() = default;
    virtual ~Alarm() = default;
    Alarm(const Alarm&) = delete;
    Alarm& operator=(const Alarm&) = delete;

   private:
    friend class Timer;
    using Alarms = std::multimap<Clock::time_point, Alarm*>;
    Alarms::iterator at_{};
    Alarms::node_type place_;  // its entry while unset, kept so that setting it again cannot fail
    bool set_ = false;
  };

  ~Timer();

  /// Sets `alarm` for `when` (moving it when it is set already). False once the timer has stopped.
  /// Throws (out of memory, no thread for the timer) only when setting an alarm the first time.
  bool set(Alarm& alarm, Clock::time_point when);
  /// Unsets `alarm`; true when it was set. When it is ringing right now, first waits until ring()
  /// has returned (unless this is the timer thread), so that its owner may go afterwards.
  bool cancel(Alarm& alarm) noexcept;
  /// Stops the thread once the alarm ringing now has rung; the alarms still set ring one last
  /// time. Idempotent.
  void stop() noexcept;
  /// Whether the calling thread is this timer's thread.
  bool runs_here() const noexcept;

 private:
  void loop();
  void ring(std::unique_lock<std::mutex>& lock, Alarm& alarm) noexcept;

  std::mutex mutex_;
  std::condition_variable changed_;  // the earliest alarm changed, or the timer is stopping
  std::condition_variable rung_;     // the alarm ringing has rung
  std::multimap<Clock::time_point, Alarm*> alarms_;
  Alarm* ringing_ = nullptr;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tasklet::detail
