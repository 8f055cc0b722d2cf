// Private: what the engine remembers about the code running on this thread, as far as this room
// needs it: whether it is one of the workers' tasks, the phase a trace records, and the state to
// go back to. A room above keeps its own per-task state in a struct derived from TaskState (the
// scheduler's RunState); this room moves it with the task and knows nothing else of it.
#pragma once

namespace tasklet::detail {

struct TracedPhase;
class WorkersImpl;

/// The state of the code running now. One per thread (made by the room above when it first looks),
/// plus one per oneTBB task of ours: a task suspended in a wait may resume on another thread, so
/// what it knows travels with it (see Wakeup::wait) instead of living in the thread.
struct TaskState {
  /// The workers whose arena task this is (spawns there stay local, and waits suspend the task
  /// instead of blocking the worker).
  WorkersImpl* worker_of = nullptr;
  /// The phase running here while a trace is recorded (its slice is cut where the task suspends).
  TracedPhase* traced_phase = nullptr;
  /// The thread's state to go back to when this task leaves the thread.
  TaskState* outer = nullptr;
};

struct ThreadContext {
  TaskState* state = nullptr;  // the running task's state, or the thread's own; null before either
};

/// This thread's context. Inline, so that the engine's hot paths reach it without a call.
inline ThreadContext& context() noexcept {
  thread_local ThreadContext ctx;
  return ctx;
}

/// The state of the code running now on this thread, or null where nothing of ours ran yet.
inline TaskState* running_state() noexcept { return context().state; }

/// Whether the code running here is one of `workers`' tasks (any workers' where null).
inline bool runs_on_workers(const WorkersImpl* workers = nullptr) noexcept {
  const TaskState* state = running_state();
  return state != nullptr && state->worker_of != nullptr &&
         (workers == nullptr || state->worker_of == workers);
}

}  // namespace tasklet::detail
