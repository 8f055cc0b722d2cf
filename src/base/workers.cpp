#include "base/workers_impl.hpp"

#include <algorithm>
#include <mutex>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>

#include "tasklet/tbb.hpp"

namespace tasklet::detail {

void ensure_worker_limit(int workers) {
  using oneapi::tbb::global_control;
  static std::mutex mutex;
  static std::unique_ptr<global_control> control;
  static int held = 0;
  // Workers plus one slot for an external thread: that is how oneTBB counts its limit.
  const int wanted = workers + 1;
  std::lock_guard lock(mutex);
  if (wanted <= held) return;
  if (static_cast<std::size_t>(wanted) <=
          global_control::active_value(global_control::max_allowed_parallelism) &&
      control == nullptr) {
    return;
  }
  auto raised = std::make_unique<global_control>(global_control::max_allowed_parallelism,
                                                 static_cast<std::size_t>(wanted));
  control = std::move(raised);  // the older, smaller limit goes away after the new one is in force
  held = wanted;
}

namespace {
int resolve_concurrency(int concurrency) {
  return concurrency > 0 ? concurrency : std::max(1, oneapi::tbb::info::default_concurrency());
}
}  // namespace

WorkersImpl::WorkersImpl(int concurrency) : concurrency_(resolve_concurrency(concurrency)) {
  ensure_worker_limit(concurrency_);
  // No slot is reserved for external threads: synchronous threads never join the arena.
  arena_ = std::make_shared<oneapi::tbb::task_arena>(concurrency_, 0);
  arena_->initialize();
}

WorkersImpl::WorkersImpl(std::shared_ptr<oneapi::tbb::task_arena> adopted)
    : arena_(std::move(adopted)), concurrency_(0) {
  arena_->initialize();
  concurrency_ = arena_->max_concurrency();
}

}  // namespace tasklet::detail

namespace tasklet {

Workers::~Workers() = default;

std::shared_ptr<Workers> Workers::create(int concurrency) {
  return std::make_shared<detail::WorkersImpl>(concurrency);
}

int Workers::concurrency() const noexcept {
  return static_cast<const detail::WorkersImpl&>(*this).concurrency();
}

std::shared_ptr<Workers> adopt_arena(std::shared_ptr<oneapi::tbb::task_arena> arena) {
  return std::make_shared<detail::WorkersImpl>(std::move(arena));
}

}  // namespace tasklet
