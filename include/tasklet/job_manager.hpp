// tasklet/job_manager.hpp: owns the workers and the rule table that schedulers and jobs share.
//
// A process-wide default (global()) plus instances of your own. Every scheduler belongs to one
// manager; its tasklets' rules and its threads' begin_rule calls go through that manager's rule
// table, so a path locked by a thread excludes a tasklet on the same path. Conflicting requests
// are granted in request order (FIFO); requests that do not conflict never wait for each other.
#pragma once

#include "tasklet/export.hpp"

#include <chrono>
#include <cstddef>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tasklet/job.hpp"
#include "tasklet/progress_monitor.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet {

class Workers;

/// Told when a thread has to wait for a rule in begin_rule (Eclipse's LockListener), so that an
/// event loop's thread can keep serving its events instead of blocking. One per manager
/// (JobManager::set_lock_listener); called for begin_rule only, on every thread that has to wait,
/// outside the library's locks.
class TASKLET_EXPORT LockListener {
 public:
  virtual ~LockListener() = default;
  /// What the thread does while it waits.
  enum class Waiting {
    /// It blocks (on a worker the task is suspended, and the worker runs other work).
    block,
    /// The synchronous thread of a scheduler (inside run(), or an inline drain of the implicit
    /// scheduler) keeps running that scheduler's sync phases queued meanwhile, each in a phase of
    /// its own, until it gets the rule. A phase run so that begins a rule conflicting with the one
    /// its thread waits for gets IllegalState (it would wait for itself). Elsewhere as block.
    serve,
  };
  /// The calling thread's request for `rule` is queued and about to wait. `blockers`: whom it
  /// waits for, holders first (see RuleBlocker); empty when the rule came free meanwhile. An
  /// exception withdraws the request and comes out of begin_rule, whose frame still needs end_rule.
  virtual Waiting about_to_wait(const Rule& rule, const std::vector<RuleBlocker>& blockers) = 0;
  /// The thread got the rule it waited for; begin_rule returns next. An exception comes out of
  /// begin_rule, with the rule held (end_rule releases it). Not called when the wait was canceled.
  virtual void got_it(const Rule& rule) { static_cast<void>(rule); }
};

/// Who holds which rules of a manager and who waits for which, and why, at one moment
/// (JobManager::rule_snapshot).
struct TASKLET_EXPORT RuleSnapshot {
  struct Request {
    /// As RuleBlocker::owner: "job 'name'", "tasklet 'name'", "thread <id>".
    std::string owner;
    Rule rule;
    /// It holds the rule; otherwise it waits for it.
    bool held = false;
    /// It asks for shared access only (read-path rules); otherwise for exclusive access somewhere.
    bool shared = false;
    /// A waiter's hard blocks: the holders of conflicting rules (indexes into `requests`).
    std::vector<std::size_t> blocked_by;
    /// A waiter's soft blocks: the earlier waiters with conflicting requests that strict FIFO
    /// puts it behind (indexes into `requests`).
    std::vector<std::size_t> behind;
    /// When it asked for the rule: known for requests made while the manager records a trace
    /// (start_trace), which times every request; unknown otherwise, where that would cost every
    /// grant a clock read.
    std::optional<std::chrono::steady_clock::time_point> since;
  };
  /// When the snapshot was taken.
  std::chrono::steady_clock::time_point taken;
  /// The holders, then the waiters in the order they asked.
  std::vector<Request> requests;
  /// Waiters past the limit rule_snapshot() was given, not listed.
  std::size_t waiters_left_out = 0;
  /// One line per request, for a log: "[2] job 'format' waits for path(/repo/src/a.cpp)
  /// (exclusive, for 12 ms): blocked by [0] job 'index'" (how long only when `since` is known).
  std::string to_string() const;
};

class TASKLET_EXPORT JobManager {
 public:
  struct Options {
    /// Worker threads for ASYNC phases and jobs (0: the machine's default concurrency).
    int concurrency = 0;
    /// Use these workers instead of creating a pool.
    std::shared_ptr<Workers> workers{};  // {}: designated initializers may leave it out under -Wextra
  };

  /// A new manager. Thread-safe.
  static std::shared_ptr<JobManager> create(Options options);
  static std::shared_ptr<JobManager> create() { return create(Options{}); }
  /// The process-wide manager, made on first use and never destroyed. Thread-safe.
  static const std::shared_ptr<JobManager>& global();

