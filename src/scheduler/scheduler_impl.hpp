// Private: the scheduler's engine.
//
// Who counts what:
//  - `active_` counts the tasklets this scheduler owns (queued for sync, in an async phase or on
//    its way there, parked, waiting for a rule); new tasklets the synchronous thread puts in its
//    async batch are added when the batch is submitted, and those with rules it starts come out of
//    a block of counts it added ahead and gives back then, before run() can look at the count. run() returns
//    when it is zero, and decides that under `mutex_`, the same lock that a thread without a stake in
//    `active_` takes to check `running_` before it adds a tasklet; so no async phase starts after run()
//    decided to return.
//  - Every oneTBB task this scheduler creates belongs to `group_`; the destructor waits for the
//    group, so no task touches a destroyed scheduler.
// Threads never run user code while holding `mutex_` or `parked_mutex_`.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <oneapi/tbb/mutex.h>
#include <oneapi/tbb/scalable_allocator.h>
#include <oneapi/tbb/task_group.h>

#include "base/door.hpp"
#include "scheduler/domain.hpp"
#include "scheduler/door.hpp"
#include "scheduler/run_state.hpp"
#include "table/door.hpp"
#include "tasklet/detail/hold.hpp"
#include "tasklet/detail/library_tasklet.hpp"
#include "tasklet/job_manager.hpp"
#include "tasklet/scheduler.hpp"
#include "tasklet/workers.hpp"

namespace tasklet::detail {

/// What every copy of a Rescheduler shares: the suspension it names. The last copy going ends the
/// suspension unless it was used (SchedulerImpl::end_suspension).
class Suspension {
 public:
  Suspension(std::weak_ptr<Scheduler> of, std::weak_ptr<Tasklet> suspended, std::uint32_t number) noexcept
      : scheduler(std::move(of)), tasklet(std::move(suspended)), generation(number) {}
  ~Suspension();
  Suspension(const Suspension&) = delete;
  Suspension& operator=(const Suspension&) = delete;

  std::weak_ptr<Scheduler> scheduler;
  std::weak_ptr<Tasklet> tasklet;
  std::uint32_t generation;  // 0 until suspend() succeeded
};

class SchedulerImpl final {
 public:
  using TaskletPtr = std::shared_ptr<Tasklet>;

  SchedulerImpl(Scheduler& self, SchedulerOptions options);
  ~SchedulerImpl();

  void run();
  /// Scheduler::run_until, run_for and poll (a deadline that has passed), named `call` in errors.
  std::size_t run_until(Clock::time_point deadline, const char* call);
  void schedule(TaskletPtr tasklet, Directive directive);
  /// Scheduler::suspend: the suspension's generation, for its Rescheduler.
  std::uint32_t suspend(Tasklet& tasklet);
  bool park_idle(Tasklet& tasklet, TaskletPtr& owned, std::uint64_t& word, std::uint32_t generation);
  TaskletPtr unpark(Tasklet& tasklet, std::uint64_t& word, std::uint32_t generation);
  void resume(const TaskletPtr& tasklet, std::uint32_t generation, Directive directive);
  /// resume() without draining inline; with `checked` false, for a suspension the engine made and
  /// knows to be current and unused (then it does not throw).
  void resume_suspension(const TaskletPtr& tasklet, std::uint32_t generation, Directive directive,
                         bool checked);
  /// Scheduler::schedule_after and Rescheduler::resume_after, on the manager's timer
  /// (scheduler_timer.cpp).
  void schedule_after(Clock::duration delay, TaskletPtr tasklet, Directive directive);
  void resume_after(const TaskletPtr& tasklet, std::shared_ptr<const Suspension> suspension,
                    Clock::duration delay, Directive directive);
  /// The last Rescheduler of a suspension is gone: unless it was used, the suspension ends (see
  /// park_unarmed for a tasklet it leaves parked).
  void end_suspension(TaskletPtr tasklet, std::uint32_t generation) noexcept;
  /// While run() has nothing else to do and a parked tasklet without a Rescheduler has an owner
  /// outside (`loose_`), it looks this often whether that owner has let go.
  static constexpr std::chrono::milliseconds loose_check_interval{50};
  void with(const TaskletPtr& tasklet);

