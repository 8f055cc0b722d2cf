// The library's part of tasklet/coroutine.hpp: where a parked coroutine goes on.
#include "tasklet/coroutine.hpp"

#include "base/context.hpp"
#include "scheduler/scheduler_impl.hpp"

namespace tasklet::detail {

// A sync phase runs on a scheduler's synchronous thread (or inline on the implicit scheduler's
// thread), never on one of the workers; an async phase always on one of them.
bool in_sync_phase() noexcept {
  const TaskState& ctx = state();
  return ctx.phase_of != nullptr && ctx.worker_of == nullptr;
}

Rescheduler suspend_in_phase(Tasklet& tasklet) {
  const TaskState& here = state();
  if (here.tasklet != &tasklet || here.phase_of == nullptr) {
    throw IllegalState("a coroutine of " + tasklet.name() + " parks outside its tasklet's phase");
  }
  return here.phase_of->self_.suspend(tasklet);
}

}  // namespace tasklet::detail
