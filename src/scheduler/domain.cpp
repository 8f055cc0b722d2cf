#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <sstream>
#include <string>
#include <utility>

#include "scheduler/domain.hpp"

#include "scheduler/run_state.hpp"
#include "scheduler/scheduler_impl.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/error.hpp"

namespace tasklet::detail {

namespace {

// The thread's idle request, parked in a table or out of every table. At thread exit a parked one
// is handed to its table (which may be gone by then only if it revoked the request first).
struct SpareHold {
  ThreadHold* hold = nullptr;
  ~SpareHold() {
    if (hold != nullptr && !RuleTable::discard(*hold)) delete hold;
  }
};
thread_local SpareHold spare;

// The request this thread is entering (ThreadHold::enter): an answer that comes while it does
// comes on this thread, and needs no wake-up.
thread_local const ThreadHold* entering_here = nullptr;

// Why end_rule(`ended`) does not match the begin_rule(`begun`) on top of the thread's stack, in
// words that tell the two apart when they print alike.
std::string mismatch(const Rule& ended, const Rule& begun, bool same_manager) {
  if (ended.get() == begun.get() && !same_manager) {
    return "end_rule(" + describe(ended) + ") is made on a job manager other than the one the most recent " +
           "begin_rule of that rule on this thread was made on";
  }
  std::string ended_text = describe(ended);
  std::string begun_text = describe(begun);
  if (ended_text != begun_text) {
    return "end_rule(" + ended_text + ") does not match the most recent begin_rule(" + begun_text +
           ") on this thread";
  }
  const auto object = [](const Rule& rule) {
    char text[40];
    std::snprintf(text, sizeof text, "%p", static_cast<const void*>(rule.get()));
    return std::string(text);
  };
  return "end_rule(" + ended_text + ") is given the rule object at " + object(ended) +
         ", but the most recent begin_rule on this thread was given another one that prints alike, at " +
         object(begun) + ": end_rule needs the object begin_rule was given";
}

}  // namespace

ThreadHold* ThreadHold::parked(const Rule& rule, const RuleTable& table) noexcept {
  ThreadHold* hold = spare.hold;
  if (hold == nullptr || hold->parked_in_ != &table || !hold->is_for(rule)) return nullptr;
  spare.hold = nullptr;
  hold->parked_in_ = nullptr;
  hold->reset();
  // Still this thread's; the code it runs for may have changed (stores only then: a fast path).
  const RunState& ctx = run_state();
  if (hold->owner_tasklet_.load(std::memory_order_relaxed) != ctx.tasklet) {
    hold->owner_tasklet_.store(ctx.tasklet, std::memory_order_relaxed);
  }
  if (hold->owner_of_.load(std::memory_order_relaxed) != ctx.phase_of) {
    hold->owner_of_.store(ctx.phase_of, std::memory_order_relaxed);
  }
  return hold;
}

void ThreadHold::reset() noexcept {
  handed = false;
  wakeup_.reset();
  serving_ = nullptr;  // one store, to a line the wake-up shares
  answer_ = Answer::canceled;
  failure_ = nullptr;
  answered_here_ = false;
}

RuleBlocker ThreadHold::describe() const {
  const Tasklet* tasklet = owner_tasklet_.load(std::memory_order_relaxed);
  const SchedulerImpl* of = owner_of_.load(std::memory_order_relaxed);
  std::string owner;
  if (tasklet != nullptr && of != nullptr) {
    owner = of->describe_tasklet(*tasklet);
  } else {
    std::ostringstream text;
    text << "thread " << owner_thread_.load(std::memory_order_relaxed);
    owner = std::move(text).str();
  }
  return {std::move(owner), last_rule_.lock(), false};
}

std::string ThreadHold::job_name() const {
  const Tasklet* tasklet = owner_tasklet_.load(std::memory_order_relaxed);
  return tasklet != nullptr ? SchedulerImpl::job_of_tasklet(*tasklet) : std::string();
}

ThreadHold* ThreadHold::take(const Rule& rule, bool parkable) {
  ThreadHold* hold = std::exchange(spare.hold, nullptr);
  if (hold != nullptr && hold->parked_in_ != nullptr) {
    hold->parked_in_ = nullptr;
    if (RuleTable::discard(*hold)) hold = nullptr;  // its table deletes it
  }
  if (hold == nullptr) hold = new ThreadHold;
  if (!hold->is_for(rule)) hold->last_rule_ = rule;
  hold->set_rule(rule.get());
  hold->parkable_ = parkable;
  hold->reset();
  const RunState& ctx = run_state();
  hold->set_owner(ctx.tasklet, ctx.phase_of, std::this_thread::get_id());
  hold->blocks_thread_ = ctx.worker_of == nullptr;
  return hold;
}

void ThreadHold::finish(ThreadHold* hold, RuleTable& table) {
  if (!table.leave(*hold)) {
    recycle(hold);
    return;
  }
  // Parked: it is the spare now (one a thread left parked before, if any, is given up).
  hold->parked_in_ = &table;
  if (ThreadHold* before = std::exchange(spare.hold, hold)) {
    if (before->parked_in_ == nullptr || !RuleTable::discard(*before)) delete before;
  }
}

void ThreadHold::recycle(ThreadHold* hold) noexcept {
  if (spare.hold != nullptr) {
    delete hold;
  } else {
    spare.hold = hold;
  }
}

bool ThreadHold::try_enter(RuleTable& table) {
  struct Entering {
    explicit Entering(const ThreadHold* hold) noexcept { entering_here = hold; }
    ~Entering() { entering_here = nullptr; }
  };
  const Entering entering(this);
  table.enter(*this);
  return answered_here_;
}

void ThreadHold::wake(Answer answer) noexcept {
  answer_ = answer;
  if (entering_here == this) {
    answered_here_ = true;
    return;
  }
  // The waiter may be gone once this returns: touch nothing.
  if (serving_ != nullptr) {
    serving_->answer_server(served_answer_);
  } else {
    wakeup_.wake();
  }
}

// Ends the frames a phase left open, innermost first; returns their names for the report.
std::string end_frames_above(RunState& ctx, std::size_t base) noexcept {
  std::string names;
  while (ctx.rule_stack.size() > base) {
    RuleFrame frame = std::move(ctx.rule_stack.back());
    ctx.rule_stack.pop_back();
    if (!names.empty()) names += ", ";
    names += describe(frame.rule);
    if (frame.hold != nullptr) {
      ThreadHold::finish(frame.hold, frame.domain->table_);
    }
  }
  return names;
}

Domain::Domain(JobManager& self, JobManager::Options options)
    : self_(self),
      workers_(options.workers ? std::move(options.workers) : Workers::create(options.concurrency)),
      timer_(std::make_shared<Timer>()) {
  trace_from_environment();
}

Domain::~Domain() { timer_->stop(); }

void Domain::shut_down() noexcept {
  struct Saved {
    Domain& domain;
    ~Saved() { domain.save_trace_file(); }  // once everything ended: the trace ends too
  } const saved{*this};
  // What the extension (the jobs) has not started is canceled and every waiting request too (see
  // close()), before what runs is waited for: a run's hold or begin_rule that waited behind another
  // run would otherwise be granted once that run ended. Then what entered meanwhile is canceled;
  // running background work is waited for by the background schedulers' destructors, or, when one
  // of their own tasks lets them go, by the task that finishes their destruction, which keeps us
  // (and so the rule table) alive until then. The extension's remains (the jobs' listeners) go
  // with us.
  close();
  if (extension_) extension_->shut_down();
  table_.cancel_all_waiting();
  if (extension_) extension_->let_go();
  background_.reset();
  timer_->stop();  // its thread goes; timed waits left go on as threads' waits
}

void Domain::close() noexcept {
  if (closing_.load(std::memory_order_acquire)) return;
  if (extension_) extension_->stop();
  // Before the cancellation, so that a request entered after it sees closing() (both are
  // sequentially consistent, and the table's lock orders the entry against the cancellation).
  closing_.store(true, std::memory_order_seq_cst);
  table_.cancel_all_waiting();
}

std::shared_ptr<Scheduler> Domain::make_background() {
  // The manager owns its background schedulers, so they must not own the manager back: an
  // aliasing pointer that owns this domain (shut_down lets the schedulers go, breaking the cycle),
  // so the rule table outlives the schedulers' last tasks.
  std::shared_ptr<JobManager> unowned(shared_from_this(), &self_);
  auto scheduler = Scheduler::create(SchedulerOptions{std::move(unowned), workers_, 0});
  impl(*scheduler).make_background();
  return scheduler;
}

Scheduler& Domain::background() {
  if (Scheduler* made = made_background_.load(std::memory_order_acquire)) return *made;
  std::lock_guard lock(making_);
  if (!background_) background_ = make_background();
  made_background_.store(background_.get(), std::memory_order_release);
  return *background_;
}

void Domain::begin_rule(const Rule& rule) {
  auto& ctx = detail::run_state();
  ctx.rule_stack.push_back(detail::RuleFrame{rule, this, nullptr});  // out of memory: nothing pushed
  if (handed_count_.load(std::memory_order_acquire) != 0) {
    try {
      take_handed_below_top(ctx);  // IllegalState: this frame stays for end_rule
    } catch (const std::bad_alloc&) {
      ctx.rule_stack.pop_back();
      throw;
    }
  }
  if (!rule) return;
  detail::ThreadHold* hold = nullptr;
  try {
    hold = hold_for(ctx, rule);
  } catch (const std::bad_alloc&) {
    // Nothing stays pushed when memory runs out, so that the caller, who cannot tell where it ran
    // out, has nothing to end (the other errors leave the frame for end_rule).
    ctx.rule_stack.pop_back();
    throw;
  }
  if (hold == nullptr) return;  // nested in the rule this thread holds
  ctx.rule_stack.back().hold = hold;
  // The lock listener, a job's monitor and the trace recorder hear of waits; without them, straight in.
  const bool told = listening_.load(std::memory_order_relaxed) || runs_extension(ctx) ||
                    trace_.load(std::memory_order_relaxed) != nullptr;
  switch (told ? enter_and_wait(*hold, ctx, rule) : hold->enter(table_, this)) {
    case detail::ThreadHold::Answer::granted:
      return;
    case detail::ThreadHold::Answer::canceled: {
      ctx.rule_stack.back().hold = nullptr;
      const bool handed = hold->handed;
      const std::exception_ptr failure = hold->failure();  // the backend's, when it gave up on it
      detail::ThreadHold::recycle(hold);
      if (failure) std::rethrow_exception(failure);
      if (!handed)
        throw IllegalState("begin_rule(" + describe(rule) + "): the job manager shut down while waiting");
      // A rule containing this one was handed to this thread while it waited: it becomes the
      // outermost, and this begin_rule nests in it.
      take_handed_below_top(ctx);
      const Rule& handed_rule = ctx.rule_stack[ctx.phase_base].rule;
      if (!handed_rule->contains(*rule)) {
        throw RuleNotContained("begin_rule(" + describe(rule) + ") does not match the rule " +
                               describe(handed_rule) +
                               " handed to this thread by transfer_rule while it waited");
      }
      return;
    }
    case detail::ThreadHold::Answer::refused:
      // Out of memory, as above: nothing stays pushed.
      ctx.rule_stack.pop_back();
      detail::ThreadHold::recycle(hold);
      throw std::bad_alloc();
  }
}

// begin_rule's checks once its frame is pushed: null when `rule` nests in the rule this thread
// holds, else the request that takes it (not entered yet).
detail::ThreadHold* Domain::hold_for(detail::RunState& ctx, const Rule& rule) {
  // The outermost rule in force: the running phase's tasklet rule, else the first non-null frame.
  const Rule* outer = nullptr;
  Domain* outer_manager = nullptr;
  if (ctx.phase_rule != nullptr && *ctx.phase_rule) {
    outer = ctx.phase_rule;
    outer_manager = ctx.phase_domain;
  } else {
    for (std::size_t i = 0; i + 1 < ctx.rule_stack.size(); ++i) {
      if (ctx.rule_stack[i].rule) {
        outer = &ctx.rule_stack[i].rule;
        outer_manager = ctx.rule_stack[i].domain;
        break;
      }
    }
  }
  if (outer != nullptr) {
    if (outer_manager != this) {
      throw IllegalState("begin_rule(" + describe(rule) + "): this thread holds " + describe(*outer) +
                         " from another job manager; rules nest only within one manager");
    }
    if (!(*outer)->contains(*rule)) {
      throw RuleNotContained("begin_rule(" + describe(rule) + ") does not match the outer scope rule " +
                             describe(*outer) +
                             " held by this thread: a nested rule must be contained by it");
    }
    check_shared(*outer);
    return nullptr;
  }
  for (const TaskFrame* serving = ctx.frames; serving != nullptr; serving = serving->outer) {
    if (serving->kind != &serving_wait) continue;
    const auto& waiting = *static_cast<const detail::ThreadHold*>(serving->owner);
    if (rule->is_conflicting(*waiting.rule())) {
      throw IllegalState("begin_rule(" + describe(rule) +
                         ") in a sync phase run while this thread waits for " + describe(waiting.rule()) +
                         " in begin_rule: it would wait for itself");
    }
  }
  SchedulerImpl::enter_pending_rules(ctx);  // what this thread started before comes first
  // While a trace is recorded, every begin_rule goes through the table (no parked requests), so
  // that it sees every hold and release.
  const bool parkable = trace_.load(std::memory_order_relaxed) == nullptr;
  detail::ThreadHold* hold =
      parkable ? detail::ThreadHold::parked(rule, table_) : nullptr;  // validated before
  if (hold == nullptr) {
    validate_rule(rule);
    hold = detail::ThreadHold::take(rule, parkable);
  }
  return hold;
}

void Domain::end_rule(const Rule& rule) {
  auto& ctx = detail::run_state();
  // Apart, so that the common end (no rule handed to any thread) carries no exception handling.
  if (handed_count_.load(std::memory_order_acquire) != 0) return end_rule_taking_handed(ctx, rule);
  end_top(ctx, rule);
}

void Domain::end_rule_taking_handed(detail::RunState& ctx, const Rule& rule) {
  // A rule handed here that this thread cannot take (it holds one) is released, and the caller
  // told so once this end is done: the rule it ends is not left held.
  std::exception_ptr not_taken;
  try {
    take_handed(ctx);
  } catch (...) {
    not_taken = std::current_exception();
  }
  end_top(ctx, rule);
  if (not_taken) std::rethrow_exception(not_taken);
}

void Domain::end_top(detail::RunState& ctx, const Rule& rule) {
  if (ctx.rule_stack.size() <= ctx.phase_base) {
    throw RuleMismatch("end_rule(" + describe(rule) + ") without a matching begin_rule on this thread" +
                       (ctx.phase_of != nullptr ? " in this phase" : ""));
  }
  detail::RuleFrame& top = ctx.rule_stack.back();
  if (top.rule.get() != rule.get() || top.domain != this)
    throw RuleMismatch(mismatch(rule, top.rule, top.domain == this));
  detail::ThreadHold* hold = top.hold;
  if (hold == nullptr) {
    const Rule nested = std::move(top.rule);
    ctx.rule_stack.pop_back();
    if (table_.backend() != nullptr && nested && ctx.rule_stack.size() > ctx.phase_base) {
      for (const detail::RuleFrame& frame : ctx.rule_stack) {
        if (frame.hold != nullptr && frame.domain == this) check_shared(frame.rule);  // its outermost hold
      }
    }
    return;
  }
  const Rule held = std::move(top.rule);  // alive until the table is done with the request
  ctx.rule_stack.pop_back();
  detail::ThreadHold::finish(hold, table_);
  check_shared(held);
}

void Domain::check_shared(const Rule& held) const {
  RuleBackend* backend = table_.backend();
  if (backend == nullptr || !held) return;
  if (std::exception_ptr failure = backend->failure(); failure && backend->shares(*held))
    std::rethrow_exception(failure);
}

Rule Domain::current_rule() const {
  const auto& ctx = detail::run_state();
  const auto innermost_from = [&](std::size_t begin, std::size_t end) -> Rule {
    for (std::size_t i = end; i > begin; --i) {
      const detail::RuleFrame& frame = ctx.rule_stack[i - 1];
      if (frame.rule && frame.domain == this) return frame.rule;
    }
    return nullptr;
  };
  const std::size_t base = std::min(ctx.phase_base, ctx.rule_stack.size());
  if (Rule rule = innermost_from(base, ctx.rule_stack.size())) return rule;
  if (ctx.phase_rule != nullptr && *ctx.phase_rule && ctx.phase_domain == this) return *ctx.phase_rule;
  return innermost_from(0, base);
}

ManagerHandle::ManagerHandle(JobManager::Options options)
    : domain(std::make_shared<Domain>(*this, std::move(options))) {}

ManagerHandle::~ManagerHandle() {
  DomainExtension* extension = domain->made_extension();
  if (extension != nullptr && extension->runs_here()) {
    // Dropped inside the extension's own work (a job's run), which the destructor would wait for:
    // that work's worker finishes the destruction once it is over.
    domain->close();
    extension->finish_after_this_run(std::move(domain));
    return;
  }
  domain->shut_down();
}

}  // namespace tasklet::detail
