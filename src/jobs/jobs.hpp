// Private: the job side of a JobManager.
//
// A plain job (no group, no delay, no listeners, the manager not suspended) goes from schedule()
// to its run and back to state none under its own lock alone: its state word, the registry's
// shard and the job scheduler are all it touches. Jobs::mutex, the manager's job lock, guards what
// is shared between jobs and rarely used: timers, the suspension's queues, groups, listeners and
// their events. Lock order: Jobs::mutex, then a group's mutex, then a job's lock, then a registry
// shard. No listener, hook or job body runs under any of them.
//
// Ownership: the manager's domain owns its Jobs through a shared_ptr, and every Job of the manager
// shares it too (never the manager itself), so a manager dies when its users drop it. Its
// destruction shuts the Jobs down (cancels what waits or sleeps, waits for what runs, stops the
// timer) and then detaches it: the Jobs lives on as the state of the jobs left, refusing schedule().
#pragma once

#include <array>
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
#include <vector>

#include <oneapi/tbb/mutex.h>

#include "base/door.hpp"
#include "jobs/job_core.hpp"
#include "scheduler/door.hpp"
#include "tasklet/job.hpp"
#include "tasklet/job_group.hpp"
#include "tasklet/job_manager.hpp"
#include "tasklet/scheduler.hpp"

namespace tasklet::detail {

class Jobs;

/// The job whose run() this code is (null elsewhere).
inline JobCore* running_job(const RunState& task = run_state()) noexcept {
  const TaskFrame* frame = find_frame(task, extension_run);
  return frame != nullptr ? static_cast<JobCore*>(frame->owner) : nullptr;
}

/// Frames of the jobs room: a listener's call (owner: its ListenerSlot), and the end of a run
/// (owner: the Jobs), so that code they call does not wait for them.
inline constexpr FrameKind listener_call{"listener call"};
inline constexpr FrameKind completing_run{"completing run"};

/// How many frames of `kind` owned by `owner` the running code is inside of.
inline std::size_t frames_of(const FrameKind& kind, const void* owner) noexcept {
  std::size_t count = 0;
  for (const TaskFrame* frame = run_state().frames; frame != nullptr; frame = frame->outer) {
    if (frame->kind == &kind && frame->owner == owner) ++count;
  }
  return count;
}

/// The job side of `manager`, made on first use (its extension in the manager's domain).
Jobs& jobs_of(const JobManager& manager);
std::shared_ptr<Jobs> shared_jobs_of(const JobManager& manager);

/// Test seam: when set, a job's run is handed to the job scheduler only after this was called with
/// the job, outside every lock. A cancel made from it lands in the window where the run is in no
/// queue yet (cancel() returns false and the hand-over ends the job), which no timing reproduces.
inline std::atomic<void (*)(Job&)> before_hand_over{nullptr};

/// When a wait of `timeout` that starts now ends (max: never).
Clock::time_point deadline_after(std::chrono::milliseconds timeout);

/// Holds a count up while somebody waits for changes of the registry (ends notify only then).
class Watching {
 public:
  explicit Watching(std::atomic<int>& watchers) noexcept : watchers_(watchers) { watchers_.fetch_add(1); }
  ~Watching() { watchers_.fetch_sub(1); }
  Watching(const Watching&) = delete;
  Watching& operator=(const Watching&) = delete;

 private:
  std::atomic<int>& watchers_;
};

/// Test seam: when set, a run that found the manager suspended calls it with the job before it
/// holds the job back, outside every lock: a resume() made from it lands in the window between
/// the run's look at the suspension and the hold.
inline std::atomic<void (*)(Job&)> before_holding_back{nullptr};

/// What is left to do once a run is over, outside the locks.
struct RunEnd {
  JobCore* job = nullptr;
  std::shared_ptr<Job> owner;                // keeps the job alive until its end is complete
  std::shared_ptr<ProgressMonitor> monitor;  // the run's, let go of outside the locks
  JobEvent done;
  bool rerun = false;
  std::chrono::milliseconds rerun_delay{0};
  GroupCore* group = nullptr;
  bool group_over = false;
  bool ask_should_cancel = false;
  std::vector<Status> group_results;
  int failed = 0;
  int canceled = 0;
  std::uint64_t group_generation = 0;  // the group's generation at this end
};

class Jobs final {
 public:
  explicit Jobs(Scheduler& scheduler);
  ~Jobs();

