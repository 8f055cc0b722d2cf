// tasklet/scheduler.hpp: runs tasklets phase by phase according to their directives.
//
// A Scheduler has a synchronous thread (the thread inside run()) and worker threads (its
// Workers). `sync` phases run only on the synchronous thread, `async` phases only on workers,
// `wait` parks a tasklet until a Rescheduler resumes it, `done` drops it. run() returns once no
// tasklet is queued, running, parked or waiting for its rule, and then rethrows the first
// exception any phase threw. Tasklets with rules acquire them from the scheduler's JobManager
// before their first phase and hold them until done.
#pragma once

#include "tasklet/export.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tasklet/directive.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet {

class JobManager;
class Workers;
class Scheduler;

/// What a new scheduler uses. Empty members mean "inherit": the thread's configured options
/// (api::configure), then the global JobManager.
struct TASKLET_EXPORT SchedulerOptions {
  /// Owns the rules this scheduler's tasklets and threads hold; also supplies default workers.
  std::shared_ptr<JobManager> manager{};  // {}: designated initializers may leave it out (-Wextra)
  /// Where ASYNC phases run; overrides `concurrency` and the manager's workers.
  std::shared_ptr<Workers> workers{};
  /// When > 0 and `workers` is empty: a private pool with this many worker threads.
  int concurrency = 0;
  /// Lets an application's event loop be the synchronous thread (see Scheduler::poll()). When set,
  /// it is called when the loop should call poll(): a sync phase became ready while no run(),
  /// poll() or run_for() was taking them, or the scheduler went from nothing active to something
  /// active (tasklets or KeepAlive guards) or back. It may be called more often than that, from
  /// any thread, never under an internal lock; it must not block or call into the scheduler: post
  /// to the loop and return (an exception from it is dropped). A scheduler with it counts as
  /// running from the start: async phases may start at any time.
  std::function<void()> wake_loop{};
};

/// A phase's exception, with the name of the tasklet that threw it.
struct TASKLET_EXPORT Failure {
  std::string tasklet;
  std::exception_ptr error;
};

namespace detail {
class Suspension;
}  // namespace detail

/// Puts a suspended tasklet back. Cheap to copy; every copy names the same suspension, which can
/// be resumed once. Thread-safe: resume() may be called from any thread, even before the
/// tasklet's phase has returned `wait` (the resume is then applied when it does; if that phase
/// returns anything else, the tasklet ends with AlreadyResumed). When the last
/// copy is destroyed unused, the suspension ends: a tasklet parked by it that nothing else can
/// suspend again (no owner outside its scheduler) ends with TaskletLost (see Scheduler::suspend).
class TASKLET_EXPORT Rescheduler {
 public:
  Rescheduler() = default;

  /// Continues the tasklet with `directive`. Throws AlreadyResumed when this suspension was
  /// resumed already or has ended (the tasklet returned something other than wait, or its
  /// scheduler is gone; also for an empty Rescheduler), and SchedulerNotRunning for `async` while
  /// the scheduler is not running, and IllegalState for `sync` on a job manager's own
  /// scheduler (a job's run: it has no synchronous thread; the tasklet then stays parked). Does not
  /// block, except that resume(sync) on the implicit scheduler's own thread runs the phases inline
  /// as schedule() does (and rethrows their exceptions).
  void resume(Directive directive) const;

  /// Resumes with `directive` once `delay` has passed, on the job manager's timer, unless the
  /// suspension was resumed or ended before then: an earlier resume() wins and this one then does
  /// nothing (a timeout). Keeps the suspension going until then. Throws as resume() does when the
  /// suspension is over already or for `async` while the scheduler is not running; std::bad_alloc. A delay
  /// of zero or less resumes at once. Does not block.
  void resume_after(std::chrono::steady_clock::duration delay, Directive directive) const;

  /// False for a default-constructed Rescheduler.
  explicit operator bool() const noexcept { return suspension_ != nullptr; }

 private:
  friend class Scheduler;
  explicit Rescheduler(std::shared_ptr<const detail::Suspension> suspension) noexcept
      : suspension_(std::move(suspension)) {}
  std::shared_ptr<const detail::Suspension> suspension_;
};

class TASKLET_EXPORT Scheduler : public std::enable_shared_from_this<Scheduler> {
 public:
  /// A new scheduler (api::new_scheduler() uses the thread's configured options).
  static std::shared_ptr<Scheduler> create(SchedulerOptions options = {});

  /// Drops what never started (queued, parked and rule-waiting tasklets), waits for running phases
  /// to end.
  /// Never throws. Must not be called from one of this scheduler's own phases.
  virtual ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Makes the calling thread the synchronous thread and runs until no tasklet is queued,
  /// running, parked or waiting for its rule. Blocks; a second run() on another thread blocks
  /// until this one returns. Rethrows the first exception a phase threw (see failures()).
  /// Throws IllegalState when called from one of this scheduler's own phases, and WaitCycle
  /// (ending run(), its tasklets still scheduled) when a tasklet waits for a rule that the calling
  /// thread's begin_rule scopes hold, so that run() could never return.
  void run();

  /// Runs the sync phases that are ready now on the calling thread, as one turn of run() does,
  /// and returns how many ran; never waits for more. Those that become ready meanwhile wait for
  /// the next call (and wake_loop says so). For an application's loop: call it whenever the
  /// scheduler's wake_loop asks, from the loop's one thread. Returns 0 at once while run() or
  /// poll() is active on another thread. Throws as run() does: the first exception a phase threw
  /// since the last run(), poll() or run_for() reported (see failures()), IllegalState from one of
  /// its own phases, and WaitCycle when nothing was ready and a tasklet waits for a rule that the
  /// calling thread's begin_rule scopes hold.
  std::size_t poll();
  /// run() for at most about `duration`: returns once nothing is active or the time is up (a phase
  /// that has begun runs to its end), with how many sync phases ran. Returns 0 at once while run()
  /// or poll() is active on another thread. Throws as run() does.
  std::size_t run_for(std::chrono::steady_clock::duration duration);
  /// run_for() up to `deadline`.
  std::size_t run_until(std::chrono::steady_clock::time_point deadline);