  /// When this thread is a synchronous thread (in run()), the requests of the tasklets with rules
  /// it started and has not entered into the rule table yet go in now, so that a request it makes
  /// next (begin_rule, with, another scheduler's tasklet) comes after them, in program order.
  static void enter_pending_rules(const RunState& here = run_state()) {
    if (SchedulerImpl* sync = here.sync_of; sync != nullptr && !sync->entering_.empty())
      sync->enter_rule_batch();
  }

  /// The implicit scheduler of the calling thread runs its sync tasklets inline.
  void make_implicit_for_this_thread();
  /// A manager's background scheduler: no synchronous thread, async phases always allowed.
  void make_background();
  /// Withdraws a tasklet still waiting for its delay or its rule and ends it unrun; false when it
  /// has started.
  bool withdraw(Tasklet& tasklet);
  /// Withdraws every tasklet waiting for exactly `rule` that `matches` (called under the rule
  /// table's lock) and ends them unrun; returns how many.
  template <class Predicate>
  std::size_t withdraw_waiting(const SchedulingRule& rule, Predicate&& matches) {
    return domain_.table_.withdraw_waiting(rule, [&](const RuleRequest& request) {
      const auto* tasklet = static_cast<const Tasklet*>(request.owner());
      return tasklet != nullptr && matches(*tasklet);
    });
  }
  /// Takes the delayed starts (schedule_after) of the tasklets that `matches` out of the delays
  /// and ends them unrun; returns how many.
  template <class Predicate>
  std::size_t withdraw_delayed(Predicate&& matches) {
    std::vector<TaskletPtr> taken;
    {
      std::lock_guard lock(delayed_mutex_);
      std::size_t count = 0;
      for (const auto& [when, entry] : delayed_) {
        if (entry.tasklet && matches(*entry.tasklet)) ++count;
      }
      taken.reserve(count);  // out of memory: nothing taken
      for (auto at = delayed_.begin(); at != delayed_.end();) {
        if (at->second.tasklet && matches(*at->second.tasklet)) {
          taken.push_back(std::move(at->second.tasklet));
          at = delayed_.erase(at);
        } else {
          ++at;
        }
      }
    }
    for (TaskletPtr& tasklet : taken) finish(std::move(tasklet), nullptr);
    return taken.size();
  }
  /// Async phases wait in deadline order (earliest first; ties in arrival order) instead of going
  /// straight to the arena. `order` gives a phase's lane and deadline; within a lane, deadlines
  /// grow with arrival (a lane is a job priority: its deadline is the time it became waiting plus
  /// the priority's delay), so each lane is a FIFO and the next phase is the earliest of the lanes'
  /// fronts. Each phase is taken by a pick task on the workers, which starts the next pick before
  /// it runs the phase: a phase that waits (suspended) leaves the queue moving, the arena's
  /// concurrency bounds how many run, and a stream of phases from one thread costs one arena
  /// submission per `concurrency` picks waiting, not one per phase. Set before use.
  using Order = PhaseOrder;
  static constexpr std::size_t lane_count = phase_lane_count;
  using OrderOf = PhaseOrderOf;
  void order_async_phases_by(OrderOf order);
  /// How diagnostics name this scheduler's tasklets ("job 'name'" for the jobs'); by default
  /// "tasklet 'name'", or "tasklet@<address>" for an unnamed one. Set before use; must not throw
  /// but for std::bad_alloc, nor take locks (it runs under the rule table's).
  /// The synchronous thread waits in begin_rule until `answered` (set by answer_server, under
  /// mutex_), running the sync phases queued meanwhile when `run_phases`.
  void serve_until(const bool& answered, bool run_phases);
  void hand_out_async() noexcept;
  bool wait_to_serve(const bool& answered, bool run_phases);
  void answer_server(bool& answered) noexcept;
  void describe_tasklets_by(DescribeTasklet describe) noexcept { describe_ = describe; }
  std::string describe_tasklet(const Tasklet& tasklet) const;
  /// The job `tasklet` works for (a library tasklet's job_name()), empty for others.
  static std::string job_of_tasklet(const Tasklet& tasklet);
  /// Ends a tasklet without running its next phase, for `error` (out of memory entering its rule
  /// or queueing the phase, its rule refused by a backend, its manager shutting down): a library
  /// tasklet is told so on a worker (detail::LibraryTasklet) and ends with no failure recorded;
  /// another ends with `error` as its failure.
  void abandon(TaskletPtr tasklet, std::exception_ptr error) noexcept;
  void tell_abandoned(TaskletPtr tasklet, std::exception_ptr error) noexcept;
  /// The front of the lane whose front is earliest (under ready_mutex_, with a phase ready).
  TaskletPtr take_earliest_ready() noexcept;
  /// The tasklet whose phase runs here lets a waiting conflicting request go first and then takes
  /// its rule again (waiting as begin_rule does). False, at once, when nobody conflicting waits.
  bool yield_rule(Tasklet& tasklet);
  /// co_await hold(rule) in a phase of `tasklet` running here (see tasklet/detail/hold.hpp).
  HoldAnswer begin_hold(Tasklet& tasklet, const Rule& rule, HoldReply& later);
  /// Releases the rule of a tasklet before it is done (a job's run is over, so its rule must be
  /// free by the time join() returns). Idempotent: done releases nothing twice.
  void release_rule(Tasklet& tasklet) noexcept;
  [[gnu::cold, gnu::noinline]] void release_traced(Trace& trace, Tasklet& tasklet,
                                                   RuleRequest& hold) noexcept;

