// tasklet/progress_monitor.hpp: progress reporting and cancellation for a job's run.
//
// A job gets a monitor from its manager's progress provider (a plain ProgressMonitor by default).
// Canceling the job sets the monitor's cancel flag; a long-running job polls is_canceled() and
// returns Status::cancel(). split() hands part of the work to a sub-monitor, the way Eclipse's
// SubMonitor does.
#pragma once

#include "tasklet/export.hpp"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace tasklet {

/// Thread-safe. Subclass it and override the on_* hooks to show progress (they are called with the
/// monitor's counts already updated, outside any library lock).
class TASKLET_EXPORT ProgressMonitor {
 public:
  static constexpr int unknown = -1;

  ProgressMonitor() = default;
  virtual ~ProgressMonitor() = default;
  ProgressMonitor(const ProgressMonitor&) = delete;
  ProgressMonitor& operator=(const ProgressMonitor&) = delete;

  /// Starts the main task: `total_work` units (or `unknown`).
  void begin_task(std::string_view name, int total_work);
  /// `work` more units are done (clamped to the total).
  void worked(int work);
  /// Names the current step.
  void subtask(std::string_view name);
  /// The work is complete.
  void done();

  /// True once set_canceled(true) was called on this monitor or on the one it was split from.
  bool is_canceled() const noexcept;
  void set_canceled(bool canceled) noexcept;

  /// A monitor for `work` units of this one's total: its own total, whatever it is, maps onto them.
  /// It reports cancellation through this monitor. The parent must outlive it.
  std::unique_ptr<ProgressMonitor> split(int work);

  /// The run waits for something it cannot do without (Eclipse's setBlocked): the library calls
  /// it when a job's run has to wait in begin_rule, with whom it waits for ("waiting for
  /// path(/src): job 'index' holds path(/src)"), and clear_blocked() once it got the rule or gave
  /// up. A split() monitor passes both on to its parent.
  void set_blocked(std::string_view reason);
  void clear_blocked();
  /// The reason given to the last set_blocked() not cleared since, or empty.
  std::string blocked_reason() const;

  std::string task_name() const;
  std::string subtask_name() const;
  int total_work() const noexcept { return total_.load(std::memory_order_relaxed); }
  /// Units done so far.
  double work_done() const noexcept { return done_work_.load(std::memory_order_relaxed); }
  bool is_done() const noexcept { return finished_.load(std::memory_order_relaxed); }

 protected:
  virtual void on_begin_task(std::string_view /*name*/, int /*total_work*/) {}
  virtual void on_worked(double /*work_done*/, int /*total_work*/) {}
  virtual void on_subtask(std::string_view /*name*/) {}
  virtual void on_done() {}
  virtual void on_canceled(bool /*canceled*/) {}
  virtual void on_blocked(std::string_view /*reason*/) {}
  virtual void on_unblocked() {}

 private:
  class Sub;
  void add_work(double work);

  mutable std::mutex mutex_;  // names only
  std::string task_name_;
  std::string subtask_name_;
  std::string blocked_reason_;
  std::atomic<int> total_{unknown};
  std::atomic<double> done_work_{0};
  std::atomic<bool> canceled_{false};
  std::atomic<bool> finished_{false};
  ProgressMonitor* parent_ = nullptr;  // set for split() monitors
  double parent_share_ = 0;            // parent units this monitor stands for
  double reported_to_parent_ = 0;
};

}  // namespace tasklet
