// Running phases: a phase's and the synchronous thread's scopes on the thread's context, the async
// phase runner with its hand-offs, and the synchronous thread's run loop, inline drains and with().
#include <algorithm>
#include <exception>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "scheduler/domain.hpp"
#include "scheduler/run_state.hpp"
#include "scheduler/scheduler_impl.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/error.hpp"

namespace tasklet {

using detail::TaskletAccess;
using TaskletPtr = detail::SchedulerImpl::TaskletPtr;

namespace {

// The thread's context while one phase runs on it: its scheduler is current, its tasklet's rule is
// the outermost rule in force, and begin_rule frames from here on belong to the phase.
class PhaseScope {
 public:
  PhaseScope(detail::SchedulerImpl& impl, const TaskletPtr& owned) noexcept
      : ctx_(detail::run_state()),
        current_(ctx_.current),
        phase_of_(ctx_.phase_of),
        tasklet_(ctx_.tasklet),
        phase_owner_(ctx_.phase_owner),
        phase_rule_(ctx_.phase_rule),
        phase_domain_(ctx_.phase_domain),
        phase_base_(ctx_.phase_base) {
    ctx_.current = &impl;
    ctx_.phase_of = &impl;
    Tasklet& tasklet = *owned;
    ctx_.tasklet = &tasklet;
    ctx_.phase_owner = &owned;
    // current_rule() may hand it out. A tasklet that gave its rule away (transfer_rule) holds none.
    const Rule& rule = tasklet.rule();
    ctx_.phase_rule = rule && TaskletAccess::hold(tasklet) != nullptr ? &rule : nullptr;
    ctx_.phase_domain = &impl.domain_;
    ctx_.phase_base = ctx_.rule_stack.size();
  }
  ~PhaseScope() {
    ctx_.current = current_;
    ctx_.phase_of = phase_of_;
    ctx_.tasklet = tasklet_;
    ctx_.phase_owner = phase_owner_;
    ctx_.phase_rule = phase_rule_;
    ctx_.phase_domain = phase_domain_;
    ctx_.phase_base = phase_base_;
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

  /// Ends the rules the phase began and left open; their names, or empty when there were none.
  std::string end_open_rules() noexcept { return detail::end_frames_above(ctx_, ctx_.phase_base); }

 private:
  detail::RunState& ctx_;
  detail::SchedulerImpl* current_;
  detail::SchedulerImpl* phase_of_;
  Tasklet* tasklet_;
  const TaskletPtr* phase_owner_;
  const Rule* phase_rule_;
  detail::Domain* phase_domain_;
  std::size_t phase_base_;
};

// The thread's context while it is the synchronous thread of a scheduler.
class SyncThreadScope {
 public:
  explicit SyncThreadScope(detail::SchedulerImpl& impl) noexcept
      : ctx_(detail::run_state()), current_(ctx_.current), sync_of_(ctx_.sync_of) {
    ctx_.current = &impl;
    ctx_.sync_of = &impl;
  }
  ~SyncThreadScope() {
    ctx_.current = current_;
    ctx_.sync_of = sync_of_;
  }
  SyncThreadScope(const SyncThreadScope&) = delete;
  SyncThreadScope& operator=(const SyncThreadScope&) = delete;

