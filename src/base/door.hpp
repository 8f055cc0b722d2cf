// Private: what the rooms above (table, scheduler, jobs, api) may use of the base room, and all
// they may include from it (the build checks: see cmake/TaskletDoorCheck.cmake).
//
// Through it: the running code's TaskState (running_state, runs_on_workers; a room keeps its own
// per-task state in a struct derived from it), WorkersImpl (the arena behind Workers), Wakeup and
// TaskCondition (waits that suspend a oneTBB task instead of blocking a worker), the Timer, the
// Trace recorder and room_for. The allocator's seam stays behind it.
#pragma once

#include "base/context.hpp"
#include "base/room_for.hpp"
#include "base/task_condition.hpp"
#include "base/timer.hpp"
#include "base/trace.hpp"
#include "base/workers_impl.hpp"
