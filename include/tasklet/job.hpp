// tasklet/job.hpp: Eclipse-style jobs on the tasklet engine.
//
// A Job is a named unit of background work with a run(ProgressMonitor&) -> Status method, an
// optional scheduling rule, a priority and families. Underneath it is a tasklet: schedule() enters
// its rule in the manager's rule table (the same one tasklets and begin_rule use, FIFO among
// conflicting requests), and it runs on the manager's workers.
//
// States: none -> (schedule) waiting or sleeping -> running -> none. Jobs are owned by
// std::shared_ptr; the manager keeps a scheduled job alive until it is done. A job does not keep
// its manager alive: destroying the manager cancels its waiting and sleeping jobs, waits for its
// running ones, and leaves every job in state none, usable but unable to be scheduled again.
#pragma once

#include "tasklet/export.hpp"

#include <any>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tasklet/progress_monitor.hpp"
#include "tasklet/scheduling_rule.hpp"
#include "tasklet/status.hpp"

namespace tasklet {

class JobManager;
class JobGroup;
class Scheduler;
class Job;

enum class JobState { none, waiting, sleeping, running };

/// Orders the start of waiting jobs that do not conflict (interactive first); never breaks FIFO
/// among conflicting jobs. It is a deadline, not a class: a job waits at most its priority's delay
/// longer than a job that asked later, so no priority starves.
enum class Priority { interactive, short_job, long_job, build, decorate };

/// A family is any object's address; belongs_to() decides membership. nullptr means "all jobs".
using Family = const void*;

/// What a listener learns about a job's life.
struct TASKLET_EXPORT JobEvent {
  std::shared_ptr<Job> job;
  Status result;                               ///< done: the run's result
  std::chrono::milliseconds delay{0};          ///< scheduled: the delay asked for
  std::shared_ptr<const Status> group_result;  ///< done of a group's last job: the group's result
};

/// Override what you need. Events of one job arrive in order, one at a time, never while the
/// manager holds an internal lock; an exception from a listener is caught and dropped.
class TASKLET_EXPORT JobListener {
 public:
  virtual ~JobListener() = default;
  virtual void scheduled(const JobEvent&) {}
  virtual void about_to_run(const JobEvent&) {}
  virtual void running(const JobEvent&) {}
  virtual void done(const JobEvent&) {}
  virtual void sleeping(const JobEvent&) {}
  virtual void awake(const JobEvent&) {}
};

namespace detail {
struct CoroutineMaker;
TASKLET_EXPORT std::shared_ptr<Job> make_coroutine_job(std::string name, const CoroutineMaker& maker,
                                                       void* callable, std::shared_ptr<JobManager> manager);
}  // namespace detail

class TASKLET_EXPORT Job : public std::enable_shared_from_this<Job> {
 public:
  /// A job of `manager` (the global manager when null). The job refers to its manager without
  /// owning it.
  explicit Job(std::string name, std::shared_ptr<JobManager> manager = nullptr);
  virtual ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  /// The job's name, for people (messages, listeners, a UI). Not synchronised with set_name().
  const std::string& name() const noexcept { return name_; }
  /// Renames the job. Only in state none, as its rule, group and kind (TaskletActive otherwise);
  /// not while another thread reads name() (a listener still handling the job's last event, say).
  void set_name(std::string name);

  /// Queues the job: waiting at once, or sleeping for `delay`. A running job runs once more after
  /// it ends (with the last delay given), and so does a waiting one that a cancel() has left to its
  /// run to end; any other waiting or sleeping job is left as it is. Calls
  /// should_schedule() first (an exception from it is passed on). Thread-safe. Throws IllegalState
  /// for a negative delay, and when the job's manager is shutting down or has been destroyed;
  /// std::bad_alloc (the job is then back in state none).
  void schedule(std::chrono::milliseconds delay = std::chrono::milliseconds{0});

