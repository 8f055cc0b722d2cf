#include <algorithm>
#include <cstdio>
#include <new>
#include <sstream>
#include <string>
#include <utility>

#include "domain.hpp"

#include "context.hpp"
#include "scheduler_impl.hpp"
#include "tasklet/error.hpp"
#include "tasklet_state.hpp"

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
  return hold;
}

// Whose request a new one is: the tasklet whose phase runs here, else this thread.
void ThreadHold::reset() noexcept {
  handed = false;
  wakeup_.reset();
  serving_ = nullptr;
  served_answer_ = false;
  answer_ = Answer::cancelled;
  answered_here_ = false;
  const TaskState& ctx = state();
  set_owner(ctx.tasklet, ctx.phase_of, std::this_thread::get_id());
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

ThreadHold::Noted::Noted(ThreadHold& hold, Domain* waits_in) noexcept {
  if (waits_in == nullptr) return;
  try {
    waits_in->note_waiting(hold);
    domain_ = waits_in;
  } catch (...) {
    // Out of memory: it waits unnoted (a transfer to this thread then waits for its next call).
  }
}

ThreadHold::Noted::~Noted() {
  if (domain_ != nullptr) domain_->note_waited();
}

ThreadHold::Answer ThreadHold::wait(Domain* waits_in, bool serve) {
  const Noted noted(*this, waits_in);
  await(serve);
  return answer_;
}

void ThreadHold::await(bool serve) {
  if (serving_ == nullptr) {
    wakeup_.wait();
  } else if (!serve) {
    serving_->serve_until(served_answer_, false);
  } else {
    // The phases run meanwhile start from this thread's stack without the frame that waits (they
    // hold nothing of it), and must not wait for a rule that conflicts with it.
    TaskState& ctx = state();
    RuleFrame waiting = std::move(ctx.rule_stack.back());
    ctx.rule_stack.pop_back();
    const CallFrame serving{this, ctx.serving_wait};
    ctx.serving_wait = &serving;
    serving_->serve_until(served_answer_, true);
    ctx.serving_wait = serving.outer;
    ctx.rule_stack.push_back(std::move(waiting));  // into the room it left: no allocation
  }
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
std::string end_frames_above(TaskState& ctx, std::size_t base) noexcept {
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
      timer_(std::make_shared<Timer>()) {}

Domain::~Domain() { timer_->stop(); }

void Domain::shut_down() noexcept {
  // What the extension (the jobs) has not started is canceled and what runs waited for; then every
  // other waiting request is cancelled (tasklets end unrun, threads are told); running background
  // work is waited for by the background schedulers' destructors, or, when one of their own tasks
  // lets them go, by the task that finishes their destruction, which keeps us (and so the rule
  // table) alive until then. The extension's remains (the jobs' listeners) go with us.
  if (extension_) extension_->shut_down();
  table_.cancel_all_waiting();
  if (extension_) extension_->let_go();
  background_.reset();
  timer_->stop();  // its thread goes; timed waits left go on as threads' waits
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
  auto& ctx = detail::state();
  if (handed_count_.load(std::memory_order_acquire) != 0) take_handed(ctx);
  ctx.rule_stack.push_back(detail::RuleFrame{rule, this, nullptr});  // out of memory: nothing pushed
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
  switch (enter_and_wait(*hold, ctx, rule)) {
    case detail::ThreadHold::Answer::granted:
      return;
    case detail::ThreadHold::Answer::cancelled: {
      ctx.rule_stack.back().hold = nullptr;
      const bool handed = hold->handed;
      detail::ThreadHold::recycle(hold);
      if (!handed)
        throw IllegalState("begin_rule(" + describe(rule) + "): the job manager shut down while waiting");
      // A rule containing this one was handed to this thread while it waited: it becomes the
      // outermost, and this begin_rule nests in it.
      detail::RuleFrame mine = std::move(ctx.rule_stack.back());
      ctx.rule_stack.pop_back();
      try {
        take_handed(ctx);
      } catch (...) {
        ctx.rule_stack.push_back(std::move(mine));  // the frame stays for end_rule
        throw;
      }
      ctx.rule_stack.push_back(std::move(mine));  // room: the popped frame's
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

detail::ThreadHold::Answer Domain::enter_and_wait(detail::ThreadHold& hold, detail::TaskState& ctx,
                                                  const Rule& rule) {
  std::shared_ptr<LockListener> listener;
  if (listening_.load(std::memory_order_acquire)) {
    std::lock_guard lock(listener_mutex_);
    listener = lock_listener_;
  }
  DomainExtension* job_layer = ctx.job != nullptr ? made_extension() : nullptr;  // a job's run
  if (!listener && job_layer == nullptr) return hold.enter(table_, this);
  // A synchronous thread may be told to serve its phases while it waits: its answer must wake it
  // there, so that it can wait for both.
  SchedulerImpl* sync_thread_of = listener && ctx.worker_of == nullptr ? ctx.sync_of : nullptr;
  hold.wake_through(sync_thread_of);
  if (hold.try_enter(table_)) return hold.answer();
  const detail::ThreadHold::Noted noted(hold, this);  // before the listener hears of it
  std::vector<RuleBlocker> blockers;
  try {
    blockers = table_.blockers(hold);
  } catch (...) {
    // Out of memory: told with nobody named.
  }
  // A job's monitor is told (Eclipse's setBlocked), and told again when the wait is over.
  struct Blocked {
    Blocked(DomainExtension* layer, const TaskState& state, const Rule& waited,
            const std::vector<RuleBlocker>& by)
        : jobs(layer), ctx(state) {
      if (jobs == nullptr) return;
      try {
        std::string reason = "waiting for " + describe(waited);
        for (std::size_t i = 0; i < by.size(); ++i) reason += (i == 0 ? ": " : "; ") + by[i].to_string();
        jobs->blocked(ctx, &reason);
      } catch (...) {
        jobs = nullptr;  // out of memory for the reason: not told
      }
    }
    ~Blocked() {
      if (jobs != nullptr) jobs->blocked(ctx, nullptr);
    }
    Blocked(const Blocked&) = delete;
    Blocked& operator=(const Blocked&) = delete;
    DomainExtension* jobs;
    const TaskState& ctx;
  } const blocked(job_layer, ctx, rule, blockers);
  if (!listener) {
    hold.await(false);
    return hold.answer();
  }
  LockListener::Waiting choice = LockListener::Waiting::block;
  try {
    choice = listener->about_to_wait(rule, blockers);
  } catch (...) {
    if (table_.withdraw(hold)) {
      ctx.rule_stack.back().hold = nullptr;  // the frame stays for end_rule, holding nothing
      detail::ThreadHold::recycle(&hold);
    } else {
      hold.await(false);  // granted meanwhile: held once the answer is here, end_rule releases it
    }
    throw;
  }
  hold.await(choice == LockListener::Waiting::serve && sync_thread_of != nullptr);
  const auto answer = hold.answer();
  if (answer == detail::ThreadHold::Answer::granted) listener->got_it(rule);  // throws with the rule held
  return answer;
}

// begin_rule's checks once its frame is pushed: null when `rule` nests in the rule this thread
// holds, else the request that takes it (not entered yet).
detail::ThreadHold* Domain::hold_for(detail::TaskState& ctx, const Rule& rule) {
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
    return nullptr;
  }
  for (const CallFrame* serving = ctx.serving_wait; serving != nullptr; serving = serving->outer) {
    const auto& waiting = *static_cast<const detail::ThreadHold*>(serving->owner);
    if (rule->is_conflicting(*waiting.rule())) {
      throw IllegalState("begin_rule(" + describe(rule) +
                         ") in a sync phase run while this thread waits for " + describe(waiting.rule()) +
                         " in begin_rule: it would wait for itself");
    }
  }
  SchedulerImpl::enter_pending_rules(ctx);  // what this thread started before comes first
  detail::ThreadHold* hold = detail::ThreadHold::parked(rule, table_);  // validated before
  if (hold == nullptr) {
    validate_rule(rule);
    hold = detail::ThreadHold::take(rule, true);
  }
  return hold;
}

void Domain::end_rule(const Rule& rule) {
  auto& ctx = detail::state();
  if (handed_count_.load(std::memory_order_acquire) != 0) take_handed(ctx);
  if (ctx.rule_stack.size() <= ctx.phase_base) {
    throw RuleMismatch("end_rule(" + describe(rule) + ") without a matching begin_rule on this thread" +
                       (ctx.phase_of != nullptr ? " in this phase" : ""));
  }
  detail::RuleFrame& top = ctx.rule_stack.back();
  if (top.rule.get() != rule.get() || top.domain != this)
    throw RuleMismatch(mismatch(rule, top.rule, top.domain == this));
  detail::ThreadHold* hold = top.hold;
  if (hold == nullptr) {
    ctx.rule_stack.pop_back();
    return;
  }
  const Rule held = std::move(top.rule);  // alive until the table is done with the request
  ctx.rule_stack.pop_back();
  detail::ThreadHold::finish(hold, table_);
}

void Domain::transfer_rule(const Rule& rule, std::thread::id destination) {
  if (!rule || destination == std::this_thread::get_id()) return;  // nothing to hand over
  auto& ctx = detail::state();
  const std::string what = "transfer_rule(" + describe(rule) + "): ";
  if (ctx.phase_rule != nullptr && *ctx.phase_rule && ctx.phase_rule->get() == rule.get()) {
    transfer_tasklet_rule(ctx, rule, destination, what);
    return;
  }
  std::size_t outer = ctx.rule_stack.size();
  for (std::size_t i = ctx.phase_base; i < ctx.rule_stack.size(); ++i) {
    if (ctx.rule_stack[i].rule) {
      outer = i;
      break;
    }
  }
  if (outer == ctx.rule_stack.size() || ctx.rule_stack[outer].rule.get() != rule.get() ||
      ctx.rule_stack[outer].domain != this || ctx.rule_stack[outer].hold == nullptr) {
    throw RuleMismatch(what + "it is not the outermost rule this thread began on this job manager" +
                       (outer == ctx.rule_stack.size()
                            ? std::string(" (it holds none)")
                            : " (that is " + describe(ctx.rule_stack[outer].rule) + ")"));
  }
  if (outer + 1 != ctx.rule_stack.size()) {
    throw IllegalState(what + "end the rules begun inside it first");
  }
  std::lock_guard lock(handing_);
  ThreadHold* waiter = destination_waiter(rule, destination, what);
  handed_.emplace(destination, ctx.rule_stack[outer]);  // out of memory: nothing changed
  ctx.rule_stack[outer].hold->set_owner(nullptr, nullptr, destination);
  ctx.rule_stack.pop_back();
  handed(waiter);
}

// transfer_rule's checks of the destination, under handing_: it has not taken a rule handed
// before, and it waits for nothing or for a part of `rule` (returned, or null).
ThreadHold* Domain::destination_waiter(const Rule& rule, std::thread::id destination,
                                       const std::string& what) {
  if (handed_.contains(destination)) {
    throw IllegalState(what + "the destination thread has not taken the rule handed to it before");
  }
  const auto waiting = waiting_.find(destination);
  ThreadHold* waiter = waiting != waiting_.end() ? waiting->second : nullptr;
  if (waiter != nullptr && !rule->contains(*waiter->rule())) {
    throw IllegalState(what + "the destination thread waits in begin_rule for " +
                       waiter->rule()->to_string() + ", which this rule does not contain");
  }
  return waiter;
}

// A rule was put in handed_, under handing_.
void Domain::handed(ThreadHold* waiter) {
  handed_count_.fetch_add(1, std::memory_order_release);
  if (waiter != nullptr) {
    // It waits for a part of this rule, which now is its own: its request goes, and it takes the rule.
    waiter->handed = true;
    table_.withdraw_waiting(*waiter->rule(),
                            [waiter](const RuleRequest& request) { return &request == waiter; });
  }
}

// The rule of the tasklet (or job) whose phase runs here moves to `destination` as if that thread
// had begun it; the tasklet holds nothing from now on, and releases nothing at its end.
void Domain::transfer_tasklet_rule(TaskState& ctx, const Rule& rule, std::thread::id destination,
                                   const std::string& what) {
  if (ctx.phase_domain != this) {
    throw RuleMismatch(what +
                       "it is the rule of the tasklet running here, which belongs to another job manager");
  }
  const bool open = std::any_of(ctx.rule_stack.begin(), ctx.rule_stack.end(),
                                [](const RuleFrame& frame) { return static_cast<bool>(frame.rule); });
  if (open) throw IllegalState(what + "end the rules begun inside it first");
  Tasklet& tasklet = *ctx.tasklet;
  RuleRequest* held = TaskletAccess::hold(tasklet);
  if (held == nullptr) throw IllegalState(what + tasklet.name() + " does not hold it");
  // A tasklet that took its rule back (yield_rule) holds it with a thread's request already;
  // otherwise a thread's request takes its place in the table.
  auto* moved = dynamic_cast<ThreadHold*>(held);
  ThreadHold* fresh = moved == nullptr ? ThreadHold::take(rule, false) : nullptr;
  try {
    std::lock_guard lock(handing_);
    ThreadHold* waiter = destination_waiter(rule, destination, what);
    ThreadHold* hold = moved != nullptr ? moved : fresh;
    const auto [entry, added] = handed_.emplace(destination, RuleFrame{rule, this, hold});
    if (fresh != nullptr) {
      try {
        table_.hand_over(*held, *fresh);
      } catch (...) {
        handed_.erase(entry);
        throw;
      }
      delete held;
    }
    hold->set_owner(nullptr, nullptr, destination);
    TaskletAccess::set_hold(tasklet, nullptr);
    ctx.phase_rule = nullptr;  // the rest of this phase holds nothing
    handed(waiter);
  } catch (...) {
    if (fresh != nullptr) ThreadHold::recycle(fresh);
    throw;
  }
}

void Domain::note_waiting(ThreadHold& hold) {
  std::lock_guard lock(handing_);
  const std::thread::id here = std::this_thread::get_id();
  waiting_[here] = &hold;
  if (handed_.contains(here)) {
    // Handed a rule between its last look and now: it takes it instead of waiting.
    hold.handed = true;
    table_.withdraw_waiting(*hold.rule(), [&hold](const RuleRequest& request) { return &request == &hold; });
  }
}

void Domain::note_waited() noexcept {
  std::lock_guard lock(handing_);
  waiting_.erase(std::this_thread::get_id());
}

void Domain::take_handed(detail::TaskState& ctx) {
  detail::RuleFrame frame;
  {
    std::lock_guard lock(handing_);
    const auto handed = handed_.find(std::this_thread::get_id());
    if (handed == handed_.end()) return;
    frame = std::move(handed->second);
    handed_.erase(handed);
    handed_count_.fetch_sub(1, std::memory_order_release);
  }
  const bool holds = (ctx.phase_rule != nullptr && *ctx.phase_rule) ||
                     std::any_of(ctx.rule_stack.begin(), ctx.rule_stack.end(),
                                 [](const detail::RuleFrame& held) { return static_cast<bool>(held.rule); });
  try {
    if (holds) {
      throw IllegalState("transfer_rule(" + describe(frame.rule) +
                         ") handed the rule to a thread that holds a rule already; it has been released");
    }
    ctx.rule_stack.insert(ctx.rule_stack.begin() + static_cast<std::ptrdiff_t>(ctx.phase_base), frame);
  } catch (...) {
    detail::ThreadHold::finish(frame.hold, table_);  // nobody may hold it: it goes back to the table
    throw;
  }
}

Rule Domain::current_rule() const {
  const auto& ctx = detail::state();
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
    extension->finish_after_this_run(std::move(domain));
    return;
  }
  domain->shut_down();
}

}  // namespace tasklet::detail

namespace tasklet {

JobManager::~JobManager() = default;

std::shared_ptr<JobManager> JobManager::create(Options options) {
  return std::make_shared<detail::ManagerHandle>(std::move(options));
}

const std::shared_ptr<JobManager>& JobManager::global() {
  // Never destroyed: schedulers and jobs may outlive static destruction order.
  static const auto* manager = new std::shared_ptr<JobManager>(create());
  return *manager;
}

void JobManager::begin_rule(const Rule& rule) { detail::domain(*this).begin_rule(rule); }
void JobManager::end_rule(const Rule& rule) { detail::domain(*this).end_rule(rule); }
void detail::Domain::check_wait(const std::string& what,
                                const std::function<bool(const RuleRequest&)>& start) {
  const TaskState& ctx = state();
  boost::container::small_vector<const RuleRequest*, 4> mine;
  for (const RuleFrame& frame : ctx.rule_stack) {
    if (frame.hold != nullptr && frame.domain == this) mine.push_back(frame.hold);
  }
  if (ctx.tasklet != nullptr && ctx.phase_domain == this && ctx.phase_rule != nullptr) {
    if (const RuleRequest* hold = TaskletAccess::hold(*ctx.tasklet)) mine.push_back(hold);
  }
  if (mine.empty()) return;
  constexpr std::size_t followed = 256;  // waiting requests a chain may pass through
  const std::vector<RuleBlocker> chain =
      table_.wait_chain(start, std::span<const RuleRequest* const>(mine.data(), mine.size()), followed);
  if (chain.size() < 2) return;
  std::string text =
      what + " would never return: " + chain.front().owner + " waits for " + describe(chain.front().rule);
  for (std::size_t i = 1; i + 1 < chain.size(); ++i) {
    text += ", behind " + chain[i].owner + " (waiting for " + describe(chain[i].rule) + ")";
  }
  text += ", which conflicts with " + describe(chain.back().rule) + ", held by " + chain.back().owner +
          ", the caller";
  throw WaitCycle(text);
}

void detail::Domain::set_lock_listener(std::shared_ptr<LockListener> listener) {
  std::lock_guard lock(listener_mutex_);
  listening_.store(listener != nullptr, std::memory_order_release);
  lock_listener_ = std::move(listener);
}

void JobManager::set_lock_listener(std::shared_ptr<LockListener> listener) {
  detail::domain(*this).set_lock_listener(std::move(listener));
}

void JobManager::transfer_rule(const Rule& rule, std::thread::id destination) {
  detail::domain(*this).transfer_rule(rule, destination);
}
Rule JobManager::current_rule() const { return detail::domain(*this).current_rule(); }

RuleSnapshot JobManager::rule_snapshot(std::size_t max_waiters) const {
  RuleSnapshot snapshot;
  const auto seen = detail::domain(*this).table_.snapshot(max_waiters, snapshot.waiters_left_out);
  snapshot.requests.reserve(seen.size());
  for (std::size_t i = 0; i < seen.size(); ++i) {
    RuleSnapshot::Request request{
        seen[i].who.owner, seen[i].who.rule, seen[i].who.holds, seen[i].shared, {}, {}};
    if (!request.held) {
      for (std::size_t other = 0; other < i; ++other) {
        if (!detail::RuleTable::conflict(seen[i], seen[other])) continue;
        (seen[other].who.holds ? request.blocked_by : request.behind).push_back(other);
      }
    }
    snapshot.requests.push_back(std::move(request));
  }
  return snapshot;
}

std::string RuleSnapshot::to_string() const {
  std::size_t held = 0;
  for (const Request& request : requests) held += request.held ? 1 : 0;
  std::string text = "rule table: " + std::to_string(held) + " held, " +
                     std::to_string(requests.size() - held + waiters_left_out) + " waiting\n";
  const auto name = [this](std::size_t at) { return "[" + std::to_string(at) + "] " + requests[at].owner; };
  for (std::size_t at = 0; at < requests.size(); ++at) {
    const Request& request = requests[at];
    text += "  " + name(at) + (request.held ? " holds " : " waits for ") + describe(request.rule) +
            (request.shared ? " (shared)" : " (exclusive)");
    const auto list = [&](const char* what, const std::vector<std::size_t>& which) {
      if (which.empty()) return;
      text += std::string(text.back() == ')' ? ": " : "; ") + what + " ";
      for (std::size_t i = 0; i < which.size(); ++i) text += (i == 0 ? "" : ", ") + name(which[i]);
    };
    list("blocked by", request.blocked_by);
    list("behind", request.behind);
    text += "\n";
  }
  if (waiters_left_out != 0) text += "  ... and " + std::to_string(waiters_left_out) + " more waiting\n";
  return text;
}

JobManager::RuleStats JobManager::rule_stats() const {
  detail::RuleTable& table = detail::domain(*this).table_;
  return RuleStats{table.held_count(), table.waiting_count()};
}

const std::shared_ptr<Workers>& JobManager::workers() const noexcept {
  return detail::domain(*this).workers_;
}

RuleScope::RuleScope(JobManager& manager, Rule rule) : manager_(manager), rule_(std::move(rule)) {
  try {
    manager_.begin_rule(rule_);
  } catch (const std::bad_alloc&) {
    throw;  // nothing was pushed
  } catch (...) {
    manager_.end_rule(rule_);
    throw;
  }
}

RuleScope::~RuleScope() {
  try {
    manager_.end_rule(rule_);
  } catch (...) {
    // Only a scope ended out of order by hand can get here; destructors never throw.
  }
}

}  // namespace tasklet