  Scheduler& self_;
  SchedulerOptions options_;  // resolved: manager and workers are set
  Domain& domain_;
  WorkersImpl& workers_;
  // On lines of its own: every spawn and every task's end writes its counter, and every phase reads
  // domain_ and workers_ above.
  alignas(64) oneapi::tbb::task_group group_;

  // Each of the next three lines is the cache line of its own: the workers write active_ once per
  // tasklet and the holds once per tasklet with a rule, and read running_ once per async phase,
  // which nobody writes while run() is active. Left to where the members happened to fall (next to
  // group_, and to each other), they would share lines with what others write.
  //
  // Tasklets scheduled and not yet done, for run() and active_count(). A background scheduler
  // (a manager's, for its serial executors and its jobs) has no run() and is not visible to users:
  // it does not count, so that its posting threads and its workers do not pass this line back and
  // forth once per tasklet.
  alignas(64) std::atomic<std::size_t> active_{0};
  std::atomic<std::size_t> keep_alives_{0};  // Scheduler::KeepAlive guards, counted in active_ too
  // TaskletHolds not yet done with this scheduler: those that the synchronous thread started inside
  // run() (plus the counts it took ahead for them), and the others.
  alignas(64) std::atomic<std::size_t> sync_holds_{0};
  std::atomic<std::size_t> holds_{0};
  alignas(64) std::atomic<bool> running_{false};
  bool background_ = false;
  const bool loop_driven_;          // options_.wake_loop is set
  std::atomic<bool> going_{false};  // the destructor has begun: a canceled hold resumes nothing

  mutable std::mutex mutex_;  // guards the members below up to `parked_mutex_`
  std::condition_variable wake_;
  std::vector<TaskletPtr> sync_queue_;
  bool sleeping_ = false;
  bool driving_ = false;    // run(), poll() or run_until() is taking the sync phases
  bool loop_told_ = false;  // wake_loop was called for the sync phases queued since
  std::vector<Failure> failures_;
  std::size_t reported_failures_ = 0;  // the first ones, which the last run() reported

  // Held by run(), poll(), run_until() and inline drains: one synchronous thread at a time.
  std::mutex run_mutex_;
  std::size_t sync_phases_run_ = 0;  // by whichever thread holds run_mutex_
  std::thread::id implicit_owner_;

  std::mutex parked_mutex_;
  std::unordered_map<Tasklet*, TaskletPtr> parked_;
  // Delayed starts and resumes, in time order (ties in arrival order), with one alarm of the
  // manager's timer set for the earliest. Closed when the scheduler goes.
  struct Delayed {
    TaskletPtr tasklet;                            // a start (schedule_after), or
    std::shared_ptr<const Suspension> suspension;  // a resume (resume_after)
    Directive directive;
  };
  struct DelayAlarm final : Timer::Alarm {
    explicit DelayAlarm(SchedulerImpl& owner) : impl(owner) {}
    void ring() noexcept override { impl.delays_due(); }
    SchedulerImpl& impl;
  };
  std::mutex delayed_mutex_;
  std::multimap<Clock::time_point, Delayed> delayed_;
  bool delays_closed_ = false;
  DelayAlarm delay_alarm_{*this};

  // Parked tasklets without a Rescheduler that had an owner outside when they parked: run() checks
  // them while it waits (end_lost_tasklets), as nothing tells it when that owner lets go.
  std::atomic<std::size_t> loose_{0};