  /// The manager is being destroyed: nothing starts from now on (schedule() throws), the timer
  /// stops, and what has not started is canceled. Once.
  void stop() noexcept;
  /// stop(), then waits for what runs (except a run on this thread: see destroy_after_this_run).
  /// Once.
  void shutdown() noexcept;
  /// What the manager had registered, handed back by detach().
  struct Registrations {
    Listeners listeners;
    JobManager::ProgressProvider provider;
  };
  /// After the manager's schedulers are gone: forgets them and hands back the manager's listeners
  /// and provider, for the caller to drop (user destructors) outside every lock.
  [[nodiscard]] Registrations detach() noexcept;
  /// Whether the calling code is the run() of one of these jobs.
  bool runs_a_job_here() const noexcept;
  /// The manager was dropped inside the run() of one of its jobs, on this thread: its remains are
  /// shut down by that job's worker once the run is over.
  void destroy_after_this_run(std::shared_ptr<Domain> domain) noexcept;

  /// The manager's trace recorder while it records, else null. Inline: read about three times a job.
  Trace* trace() const noexcept { return domain_ != nullptr ? domain_->trace() : nullptr; }
  /// Records that `job` is now in `state` ("waiting", ..., "done" with its `result`).
  [[gnu::cold, gnu::noinline]] void trace_state(Trace& trace, JobCore& job, const char* state,
                                                const Status* result = nullptr) noexcept;

  /// How `job`, canceled before it ran, ends when the backend that shares its rule failed (etcd's
  /// lease was lost, which cancels the jobs granted through it): with the failure, as the requests
  /// still waiting then do. Nullopt when the rule is not shared or its backend has not failed.
  std::optional<Status> lost_before_run(const JobCore& job) const noexcept;

  // Job operations (Job's public methods land here).
  void schedule(JobCore& job, std::chrono::milliseconds delay, bool is_rerun);
  bool cancel(JobCore& job);
  bool join(JobCore& job, std::chrono::milliseconds timeout);
  bool sleep(JobCore& job);
  void wake_up(JobCore& job, std::chrono::milliseconds delay);
  bool yield_rule(JobCore& job);
  std::vector<RuleBlocker> blockers(JobCore& job);
  bool is_blocking(JobCore& job);
  void add_listener(JobCore& job, std::shared_ptr<JobListener> listener);
  void remove_listener(JobCore& job, const std::shared_ptr<JobListener>& listener);

  // Family and manager operations.
  std::vector<std::shared_ptr<Job>> find(Family family) const;
  void cancel(Family family);
  bool join(Family family, std::chrono::milliseconds timeout);
  void sleep(Family family);
  void wake_up(Family family);
  void suspend();
  void resume();
  bool is_suspended() const noexcept { return suspended_.load(std::memory_order_acquire); }
  bool is_idle() const;
  void add_listener(std::shared_ptr<JobListener> listener);
  void remove_listener(const std::shared_ptr<JobListener>& listener);
  void set_progress_provider(JobManager::ProgressProvider provider);

  /// One run of a job, as its JobRun's phase: the phase's directive. `wait` when the run finishes
  /// later (its next phase is finish_run_later()); `wait` or `async` when it goes on in another
  /// phase (a coroutine job's: its next phase is go_on()).
  Directive run(JobCore& job, JobRun& run) noexcept;
  /// The next phase of a run that goes on over several (see JobRun::go_on_in).
  Directive go_on(JobCore& job, JobRun& run) noexcept;
  static void end_traced_phase() noexcept;
  /// Job::done(): hands the result to the run that finishes later and resumes it.
  void done(JobCore& job, Status result);
  /// set_sync_scheduler's check (under `mutex`): std::invalid_argument unless `scheduler` is one of
  /// this manager's with a synchronous thread.
  void check_sync_scheduler(const Scheduler& scheduler, const Job& job) const;
  /// The phase after done(): ends the run with the result done() gave.
  void finish_run_later(JobCore& job, JobRun& run) noexcept;
  /// Ends a job whose run the engine will not start (its rule could not be entered) with `result`.
  void end_unrun(JobCore& job, Tasklet& run, Status result) noexcept;
  /// The part of a run's end that runs user code (group hooks, listeners), then the re-run.
  void complete(RunEnd end);

