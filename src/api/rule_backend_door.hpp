// Private: the one door through which a rule backend outside the engine (tasklet::etcd) reaches
// it. It brings the backend's interface and its requests (table/rule_backend.hpp,
// table/rule_request.hpp), and what a backend asks of the engine: to stand behind a manager's
// table, to give a request up, which job holds a request, and what the calling code holds.
// Nothing else of the engine is for a backend (a test checks that tasklet::etcd includes no other
// engine header).
#pragma once

#include <memory>
#include <vector>

#include "table/rule_backend.hpp"
#include "table/rule_request.hpp"
#include "tasklet/export.hpp"
#include "tasklet/job.hpp"
#include "tasklet/job_manager.hpp"

namespace tasklet::detail {

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
