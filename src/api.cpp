#include "tasklet/api.hpp"

#include "context.hpp"
#include "scheduler_impl.hpp"
#include "tasklet/job_manager.hpp"
#include "tasklet/workers.hpp"

namespace tasklet::api {

std::shared_ptr<Scheduler> new_scheduler() { return Scheduler::create(); }

std::shared_ptr<Scheduler> new_scheduler(SchedulerOptions options) {
  return Scheduler::create(std::move(options));
}

Scheduler& current() {
  auto& ctx = detail::context();
  if (Scheduler* current = detail::state().current) return *current;
  if (!ctx.implicit) {
    ctx.implicit = Scheduler::create(ctx.configured);
    ctx.implicit->impl().make_implicit_for_this_thread();
  }
  return *ctx.implicit;
}

void with(Scheduler& scheduler, const std::shared_ptr<Tasklet>& tasklet) { scheduler.impl().with(tasklet); }

void configure(SchedulerOptions options) {
  // A configured concurrency becomes one pool shared by the thread's new schedulers.
  if (!options.workers && options.concurrency > 0) options.workers = Workers::create(options.concurrency);
  detail::context().configured = std::move(options);
}

SchedulerOptions options() { return detail::context().configured; }

void reset() {
  auto& ctx = detail::context();
  std::shared_ptr<Scheduler> implicit = std::move(ctx.implicit);
  ctx.configured = {};
  implicit.reset();
}

}  // namespace tasklet::api
