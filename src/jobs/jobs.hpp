// Private: the job side of a JobManager. Jobs are tasklets underneath: each run is a JobTasklet on
// the manager's job scheduler, holding the job's rule through the one rule table; its async phase
// waits in a deadline-ordered queue (the job's priority) for one of `concurrency` runners.
//
// All job, group and registry state is guarded by Jobs::mutex (one lock, as in Eclipse); a group's
// own mutex is only ever taken inside it. No listener, hook or job body runs under either.
//
// Ownership: the manager owns its Jobs through a shared_ptr, and every Job of the manager shares
// it too (never the manager itself), so a manager dies when its users drop it. Its destructor
// shuts the Jobs down (cancels what waits or sleeps, waits for what runs, stops the timer) and
// then detaches it: the Jobs lives on as the lock and state of the jobs left, refusing schedule().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "context.hpp"
#include "domain.hpp"
#include "task_condition.hpp"
#include "tasklet/job.hpp"
#include "tasklet/job_group.hpp"
#include "tasklet/job_manager.hpp"
#include "tasklet/scheduler.hpp"
#include "tasklet/tasklet_base.hpp"

namespace tasklet::detail {

class Jobs;

/// The job whose run() this code is (null elsewhere).
inline Job* running_job() noexcept { return static_cast<Job*>(state().job); }

/// The job side of `manager`, made on first use (its JobsExtension in the manager's domain).
Jobs& jobs_of(const JobManager& manager);
std::shared_ptr<Jobs> shared_jobs_of(const JobManager& manager);

/// Test seam: when set, Jobs::start calls it with each job whose run it is about to hand to the job
/// scheduler, outside every lock. A cancel made from it lands in the window where the run is in no
/// queue yet (cancel() returns false and the hand-over ends the job), which no timing reproduces.
inline std::atomic<void (*)(Job&)> before_hand_over{nullptr};

/// What is left to do once a run is over, outside the lock.
struct RunEnd {
  std::shared_ptr<Job> job;
  JobEvent done;
  bool rerun = false;
  std::chrono::milliseconds rerun_delay{0};
  std::shared_ptr<JobGroup> group;
  bool group_over = false;
  bool ask_should_cancel = false;
  std::vector<Status> group_results;
  int failed = 0;
  int canceled = 0;
};

/// A listener event waiting for delivery.
struct PendingEvent {
  enum class Kind { scheduled, about_to_run, running, done, sleeping, awake };
  Kind kind;
  JobEvent event;
};

/// A registered listener. remove_listener waits until no call of it is in progress, so a removed
/// listener is never called after remove_listener returns (except by a call it is inside of).
struct ListenerSlot {
  explicit ListenerSlot(std::shared_ptr<JobListener> registered) : listener(std::move(registered)) {}
  const std::shared_ptr<JobListener> listener;
  std::atomic<bool> removed{false};
  std::atomic<int> calls{0};  // in progress
};
using Listeners = std::vector<std::shared_ptr<ListenerSlot>>;

/// One run of a job: a tasklet holding the job's rule, whose only phase runs the job.
class JobTasklet final : public Tasklet {
 public:
  JobTasklet(std::shared_ptr<Job> owner, Jobs& jobs, std::int64_t deadline)
      : job(std::move(owner)), jobs_(jobs), deadline_(deadline) {}
  Directive task() override;
  static std::int64_t deadline_of(const Tasklet& tasklet) {
    return static_cast<const JobTasklet&>(tasklet).deadline_;
  }

  const std::shared_ptr<Job> job;
  // Handed to the job scheduler (under Jobs::mutex): until then its request is in no queue that
  // cancel() could take it out of.
  bool handed = false;
  // Set for a tasklet that does not run the job but completes its end (listeners, group hooks)
  // off the timer thread: see Jobs::start.
  std::optional<RunEnd> completion;

 private:
  Jobs& jobs_;
  std::int64_t deadline_;
};

class Jobs final : public WaitTimer {
 public:
  explicit Jobs(Scheduler& scheduler);
  ~Jobs();

  /// The manager is being destroyed: cancels what has not started, stops the timer, waits for
  /// what runs (except a run on this thread: see destroy_after_this_run). schedule() throws from
  /// now on.
  void shutdown() noexcept;
  /// What the manager had registered, handed back by detach().
  struct Registrations {
    Listeners listeners;
    JobManager::ProgressProvider provider;
  };
  /// After the manager's schedulers are gone: forgets them and hands back the manager's listeners
  /// and provider, for the caller to drop (user destructors) outside every lock. The jobs keep
  /// their state; nothing runs any more.
  [[nodiscard]] Registrations detach() noexcept;
  /// Whether the calling code is the run() of one of these jobs.
  bool runs_a_job_here() const noexcept;
  /// The manager was dropped inside the run() of one of its jobs, on this thread: its remains are
  /// destroyed by that job's runner once the run is over.
  void destroy_after_this_run(std::shared_ptr<Domain> manager) noexcept;

  // Job operations (Job's public methods land here).
  void schedule(Job& job, std::chrono::milliseconds delay, bool is_rerun);
  bool cancel(Job& job);
  bool join(Job& job, std::chrono::milliseconds timeout);
  bool sleep(Job& job);
  void wake_up(Job& job, std::chrono::milliseconds delay);
  bool yield_rule(Job& job);