  /// Starts `tasklet` with `directive`. Throws AlreadyScheduled when the tasklet is active,
  /// SchedulerNotRunning for `async` while the scheduler is not running, std::invalid_argument for a null
  /// tasklet, and std::bad_alloc (the tasklet then was not scheduled). On the implicit scheduler
  /// (api::current() of a thread with none) a `sync` tasklet scheduled from its own thread runs
  /// inline before schedule() returns, and an exception from those phases is rethrown here; one
  /// whose rule is not free does not wait for it, but runs at that thread's next schedule(),
  /// resume(sync) or run().
  /// Thread-safe. Waits for flow control when tasklets with rules pile up in the rule table: the
  /// synchronous thread inside run() (counting its own, at every 16th) and any thread that is not
  /// a worker (counting those of every thread but the synchronous one, at every call), while more
  /// than 1,024 wait for their rules, wait until the workers have let all but 512 through. They go
  /// on when a millisecond passes in which none was let through (they may be waiting for this very
  /// thread), and then hold back again only once 512 more were let through.
  Scheduler& schedule(std::shared_ptr<Tasklet> tasklet, Directive directive);

  /// Starts `tasklet` with `directive` once `delay` has passed, on the job manager's one timer (no
  /// thread of its own). The tasklet is active from now on (run() waits for it) and requests its
  /// rule when the delay is over; tasklets due at the same moment start in the order they were
  /// scheduled. A delay of zero or less is schedule(). On the implicit scheduler a delayed `sync`
  /// tasklet waits for run() or for that thread's next schedule(). Throws what schedule() throws
  /// (AlreadyScheduled, SchedulerNotRunning for `async` while the scheduler is not running,
  /// std::invalid_argument, std::bad_alloc). Destroying the scheduler drops it unrun. Thread-safe;
  /// does not block.
  Scheduler& schedule_after(std::chrono::steady_clock::duration delay, std::shared_ptr<Tasklet> tasklet,
                            Directive directive);

  /// Suspends `tasklet`: an idle tasklet becomes parked; a tasklet calling this from its own
  /// phase parks when that phase returns `wait`; a parked tasklet gets a new Rescheduler.
  /// Keep the Rescheduler until you resume: a tasklet parked with no Rescheduler alive (it
  /// returned `wait` without one, or the last copy was destroyed unused) can be resumed only
  /// through a new suspend(), so once nothing outside the scheduler owns it (a std::weak_ptr does
  /// not count) it ends with TaskletLost, which run() rethrows, instead of keeping run() waiting
  /// forever. The scheduler notices at once when the tasklet parks or its last Rescheduler goes,
  /// and otherwise, while run() has nothing else to do, within a tenth of a second of the last
  /// owner letting go.
  /// Throws AlreadyScheduled when the tasklet is queued or running elsewhere, parked in another
  /// scheduler, or already has an outstanding Rescheduler; IllegalState when it is not owned by a
  /// std::shared_ptr; std::bad_alloc (nothing is suspended then). Thread-safe; does not block.
  Rescheduler suspend(Tasklet& tasklet);

  /// Keeps run() going while it lives, with or without tasklets to run: for work that other
  /// threads schedule later (an event loop; asio's work guard). run() returns once the last guard
  /// is gone and nothing else is active. Movable; reset() or destruction lets go. Thread-safe.
  class [[nodiscard]] KeepAlive {
   public:
    KeepAlive() noexcept = default;
    KeepAlive(KeepAlive&& other) noexcept : scheduler_(std::move(other.scheduler_)) {}
    KeepAlive& operator=(KeepAlive&& other) noexcept;
    ~KeepAlive() { reset(); }
    /// Lets go (nothing for an empty guard). Never throws.
    void reset() noexcept;
    explicit operator bool() const noexcept { return scheduler_ != nullptr; }

   private:
    friend class Scheduler;
    explicit KeepAlive(std::shared_ptr<Scheduler> scheduler) noexcept : scheduler_(std::move(scheduler)) {}
    std::shared_ptr<Scheduler> scheduler_;
  };
  /// A guard that keeps run() going (see KeepAlive). Throws IllegalState for a scheduler not
  /// owned by a std::shared_ptr (every scheduler create() made is).
  KeepAlive keep_alive();

  /// True from run(), poll() or run_for() until one of them finds nothing active, and always for a
  /// scheduler with wake_loop; async phases can start only then.
  bool is_running() const noexcept;
  /// True while a tasklet or a KeepAlive guard is active: run() would not return yet. An
  /// application's loop keeps going while it is true.
  bool has_work() const noexcept;
  /// Tasklets queued, running, parked, delayed or waiting for their rule (KeepAlive guards not
  /// included). While run() is active it may count up to 63 more: the synchronous thread counts
  /// the tasklets with rules it starts in blocks of 64.
  std::size_t active_count() const noexcept;
  /// Every phase exception of the last run() (or inline schedule()), first one first, after those
  /// of tasklets that ended while no run() was active before it (which that run() rethrows).
  /// A tasklet the engine cannot go on with for lack of memory ends with std::bad_alloc here.
  std::vector<Failure> failures() const;
  /// The manager whose rule table this scheduler's tasklets use.
  const std::shared_ptr<JobManager>& manager() const noexcept;

 protected:
  Scheduler() = default;  // made by create() only
};

}  // namespace tasklet