  /// Waiting or sleeping: removed, done with a cancel result, returns true. Waiting, but its run
  /// already started (should_run(), about_to_run) or not yet handed over by the thread that made
  /// it waiting (a schedule(), wake_up(), resume() or group let-in elsewhere, or the timer): it
  /// will not run; that run ends it with a cancel result shortly, join() waits for that; returns
  /// false. A re-run asked for before the cancel is dropped: only a schedule() after it runs the
  /// job again. So a waiting job's cancel() may
  /// return false, depending on timing: join() tells when it has ended. Running: its monitor is
  /// canceled and canceling() is called (once per run), returns false. None: returns true.
  /// Thread-safe; a job's rule is free once it has ended.
  bool cancel();

  /// Waits until the job's current run (or its wait to run) is over; returns at once for a job in
  /// state none. Throws IllegalState when called from the job itself. join(timeout) returns false
  /// when the time ran out. Called from another job, the joiner frees its worker while it waits
  /// (the task is suspended), so the job joined can run even when every worker is taken.
  /// join() throws WaitCycle, naming the cycle, when the job waits for a rule the caller holds
  /// (directly, or behind requests that wait for one); a job that has not asked for its rule yet
  /// (delayed, sleeping) is not seen (see docs/observability.md).
  void join();
  bool join(std::chrono::milliseconds timeout);

  /// Waiting: becomes sleeping until woken. Sleeping: its wake-up time is cleared. Returns false
  /// (and does nothing) for a running job, or a waiting one whose run has already started
  /// or that is not handed over yet (as for cancel()), or that a cancel() has left to end.
  bool sleep();
  /// A sleeping job waits again, at once or after `delay`. Ignored for jobs that are not sleeping.
  void wake_up(std::chrono::milliseconds delay = std::chrono::milliseconds{0});

  JobState state() const;
  /// The result of the last run (ok before any run).
  Status result() const;

  /// The rule held while it runs. Throws TaskletActive unless the job is in state none, and
  /// InvalidRule for an invalid rule.
  void set_rule(Rule rule);
  Rule rule() const;
  void set_priority(Priority priority);
  Priority priority() const;
  /// System jobs are internal; user jobs were started by the user (a UI would show them). Both
  /// flags are set in state none only (TaskletActive otherwise); priority and properties anytime.
  void set_system(bool system);
  bool is_system() const;
  void set_user(bool user);
  bool is_user() const;

  /// Belongs to at most one group; only settable in state none (TaskletActive otherwise).
  void set_group(std::shared_ptr<JobGroup> group);
  std::shared_ptr<JobGroup> group() const;

  /// Reports this job's progress into `group`, a monitor that stands for a batch of jobs (Eclipse's
  /// progress groups): each run's monitor is a part of `group` worth `work` of its units (as
  /// ProgressMonitor::split() makes), instead of one from the manager's progress provider; so
  /// begin_task() on the group with the sum of the jobs' shares, and one bar shows the batch.
  /// Canceling the group cancels its jobs' runs. Null stops it. Only in state none (TaskletActive
  /// otherwise); std::invalid_argument for negative work.
  void set_progress_group(std::shared_ptr<ProgressMonitor> group, int work);
  std::shared_ptr<ProgressMonitor> progress_group() const;

  /// Runs this job on `scheduler`'s synchronous thread (Eclipse's UIJob): the thread in its run(),
  /// or its poll()/run_for() loop (an io_context's with asio::make_scheduler). The job keeps its
  /// rule, states, listeners, cancel() and join(), FIFO with every other holder of its rule; while
  /// it waits for the rule it takes no thread, and once granted it is one of that scheduler's sync
  /// phases (so run() waits for it). A coroutine job may go on there in sync() and async() phases.
  /// Null: the manager's workers again. Only in state none (TaskletActive otherwise);
  /// std::invalid_argument for a scheduler of another manager or one without a synchronous thread.
  /// The job does not keep `scheduler` alive: destroying it ends a run not yet started there
  /// (canceled); a run that has started there (finishing later, or a coroutine job between
  /// phases) must end first. join() without a timeout on that synchronous thread throws
  /// IllegalState while the job has not ended: its run needs the thread.
  void set_sync_scheduler(const std::shared_ptr<Scheduler>& scheduler);
  std::shared_ptr<Scheduler> sync_scheduler() const;

  void set_property(const std::string& key, std::any value);
  std::any property(const std::string& key) const;

  void add_listener(std::shared_ptr<JobListener> listener);
  /// Once it returns, the listener is not called again: it waits for calls in progress on other
  /// threads. Called from inside that listener's own call, it does not wait for that call.
  void remove_listener(const std::shared_ptr<JobListener>& listener);