  // Family and manager operations.
  std::vector<std::shared_ptr<Job>> find(Family family) const;
  void cancel(Family family);
  bool join(Family family, std::chrono::milliseconds timeout);
  void sleep(Family family);
  void wake_up(Family family);
  void suspend();
  void resume();
  bool is_suspended() const;
  bool is_idle() const;
  void add_listener(std::shared_ptr<JobListener> listener);
  void remove_listener(const std::shared_ptr<JobListener>& listener);
  /// Job listeners (under the lock)
  static void add_to(Listeners& listeners, std::shared_ptr<JobListener> listener);
  /// Removes it from `listeners`, then waits for its calls in progress (outside the lock).
  void remove_from(Listeners& listeners, const std::shared_ptr<JobListener>& listener);
  void set_progress_provider(JobManager::ProgressProvider provider);

  /// One run of a job, as the JobTasklet's only phase.
  void run(JobTasklet& tasklet) noexcept;

  void group_cancel(JobGroup& group);

  // WaitTimer: alarms for suspended timed waits, on the timer thread.
  std::optional<Alarms::iterator> wake_at(Clock::time_point when, Wakeup& wakeup) override;
  void cancel_wake(Wakeup& wakeup, Alarms::iterator alarm) noexcept override;

  mutable std::mutex mutex;

 private:
  friend class JobTasklet;  // a completion tasklet calls complete()
  void enter_waiting(const std::shared_ptr<Job>& job, std::vector<std::shared_ptr<JobTasklet>>& to_start);
  void start(std::vector<std::shared_ptr<JobTasklet>>& to_start);
  RunEnd finish_run(Job& job, Status result, std::vector<std::shared_ptr<JobTasklet>>& to_start);
  void complete(RunEnd end);
  void complete_run(RunEnd end);
  void post(Job& job, PendingEvent::Kind kind, JobEvent event);
  void deliver(Job& job) noexcept;
  bool withdraw_waiting(Job& job);
  void release_group_slot(Job& job, std::vector<std::shared_ptr<JobTasklet>>& to_start);
  static std::vector<std::shared_ptr<Job>> take_admissible(JobGroup& group);
  void deliver_before_run(Job& job) noexcept;
  void arm_timer(Job& job, Clock::time_point when);
  void disarm_timer(Job& job);
  void start_timer_thread();
  void timer_loop();
  bool is_live(const Job& job) const;
  void notify_changed() noexcept;  // under the lock
  void schedule_refused(const Job& job) const;

  Scheduler* scheduler_;   // null once detached
  TaskCondition changed_;  // any job state change (join)
  std::uint64_t changes_ = 0;
  int starting_ = 0;  // runs made by enter_waiting and not yet handed to the scheduler (start)
  int ending_ = 0;    // runs over (finish_run) whose listeners complete() has not yet told
  std::unordered_map<const Job*, std::shared_ptr<Job>> live_;  // waiting, sleeping, running
  // Waiting while suspended: jobs that had entered the rule table before the suspension first
  // (they asked earlier), then jobs scheduled during it.
  std::deque<std::shared_ptr<Job>> held_entered_;
  std::deque<std::shared_ptr<Job>> held_;
  TaskCondition delivered_;  // a job's event queue ran empty
  bool suspended_ = false;
  Listeners listeners_;
  JobManager::ProgressProvider provider_;

  std::multimap<Clock::time_point, std::shared_ptr<Job>> timers_;
  Alarms alarms_;
  std::condition_variable timer_changed_;
  std::thread timer_;
  bool stopping_ = false;
  bool detached_ = false;
  // Set by destroy_after_this_run: the manager's remains and the job whose run they wait for.
  std::shared_ptr<Domain> dying_;
  const Job* dying_after_ = nullptr;
};

}  // namespace tasklet::detail

namespace tasklet {

struct Job::Impl {
  std::shared_ptr<detail::Jobs> jobs;  // the manager's job side: its lock guards what follows
  JobState state = JobState::none;
  bool about_to_run = false;      // taken by a runner, not running yet
  bool cancel_requested = false;  // canceled while about to run, or before its run was handed over
  bool canceling_called = false;
  bool rerun = false;          // schedule() while running: run once more
  bool rerun_pending = false;  // the run is over and the re-run not queued yet
  std::chrono::milliseconds rerun_delay{0};
  bool seed = false;              // this run counts as a seed of its group
  bool holds_group_slot = false;  // let into the rule table under its group's max_threads
  std::uint64_t ends = 0;         // completed runs (and unrun ends): join waits for a change
  Status result;
  Rule rule;
  Priority priority = Priority::long_job;
  bool system = false;
  bool user = false;
  std::shared_ptr<JobGroup> group;
  std::map<std::string, std::any> properties;
  detail::Listeners listeners;
  std::shared_ptr<detail::JobTasklet> tasklet;  // the current run's tasklet while waiting
  std::shared_ptr<ProgressMonitor> monitor;     // while running (cancel() may outlive the run)
  bool has_timer = false;
  std::multimap<detail::Clock::time_point, std::shared_ptr<Job>>::iterator timer;
  std::deque<detail::PendingEvent> events;
  bool delivering = false;
};

struct JobGroup::Impl {
  mutable std::mutex mutex;       // taken only inside Jobs::mutex, or alone
  detail::TaskCondition changed;  // notified under `mutex`
  State state = State::none;
  int seeds_expected = 0;
  int seeds_done = 0;
  int running = 0;  // jobs let into the rule table and not ended
  int deciding = 0;  // failures whose should_cancel() has not decided yet: nobody is let in
  int failed = 0;
  int canceled = 0;
  // Waiting for a slot under max_threads, or for should_cancel() to decide.
  std::deque<std::shared_ptr<Job>> throttled;
  // Whether a job may be let into the rule table now (under `mutex`).
  bool admits(int max_threads, int more = 0) const noexcept {
    return deciding == 0 && (max_threads <= 0 || running + more < max_threads);
  }
  std::vector<std::shared_ptr<Job>> active;
  std::vector<Status> results;
  Status last_result;
};

}  // namespace tasklet
