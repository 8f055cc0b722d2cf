// Handing a held rule to another thread (transfer_rule): the rule waits in handed_ until the
// destination takes it, at its next begin_rule or at once where it waits for a rule already.
#include <algorithm>
#include <functional>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/domain.hpp"

#include "scheduler/run_state.hpp"
#include "scheduler/scheduler_impl.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/error.hpp"

namespace tasklet::detail {

void Domain::transfer_rule(const Rule& rule, std::thread::id destination) {
  if (!rule || destination == std::this_thread::get_id()) return;  // nothing to hand over
  auto& ctx = detail::run_state();
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
void Domain::transfer_tasklet_rule(RunState& ctx, const Rule& rule, std::thread::id destination,
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

void Domain::take_handed_below_top(detail::RunState& ctx) {
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

void Domain::take_handed(detail::RunState& ctx) {
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