 private:
  detail::RunState& ctx_;
  detail::SchedulerImpl* current_;
  detail::SchedulerImpl* sync_of_;
};

struct PhaseResult {
  Directive directive;
  std::exception_ptr error;
};

PhaseResult run_untraced_phase(detail::SchedulerImpl& impl, const TaskletPtr& owned) noexcept {
  PhaseScope scope(impl, owned);
  Tasklet& tasklet = *owned;
  PhaseResult result{Directive::done, nullptr};
  try {
    result.directive = tasklet.task();
  } catch (...) {
    result.error = std::current_exception();
  }
  const std::string open_rules = scope.end_open_rules();
  if (!open_rules.empty() && !result.error) {
    result.directive = Directive::done;
    result.error =
        std::make_exception_ptr(RuleMismatch("a phase of " + tasklet.name() + " began " + open_rules +
                                             " and did not end it; rules begun in a phase "
                                             "must be ended in that phase (they have been released)"));
  }
  return result;
}

// A phase while the manager records a trace: the slice it ran in on this thread, the end of the
// arrow from the release that let its tasklet's rule through, and the park it comes back from.
[[gnu::cold, gnu::noinline]] PhaseResult run_traced_phase(detail::Trace& trace, detail::SchedulerImpl& impl,
                                                          const TaskletPtr& owned, bool sync) noexcept {
  Tasklet& tasklet = *owned;
  detail::TracedPhase phase{trace, detail::Trace::now(), {}, {}};
  const detail::RuleRequest* hold = TaskletAccess::hold(tasklet);
  detail::Trace::Owner owner;
  try {
    if (hold != nullptr) trace.flow_end(hold, phase.since);
    trace.resumed(&tasklet, phase.since);
    owner = {impl.describe_tasklet(tasklet), detail::SchedulerImpl::job_of_tasklet(tasklet)};
    phase.name = owner.text + (sync ? " (sync)" : " (async)");
    phase.args = detail::Trace::with_owner(owner, {{"phase", sync ? "sync" : "async"}});
    if (hold != nullptr) phase.args.emplace_back("rule", describe(tasklet.rule()));
  } catch (...) {
    // Out of memory: the trace misses them.
  }
  detail::RunState& task = detail::run_state();  // the task's, wherever it resumes
  detail::TracedPhase* const outer = std::exchange(task.traced_phase, &phase);
  PhaseResult result = run_untraced_phase(impl, owned);
  task.traced_phase = outer;
  try {
    if (!phase.ended) {
      phase.args.emplace_back("next", std::string(result.error ? "failed" : to_string(result.directive)));
      trace.slice("phase", std::move(phase.name), phase.since, std::move(phase.args));
    }
    if (!result.error && result.directive == Directive::wait) trace.parked(&tasklet, std::move(owner));
  } catch (...) {
    // Out of memory: the trace misses this phase.
  }
  return result;
}

PhaseResult run_phase(detail::SchedulerImpl& impl, const TaskletPtr& tasklet, bool sync) noexcept {
  if (detail::Trace* trace = impl.domain_.trace()) [[unlikely]]
    return run_traced_phase(*trace, impl, tasklet, sync);
  return run_untraced_phase(impl, tasklet);
}

}  // namespace

// Runs an async phase, then up to `handoff_limit` phases handed to this worker by what the phase's
// end let through (its own next async phase, or a tasklet its rule release granted); beyond that
// they are spawned so that one chain cannot keep a worker from the rest of the arena forever.
void detail::SchedulerImpl::run_async_phase(TaskletPtr tasklet) noexcept {
  constexpr int handoff_limit = 64;
  for (int handoffs = 0;; ++handoffs) {
    const PhaseResult result = run_phase(*this, tasklet, false);
    detail::RunState& here = detail::run_state();  // the phase may have moved to another thread
    if (handoffs < handoff_limit) here.handoff_of = this;
    continue_after_phase(std::move(tasklet), result.directive, result.error);
    here.handoff_of = nullptr;
    if (!here.handoff) return;
    tasklet = std::move(here.handoff);
  }
}

void detail::SchedulerImpl::run_sync_phase(TaskletPtr tasklet) noexcept {
  ++sync_phases_run_;
  const PhaseResult result = run_phase(*this, tasklet, true);
  continue_after_phase(std::move(tasklet), result.directive, result.error);
}

// Submits the async phases the last turn started and the requests this thread made, which no worker
// has entered yet (they may all be busy for long; a sync tasklet may be waiting for its rule). The
// grants it delivers may end tasklets whose destructors schedule more here: that goes out too.
void detail::SchedulerImpl::hand_out_async_or_throw() {
  flush_async_batch();
  if (domain_.table_.has_submitted()) {
    domain_.table_.drain();
    flush_async_batch();
  }
}

// One turn of the run loop: submit what the last turn started, then take every queued sync
// tasklet (sleeping while there is none, up to `deadline`) and run them.
detail::SchedulerImpl::Turn detail::SchedulerImpl::drain_sync_queue_once(Clock::time_point deadline,
                                                                         const char* call) {
  hand_out_async_or_throw();
  {
    std::unique_lock lock(mutex_);
    bool checked = false;
    while (sync_queue_.empty()) {
      if (active_.load(std::memory_order_acquire) == 0) {
        if (!loop_driven_) running_.store(false, std::memory_order_release);
        return Turn::finished;
      }
      if (!checked) {
        // Before it sleeps (not at every turn: the check reads the rule table under its lock).
        checked = true;
        lock.unlock();
        check_wait_cycle(call);
        lock.lock();
        continue;
      }
      if (!sleep_until(lock, deadline)) return Turn::timed_out;
    }
    sync_batch_.swap(sync_queue_);
  }
  run_sync_batch();
  return Turn::ran;
}

// Sleeps until woken or `deadline` (false once it has passed). Parked tasklets without a
// Rescheduler are checked every loose_check_interval meanwhile: their owners outside may have let go.
bool detail::SchedulerImpl::sleep_until(std::unique_lock<std::mutex>& lock, Clock::time_point deadline) {
  const bool loose = loose_.load(std::memory_order_acquire) != 0;
  if (deadline == Clock::time_point::max() && !loose) {
    sleeping_ = true;
    wake_.wait(lock);
    sleeping_ = false;
    return true;
  }
  const Clock::time_point now = Clock::now();
  bool timed_out = now >= deadline;
  if (!timed_out) {
    sleeping_ = true;
    timed_out = wake_.wait_until(lock, loose ? std::min(deadline, now + loose_check_interval) : deadline) ==
                std::cv_status::timeout;
    sleeping_ = false;
  }
  if (timed_out && loose) {
    lock.unlock();
    end_lost_tasklets();
    lock.lock();
  }
  return !timed_out || Clock::now() < deadline;
}

// A phase of the batch may wait in begin_rule and run the rest of it meanwhile (serve_until):
// both go by the one cursor.
void detail::SchedulerImpl::run_sync_batch() noexcept {
  while (sync_next_ < sync_batch_.size()) run_sync_phase(std::move(sync_batch_[sync_next_++]));
  sync_batch_.clear();
  sync_next_ = 0;
}

void detail::SchedulerImpl::serve_until(const bool& answered, bool run_phases) {
  for (;;) {
    if (run_phases) hand_out_async();
    if (wait_to_serve(answered, run_phases)) return;
    run_sync_phase(std::move(sync_batch_[sync_next_++]));
  }
}

// The async phases the synchronous thread queued, and the requests it submitted, go out before it
// waits. Out of memory: the batch stays for the next turn.
void detail::SchedulerImpl::hand_out_async() noexcept {
  try {
    hand_out_async_or_throw();
  } catch (...) {
  }
}

// serve_until()'s wait: true once answered; else a sync phase is next in sync_batch_ (first the rest
// of the turn this wait is nested in, queued before what came since).
bool detail::SchedulerImpl::wait_to_serve(const bool& answered, bool run_phases) {
  std::unique_lock lock(mutex_);
  const auto batch_done = [this] { return sync_next_ == sync_batch_.size(); };
  while (!answered && (!run_phases || (batch_done() && sync_queue_.empty()))) {
    const bool was_sleeping = std::exchange(sleeping_, true);
    wake_.wait(lock);
    sleeping_ = was_sleeping;
  }
  if (answered) return true;
  if (batch_done()) {
    sync_batch_.clear();
    sync_next_ = 0;
    sync_batch_.swap(sync_queue_);
  }
  return false;
}

void detail::SchedulerImpl::answer_server(bool& answered) noexcept {
  std::lock_guard lock(mutex_);
  answered = true;
  wake_.notify_all();
}

// run() on a thread that holds rules of this manager: a tasklet of this scheduler waiting for one
// of them (or behind requests that do) would keep run() from ever returning.
void detail::SchedulerImpl::check_wait_cycle(const char* call) {
  const detail::RunState& ctx = detail::run_state();
  const bool holds = std::any_of(
      ctx.rule_stack.begin(), ctx.rule_stack.end(),
      [this](const RuleFrame& frame) { return frame.hold != nullptr && frame.domain == &domain_; });
  if (!holds) return;
  const Scheduler* const mine = &self_;
  domain_.check_wait(call, [mine](const RuleRequest& request) {
    const auto* tasklet = static_cast<const Tasklet*>(request.owner());
    return tasklet != nullptr && TaskletAccess::scheduler(*tasklet) == mine;
  });
}

// run(), poll() and run_until() on the calling thread: it is the synchronous thread, the failures
// the last one reported are forgotten, and a loop's wake call waits until it is over.
class detail::SchedulerImpl::Driving {
 public:
  explicit Driving(SchedulerImpl& impl) : impl_(impl), scope_(impl) {
    std::lock_guard lock(impl.mutex_);
    impl.forget_reported_failures();
    impl.running_.store(true, std::memory_order_release);
    impl.driving_ = true;
  }
  ~Driving() {
    bool tell = false;
    {
      std::lock_guard lock(impl_.mutex_);
      impl_.driving_ = false;
      // What became ready meanwhile waits for the loop's next call.
      tell = impl_.loop_driven_ && !impl_.sync_queue_.empty();
      impl_.loop_told_ = tell;
    }
    if (tell) impl_.tell_loop();
  }
  Driving(const Driving&) = delete;
  Driving& operator=(const Driving&) = delete;

