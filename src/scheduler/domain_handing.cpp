// Waits in begin_rule that somebody hears of (the lock listener, a job's monitor), handing rules
// to other threads, and the manager's wait cycles (check_wait). Kept apart from begin_rule and
// end_rule, whose fast paths the compiler inlines within their own file.
#include <algorithm>
#include <functional>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/domain.hpp"

#include "base/context.hpp"
#include "scheduler/scheduler_impl.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/error.hpp"

namespace tasklet::detail {

ThreadHold::Noted::Noted(ThreadHold& hold, Domain* waits_in) noexcept {
  if (waits_in == nullptr) return;
  try {
    waits_in->note_waiting(hold);
    domain_ = waits_in;
  } catch (...) {
    // Out of memory: it waits unnoted (a transfer to this thread then waits for its next call).
  }
}

void ThreadHold::Noted::end() noexcept {
  if (domain_ != nullptr) domain_->note_waited();
  domain_ = nullptr;
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
    {
      const FrameScope serving(serving_wait, this);
      serving_->serve_until(served_answer_, true);
    }
    ctx.rule_stack.push_back(std::move(waiting));  // into the room it left: no allocation
  }
}

detail::ThreadHold::Answer Domain::enter_and_wait(detail::ThreadHold& hold, detail::TaskState& ctx,
                                                  const Rule& rule) {
  Trace* trace = this->trace();
  if (trace == nullptr) return enter_and_wait_told(hold, ctx, rule);
  const Trace::Nanos asked = Trace::now();
  const auto answer = enter_and_wait_told(hold, ctx, rule);
  if (answer == detail::ThreadHold::Answer::granted) {
    try {
      trace->thread_got(&hold, asked, Trace::now());
    } catch (...) {
      // Out of memory: the trace misses this wait.
    }
  }
  return answer;
}

detail::ThreadHold::Answer Domain::enter_and_wait_told(detail::ThreadHold& hold, detail::TaskState& ctx,
                                                       const Rule& rule) {
  std::shared_ptr<LockListener> listener;
  if (listening_.load(std::memory_order_acquire)) {
    std::lock_guard lock(listener_mutex_);
    listener = lock_listener_;
  }
  DomainExtension* job_layer = runs_extension(ctx) ? made_extension() : nullptr;  // a job's run
  if (!listener && job_layer == nullptr) return hold.enter(table_, this);
  // A synchronous thread may be told to serve its phases while it waits: its answer must wake it
  // there, so that it can wait for both.
  SchedulerImpl* sync_thread_of = listener && ctx.worker_of == nullptr ? ctx.sync_of : nullptr;
  hold.wake_through(sync_thread_of);
  if (hold.try_enter(table_)) return hold.answer();
  // A job's run in a manager that shuts down does not wait: the shutdown withdrew those waiting
  // when it began (see close()), and this one is answered as they were.
  if (job_layer != nullptr && closing() && table_.withdraw(hold)) return detail::ThreadHold::Answer::canceled;
  detail::ThreadHold::Noted noted(hold, this);  // before the listener hears of it
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
    noted.end();  // a transfer_rule must not find the request once it may go
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

void Domain::take_handed_below_top(detail::TaskState& ctx) {
  ctx.rule_stack.reserve(ctx.rule_stack.size() + 1);  // out of memory: nothing taken, the frame stays
  detail::RuleFrame mine = std::move(ctx.rule_stack.back());
  ctx.rule_stack.pop_back();
  try {
    take_handed(ctx);
  } catch (...) {
    ctx.rule_stack.push_back(std::move(mine));  // room: the popped frame's
    throw;
  }
  ctx.rule_stack.push_back(std::move(mine));  // room: reserved above
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

}  // namespace tasklet::detail

namespace tasklet {

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

}  // namespace tasklet
