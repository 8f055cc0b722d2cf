// Private: the oneTBB arena behind a Workers handle.
#pragma once

#include <memory>

#include <oneapi/tbb/task_arena.h>

#include "tasklet/workers.hpp"

namespace tasklet {

struct Workers::Impl {
  explicit Impl(int concurrency);
  explicit Impl(std::shared_ptr<oneapi::tbb::task_arena> adopted);

  oneapi::tbb::task_arena& arena() noexcept { return *arena_; }
  int concurrency() const noexcept { return concurrency_; }

 private:
  std::shared_ptr<oneapi::tbb::task_arena> arena_;
  int concurrency_;
};

namespace detail {
/// Raises oneTBB's process-wide worker limit so that `workers` threads can serve arenas while the
/// threads that submit work (synchronous threads) stay outside them. Never lowers it.
void ensure_worker_limit(int workers);
}  // namespace detail

}  // namespace tasklet