  /// Cancels the group's jobs, unless `generation` is given and the group was over since.
  void group_cancel(GroupCore& group, std::optional<std::uint64_t> generation = std::nullopt);

  /// The manager's timer, for the timed waits of suspended tasks.
  Timer* timer() const noexcept { return timer_.get(); }

  /// The manager's job lock (see the top of this file).
  mutable std::mutex mutex;

 private:
  // Entering and leaving the states.
  void enter_waiting(JobCore& job, ToStart& to_start);
  void start(ToStart& to_start);
  void hand_over(JobCore& job);
  static std::shared_ptr<JobRun> take_run(JobCore& job, const std::shared_ptr<Job>& owner);
  static void attach_run(JobCore& job, JobRun& run) noexcept;
  void submit_run(JobCore& job, std::shared_ptr<JobRun> run);
  bool submit_to_sync_thread(JobCore& job, std::shared_ptr<JobRun> run);
  /// The scheduler `job`'s runs happen on (set_sync_scheduler), while it lives; else null.
  static std::shared_ptr<Scheduler> sync_target(const JobCore& job) noexcept;
  /// withdraw() of `run` from the scheduler it was handed to.
  bool withdraw_run(const JobCore& job, Tasklet& run);
  bool withdraw_waiting(JobCore& job);
  void release_group_slot(JobCore& job, ToStart& to_start);
  static void take_admissible(GroupCore& group, ToStart& let_in) noexcept;
  RunEnd finish_run(JobCore& job, Status result, ToStart& to_start);
  // The end of a run that has started: its rule released, the word ended, the group told.
  void end_started_run(JobCore& job, Status result) noexcept;
  // Calls the job's run() in a phase of its run, and ends the run unless it goes on later.
  Directive run_step(JobCore& job, JobRun& run, ProgressMonitor& monitor) noexcept;
  // Parks the run in a suspension of its own until done(), and returns nothing; or returns the
  // result to end with now: the one a done() gave already, or out of memory.
  std::optional<Status> finish_later(JobCore& job, JobRun& run) noexcept;
  RunEnd end_word(JobCore& job, Status result);
  void finish_group(JobCore& job, RunEnd& end, ToStart& to_start);
  void complete_run(RunEnd& end);
  void complete_off_timer(RunEnd end);
  void schedule_refused(const Job& job) const;
  // What a schedule() asks for, and what make_waiting() made of it.
  struct ScheduleCall {
    std::chrono::milliseconds delay;
    bool is_rerun, wanted, plain;
  };
  struct Scheduling {
    std::uint32_t ends = 0;     // of the job before this waiting
    bool waiting = false;       // it became waiting
    bool wake_joiners = false;  // a re-run no longer wanted: its joiners stop waiting for it
  };
  Scheduling make_waiting(JobCore& job, ScheduleCall call, const std::shared_ptr<Job>& owner,
                          std::shared_ptr<JobRun>& run);
  RunEnd enter_scheduled(JobCore& job, std::chrono::milliseconds delay, bool is_rerun,
                         std::unique_lock<std::mutex>& manager_lock, ToStart& to_start);
  bool enter_group(JobCore& job, GroupCore& group, bool is_rerun, GroupCore*& entered,
                   JobGroup::State& before);
  // The parts of a run before the job's own run(): taking the turn (nullopt: not this run's; else
  // whether it is canceled), holding it back while the manager is suspended, the monitor, the
  // events told before it, and the end of a run that does not start.
  std::optional<bool> take_turn(JobCore& job, JobRun& run, bool stopping);
  bool hold_back(JobCore& job);
  std::shared_ptr<ProgressMonitor> monitor_for(JobCore& job, std::exception_ptr& no_monitor) noexcept;
  void tell_before_run(JobCore& job, PendingEvent::Kind kind) noexcept;
  Directive end_before_run(JobCore& job, bool canceled, bool stopping,
                           const std::exception_ptr& no_monitor) noexcept;
  void undo_schedule(JobCore& job, GroupCore* group, JobGroup::State group_before,
                     std::size_t events_before) noexcept;

