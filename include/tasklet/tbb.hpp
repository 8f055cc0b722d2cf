// tasklet/tbb.hpp: the seam to oneTBB, for users who want ASYNC phases in an arena of their own.
// Including it requires oneTBB's headers; nothing else in the public API does.
#pragma once

#include "tasklet/export.hpp"

#include <memory>

#include <oneapi/tbb/task_arena.h>

#include "tasklet/workers.hpp"

namespace tasklet {

/// Wraps an existing arena. ASYNC phases are enqueued into it and spawn within it; the arena must
/// let worker threads in (reserved_for_masters below max_concurrency), and it must outlive every
/// scheduler using it (the returned Workers keeps the shared_ptr).
TASKLET_EXPORT std::shared_ptr<Workers> adopt_arena(std::shared_ptr<oneapi::tbb::task_arena> arena);

}  // namespace tasklet