  // Touched by the synchronous thread only: async phases it started, submitted in batches, and
  // the sync tasklets taken from the queue for one turn of the loop.
  std::vector<TaskletPtr> async_batch_;
  std::size_t uncounted_in_batch_ = 0;  // new tasklets in async_batch_ not yet in active_
  // Counts the synchronous thread added to active_ and sync_holds_ ahead of the tasklets with rules it
  // starts (which run at once, so they cannot wait for the batch), one atomic add per block
  // instead of one per tasklet. The unused rest is given back when the batch is submitted, before
  // run() looks at active_.
  std::size_t reserved_active_ = 0;
  std::size_t reserved_holds_ = 0;
  // Requests of tasklets with rules it started, submitted to the rule table together when there
  // are enough, at the batch's submission, or before this thread makes another request.
  std::vector<RuleRequest*> entering_;
  std::vector<TaskletPtr*> entering_tasklets_;  // their TaskletHold::tasklet (for the destructor)
  std::vector<TaskletPtr> sync_batch_;
  std::size_t sync_next_ = 0;  // the next of sync_batch_ to run
  // Flow control of a thread's requests (let_rules_catch_up): the holds it started, how many of
  // them must have been delivered before it holds back again after giving up, and how often it held
  // back and gave up doing so (for tests and diagnostics).
  struct CatchUp {
    std::size_t started = 0;
    std::size_t rearm_at = 0;
    std::size_t waits = 0;
    std::size_t give_ups = 0;
  };
  CatchUp sync_catch_up_;  // the synchronous thread's

  std::atomic<bool> spawned_{false};  // any oneTBB task was ever created (the destructor waits)

  // Deadline-ordered async phases (order_async_phases_by): a FIFO per lane, and the picks started
  // and not yet running (at most the workers' concurrency).
  struct ReadyPhase {
    // Takes the tasklet only once its place is allocated (emplace_back): out of memory, the caller
    // still has it.
    ReadyPhase(std::int64_t when, TaskletPtr&& phase) noexcept : deadline(when), tasklet(std::move(phase)) {}
    std::int64_t deadline;
    TaskletPtr tasklet;
  };
  OrderOf order_ = nullptr;
  DescribeTasklet describe_ = nullptr;
  oneapi::tbb::mutex ready_mutex_;  // held for a queue step: spins briefly, then waits
  // Blocks pushed by the posting thread are freed by the workers: glibc's allocator would make them
  // contend for its arena lock, the scalable allocator frees into the owner thread's pool.
  using Lane = std::deque<ReadyPhase, oneapi::tbb::scalable_allocator<ReadyPhase>>;
  std::array<Lane, lane_count> ready_;
  std::size_t ready_count_ = 0;
  int pending_picks_ = 0;

 private:
  struct PhaseTask;
  struct BatchTask;
  struct AbandonTask;
  struct EnterTask;
  struct PickTask;
  template <std::size_t N>
  struct TaskletHold;
  struct PhaseHold;
  struct Delivery;