 private:
  SchedulerImpl& impl_;
  SyncThreadScope scope_;
};

void detail::SchedulerImpl::check_may_drive(const char* call) const {
  const auto& ctx = detail::run_state();
  if (ctx.phase_of == this || ctx.sync_of == this) {
    throw IllegalState(std::string(call) +
                       " called from inside one of its own scheduler's phases would wait for itself");
  }
  if (background_) {
    throw IllegalState(std::string(call) + " on a background scheduler: it has no synchronous thread");
  }
}

void detail::SchedulerImpl::run() {
  check_may_drive("run()");
  std::unique_lock run_lock(run_mutex_);
  drive(Clock::time_point::max(), "run()");
}

std::size_t detail::SchedulerImpl::run_until(Clock::time_point deadline, const char* call) {
  check_may_drive(call);
  // Not a timed wait: another thread's run() may last for ever, and poll() must not wait at all.
  std::unique_lock run_lock(run_mutex_, std::try_to_lock);
  if (!run_lock) return 0;  // another thread is the synchronous thread
  // A loop that calls it while it holds what its tasklets wait for would never end.
  return drive(deadline, "the loop driving this scheduler");
}

// The run loop up to `deadline`: returns how many sync phases ran.
std::size_t detail::SchedulerImpl::drive(Clock::time_point deadline, const char* call) {
  const std::size_t before = sync_phases_run_;
  {
    Driving driving(*this);
    try {
      run_turns(deadline, call);
    } catch (...) {
      // A wait cycle (or out of memory): this turn is over.
      if (!loop_driven_) running_.store(false, std::memory_order_release);
      throw;
    }
  }
  report_failures();
  return sync_phases_run_ - before;
}

// A turn that has begun runs to its end, so a past deadline (poll()) runs the phases that were
// ready when it was called.
void detail::SchedulerImpl::run_turns(Clock::time_point deadline, const char* call) {
  while (drain_sync_queue_once(deadline, call) == Turn::ran) {
    if (deadline == Clock::time_point::max() || Clock::now() < deadline) continue;
    // Time is up after a turn: what it started goes out, and with nothing left the run is over,
    // as the next turn would have found.
    hand_out_async_or_throw();
    std::lock_guard lock(mutex_);
    if (!loop_driven_ && active_.load(std::memory_order_acquire) == 0)
      running_.store(false, std::memory_order_release);
    return;
  }
}

// Failures reported by the last run() (or inline drain) go; those recorded since (a tasklet ended
// while no run() was active, out of memory for instance) stay for this one to report. Under mutex_.
void detail::SchedulerImpl::forget_reported_failures() noexcept {
  failures_.erase(failures_.begin(), failures_.begin() + static_cast<std::ptrdiff_t>(
                                                             std::min(reported_failures_, failures_.size())));
  reported_failures_ = 0;
}

void detail::SchedulerImpl::report_failures() {
  std::exception_ptr first;
  {
    std::lock_guard lock(mutex_);
    reported_failures_ = failures_.size();
    if (!failures_.empty()) first = failures_.front().error;
  }
  if (first) std::rethrow_exception(first);
}

// The implicit scheduler's inline behaviour: on its own thread, while run() is not active,
// schedule() runs the sync tasklets it queued before returning.
void detail::SchedulerImpl::drain_inline() {
  const auto& ctx = detail::run_state();
  if (implicit_owner_ != std::this_thread::get_id() || ctx.sync_of == this) return;
  std::unique_lock run_lock(run_mutex_, std::try_to_lock);
  if (!run_lock) return;  // run() is active on another thread; it takes the queue
  SyncThreadScope scope(*this);
  {
    std::lock_guard lock(mutex_);
    forget_reported_failures();
  }
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (sync_queue_.empty()) break;
      sync_batch_.swap(sync_queue_);
    }
    run_sync_batch();
  }
  report_failures();
}

