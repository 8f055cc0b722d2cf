// Private: the one door through which a rule backend outside the engine (tasklet::etcd) reaches
// it. It brings the backend's interface (table/rule_backend.hpp), a request as a handle with the
// three things a backend does with one (read its rule, tell it it is held, tell it why not), and
// what a backend asks of the engine: to stand behind a manager's table, to give a request up,
// which job holds a request, and what the calling code holds.
// Nothing else of the engine is for a backend (a test checks that tasklet::etcd includes no other
// engine header).
#pragma once

#include <exception>
#include <memory>
#include <vector>

#include "table/rule_backend.hpp"
#include "tasklet/export.hpp"
#include "tasklet/job.hpp"
#include "tasklet/job_manager.hpp"

namespace tasklet::detail {

/// The rule `request` asks for (null before it has one); its owner keeps it alive while the request
/// is in the table.
TASKLET_EXPORT const SchedulingRule* requested_rule(const RuleRequest& request) noexcept;

/// Tells a request that RuleBackend::acquire held it in the backend: it is granted (once).
TASKLET_EXPORT void tell_granted(RuleRequest& request) noexcept;

/// Tells a request why the backend could not hold it, once it is out of the table (abandon).
TASKLET_EXPORT void tell_failed(RuleRequest& request, std::exception_ptr why) noexcept;

/// Puts `backend` behind `manager`'s rule table, before the manager's first rule. Not thread-safe.
TASKLET_EXPORT void install_rule_backend(JobManager& manager, std::shared_ptr<RuleBackend> backend) noexcept;

/// The backend behind `manager`'s rule table, or null.
TASKLET_EXPORT RuleBackend* rule_backend_of(const JobManager& manager) noexcept;

/// RuleBackend::acquire could not hold `request` in the backend: it leaves `table` (the caller
/// then tells the request why, request.failed()).
TASKLET_EXPORT void abandon(RuleTable& table, RuleRequest& request) noexcept;

/// The job whose run holds `request`: its own rule, or one its run took with begin_rule or
/// co_await hold(); null for a request of anything else. While `request` cannot leave the table.
TASKLET_EXPORT std::shared_ptr<Job> job_holding(const RuleRequest& request);

/// The requests of `manager`'s table through which the calling code holds rules: this thread's
/// begin_rule scopes, outermost first, then the running tasklet's or job's own rule or hold.
TASKLET_EXPORT std::vector<const RuleRequest*> requests_held_here(const JobManager& manager);

}  // namespace tasklet::detail