  void claim(Tasklet& tasklet, const char* action);
  void unclaim(Tasklet& tasklet) noexcept;
  bool run_is_active_for_caller();
  // Counts a tasklet just claimed for `action` in active_; for `async` only while run() is active,
  // else unclaims it and throws SchedulerNotRunning.
  void count_claimed(Tasklet& tasklet, Directive directive, const char* action);
  // The synchronous thread's count for one more tasklet, out of `reserved` (refilled in blocks).
  static void take_reserved(std::atomic<std::size_t>& counter, std::size_t& reserved) noexcept;
  // Out of memory, `tasklet` is left with the caller and nothing changed.
  void start(TaskletPtr& tasklet, Directive directive);
  template <std::size_t N>
  void start_holding(TaskletPtr& tasklet, Directive directive);
  void continue_after_phase(TaskletPtr tasklet, Directive directive, std::exception_ptr error) noexcept;
  void dispatch(TaskletPtr tasklet, Directive directive) noexcept;
  // Out of memory, the tasklet is abandoned (see abandon) rather than lost.
  void enqueue_sync(TaskletPtr tasklet) noexcept;
  void enqueue_async(TaskletPtr tasklet) noexcept;
  void enqueue_async_or_throw(TaskletPtr& tasklet);
  // Out of memory, `task` is left as it was (oneTBB allocates before it moves the task in).
  template <class Task>
  void spawn(Task&& task);
  void flush_async_batch();
  void enter_rule_batch();
  template <class Waiting>
  void let_rules_catch_up(CatchUp& state, Waiting&& waiting);
  // Takes `holds` out of holds_ or sync_holds_, waking whoever waits for that count.
  static void count_out(std::atomic<std::size_t>& count, std::size_t holds) noexcept;
  void check_resumable(const Tasklet& tasklet, std::uint64_t word, std::uint32_t generation,
                       Directive directive) const;
  void add_delayed(Clock::time_point when, Delayed entry);
  void delays_due() noexcept;
  void fire(Delayed& entry) noexcept;
  // The scheduler is going: drops what waits for its delay (tasklets end idle, unrun).
  void close_delays() noexcept;
  // Parks a tasklet that no Rescheduler can resume; with no owner outside, it is lost (TaskletLost).
  void park_unarmed(TaskletPtr tasklet) noexcept;
  void end_lost(TaskletPtr tasklet) noexcept;
  void note_loose() noexcept;
  // Ends the parked tasklets without a Rescheduler whose outside owners have let go; recounts loose_.
  void end_lost_tasklets() noexcept;
  void forget_deliveries_here() noexcept;
  void finish(TaskletPtr tasklet, std::exception_ptr error) noexcept;
  // One tasklet more in active_ (nothing for a background scheduler); the first tells the loop.
  void count_in() noexcept;
  // One tasklet fewer in active_ (nothing for a background scheduler); the last wakes run() and
  // tells the loop.
  void uncount_active() noexcept;
  // Calls options_.wake_loop, for a scheduler an application's loop drives.
  void tell_loop() noexcept;

 public:
  void keep_alive() noexcept;
  void let_go() noexcept;

 private:
  void record_failure(const Tasklet& tasklet, std::exception_ptr error) noexcept;
  void forget_reported_failures() noexcept;
  // Rethrows the first failure not reported before, and counts them all reported.
  void report_failures();
  void run_async_phase(TaskletPtr tasklet) noexcept;
  void run_sync_phase(TaskletPtr tasklet) noexcept;
  enum class Turn { ran, finished, timed_out };
  class Driving;
  void check_may_drive(const char* call) const;
  std::size_t drive(Clock::time_point deadline, const char* call);
  void run_turns(Clock::time_point deadline, const char* call);
  Turn drain_sync_queue_once(Clock::time_point deadline, const char* call);
  bool sleep_until(std::unique_lock<std::mutex>& lock, Clock::time_point deadline);
  void hand_out_async_or_throw();
  void run_sync_batch() noexcept;
  void check_wait_cycle(const char* call);
  static long held_rule_references(const Tasklet& tasklet) noexcept;
  void drain_inline();
  void drop_pending() noexcept;
};

// A fresh state for one of a scheduler's oneTBB tasks, installed on the thread while it runs there.
class WorkerTaskScope {
 public:
  WorkerTaskScope(WorkersImpl& workers, SchedulerImpl& impl) noexcept {
    auto& ctx = context();
    mine_.outer = ctx.state;
    mine_.worker_of = &workers;
    mine_.task_of = &impl;
    ctx.state = &mine_;
  }
  // The task may have moved to another thread while suspended: go back to that thread's state.
  ~WorkerTaskScope() { context().state = mine_.outer; }
  WorkerTaskScope(const WorkerTaskScope&) = delete;
  WorkerTaskScope& operator=(const WorkerTaskScope&) = delete;

 private:
  RunState mine_;
};

template <class Task>
inline void SchedulerImpl::spawn(Task&& task) {
  spawned_.store(true, std::memory_order_relaxed);
  if (run_state().worker_of == &workers_) {
    group_.run(std::forward<Task>(task));  // stays on this worker's deque unless stolen
  } else {
    workers_.arena().enqueue(group_.defer(std::forward<Task>(task)));
  }
}

/// The concrete Scheduler: a handle on its engine, which outlives it when the last reference goes
/// inside one of the scheduler's own tasks.
class SchedulerHandle final : public Scheduler {
 public:
  explicit SchedulerHandle(SchedulerOptions options);
  ~SchedulerHandle() override;
  std::unique_ptr<SchedulerImpl> impl;
};

/// The engine behind a public scheduler (every Scheduler is a SchedulerHandle).
inline SchedulerImpl& impl(const Scheduler& scheduler) noexcept {
  return *static_cast<const SchedulerHandle&>(scheduler).impl;
}

}  // namespace tasklet::detail
