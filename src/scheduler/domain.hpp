// Private: the domain of one JobManager (its rule table, its workers, its background scheduler)
// and the threads' side of the rule table (begin_rule/end_rule). The layers above plug their own
// per-manager state in as an extension (the jobs do).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "base/door.hpp"
#include "scheduler/run_state.hpp"
#include "table/door.hpp"
#include "tasklet/error.hpp"
#include "tasklet/job_manager.hpp"
#include "tasklet/scheduler.hpp"
#include "tasklet/workers.hpp"

namespace tasklet::detail {

/// A thread's request in begin_rule. wait() blocks an ordinary thread; on a worker it suspends the
/// oneTBB task, so the worker goes on with other work (waiting callers never starve the pool).
class ThreadHold final : public InlineRuleRequest<4> {
 public:
  /// begin_rule's fast path: the request this thread left parked in `table` for exactly `rule` at
  /// its last end_rule, to enter() there again (which takes it back without the table's lock unless
  /// somebody came for it meanwhile); null when there is none. Lock-free.
  static ThreadHold* parked(const Rule& rule, const RuleTable& table) noexcept;
  /// A request for `rule`, out of every table, to enter() in one. `rule` must outlive it (the
  /// begin_rule frame or the tasklet keeps it). Recycled per thread: uncontended begin_rule/end_rule
  /// allocate nothing. `parkable`: leave() may park it (begin_rule's requests; see RuleTable::leave).
  static ThreadHold* take(const Rule& rule, bool parkable);
  /// end_rule: leaves `table`, where the request stays parked for this thread's next begin_rule of
  /// the same rule when nobody wants it; either way the caller is done with it.
  static void finish(ThreadHold* hold, RuleTable& table);
  static void recycle(ThreadHold* hold) noexcept;
  /// How enter() ended: granted, canceled (the manager shut down while it waited) or refused (the
  /// table ran out of memory entering it; it never was in the table).
  enum class Answer { granted, canceled, refused };
  /// Enters the request in `table` and returns once it is answered. While it waits, `waits_in`
  /// knows (a transfer_rule may hand this thread a rule meanwhile).
  Answer enter(RuleTable& table, Domain* waits_in = nullptr) {
    return try_enter(table) ? answer_ : wait(waits_in, false);
  }
  /// enter() in two steps: true when the request was answered at once (answer()), else wait().
  bool try_enter(RuleTable& table);
  /// Waits for the answer, noted in `waits_in` meanwhile (see Noted). With `serve`, a request that
  /// wakes a synchronous thread (wake_through) runs that scheduler's sync phases meanwhile, out of
  /// the frame on top of this thread's stack.
  Answer wait(Domain* waits_in, bool serve);
  void await(bool serve);
  /// While it lives, `waits_in` knows that this thread waits for `hold` (a transfer_rule may hand
  /// the thread a rule meanwhile). Out of memory, the thread waits unnoted.
  class Noted {
   public:
    Noted(ThreadHold& hold, Domain* waits_in) noexcept;
    ~Noted() { end(); }
    /// The thread no longer waits for the request (before the request may go).
    void end() noexcept;
    Noted(const Noted&) = delete;
    Noted& operator=(const Noted&) = delete;

   private:
    Domain* domain_ = nullptr;
  };
  Answer answer() const noexcept { return answer_; }
  /// Before it enters: its answer wakes `sync_thread_of`'s synchronous thread (this one) through
  /// the scheduler's own wake-up, so that it can wait for both (null: the usual wake-up).
  void wake_through(SchedulerImpl* sync_thread_of) noexcept {
    serving_ = sync_thread_of;
    served_answer_ = false;
  }
  /// Whose request it is, for diagnostics: the tasklet whose phase (or rule) it is for, else the
  /// thread. take() and parked() set it from the calling code.
  void set_owner(const Tasklet* tasklet, const SchedulerImpl* of, std::thread::id thread) noexcept {
    owner_tasklet_.store(tasklet, std::memory_order_relaxed);
    owner_of_.store(of, std::memory_order_relaxed);
    owner_thread_.store(thread, std::memory_order_relaxed);
  }
  RuleBlocker describe() const override;
  std::string job_name() const override;
  /// The tasklet whose phase (or rule) it is for, if any.
  const Tasklet* owner_tasklet() const noexcept { return owner_tasklet_.load(std::memory_order_relaxed); }
  /// Set (under the domain's handing lock) when this waiting request was withdrawn because a rule
  /// containing it was handed to its thread: `canceled` then means that.
  bool handed = false;
  void granted() noexcept override { wake(Answer::granted); }
  void canceled() noexcept override { wake(Answer::canceled); }
  void refused() noexcept override { wake(Answer::refused); }
  void failed(std::exception_ptr why) noexcept override {
    failure_ = std::move(why);
    wake(Answer::canceled);
  }
  /// Why a backend could not grant it (answer() is then canceled), else null.
  const std::exception_ptr& failure() const noexcept { return failure_; }
  bool parkable() const noexcept override { return parkable_; }
  bool blocks_thread() const noexcept override { return blocks_thread_; }

