#include "tasklet/api.hpp"

#include "base/context.hpp"
#include "scheduler/scheduler_impl.hpp"
#include "tasklet/job_manager.hpp"
#include "tasklet/workers.hpp"

namespace tasklet::api {

std::shared_ptr<Scheduler> new_scheduler() { return Scheduler::create(); }

std::shared_ptr<Scheduler> new_scheduler(SchedulerOptions options) {
  return Scheduler::create(std::move(options));
}

Scheduler& current() {
  if (detail::SchedulerImpl* current = detail::state().current) {
    // A job's run: the jobs' own scheduler orders job runs only; the user's tasklets go to the
    // manager's background scheduler.
    if (current->order_ != nullptr) return current->domain_.background();
    return current->self_;
  }
  auto& mine = detail::thread_options();
  if (!mine.implicit) {
    mine.implicit = Scheduler::create(mine.configured);
    detail::impl(*mine.implicit).make_implicit_for_this_thread();
  }
  return *mine.implicit;
}

void with(Scheduler& scheduler, const std::shared_ptr<Tasklet>& tasklet) {
  detail::impl(scheduler).with(tasklet);
}

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
