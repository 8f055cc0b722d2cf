// Private: a test seam in the library's own allocator (allocate_bytes, behind every pooled object:
// tasklets, rule requests, jobs and their runs).
#pragma once

#include <atomic>

namespace tasklet::detail {

/// When set, allocate_bytes asks it before each allocation and throws std::bad_alloc when it says
/// so: the fault injection tests fail allocations one at a time with it. One relaxed load when unset.
extern std::atomic<bool (*)()> allocation_fails;

}  // namespace tasklet::detail
