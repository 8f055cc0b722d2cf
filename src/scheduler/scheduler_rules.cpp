// How a scheduler's tasklets hold their rules: a tasklet with a rule enters the rule table before
// its first phase (the synchronous thread's in batches, held back while the workers catch up),
// the grant continues it, and it leaves the table when it is done or yields its rule.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <new>
#include <utility>

#include "base/door.hpp"
#include "scheduler/domain.hpp"
#include "scheduler/run_state.hpp"
#include "scheduler/scheduler_impl.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/error.hpp"

namespace tasklet {

using detail::TaskletAccess;

namespace {

// Tasklets with rules from the synchronous thread submitted to the rule table together: few, so
// that a chain of holders starts while the synchronous thread is still adding to it.
constexpr std::size_t rule_batch_size = 16;
// How many of the tasklets with rules that the synchronous thread started may wait for their
// rules before it lets the workers catch up (see let_rules_catch_up); the backlog it lets them get
// down to, which is also how many must be delivered after it gave up before it holds back again;
// and how long a backlog may deliver nothing before it is taken as stuck.
constexpr std::size_t backlog_limit = 1024;
constexpr std::size_t backlog_resume = backlog_limit / 2;
constexpr std::chrono::milliseconds backlog_patience{1};

// Where threads held back by let_rules_catch_up wait, for any scheduler: a hold's delivery may be
// the last thing that touches its scheduler (see Delivery), so what wakes them must outlive it.
std::mutex& held_back_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::condition_variable& held_back() {
  static std::condition_variable condition;
  return condition;
}

}  // namespace

// Once `count` is down, the scheduler may be gone (its destructor waits for the holds to reach
// zero), so nothing here touches it: waking its destructor goes by the count's address, waking a
// held-back thread by the process-wide condition, only when the count comes down to the backlog
// it waits for.
void detail::SchedulerImpl::count_out(std::atomic<std::size_t>& count, std::size_t holds) noexcept {
  if (holds == 0) return;
  const std::size_t before = count.fetch_sub(holds, std::memory_order_acq_rel);
  if (before == holds) count.notify_all();
  if (before > backlog_resume && before - holds <= backlog_resume) {
    { std::lock_guard lock(held_back_mutex()); }
    held_back().notify_all();
  }
}

// Enters what was submitted to the rule table (see enter_rule_batch).
struct detail::SchedulerImpl::EnterTask {
  SchedulerImpl* impl;
  void operator()() const {
    WorkerTaskScope scope(impl->workers_, *impl);
    impl->domain_.table_.drain();
  }
};

// A tasklet's request for its rule. While it waits it owns the tasklet; once granted it continues
// the tasklet with the directive it was started with. Its entries are in place for rules of up to
// N entries (start() picks N), so one block holds the whole request. It is counted in the
// scheduler's holds_ or sync_holds_ until it is done with the scheduler, which the destructor waits for.
//
// Delivering a grant or a cancellation can run user code (a tasklet ended by it is destroyed), and
// that code may drop the last reference to this very scheduler. Its destructor, on this thread,
// must not wait for the delivery it is nested in: each delivery in progress is on a thread-local
// list, which the destructor counts out itself instead (and the delivery then leaves it alone).
struct detail::SchedulerImpl::Delivery {
  Delivery(SchedulerImpl& scheduler, std::atomic<std::size_t>& counted_in) noexcept
      : impl(&scheduler), count(&counted_in), outer(innermost) {
    innermost = this;
  }
  Delivery(const Delivery&) = delete;
  Delivery& operator=(const Delivery&) = delete;
  ~Delivery() {
    innermost = outer;
    if (impl != nullptr) count_out(*count, 1);  // it may go now
  }
  SchedulerImpl* impl;              // null once its destructor has counted this delivery out
  std::atomic<std::size_t>* count;  // holds_ or sync_holds_
  Delivery* outer;
  static thread_local Delivery* innermost;
};

thread_local detail::SchedulerImpl::Delivery* detail::SchedulerImpl::Delivery::innermost = nullptr;

template <std::size_t N>
struct detail::SchedulerImpl::TaskletHold final : detail::InlineRuleRequest<N>, detail::PooledObject {
  // `by_sync_thread`: counted in sync_holds_ (started by the synchronous thread), else in holds_.
  TaskletHold(TaskletPtr waiting, Directive first, bool by_sync_thread) : tasklet(std::move(waiting)) {
    this->set_rule(tasklet->rule().get());  // the tasklet's rule cannot change while it is active
    static_assert(static_cast<int>(Directive::done) < 4, "the first directive is kept in 2 bits");
    this->set_own_bits(static_cast<std::uint8_t>(static_cast<unsigned>(first) | (by_sync_thread ? 4u : 0u)));
  }
  // The directive it was started with, for its first phase.
  Directive pending() const noexcept { return static_cast<Directive>(this->own_bits() & 3u); }
  std::atomic<std::size_t>& count_in(SchedulerImpl& impl) const noexcept {
    return (this->own_bits() & 4u) != 0 ? impl.sync_holds_ : impl.holds_;
  }
  const void* owner() const noexcept override { return tasklet.get(); }
  RuleBlocker describe() const override {
    return {scheduler().describe_tasklet(*tasklet), tasklet->rule(), false};
  }
  std::string job_name() const override { return SchedulerImpl::job_of_tasklet(*tasklet); }
  SchedulerImpl& scheduler() const noexcept { return detail::impl(*TaskletAccess::scheduler(*tasklet)); }
  void granted() noexcept override {
    SchedulerImpl& impl = scheduler();
    const Delivery delivery(impl, count_in(impl));
    // A copy: the hold keeps its reference until the rule is released, so that blockers() can
    // name the holder without racing with the grant.
    impl.dispatch(TaskletPtr(tasklet), pending());
  }
  void canceled() noexcept override {
    SchedulerImpl& impl = scheduler();
    const Delivery delivery(impl, count_in(impl));
    TaskletPtr ended = std::move(tasklet);
    TaskletAccess::set_hold(*ended, nullptr);  // it never held the rule: nothing to release
    delete this;
    // Withdrawn by the scheduler's destruction: a library tasklet hears so (a job's run ends its job).
    TaskletPtr dropped;
    if (impl.going_.load(std::memory_order_acquire) && dynamic_cast<LibraryTasklet*>(ended.get()) != nullptr)
      dropped = ended;
    impl.finish(std::move(ended), nullptr);
    if (dropped) static_cast<LibraryTasklet&>(*dropped).dropped();
  }
  // Its manager shuts down while it waits: a library tasklet hears why (a job's run ends its job,
  // canceled); any other ends unrun, as when withdrawn.
  void closed() noexcept override {
    if (dynamic_cast<const LibraryTasklet*>(tasklet.get()) == nullptr) {
      canceled();
      return;
    }
    std::exception_ptr why;
    try {
      why =
          std::make_exception_ptr(ManagerShutDown("its job manager shut down while it waited for its rule"));
    } catch (...) {
      why = std::current_exception();  // out of memory for the message
    }
    failed(std::move(why));
  }
  void refused() noexcept override { failed(std::make_exception_ptr(std::bad_alloc())); }
  // Ends the tasklet unrun with `why` (see SchedulerImpl::abandon).
  void failed(std::exception_ptr why) noexcept override {
    SchedulerImpl& impl = scheduler();
    const Delivery delivery(impl, count_in(impl));
    TaskletPtr ended = std::move(tasklet);
    TaskletAccess::set_hold(*ended, nullptr);
    delete this;
    impl.abandon(std::move(ended), std::move(why));
  }