 private:
  bool is_for(const Rule& rule) const noexcept {
    return this->rule() == rule.get() && !last_rule_.owner_before(rule) && !rule.owner_before(last_rule_);
  }
  void wake(Answer answer) noexcept;
  void reset() noexcept;
  Wakeup wakeup_;
  Answer answer_ = Answer::canceled;
  std::exception_ptr failure_;
  bool answered_here_ = false;  // granted or canceled by the owner's own enter(): nothing to wait for
  bool parkable_ = false;
  bool blocks_thread_ = false;  // its owner's wait blocks its thread: not a task on a worker
  // The table where this request is parked (read by its owner only), or null.
  RuleTable* parked_in_ = nullptr;
  // The rule of the last request: a weak reference, so that a new rule cannot take its address
  // while its request is parked.
  std::weak_ptr<const SchedulingRule> last_rule_;
  // Off begin_rule's fast path, so kept behind what it touches. Set by wake_through before it
  // enters (null otherwise); the answer, under serving_'s mutex.
  SchedulerImpl* serving_ = nullptr;
  bool served_answer_ = false;
  // Written by its owner (and transfer_rule), read under the table's lock by blockers().
  std::atomic<const Tasklet*> owner_tasklet_{nullptr};
  std::atomic<const SchedulerImpl*> owner_of_{nullptr};
  std::atomic<std::thread::id> owner_thread_{};
};

/// Ends the begin_rule frames above `base` (a phase's leftovers), innermost first, releasing
/// what they hold; returns their names for the report, empty when there were none.
std::string end_frames_above(RunState& ctx, std::size_t base) noexcept;

/// Why a library tasklet that waited for its rule ended unrun: its manager shut down.
class ManagerShutDown : public IllegalState {
 public:
  using IllegalState::IllegalState;
};

/// The frame of a run of the extension's (a job's run; owner: the job's core): begin_rule tells
/// the extension when that code has to wait.
inline constexpr FrameKind extension_run{"extension run"};
/// The frame of a begin_rule wait that runs sync phases meanwhile (owner: its ThreadHold): a phase
/// run then must not wait for a rule that conflicts.
inline constexpr FrameKind serving_wait{"serving wait"};

/// Whether code of the extension runs on `task` (see extension_run).
inline bool runs_extension(const RunState& task) noexcept {
  return find_frame(task, extension_run) != nullptr;
}

/// What a layer above keeps per manager (the jobs): told, in this order, when the manager goes.
class DomainExtension {
 public:
  virtual ~DomainExtension() = default;
  /// Nothing starts from now on, and what has not started is canceled (before the table's
  /// waiters are).
  virtual void stop() noexcept = 0;
  /// Waits for what runs (after the table's waiters were canceled).
  virtual void shut_down() noexcept = 0;
  /// After the table's waiters are canceled: lets its schedulers go and forgets them. What it
  /// still owns is dropped with the domain, after the last task of the domain's schedulers.
  virtual void let_go() noexcept = 0;
  /// Whether the calling code is work of the extension that shut_down() would wait for; then
  /// finish_after_this_run() takes the domain, to shut it down once that work is over.
  virtual bool runs_here() const noexcept = 0;
  virtual void finish_after_this_run(std::shared_ptr<Domain> domain) noexcept = 0;
  /// The code running on `ctx` (in an extension_run frame) has to wait in begin_rule;
  /// `reason` says for what and whom, null once the wait is over. On that code's thread.
  virtual void blocked(const RunState& ctx, const std::string* reason) noexcept = 0;
};

/// Owned by its JobManager and by the manager's own background schedulers, so the rule table
/// outlives every task of theirs, even one still finishing after the manager is gone.
class Domain : public std::enable_shared_from_this<Domain> {
 public:
  Domain(JobManager& self, JobManager::Options options);
  ~Domain();