  /// Jobs do not own their manager, so this runs when its users drop it, with jobs pending or
  /// not. First cancels what has not started (waiting and sleeping jobs end with a cancel result
  /// and their done listeners are called) and every request waiting for a rule (serial tasks,
  /// tasklets, a running job's begin_rule, which throws IllegalState, and co_await hold(), which
  /// throws IllegalState); from then on a hold or begin_rule of a running job that would wait is
  /// refused the same way. Then it cancels the monitors of running jobs and waits for them and for
  /// other background work, and stops the timer. The jobs stay usable, in state none; schedule() on them
  /// throws IllegalState. Dropped inside one of its own jobs' run(), it waits for everything but that run,
  /// and the job's worker finishes the destruction after it. The manager's listeners are dropped last, once
  /// everything else is torn down. Never throws.
  virtual ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  /// Two-phase locking for the calling thread. If the thread already holds a rule (an earlier
  /// begin_rule, or the rule of the tasklet whose phase it runs), `rule` must be contained by the
  /// outermost one and is pushed without waiting; otherwise RuleNotContained. A thread holding
  /// nothing waits, in FIFO order with tasklets and other threads, until `rule` is free: on one of
  /// the library's worker threads the waiting task is suspended and the worker runs other work
  /// (in a job, the job frees its worker meanwhile).
  /// A null rule pushes a no-op scope. The push happens before any check, so every begin_rule,
  /// even one that throws (RuleNotContained, InvalidRule, IllegalState for nesting across
  /// managers, when the manager shuts down while the thread waits, or for a rule handed to this
  /// thread by transfer_rule that it cannot take), must be balanced by end_rule; prefer
  /// RuleScope. The exception is std::bad_alloc: out of memory, nothing stays pushed and there is nothing to
  /// end. Rules begun in a tasklet phase must be ended in that phase. On a manager that shares rules
  /// through etcd (tasklet::etcd::make_job_manager), a shared rule whose lease was lost throws
  /// tasklet::etcd::EtcdLeaseLost, here and when nested in a shared rule held when it was lost.
  void begin_rule(const Rule& rule);

  /// Hands the rule this thread began (its outermost, with nothing begun inside it still open) to
  /// `destination`, which then holds it as if it had begun it: it ends it with end_rule, and may
  /// begin rules it contains inside it. The rule never becomes free in between. The destination
  /// takes it at its next begin_rule or end_rule on this manager; one waiting in begin_rule for a
  /// rule this one contains takes it at once and holds both (it ends the one it asked for, then
  /// the handed one). Called in a phase of a tasklet or job that holds `rule` as its own, it hands
  /// that: the rest of the tasklet holds nothing, and its end releases nothing. Nothing for a null
  /// rule or this thread. Throws RuleMismatch when `rule` is not this thread's outermost rule of
  /// this manager, IllegalState when rules begun inside it are open, when the destination has not
  /// taken a rule handed to it earlier, or waits for a rule this one does not contain; std::bad_alloc.
  /// A destination that holds a rule of its own when it would take this one gets IllegalState
  /// there (its begin_rule has pushed all the same; its end_rule has ended its rule all the same),
  /// and the handed rule is released. As with a thread that ends inside begin_rule scopes,
  /// a destination that ends without taking the rule leaves it held. Does not block.
  void transfer_rule(const Rule& rule, std::thread::id destination);

  /// Sets the manager's lock listener (null: none). Thread-safe; a thread waiting already keeps the
  /// listener it was told by.
  void set_lock_listener(std::shared_ptr<LockListener> listener);

  /// Ends the most recent begin_rule on this thread, which must name the same rule object (else
  /// RuleMismatch, and nothing changes). Ending the outermost rule releases it. Never blocks.
  /// Throws IllegalState, once the scope has ended, for a rule handed to this thread by
  /// transfer_rule that it cannot take (see there). On a
  /// manager that shares rules through etcd, ending a shared rule (or one nested in it) after the
  /// lease was lost throws tasklet::etcd::EtcdLeaseLost once the scope has ended: the rule may have
  /// been another process's meanwhile.
  void end_rule(const Rule& rule);

  /// The innermost rule in force on this thread for this manager: its latest non-null begin_rule,
  /// else the rule of the tasklet whose phase it runs; null when none.
  Rule current_rule() const;

  // ---- Jobs (see tasklet/job.hpp). All thread-safe.