  TaskletPtr tasklet;  // while it waits, the tasklet's owner; once granted, one of its owners
};

// co_await hold(rule) (tasklet/detail/hold.hpp): a tasklet without a rule takes one between two of
// its phases, waiting in the table like every other holder (in the same FIFO) and holding no thread
// meanwhile. Granted, it is the tasklet's hold, as a granted TaskletHold is (keeping a reference to
// the tasklet), until end_hold or the tasklet's end releases it. The tasklet's rule is the one asked
// for from the moment it enters the table.
struct detail::SchedulerImpl::PhaseHold final : detail::InlineRuleRequest<4>, detail::PooledObject {
  PhaseHold(TaskletPtr holder, std::uint32_t suspension, Directive next, HoldReply& reply) noexcept
      : tasklet(std::move(holder)), generation(suspension), then(next), answer(&reply) {
    this->set_rule(tasklet->rule().get());
  }
  const void* owner() const noexcept override { return tasklet.get(); }
  RuleBlocker describe() const override {
    return {scheduler().describe_tasklet(*tasklet), tasklet->rule(), false};
  }
  std::string job_name() const override { return SchedulerImpl::job_of_tasklet(*tasklet); }
  SchedulerImpl& scheduler() const noexcept { return detail::impl(*TaskletAccess::scheduler(*tasklet)); }
  void granted() noexcept override { answer_with(HoldAnswer::granted); }
  void canceled() noexcept override { answer_with(HoldAnswer::canceled); }
  void refused() noexcept override { answer_with(HoldAnswer::refused); }
  void failed(std::exception_ptr why) noexcept override {
    answer->failure = std::move(why);
    answer_with(HoldAnswer::failed);
  }