  /// The manager is being destroyed: cancels what has not started, waits for what runs (see
  /// ~JobManager), lets its schedulers go and its extension. Once.
  void shut_down() noexcept;
  /// shut_down's first part, for one called from inside a run, which finishes it once that run is
  /// over: nothing new starts, and every waiting request (tasklets, holds, begin_rule) is
  /// canceled, now and whenever one would wait from now on. Once; shut_down() calls it.
  void close() noexcept;
  /// Whether close() was called: a hold or begin_rule that would wait is refused instead.
  bool closing() const noexcept { return closing_.load(std::memory_order_seq_cst); }

  void begin_rule(const Rule& rule);
  detail::ThreadHold* hold_for(detail::RunState& ctx, const Rule& rule);
  void end_rule(const Rule& rule);
  /// Before a wait for work of this manager (`what`, as "join(job 'B')"): throws WaitCycle when
  /// the calling code holds rules of this manager and a waiting request that `start` accepts (the
  /// work's) waits for one of them, directly or behind other waiting requests. Costs nothing
  /// when the calling code holds no rule. Detects what the table shows now: work that will ask for
  /// a rule later, or a holder that waits for the caller in another way, is not seen.
  void check_wait(const std::string& what, const std::function<bool(const RuleRequest&)>& start);
  /// JobManager::set_lock_listener.
  void set_lock_listener(std::shared_ptr<LockListener> listener);
  /// The recorder while one records (JobManager::start_trace), else null. Lock-free.
  Trace* trace() const noexcept { return trace_.load(std::memory_order_acquire); }
  void start_trace(std::size_t max_events);
  void stop_trace() noexcept;
  void write_trace(std::ostream& out, JobManager::TraceFormat format) const;
  void save_trace(const std::string& path) const;
  /// Saves the trace to the file TASKLET_TRACE named for this manager, if any (errors go to
  /// standard error: called where nobody could catch them).
  void save_trace_file() noexcept;
  /// JobManager::transfer_rule.
  void transfer_rule(const Rule& rule, std::thread::id destination);
  /// ThreadHold::enter: a thread starts or stops waiting in begin_rule.
  void note_waiting(ThreadHold& hold);
  void note_waited() noexcept;
  Rule current_rule() const;
  /// Throws the table's backend's failure (a lost lease) when it shares `held`, a rule this thread
  /// holds or asked for: begin_rule and end_rule tell its holders so at their next call.
  void check_shared(const Rule& held) const;

  /// The manager's own scheduler for work with no synchronous thread (serial executors):
  /// async phases only, always running. Made on first use.
  Scheduler& background();
  /// A new scheduler of that kind, for a layer above (the jobs' scheduler).
  std::shared_ptr<Scheduler> make_background();

  /// The extension of the layer above, made by `make` on first use.
  template <class Extension, class Make>
  Extension& extension(Make&& make) {
    DomainExtension* made = made_extension_.load(std::memory_order_acquire);
    if (made == nullptr) {
      std::lock_guard lock(making_);
      if (!extension_) extension_ = make();
      made = extension_.get();
      made_extension_.store(made, std::memory_order_release);
    }
    return static_cast<Extension&>(*made);
  }
  /// The extension if it was made, else null.
  DomainExtension* made_extension() const noexcept { return made_extension_.load(std::memory_order_acquire); }

  /// The manager's one timer (delayed jobs, tasklets and resumes, timed waits); stopped when the
  /// manager goes. Shared: the jobs' state may outlive the domain.
  const std::shared_ptr<Timer>& timer() const noexcept { return timer_; }

