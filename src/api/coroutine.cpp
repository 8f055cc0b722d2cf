// The library's part of tasklet/coroutine.hpp: where a parked coroutine goes on.
#include "tasklet/coroutine.hpp"

#include "scheduler/door.hpp"

namespace tasklet::detail {

// A sync phase runs on a scheduler's synchronous thread (or inline on the implicit scheduler's
// thread), never on one of the workers; an async phase always on one of them.
bool in_sync_phase() noexcept {
  const RunState& ctx = run_state();
  return phase_scheduler(ctx) != nullptr && ctx.worker_of == nullptr;
}

Rescheduler suspend_in_phase(Tasklet& tasklet) {
  const RunState& here = run_state();
  Scheduler* scheduler = phase_scheduler(here);
  if (here.tasklet != &tasklet || scheduler == nullptr) {
    throw IllegalState("a coroutine of " + tasklet.name() + " parks outside its tasklet's phase");
  }
  return scheduler->suspend(tasklet);
}

}  // namespace tasklet::detail