  /// The job whose run() is running on this thread (null elsewhere).
  std::shared_ptr<Job> current_job() const;
  /// Jobs of `family` (all jobs for nullptr) that are waiting, sleeping or running.
  std::vector<std::shared_ptr<Job>> find(Family family) const;
  /// Cancels every job of the family (see Job::cancel).
  void cancel(Family family);
  /// Waits until no job of the family is waiting, sleeping or running (while suspended: running),
  /// including jobs scheduled into it meanwhile. False when the timeout ran out. Must not be
  /// called from a job of that family (IllegalState); from another job it frees that job's worker
  /// while it waits.
  bool join(Family family, std::chrono::milliseconds timeout = std::chrono::milliseconds::max());
  /// Puts every waiting job of the family to sleep; wakes every sleeping one.
  void sleep(Family family);
  void wake_up(Family family);

  /// While suspended no job starts; running jobs go on. Jobs scheduled meanwhile wait.
  void suspend();
  void resume();
  bool is_suspended() const;
  /// No job is running or waiting (sleeping jobs do not count).
  bool is_idle() const;

  /// Listeners for every job of this manager, told before the job's own listeners.
  void add_listener(std::shared_ptr<JobListener> listener);
  /// Once it returns, the listener is not called again: queued events skip it, and it waits for
  /// its calls in progress on other threads (not for one it is called from inside of).
  void remove_listener(const std::shared_ptr<JobListener>& listener);

  /// Decides which monitor a job's run gets (a plain ProgressMonitor when unset or when it
  /// returns null). Called on the thread about to run the job, outside internal locks.
  using ProgressProvider = std::function<std::unique_ptr<ProgressMonitor>(Job&)>;
  void set_progress_provider(ProgressProvider provider);

  /// Held and waiting rule requests, for diagnostics and tests. Thread-safe. A rule a thread has
  /// ended is not held, even though its request may stay in the table, idle, for that thread's
  /// next begin_rule of the same rule (anyone else who asks for it gets it at once).
  struct RuleStats {
    std::size_t held = 0;
    std::size_t waiting = 0;
  };
  RuleStats rule_stats() const;

  /// Every holder and waiter of the rule table at one moment (copied under the table's lock, whose
  /// cost nobody pays until asked), with whom each waiter waits for. Lists the first
  /// `max_waiters` waiters in FIFO order (the blocks are computed among those listed, outside the
  /// lock: O(listed²)). Idle requests parked by threads that ended their rule are not listed.
  /// Thread-safe; throws std::bad_alloc.
  RuleSnapshot rule_snapshot(std::size_t max_waiters = 1000) const;

  // ---- Trace recording (docs/observability.md). All thread-safe.

  /// Starts recording this manager's work: the phases of its tasklets and jobs on the threads that
  /// ran them, job states, rule requests with whom they wait for, grants, holds and releases, and
  /// which release let which request through. Drops what an earlier recording kept. Keeps at most
  /// `max_events` events (about 150 bytes each); later ones are counted as dropped. Off by default,
  /// when it costs nothing; on, every event takes the recorder's lock. The environment variable
  /// TASKLET_TRACE=<file> starts it for every manager, and the trace is saved to that file (see
  /// save_trace) when the manager is destroyed (the global() manager: at exit).
  void start_trace(std::size_t max_events = 1'000'000);
  /// Stops recording; what was recorded stays for write_trace.
  void stop_trace();
  enum class TraceFormat {
    /// Chrome's Trace Event Format (JSON), for Perfetto UI (ui.perfetto.dev) or chrome://tracing.
    chrome_json,
    /// One self-contained page that draws the run as a timeline (no network access needed).
    html,
  };
  /// Writes what was recorded so far (nothing recorded: an empty trace).
  void write_trace(std::ostream& out, TraceFormat format) const;
  /// write_trace to a file: HTML when `path` ends in ".html", else Chrome JSON. Throws
  /// std::ios_base::failure, naming the path, when it cannot be written.
  void save_trace(const std::string& path) const;

  /// The workers ASYNC phases of this manager's schedulers use by default.
  const std::shared_ptr<Workers>& workers() const noexcept;

 protected:
  JobManager() = default;  // made by create() only
};

/// Begins a rule on construction and ends it on destruction (also when begin_rule threw, which is
/// then rethrown from the constructor; but for std::bad_alloc, which leaves nothing to end). Not
/// copyable or movable: it belongs to its thread's scope.
class TASKLET_EXPORT RuleScope {
 public:
  RuleScope(JobManager& manager, Rule rule);
  ~RuleScope();
  RuleScope(const RuleScope&) = delete;
  RuleScope& operator=(const RuleScope&) = delete;

  const Rule& rule() const noexcept { return rule_; }

 private:
  JobManager& manager_;
  Rule rule_;
};

}  // namespace tasklet
