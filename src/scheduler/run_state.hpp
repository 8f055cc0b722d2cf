// Private: what the scheduler room remembers about the code running on this thread (the running
// scheduler and phase, begin_rule's frames, the hand-off of the next phase) and the frames the
// rooms above push while some code of theirs runs. A RunState is the base room's TaskState with
// this room's part: the workers move it with a suspended task, wherever it resumes.
#pragma once

#include <cstddef>
#include <memory>

#include <boost/container/small_vector.hpp>

#include "base/door.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet {
class Tasklet;
}

namespace tasklet::detail {

class Domain;
class SchedulerImpl;
class ThreadHold;

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

/// What the scheduler knows about the code running now (see TaskState: one per thread, plus one
/// per oneTBB task of a scheduler's, made by WorkerTaskScope).
struct RunState : TaskState {
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
};

/// The thread's own state, installed the first time the thread asks (out of line: rarely).
RunState& install_thread_state() noexcept;

/// The state of the code running now on this thread. Every TaskState this room installs is a
/// RunState, and nothing below installs one.
inline RunState& run_state() noexcept {
  TaskState* running = running_state();
  if (running == nullptr) [[unlikely]]
    return install_thread_state();
  return static_cast<RunState&>(*running);
}

/// The innermost frame of `kind` on `task`, or null.
inline const TaskFrame* find_frame(const RunState& task, const FrameKind& kind) noexcept {
  for (const TaskFrame* frame = task.frames; frame != nullptr; frame = frame->outer) {
    if (frame->kind == &kind) return frame;
  }
  return nullptr;
}

/// Pushes a frame on the running task for the scope's lifetime. The task may move to another
/// thread meanwhile (a wait suspends it): the frame is popped from the task, wherever it is then.
class FrameScope {
 public:
  FrameScope(const FrameKind& kind, void* owner) noexcept : frame_{&kind, owner, run_state().frames} {
    run_state().frames = &frame_;
  }
  ~FrameScope() { run_state().frames = frame_.outer; }
  FrameScope(const FrameScope&) = delete;
  FrameScope& operator=(const FrameScope&) = delete;

 private:
  TaskFrame frame_;
};

}  // namespace tasklet::detail