  /// The rule table's answers for the rooms above (see RuleTable): whom the waiting request of
  /// `owner` waits for, and whether a waiter that `matches` accepts conflicts with the held
  /// request that `mine` accepts (both run under the table's lock).
  std::vector<RuleBlocker> blockers_of(const void* owner) { return table_.blockers_of(owner); }
  template <class Mine, class Predicate>
  bool has_conflicting_waiter_if(Mine&& mine, Predicate&& matches) {
    return table_.has_conflicting_waiter_if(std::forward<Mine>(mine), std::forward<Predicate>(matches));
  }
  /// The backend that shares this manager's rules beyond the process (see RuleTable::set_backend).
  void set_backend(std::shared_ptr<RuleBackend> backend) noexcept { table_.set_backend(std::move(backend)); }
  RuleBackend* backend() const noexcept { return table_.backend(); }

 private:
  JobManager& self_;
  std::shared_ptr<Workers> workers_;
  // The scheduler room's engine and JobManager's methods reach the table; the rooms above do not.
  friend class SchedulerImpl;
  friend class tasklet::JobManager;
  friend std::string end_frames_above(RunState& ctx, std::size_t base) noexcept;
  RuleTable table_;
  std::shared_ptr<Timer> timer_;
  // Made on first use under `making_` rather than std::call_once: making them may throw (out of
  // memory), and an exception through call_once leaves it stuck with some C++ runtimes.
  std::mutex making_;
  std::atomic<Scheduler*> made_background_{nullptr};
  std::shared_ptr<Scheduler> background_;
  std::atomic<DomainExtension*> made_extension_{nullptr};
  std::shared_ptr<DomainExtension> extension_;

  // transfer_rule: rules handed to threads that have not taken them yet, and the threads waiting
  // in begin_rule (a transfer to one of them wakes it). Rarely used: begin_rule and end_rule look
  // only while `handed_count_` is not zero.
  std::mutex handing_;
  std::unordered_map<std::thread::id, RuleFrame> handed_;
  std::unordered_map<std::thread::id, ThreadHold*> waiting_;
  std::atomic<std::size_t> handed_count_{0};
  // The rule handed to this thread, if any, becomes its outermost rule (at `ctx.phase_base`).
  void take_handed(RunState& ctx);
  // As take_handed, below the frame on top (the caller's, pushed already), which stays pushed
  // whatever it throws.
  void take_handed_below_top(RunState& ctx);
  // end_rule's end of the top frame, which must be `rule`'s.
  void end_top(RunState& ctx, const Rule& rule);
  // end_rule when a rule was handed to some thread: takes it first if it is this thread's.
  void end_rule_taking_handed(RunState& ctx, const Rule& rule);
  ThreadHold* destination_waiter(const Rule& rule, std::thread::id destination, const std::string& what);
  void handed(ThreadHold* waiter);
  void transfer_tasklet_rule(RunState& ctx, const Rule& rule, std::thread::id destination,
                             const std::string& what);

  // The lock listener, read by begin_rule only when it has to wait and `listening_` says so.
  std::mutex listener_mutex_;
  std::shared_ptr<LockListener> lock_listener_;
  std::atomic<bool> listening_{false};
  // close() was called (see closing()).
  std::atomic<bool> closing_{false};
  // The recorder, made by the first start_trace and kept until the domain goes (a thread may still
  // be recording into it after stop_trace); started again, it starts over. `trace_` is set while
  // it records: beside `listening_`, which begin_rule reads with it.
  std::atomic<Trace*> trace_{nullptr};
  mutable std::mutex trace_mutex_;
  std::unique_ptr<Trace> recorder_;
  std::string trace_file_;  // where TASKLET_TRACE saves it at shut_down
  void trace_from_environment();
  // begin_rule's request enters and waits, telling the lock listener, the job's monitor and the
  // trace recorder.
  ThreadHold::Answer enter_and_wait(ThreadHold& hold, RunState& ctx, const Rule& rule);
  ThreadHold::Answer enter_and_wait_told(ThreadHold& hold, RunState& ctx, const Rule& rule);
};

/// The concrete JobManager: a handle on its domain.
class ManagerHandle final : public JobManager {
 public:
  explicit ManagerHandle(JobManager::Options options);
  ~ManagerHandle() override;
  std::shared_ptr<Domain> domain;
};

/// The domain behind a public manager (every JobManager is a ManagerHandle).
inline Domain& domain(const JobManager& manager) noexcept {
  return *static_cast<const ManagerHandle&>(manager).domain;
}

}  // namespace tasklet::detail
