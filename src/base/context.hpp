// Private: what the engine remembers about the code running on this thread.
//
// The lowest room: it stores opaque pointers to the rooms above (declared here, defined there) and
// knows none of the public scheduler, manager or job classes.
#pragma once

#include <cstddef>
#include <memory>

#include <boost/container/small_vector.hpp>

#include "tasklet/scheduling_rule.hpp"

namespace tasklet {
class Tasklet;
}

namespace tasklet::detail {

class Domain;
class SchedulerImpl;
class ThreadHold;
struct TracedPhase;
class WorkersImpl;

/// One begin_rule on this thread. `hold` is set on the outermost frame that acquired the rule.
struct RuleFrame {
  Rule rule;
  Domain* domain = nullptr;
  ThreadHold* hold = nullptr;
};

/// A call in progress on this task, innermost first, so that code it calls does not wait for it:
/// a listener's call (a listener that removes itself), or the end of a job's run (a manager
/// destroyed from a done listener).
struct CallFrame {
  const void* owner;
  const CallFrame* outer;
};

/// What the engine knows about the code running now. One per thread, plus one per oneTBB task of
/// ours: a task suspended in a wait may resume on another thread, so what it knows travels with
/// it (see Wakeup::wait) instead of living in the thread.
struct TaskState {
  /// api::current() while set (run loop, phases, api::with; in a job's run, its manager's
  /// background scheduler instead); else the implicit scheduler.
  SchedulerImpl* current = nullptr;
  /// The scheduler whose synchronous thread this is (inside run() or an inline drain).
  SchedulerImpl* sync_of = nullptr;
  /// The scheduler and tasklet whose phase is running here.
  SchedulerImpl* phase_of = nullptr;
  Tasklet* tasklet = nullptr;
  /// The running phase's owning reference to `tasklet` (a request that keeps the tasklet takes it).
  const std::shared_ptr<Tasklet>* phase_owner = nullptr;
  /// The workers whose arena task this is (spawns there stay local, and waits suspend the task
  /// instead of blocking the worker).
  WorkersImpl* worker_of = nullptr;
  /// The scheduler whose oneTBB task this is (its destructor must not wait for it here).
  SchedulerImpl* task_of = nullptr;

  /// begin_rule frames, innermost last. Frames from `phase_base` on belong to the running phase.
  boost::container::small_vector<RuleFrame, 4> rule_stack;
  std::size_t phase_base = 0;
  /// The running phase's tasklet rule (held for the whole phase) and its domain.
  const Rule* phase_rule = nullptr;
  Domain* phase_domain = nullptr;

  /// While a worker ends a phase of this scheduler, an async phase it lets through is handed to it
  /// here instead of being spawned.
  SchedulerImpl* handoff_of = nullptr;
  std::shared_ptr<Tasklet> handoff;

  /// The job whose run() this is (the jobs layer's; JobManager::current_job).
  void* job = nullptr;
  /// The listener calls, and the ends of job runs, that this code is inside of.
  const CallFrame* listener_call = nullptr;
  const CallFrame* completing_run = nullptr;
  /// The begin_rule requests (ThreadHolds) this thread waits for while it runs sync phases meanwhile
  /// (a lock listener's `serve`): a phase run then must not wait for a rule that conflicts.
  const CallFrame* serving_wait = nullptr;
  /// The phase running here while a trace is recorded (its slice is cut where the task suspends).
  TracedPhase* traced_phase = nullptr;

  /// The thread's state to go back to when this task leaves the thread.
  TaskState* outer = nullptr;
};

struct ThreadContext {
  TaskState own;
  TaskState* state = &own;  // the running task's state, or the thread's own
};

/// This thread's context. Inline, so that the engine's hot paths reach it without a call.
inline ThreadContext& context() noexcept {
  thread_local ThreadContext ctx;
  return ctx;
}

/// The state of the code running now on this thread.
inline TaskState& state() noexcept { return *context().state; }

}  // namespace tasklet::detail
