// Private: the oneTBB arena behind a Workers handle.
#pragma once

#include <memory>

#include <oneapi/tbb/task_arena.h>

#include "tasklet/workers.hpp"

namespace tasklet::detail {

class WorkersImpl final : public Workers {
 public:
  explicit WorkersImpl(int concurrency);
  explicit WorkersImpl(std::shared_ptr<oneapi::tbb::task_arena> adopted);

  oneapi::tbb::task_arena& arena() noexcept { return *arena_; }
  int concurrency() const noexcept { return concurrency_; }

 private:
  std::shared_ptr<oneapi::tbb::task_arena> arena_;
  int concurrency_;
};

/// The arena behind a public handle (every Workers is a WorkersImpl).
inline WorkersImpl& impl(Workers& workers) noexcept { return static_cast<WorkersImpl&>(workers); }

/// Raises oneTBB's process-wide worker limit so that `workers` threads can serve arenas while the
/// threads that submit work (synchronous threads) stay outside them. Never lowers it.
void ensure_worker_limit(int workers);

}  // namespace tasklet::detail
