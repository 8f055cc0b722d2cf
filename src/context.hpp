// Private: what the engine remembers about the calling thread.
#pragma once

#include <cstddef>
#include <memory>

#include <boost/container/small_vector.hpp>

#include "tasklet/job.hpp"
#include "tasklet/job_manager.hpp"
#include "tasklet/scheduler.hpp"
#include "tasklet/workers.hpp"

namespace tasklet::detail {

class ThreadHold;

/// One begin_rule on this thread. `hold` is set on the outermost frame that acquired the rule.
struct RuleFrame {
  Rule rule;
  JobManager::Impl* manager = nullptr;
  ThreadHold* hold = nullptr;
};

/// A call in progress on this task, innermost first, so that code it calls does not wait for it:
/// a listener's call (Jobs::deliver: a listener that removes itself), or the end of a job's run
/// (Jobs::complete: a manager destroyed from a done listener).
struct CallFrame {
  const void* owner;
  const CallFrame* outer;
};

/// What the engine knows about the code running now. One per thread, plus one per oneTBB task of
/// ours: a task suspended in begin_rule may resume on another thread, so what it knows travels with
/// it (see ThreadHold::wait) instead of living in the thread.
struct TaskState {
  /// api::current() while set (run loop, phases, api::with); else the implicit scheduler.
  Scheduler* current = nullptr;
  /// The scheduler whose synchronous thread this is (inside run() or an inline drain).
  Scheduler::Impl* sync_of = nullptr;
  /// The scheduler and tasklet whose phase is running here.
  Scheduler::Impl* phase_of = nullptr;
  Tasklet* tasklet = nullptr;
  /// The workers whose arena task this is (spawns there stay local, and waits for rules suspend
  /// the task instead of blocking the worker).
  Workers::Impl* worker_of = nullptr;
  /// The scheduler whose oneTBB task this is (its destructor must not wait for it here).
  Scheduler::Impl* task_of = nullptr;

  /// begin_rule frames, innermost last. Frames from `phase_base` on belong to the running phase.
  boost::container::small_vector<RuleFrame, 4> rule_stack;
  std::size_t phase_base = 0;
  /// The running phase's tasklet rule (held for the whole phase) and its manager.
  const Rule* phase_rule = nullptr;
  JobManager::Impl* phase_manager = nullptr;

  /// While a worker ends a phase of this scheduler, an async phase it lets through is handed to it
  /// here instead of being spawned.
  Scheduler::Impl* handoff_of = nullptr;
  std::shared_ptr<Tasklet> handoff;

  /// The job whose run() this is (JobManager::current_job).
  Job* job = nullptr;
  /// The listener calls, and the ends of job runs, that this code is inside of.
  const CallFrame* listener_call = nullptr;
  const CallFrame* completing_run = nullptr;

  /// The thread's state to go back to when this task leaves the thread.
  TaskState* outer = nullptr;
};

struct ThreadContext {
  TaskState own;
  TaskState* state = &own;  // the running task's state, or the thread's own
  std::shared_ptr<Scheduler> implicit;
  SchedulerOptions configured;
};

ThreadContext& context() noexcept;

/// Whether the code running now is a task on the workers (a phase, a job, an entering task) of any
/// pool, which continues the tasklets it lets through on a worker, rather than the synchronous
/// thread or a thread of the user's.
bool in_worker_task() noexcept;

/// The state of the code running now on this thread.
inline TaskState& state() noexcept { return *context().state; }

}  // namespace tasklet::detail