  // Listeners and events (under `mutex`, delivered outside it).
  bool has_listeners(const JobCore& job) const noexcept;
  void post(JobCore& job, PendingEvent::Kind kind, JobEvent event);
  void deliver(JobCore& job) noexcept;
  void deliver_before_run(JobCore& job) noexcept;
  void remove_from(Listeners& listeners, const std::shared_ptr<JobListener>& listener);
  static Listeners with_added(const Listeners& listeners, std::shared_ptr<ListenerSlot> slot);

  // The registry of live jobs.
  void list(JobCore& job, std::shared_ptr<Job> owner);
  void unlist_if_over(JobCore& job);
  template <class Visit>
  void for_each_listed(Visit&& visit) const;
  void changed() noexcept;
  void wake_joiners();
  void drop_rerun(JobCore& job);

  // Delayed schedules and wake-ups: one alarm on the manager's timer, set for the earliest.
  void arm_timer(JobCore& job, Clock::time_point when);
  void disarm_timer(JobCore& job);
  void timer_rang() noexcept;

  Scheduler* scheduler_;  // null once detached
  Domain* domain_;        // scheduler_'s, null once detached
  std::atomic<bool> stopping_{false};
  bool shut_down_ = false;  // shutdown() waited, or waits (under `mutex`)
  std::atomic<bool> suspended_{false};
  bool detached_ = false;
  // Written per job by the posting thread: a line of its own, away from what every run reads.
  alignas(64) std::atomic<std::uint64_t> next_order_{0};
  alignas(64) std::atomic<int> listeners_count_{0};  // manager listeners, and jobs with listeners

  // Live jobs, by the address of their core: a shard's lock is taken twice per run.
  struct alignas(64) Shard {
    mutable oneapi::tbb::mutex mutex;
    JobCore* head = nullptr;
    std::size_t count = 0;
  };
  static constexpr std::size_t shard_count = 16;
  std::array<Shard, shard_count> shards_;
  Shard& shard_of(const JobCore& job) const noexcept {
    return const_cast<Shard&>(shards_[(reinterpret_cast<std::uintptr_t>(&job) >> 6) % shard_count]);
  }

  // Join: a joiner sets its job's `joined` bit under join_mutex_; an end that finds the bit set
  // notifies under it.
  std::mutex join_mutex_;
  TaskCondition joined_;
  // Any job leaving the registry, for family joins, is_idle waits and shutdown (under `mutex`);
  // ends notify only while somebody watches.
  TaskCondition changed_;
  std::uint64_t changes_ = 0;
  std::atomic<int> watchers_{0};

  // Waiting while suspended: jobs that had entered the job scheduler before the suspension first
  // (they asked earlier), then jobs scheduled during it.
  std::deque<JobCore*> held_entered_;
  std::deque<JobCore*> held_;
  TaskCondition delivered_;  // a job's event queue ran empty
  Listeners listeners_;
  JobManager::ProgressProvider provider_;
  std::atomic<bool> has_provider_{false};

  std::multimap<Clock::time_point, JobCore*> timers_;
  std::shared_ptr<Timer> timer_;
  struct DueAlarm final : Timer::Alarm {
    explicit DueAlarm(Jobs& owner) : jobs(owner) {}
    void ring() noexcept override { jobs.timer_rang(); }
    Jobs& jobs;
  } due_alarm_{*this};
  bool timer_closed_ = false;  // shut down: the alarm is not set again
  // Set by destroy_after_this_run: the manager's remains and the job whose run they wait for.
  std::shared_ptr<Domain> dying_;
  std::atomic<const JobCore*> dying_after_{nullptr};  // read by every run without the lock
};

template <class Visit>
void Jobs::for_each_listed(Visit&& visit) const {
  for (const Shard& shard : shards_) {
    std::lock_guard lock(shard.mutex);
    for (JobCore* job = shard.head; job != nullptr; job = job->next) visit(*job);
  }
}

}  // namespace tasklet::detail
