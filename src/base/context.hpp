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

/// A frame that a room above pushes on the running task for as long as some code of it runs (a
/// job's run, a listener's call, a wait that serves phases meanwhile). `kind` says whose frame it
/// is: each room defines its kinds and finds its frames by them; this room only carries them.
struct FrameKind {
  const char* name;  // for a debugger
};
struct TaskFrame {
  const FrameKind* kind;
  void* owner;
  const TaskFrame* outer;
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

  /// The rooms above's frames, innermost first (see TaskFrame).
  const TaskFrame* frames = nullptr;
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

/// The innermost frame of `kind` on `task`, or null.
inline const TaskFrame* find_frame(const TaskState& task, const FrameKind& kind) noexcept {
  for (const TaskFrame* frame = task.frames; frame != nullptr; frame = frame->outer) {
    if (frame->kind == &kind) return frame;
  }
  return nullptr;
}

/// Pushes a frame on the running task for the scope's lifetime. The task may move to another
/// thread meanwhile (a wait suspends it): the frame is popped from the task, wherever it is then.
class FrameScope {
 public:
  FrameScope(const FrameKind& kind, void* owner) noexcept : frame_{&kind, owner, state().frames} {
    state().frames = &frame_;
  }
  ~FrameScope() { state().frames = frame_.outer; }
  FrameScope(const FrameScope&) = delete;
  FrameScope& operator=(const FrameScope&) = delete;

 private:
  TaskFrame frame_;
};

}  // namespace tasklet::detail