void detail::SchedulerImpl::with(const TaskletPtr& tasklet) {
  if (!tasklet) throw std::invalid_argument("with: null tasklet");
  claim(*tasklet, "with");
  count_in();
  if (const Rule& rule = tasklet->rule()) {
    // The phase runs here and now, so the caller waits for the rule like a thread in begin_rule.
    detail::ThreadHold* hold = nullptr;
    try {
      enter_pending_rules();
      hold = detail::ThreadHold::take(rule, false);
      hold->set_owner(tasklet.get(), this, std::this_thread::get_id());
    } catch (...) {
      finish(tasklet, nullptr);  // out of memory: ended unrun, as if never given
      throw;
    }
    const auto answer = hold->enter(domain_.table_);
    if (answer != detail::ThreadHold::Answer::granted) {
      const std::exception_ptr failure = hold->failure();
      detail::ThreadHold::recycle(hold);
      finish(tasklet, nullptr);
      if (answer == detail::ThreadHold::Answer::refused) throw std::bad_alloc();
      if (failure) std::rethrow_exception(failure);
      throw IllegalState("with(" + tasklet->name() + "): the job manager shut down while it waited for " +
                         describe(rule));
    }
    TaskletAccess::set_hold(*tasklet, hold);
  }
  const PhaseResult result = run_phase(*this, tasklet, true);
  if (result.error) {
    finish(tasklet, nullptr);
    std::rethrow_exception(result.error);
  }
  if (result.directive == Directive::async && !running_.load(std::memory_order_acquire)) {
    // As schedule(async) outside run(): the caller hears it now, rather than run() later.
    const std::string name = tasklet->name();
    finish(tasklet, nullptr);
    throw SchedulerNotRunning("with(" + name +
                              ") returned async while the scheduler's run() is not active, so no " +
                              "worker could continue it; call run() first, or return sync");
  }
  continue_after_phase(tasklet, result.directive, nullptr);
  drain_inline();
}

}  // namespace tasklet