  // Told while begin_hold still enters it (on its thread or another), it leaves the answer to
  // begin_hold; else it resumes the suspended tasklet, where it was.
  void answer_with(HoldAnswer given) noexcept {
    SchedulerImpl& impl = scheduler();
    const Delivery delivery(impl, impl.holds_);
    if (given == HoldAnswer::granted) TaskletAccess::set_hold(*tasklet, this);
    answer->answer = given;
    if (!told.exchange(true, std::memory_order_acq_rel)) return;
    TaskletPtr resumed = tasklet;
    const std::uint32_t suspension = generation;  // read before a refusal deletes this
    const Directive next = then;
    if (given != HoldAnswer::granted) {
      TaskletAccess::set_trusted_rule(*resumed, nullptr);
      delete this;
    }
    // A scheduler that is going drops its parked tasklets instead.
    if (!impl.going_.load(std::memory_order_acquire))
      impl.resume_suspension(resumed, suspension, next, false);
  }

  TaskletPtr tasklet;
  std::uint32_t generation;  // of the suspension begin_hold made
  Directive then;            // where the tasklet goes on
  HoldReply* answer;         // in the awaiting coroutine's frame: alive while its tasklet waits
  // Set by the first of begin_hold (done entering) and answer_with (answered): the second acts.
  std::atomic<bool> told{false};
};

detail::HoldAnswer detail::SchedulerImpl::begin_hold(Tasklet& tasklet, const Rule& rule, HoldReply& later) {
  RunState& here = detail::run_state();
  if (!rule) return HoldAnswer::nested;  // no rule: nothing to take
  if (here.rule_stack.size() > here.phase_base) {
    throw IllegalState(
        "hold(" + describe(rule) + ") in " + describe_tasklet(tasklet) +
        " inside begin_rule scopes of its phase; end them first, or hold the rule before them");
  }
  if (const Rule& held = tasklet.rule()) {
    if (TaskletAccess::hold(tasklet) == nullptr) {
      throw IllegalState("hold(" + describe(rule) + "): " + describe_tasklet(tasklet) + " gave its rule " +
                         describe(held) + " away (transfer_rule)");
    }
    if (!held->contains(*rule)) {
      throw RuleNotContained("hold(" + describe(rule) + ") in " + describe_tasklet(tasklet) +
                             " does not match the rule it holds, " + describe(held) +
                             ": a nested rule must be contained by it");
    }
    return HoldAnswer::nested;
  }
  validate_rule(rule);
  const TaskletPtr& owned = *here.phase_owner;
  const Directive then = here.worker_of == nullptr ? Directive::sync : Directive::async;
  const std::uint32_t generation = suspend(tasklet);  // AlreadyScheduled: suspended already
  PhaseHold* hold = nullptr;
  try {
    TaskletAccess::set_trusted_rule(tasklet, rule);
    hold = new PhaseHold(owned, generation, then, later);
    enter_pending_rules(here);  // what this thread started before comes first
  } catch (...) {
    delete hold;
    TaskletAccess::set_trusted_rule(tasklet, nullptr);
    end_suspension(owned, generation);
    throw;
  }
  holds_.fetch_add(1, std::memory_order_relaxed);
  domain_.table_.enter(*hold);
  // A manager that shuts down lets no hold wait: it withdrew those waiting when it began (see
  // Domain::close), and this one is answered as they were.
  if (domain_.closing() && domain_.table_.withdraw(*hold)) hold->canceled();
  if (!hold->told.exchange(true, std::memory_order_acq_rel)) return HoldAnswer::waiting;
  // Answered while it entered: the phase goes on, unsuspended.
  end_suspension(owned, generation);
  const HoldAnswer answer = later.answer;
  if (answer == HoldAnswer::granted) {
    here.phase_rule = &tasklet.rule();  // the rest of this phase holds it too
  } else {
    delete hold;
    TaskletAccess::set_trusted_rule(tasklet, nullptr);
  }
  return answer;
}

detail::HoldAnswer detail::begin_hold(Tasklet& tasklet, const Rule& rule, HoldReply& later) {
  const RunState& here = detail::run_state();
  if (here.tasklet != &tasklet || here.phase_of == nullptr) {
    throw IllegalState("hold(" + describe(rule) + ") outside a phase of " + tasklet.name() +
                       "; a coroutine holds rules from its own steps");
  }
  return here.phase_of->begin_hold(tasklet, rule, later);
}

void detail::end_hold(Tasklet& tasklet) noexcept {
  if (Scheduler* scheduler = TaskletAccess::scheduler(tasklet);
      scheduler != nullptr && TaskletAccess::hold(tasklet) != nullptr) {
    detail::impl(*scheduler).release_rule(tasklet);
  }
  RunState& here = detail::run_state();
  if (here.tasklet == &tasklet) here.phase_rule = nullptr;
  TaskletAccess::set_trusted_rule(tasklet, nullptr);
}

void detail::SchedulerImpl::forget_deliveries_here() noexcept {
  for (Delivery* delivery = Delivery::innermost; delivery != nullptr; delivery = delivery->outer) {
    if (delivery->impl == this) {
      delivery->impl = nullptr;
      count_out(*delivery->count, 1);
    }
  }
}

// A tasklet with a rule takes it before its first phase: at once when it is free, else it waits in
// the rule table (holding no thread) and the grant continues it.
void detail::SchedulerImpl::start(TaskletPtr& tasklet, Directive directive) {
  if (!tasklet->rule()) {
    dispatch(std::move(tasklet), directive);
    return;
  }
  static_assert(sizeof(TaskletHold<2>) <= 80 && sizeof(TaskletHold<4>) <= 96 && sizeof(TaskletHold<8>) <= 128,
                "TaskletHold outgrew its block of the scalable allocator (memory per queued tasklet)");
  const std::size_t entries = detail::entry_count_hint(*tasklet->rule());
  // A mutex rule takes 1 entry, a path rule of depth d up to d + 1 (with the root's intent); larger
  // rules (deep paths, multi rules) get 8 in place and the rest on the heap.
  switch (entries) {
    case 0:
    case 1:
      return start_holding<1>(tasklet, directive);
    case 2:
      return start_holding<2>(tasklet, directive);
    case 3:
      return start_holding<3>(tasklet, directive);
    case 4:
      return start_holding<4>(tasklet, directive);
    case 5:
      return start_holding<5>(tasklet, directive);
    default:
      return start_holding<8>(tasklet, directive);
  }
}

template <std::size_t N>
void detail::SchedulerImpl::start_holding(TaskletPtr& tasklet, Directive directive) {
  Tasklet& raw = *tasklet;
  const bool batched = detail::run_state().sync_of == this && running_.load(std::memory_order_relaxed);
  if (batched) {
    // Room first: out of memory, nothing has changed (the hold's allocation comes before the
    // tasklet moves into it).
    room_for(entering_);
    room_for(entering_tasklets_);
  }
  auto* hold = new TaskletHold<N>(std::move(tasklet), directive, batched);
  TaskletAccess::set_hold(raw, hold);
  if (batched) {
    take_reserved(sync_holds_, reserved_holds_);
    ++sync_catch_up_.started;
    entering_.push_back(hold);
    entering_tasklets_.push_back(&hold->tasklet);
    if (entering_.size() >= rule_batch_size) {
      enter_rule_batch();
      const auto waiting = [this] { return sync_holds_.load(std::memory_order_acquire) - reserved_holds_; };
      if (waiting() > backlog_limit) {
        // Counts taken ahead go back first: the count then comes down to the backlog waited for.
        count_out(sync_holds_, std::exchange(reserved_holds_, 0));
        let_rules_catch_up(sync_catch_up_, waiting);
      }
    }
    return;
  }
  enter_pending_rules();
  // Counted as a delivery to wait for: granted() continues it, at once or later, perhaps on the
  // thread that holds the table's lock now (this one does not wait for it).
  holds_.fetch_add(1, std::memory_order_relaxed);
  domain_.table_.enter(*hold);
  if (detail::run_state().worker_of == nullptr) {
    // A thread of the user's (jobs scheduled from a plain thread): it makes work for the workers
    // as the synchronous thread does, and is held back alike.
    thread_local CatchUp plain;
    ++plain.started;
    const auto waiting = [this] { return holds_.load(std::memory_order_acquire); };
    if (waiting() > backlog_limit) let_rules_catch_up(plain, waiting);
  }
}

void detail::SchedulerImpl::release_rule(Tasklet& tasklet) noexcept {
  detail::RuleRequest* hold = TaskletAccess::hold(tasklet);
  if (hold == nullptr) return;
  TaskletAccess::set_hold(tasklet, nullptr);
  if (detail::Trace* trace = domain_.trace()) [[unlikely]] {
    release_traced(*trace, tasklet, *hold);
    return;
  }
  domain_.table_.leave(*hold);
  delete hold;
}

// A release while the manager records a trace: a slice of its own, where the arrows to the grants
// it causes start.
void detail::SchedulerImpl::release_traced(detail::Trace& trace, Tasklet& tasklet,
                                           detail::RuleRequest& hold) noexcept {
  const detail::Trace::Nanos start = detail::Trace::now();
  detail::Trace::Owner owner;
  std::string rule;
  try {
    owner = {describe_tasklet(tasklet), job_of_tasklet(tasklet)};
    rule = describe(tasklet.rule());
  } catch (...) {
    // Out of memory: the slice goes unnamed.
  }
  domain_.table_.leave(hold);
  delete &hold;
  try {
    trace.slice("release", "release " + rule, start, detail::Trace::with_owner(owner, {{"rule", rule}}));
  } catch (...) {
    // Out of memory: the trace misses this release.
  }
}

// The synchronous thread's tasklets with rules are submitted to the table together (in order, in
// one atomic step) and entered by a task on the workers, unless a thread that takes the table's
// lock first enters them. The synchronous thread, which makes the work for everyone, spends no
// time in the table, nor waits for its lock. The grants continue the tasklets (granted()) and give
// back the counts taken ahead for them.
void detail::SchedulerImpl::enter_rule_batch() {
  if (entering_.empty()) return;
  domain_.table_.enter_all(entering_);
  entering_.clear();
  entering_tasklets_.clear();
  try {
    spawn(EnterTask{this});
  } catch (...) {
    domain_.table_.drain();  // out of memory for the task: entered here instead
  }
}

// A thread that makes work (the synchronous thread, or a user's thread scheduling jobs) can start
// tasklets with rules faster than the workers get through them when they conflict: the rest wait in
// the rule table, and a table with a long backlog costs more per request than a short one (each
// request it takes up is a cache miss by then; docs/performance.md, growth rows). So such a thread,
// past backlog_limit of undelivered holds (`waiting`: its own, for the synchronous thread; for a
// user's thread, those of every thread but the synchronous one), waits until the workers have them
// down to backlog_resume (count_out wakes it): the backlog, and the cost per job, stay flat. It
// never waits for a backlog that does not move: the tasklets may wait for this very thread (its
// begin_rule, a sync tasklet that holds a rule). When backlog_patience passes without a delivery it
// goes on, and it does not hold back again until backlog_resume more of its tasklets were
// delivered: a backlog that is partly stuck would otherwise cost the patience at every batch.
template <class Waiting>
void detail::SchedulerImpl::let_rules_catch_up(CatchUp& state, Waiting&& waiting) {
  std::size_t backlog = waiting();
  const auto delivered = [&](std::size_t left) { return state.started > left ? state.started - left : 0; };
  if (delivered(backlog) < state.rearm_at || backlog <= backlog_resume) return;
  ++state.waits;
  std::unique_lock lock(held_back_mutex());
  while (backlog > backlog_resume) {
    const bool woken = held_back().wait_for(lock, backlog_patience) == std::cv_status::no_timeout;
    const std::size_t now = waiting();
    if (!woken && now >= backlog) {
      state.rearm_at = delivered(now) + backlog_resume;
      ++state.give_ups;
      return;
    }
    backlog = now;
  }
}

bool detail::SchedulerImpl::yield_rule(Tasklet& tasklet) {
  detail::RuleRequest* hold = TaskletAccess::hold(tasklet);
  if (hold == nullptr || !domain_.table_.has_conflicting_waiter(*hold)) return false;
  // Release, then queue again behind whoever waits: the same FIFO as everyone else.
  enter_pending_rules();
  detail::ThreadHold* again = detail::ThreadHold::take(tasklet.rule(), false);
  domain_.table_.leave(*hold);
  delete hold;
  TaskletAccess::set_hold(tasklet, again);
  const auto answer = again->enter(domain_.table_);
  if (answer == detail::ThreadHold::Answer::granted) return true;
  // It holds nothing now: what it does from here on, it does without its rule.
  TaskletAccess::set_hold(tasklet, nullptr);
  detail::ThreadHold::recycle(again);
  if (answer == detail::ThreadHold::Answer::refused) throw std::bad_alloc();
  throw IllegalState("yield_rule: the job manager shut down while " + tasklet.name() +
                     " waited to take its rule back");
}

}  // namespace tasklet
