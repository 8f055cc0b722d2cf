// Private: what the rooms above (jobs, api) may ask of the scheduler room, and all they may
// include from it (the build checks: see cmake/TaskletDoorCheck.cmake).
//
// Through it: a manager's Domain (its public members), a tasklet's engine view (TaskletAccess), the
// running code's RunState and the frames the rooms above push on it, and the calls below on a
// Scheduler. The scheduler's engine (SchedulerImpl) and the rule table stay behind it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "scheduler/domain.hpp"
#include "scheduler/run_state.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/directive.hpp"
#include "tasklet/scheduler.hpp"

namespace tasklet::detail {

/// Where an async phase waits when a scheduler orders them (order_async_phases_by): its lane and
/// its deadline. Within a lane, deadlines grow with arrival.
struct PhaseOrder {
  std::size_t lane;
  std::int64_t deadline;
};
inline constexpr std::size_t phase_lane_count = 5;
using PhaseOrderOf = PhaseOrder (*)(const Tasklet&);
/// How diagnostics name a scheduler's tasklets; must not throw but for std::bad_alloc, nor take
/// locks (it runs under the rule table's).
using DescribeTasklet = std::string (*)(const Tasklet&);

/// The manager behind `scheduler`.
Domain& domain_of(const Scheduler& scheduler) noexcept;

/// Async phases of `scheduler` wait in deadline order (earliest first; ties in arrival order)
/// instead of going straight to the workers. Set before use.
void order_async_phases_by(Scheduler& scheduler, PhaseOrderOf order);
/// Whether `scheduler`'s phases are ordered so (a job scheduler's).
bool orders_async_phases(const Scheduler& scheduler) noexcept;
/// How diagnostics name `scheduler`'s tasklets ("job 'name'" for the jobs'). Set before use.
void describe_tasklets_by(Scheduler& scheduler, DescribeTasklet describe) noexcept;

/// Withdraws a tasklet still waiting for its delay, its rule, a worker or the synchronous thread and
/// ends it unrun; false when it has started (or its turn on the synchronous thread has come).
bool withdraw(Scheduler& scheduler, Tasklet& tasklet);
/// Whether `scheduler` has a synchronous thread (it is not a manager's background scheduler).
bool has_synchronous_thread(const Scheduler& scheduler) noexcept;
/// Whether the calling thread is `scheduler`'s synchronous thread (in its run(), poll() or
/// run_until(), or one of its sync phases).
bool is_synchronous_thread_of(const Scheduler& scheduler) noexcept;
/// Scheduler::suspend of the tasklet whose phase runs: the suspension's generation.
std::uint32_t suspend(Scheduler& scheduler, Tasklet& tasklet);
/// Resumes that suspension (a Rescheduler's resume, made by the engine).
void resume(Scheduler& scheduler, const std::shared_ptr<Tasklet>& tasklet, std::uint32_t generation,
            Directive directive);

/// The running phase's scheduler on `task` (null outside a phase).
Scheduler* phase_scheduler(const RunState& task) noexcept;
/// The phase running on `task` lets a waiting conflicting request go first and takes its rule
/// again; false at once when nobody conflicting waits. Precondition: a phase runs on `task`.
bool yield_phase_rule(const RunState& task);
/// Releases the rule of the phase running on `task` before its tasklet is done (idempotent).
void release_phase_rule(const RunState& task) noexcept;

/// The scheduler of the code running here (api::current): a phase's, a run loop's, a job run's
/// (then its manager's background scheduler), or null.
Scheduler* running_scheduler() noexcept;
/// What api::configure and the implicit scheduler keep per thread.
struct ThreadOptions {
  std::shared_ptr<Scheduler> implicit;
  SchedulerOptions configured;
};
ThreadOptions& thread_options() noexcept;
/// api::with.
void with(Scheduler& scheduler, const std::shared_ptr<Tasklet>& tasklet);
/// The implicit scheduler of the calling thread runs its sync tasklets inline.
void make_implicit_for_this_thread(Scheduler& scheduler);

/// A serial executor's cancel_all: withdraws what waits for its delay and what waits for exactly
/// `rule` among the tasklets that `mine` accepts, and ends them unrun; returns how many.
/// `mine` runs under the rule table's lock: it must not take locks.
std::size_t withdraw_all(Scheduler& scheduler, const SchedulingRule& rule,
                         const std::function<bool(const Tasklet&)>& mine);

}  // namespace tasklet::detail
