// Waits in begin_rule that somebody hears of (the lock listener, a job's monitor), a waiting
// thread that serves its scheduler's phases meanwhile, and the manager's wait cycles
// (check_wait). Kept apart from begin_rule and end_rule, whose fast paths the compiler inlines
// within their own file.
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
    RunState& ctx = run_state();
    RuleFrame waiting = std::move(ctx.rule_stack.back());
    ctx.rule_stack.pop_back();
    {
      const FrameScope serving(serving_wait, this);
      serving_->serve_until(served_answer_, true);
    }
    ctx.rule_stack.push_back(std::move(waiting));  // into the room it left: no allocation
  }
}

detail::ThreadHold::Answer Domain::enter_and_wait(detail::ThreadHold& hold, detail::RunState& ctx,
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

detail::ThreadHold::Answer Domain::enter_and_wait_told(detail::ThreadHold& hold, detail::RunState& ctx,
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
    Blocked(DomainExtension* layer, const RunState& state, const Rule& waited,
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
    const RunState& ctx;
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

}  // namespace tasklet::detail

namespace tasklet {

void detail::Domain::check_wait(const std::string& what,
                                const std::function<bool(const RuleRequest&)>& start) {
  const RunState& ctx = run_state();
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
