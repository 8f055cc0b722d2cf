// Private: what the engine remembers about the calling thread.
#pragma once

#include <memory>

#include "tasklet/scheduler.hpp"
#include "tasklet/workers.hpp"

namespace tasklet::detail {

struct ThreadContext {
  /// api::current() while set (run loop, phases, api::with); else the implicit scheduler.
  Scheduler* current = nullptr;
  /// The scheduler whose synchronous thread this is (inside run() or an inline drain).
  Scheduler::Impl* sync_of = nullptr;
  /// The scheduler and tasklet whose phase is running on this thread.
  Scheduler::Impl* phase_of = nullptr;
  Tasklet* tasklet = nullptr;
  /// The workers whose arena task this thread is executing (spawns there stay local).
  Workers::Impl* worker_of = nullptr;
  /// The scheduler whose oneTBB task this thread is executing (its destructor must not wait here).
  Scheduler::Impl* task_of = nullptr;

  std::shared_ptr<Scheduler> implicit;
  SchedulerOptions configured;
};

ThreadContext& context() noexcept;

}  // namespace tasklet::detail
