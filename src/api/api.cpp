#include "tasklet/api.hpp"

#include "scheduler/door.hpp"
#include "tasklet/job_manager.hpp"
#include "tasklet/workers.hpp"

namespace tasklet::api {

std::shared_ptr<Scheduler> new_scheduler() { return Scheduler::create(); }

std::shared_ptr<Scheduler> new_scheduler(SchedulerOptions options) {
  return Scheduler::create(std::move(options));
}

Scheduler& current() {
  if (Scheduler* current = detail::running_scheduler()) return *current;
  auto& mine = detail::thread_options();
  if (!mine.implicit) {
    mine.implicit = Scheduler::create(mine.configured);
    detail::make_implicit_for_this_thread(*mine.implicit);
  }
  return *mine.implicit;
}

void with(Scheduler& scheduler, const std::shared_ptr<Tasklet>& tasklet) { detail::with(scheduler, tasklet); }

void configure(SchedulerOptions options) {
  // A configured concurrency becomes one pool shared by the thread's new schedulers.
  if (!options.workers && options.concurrency > 0) options.workers = Workers::create(options.concurrency);
  detail::thread_options().configured = std::move(options);
}

SchedulerOptions options() { return detail::thread_options().configured; }

void reset() {
  auto& mine = detail::thread_options();
  std::shared_ptr<Scheduler> implicit = std::move(mine.implicit);
  mine.configured = {};
  implicit.reset();
}

}  // namespace tasklet::api
