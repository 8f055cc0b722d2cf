// The door of rule backends outside the engine (rule_backend_door.hpp).
#include "api/rule_backend_door.hpp"

#include <exception>
#include <utility>

#include "jobs/door.hpp"
#include "scheduler/door.hpp"

namespace tasklet::detail {

void install_rule_backend(JobManager& manager, std::shared_ptr<RuleBackend> backend) noexcept {
  domain(manager).set_backend(std::move(backend));
}

RuleBackend* rule_backend_of(const JobManager& manager) noexcept { return domain(manager).backend(); }

const SchedulingRule* requested_rule(const RuleRequest& request) noexcept { return request.rule(); }

void tell_granted(RuleRequest& request) noexcept { request.granted(); }

void tell_failed(RuleRequest& request, std::exception_ptr why) noexcept { request.failed(std::move(why)); }

void abandon(RuleTable& table, RuleRequest& request) noexcept { table.abandon(request); }

std::shared_ptr<Job> job_holding(const RuleRequest& request) {
  const void* owner = request.owner();  // a tasklet's or job's rule, or a hold
  if (const auto* thread = dynamic_cast<const ThreadHold*>(&request)) owner = thread->owner_tasklet();
  return job_of_run(static_cast<const Tasklet*>(owner));
}

std::vector<const RuleRequest*> requests_held_here(const JobManager& manager) {
  const Domain& here = domain(manager);
  const RunState& ctx = run_state();
  std::vector<const RuleRequest*> held;
  for (const RuleFrame& frame : ctx.rule_stack) {
    if (frame.hold != nullptr && frame.domain == &here) held.push_back(frame.hold);
  }
  if (ctx.tasklet != nullptr && ctx.phase_domain == &here) {
    if (const RuleRequest* hold = TaskletAccess::hold(*ctx.tasklet)) held.push_back(hold);
  }
  return held;
}

}  // namespace tasklet::detail
