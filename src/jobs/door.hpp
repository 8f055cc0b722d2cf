// Private: what the room above (api) may ask of the jobs room, and all it may include from it
// (the build checks: see cmake/TaskletDoorCheck.cmake). The jobs' state stays behind it.
#pragma once

#include <memory>

#include "tasklet/job.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet::detail {

/// The job whose run `tasklet` is, if it is one (whom a holder of a rule is).
std::shared_ptr<Job> job_of_run(const Tasklet* tasklet);

}  // namespace tasklet::detail