  /// Ends the run that returned Status::finish_later(): the job releases its rule and ends with
  /// `result`, as if run() had returned it (its monitor is told done(), listeners, joiners, its
  /// group and the manager's shutdown waited for this). Thread-safe; from any thread. Throws
  /// IllegalState, naming the job, when no run of it is finishing later (it did not ask to, or
  /// done() was called already).
  void done(Status result);

  /// Lets a waiting job whose rule conflicts with this one's go first, then takes the rule back.
  /// Call it from the job's own run(). Returns true when somebody was let through; false (at once)
  /// when nobody was waiting or the job has no rule. Throws IllegalState outside the job's run or
  /// when the manager shuts down while it takes the rule back, and std::bad_alloc.
  bool yield_rule();

  /// Whom this job waits for while it waits for its rule: the holders of conflicting rules, then
  /// the earlier requests it queues behind (see RuleBlocker). Empty when it is not waiting for its
  /// rule (not scheduled, sleeping, already granted, or without a rule). Thread-safe; a moment's
  /// picture, taken under the rule table's lock. Throws std::bad_alloc.
  std::vector<RuleBlocker> blockers() const;
  /// True while the job runs holding its rule and a waiting job of a higher priority (an earlier
  /// Priority) needs a rule that conflicts with it (Eclipse's isBlocking): a long job can then
  /// yield_rule(). Thread-safe; O(requests in the rule table).
  bool is_blocking() const;

  /// Family membership; override it. The default belongs to no family.
  virtual bool belongs_to(Family family) const;

  /// The job's manager; null once the manager has been destroyed (or while its destructor runs).
  std::shared_ptr<JobManager> manager() const noexcept { return manager_.lock(); }

 protected:
  /// The work. The monitor is never null; report progress and poll is_canceled(). An exception
  /// becomes an error status carrying it.
  virtual Status run(ProgressMonitor& monitor) = 0;
  /// Called before the job is queued (also before each automatic re-run); false drops it.
  virtual bool should_schedule() { return true; }
  /// Called just before it would run; false ends this run with a cancel result.
  virtual bool should_run() { return true; }
  /// Called once per run when the job is canceled while running.
  virtual void canceling() {}

 public:
  /// The job's state in the jobs layer (defined inside the library, not for users).
  struct Core;

 private:
  class Function;   // make_job's jobs
  class Coroutine;  // make_job's jobs whose run is a coroutine (tasklet/coroutine.hpp)
  friend std::shared_ptr<Job> make_job(std::string, std::function<Status(ProgressMonitor&)>,
                                       std::shared_ptr<JobManager>);
  friend std::shared_ptr<Job> detail::make_coroutine_job(std::string, const detail::CoroutineMaker&, void*,
                                                         std::shared_ptr<JobManager>);
  Job(std::string name, const std::shared_ptr<JobManager>& manager, Core& placed) noexcept;

  std::string name_;
  std::weak_ptr<JobManager> manager_;
  std::unique_ptr<Core> core_;
};

/// A job whose run() calls `fn(monitor)` and ends with the Status it returns. Made on `manager`
/// (the global manager when null). Throws std::bad_alloc.
TASKLET_EXPORT std::shared_ptr<Job> make_job(std::string name, std::function<Status(ProgressMonitor&)> fn,
                                             std::shared_ptr<JobManager> manager = nullptr);

/// A job's run that returns nothing: callable with the job's ProgressMonitor.
template <class F>
concept VoidJobBody =
    std::invocable<F&, ProgressMonitor&> && std::is_void_v<std::invoke_result_t<F&, ProgressMonitor&>>;

/// The same for a callable that returns nothing: the run ends ok unless it throws.
template <VoidJobBody F>
std::shared_ptr<Job> make_job(std::string name, F fn, std::shared_ptr<JobManager> manager = nullptr) {
  return make_job(
      std::move(name),
      std::function<Status(ProgressMonitor&)>([fn = std::move(fn)](ProgressMonitor& monitor) mutable {
        fn(monitor);
        return Status::ok();
      }),
      std::move(manager));
}

}  // namespace tasklet
