#include "scheduler/door.hpp"

#include "scheduler/scheduler_impl.hpp"

namespace tasklet::detail {

Domain& domain_of(const Scheduler& scheduler) noexcept { return impl(scheduler).domain_; }

void order_async_phases_by(Scheduler& scheduler, PhaseOrderOf order) {
  impl(scheduler).order_async_phases_by(order);
}

bool orders_async_phases(const Scheduler& scheduler) noexcept { return impl(scheduler).order_ != nullptr; }

void describe_tasklets_by(Scheduler& scheduler, DescribeTasklet describe) noexcept {
  impl(scheduler).describe_tasklets_by(describe);
}

bool withdraw(Scheduler& scheduler, Tasklet& tasklet) { return impl(scheduler).withdraw(tasklet); }

bool has_synchronous_thread(const Scheduler& scheduler) noexcept { return !impl(scheduler).background_; }

bool is_synchronous_thread_of(const Scheduler& scheduler) noexcept {
  return run_state().sync_of == &impl(scheduler);
}

std::uint32_t suspend(Scheduler& scheduler, Tasklet& tasklet) { return impl(scheduler).suspend(tasklet); }

void resume(Scheduler& scheduler, const std::shared_ptr<Tasklet>& tasklet, std::uint32_t generation,
            Directive directive) {
  impl(scheduler).resume(tasklet, generation, directive);
}

Scheduler* phase_scheduler(const RunState& task) noexcept {
  return task.phase_of != nullptr ? &task.phase_of->self_ : nullptr;
}

bool yield_phase_rule(const RunState& task) { return task.phase_of->yield_rule(*task.tasklet); }

void release_phase_rule(const RunState& task) noexcept {
  if (task.phase_of != nullptr && task.tasklet != nullptr) task.phase_of->release_rule(*task.tasklet);
}

Scheduler* running_scheduler() noexcept {
  SchedulerImpl* current = run_state().current;
  if (current == nullptr) return nullptr;
  // A job's run: the jobs' own scheduler orders job runs only; the user's tasklets go to the
  // manager's background scheduler.
  if (current->order_ != nullptr) return &current->domain_.background();
  return &current->self_;
}

void with(Scheduler& scheduler, const std::shared_ptr<Tasklet>& tasklet) { impl(scheduler).with(tasklet); }

void make_implicit_for_this_thread(Scheduler& scheduler) { impl(scheduler).make_implicit_for_this_thread(); }

std::size_t withdraw_all(Scheduler& scheduler, const SchedulingRule& rule,
                         const std::function<bool(const Tasklet&)>& mine) {
  SchedulerImpl& engine = impl(scheduler);
  const std::size_t delayed = engine.withdraw_delayed(mine);
  return delayed + engine.withdraw_waiting(rule, mine);
}

}  // namespace tasklet::detail
