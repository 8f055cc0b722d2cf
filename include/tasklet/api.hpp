// tasklet/api.hpp: the per-thread API (the Java library's SchedulerAPI).
//
// Each thread has a current scheduler: inside a phase or run(), the scheduler running it (inside a
// job's run, its manager's background scheduler, which runs async phases only); otherwise the
// thread's implicit scheduler, made on first use, whose `sync` tasklets scheduled
// from that thread run inline inside schedule(). ASYNC phases start with their spawning scheduler
// as the current one. New schedulers take the thread's configured options, which ASYNC phases
// inherit from their scheduler.
#pragma once

#include "tasklet/export.hpp"

#include <memory>

#include "tasklet/scheduler.hpp"

namespace tasklet::api {

/// A new scheduler with the calling thread's options (inside a phase: its scheduler's options).
TASKLET_EXPORT std::shared_ptr<Scheduler> new_scheduler();
/// A new scheduler with explicit options; empty members inherit as in new_scheduler().
TASKLET_EXPORT std::shared_ptr<Scheduler> new_scheduler(SchedulerOptions options);

/// The calling thread's current scheduler (see the header comment). Throws only std::bad_alloc,
/// when it makes the implicit scheduler.
TASKLET_EXPORT Scheduler& current();

/// Runs tasklet->task() on the calling thread with `scheduler` as its current scheduler, then
/// continues the tasklet on `scheduler` with the directive it returned. The tasklet must be idle
/// (AlreadyScheduled); its rule is acquired first, blocking the caller while it conflicts.
/// An exception from that phase ends the tasklet and is rethrown here; so does a phase that
/// returns `async` while the scheduler's run() is not active (SchedulerNotRunning, naming it).
/// Also throws std::invalid_argument for a null tasklet, IllegalState when the manager shuts down
/// while it waits for the rule, and std::bad_alloc; on the implicit scheduler's own thread, the
/// exceptions of the `sync` phases that then run inline.
TASKLET_EXPORT void with(Scheduler& scheduler, const std::shared_ptr<Tasklet>& tasklet);

/// Sets the options new schedulers on this thread use (and the implicit scheduler, when it is
/// next created).
TASKLET_EXPORT void configure(SchedulerOptions options);
/// The calling thread's configured options.
TASKLET_EXPORT SchedulerOptions options();

/// Drops the thread's implicit scheduler (see Scheduler's destructor) and its configuration.
TASKLET_EXPORT void reset();

}  // namespace tasklet::api
