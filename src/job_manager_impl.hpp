// Private: what a JobManager owns, and the threads' side of the rule table (begin_rule/end_rule).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "context.hpp"
#include "jobs.hpp"
#include "rule_table.hpp"
#include "task_condition.hpp"
#include "tasklet/job_manager.hpp"
#include "tasklet/scheduler.hpp"
#include "tasklet/workers.hpp"

namespace tasklet {

namespace detail {

class Jobs;

/// A thread's request in begin_rule. wait() blocks an ordinary thread; on a worker it suspends the
/// oneTBB task, so the worker goes on with other work (waiting callers never starve the pool), and
/// a job runner leaves its runner limit while it waits (see Wakeup).
class ThreadHold final : public InlineRuleRequest<4> {
 public:
  /// A request for `rule` in `table`, out of every table. `rule` must outlive it (the begin_rule
  /// frame or the tasklet keeps it). Recycled per thread: uncontended begin_rule/end_rule allocate
  /// nothing, and resolving the rule's nodes is skipped when this thread's last request was for
  /// the same rule.
  static ThreadHold* make(const Rule& rule, RuleTable& table);
  /// begin_rule's fast path: the request this thread parked in `table` for exactly `rule` at its
  /// last end_rule, held again without the table's lock; null when there is none or a conflicting
  /// request revoked it meanwhile.
  static ThreadHold* resume(const Rule& rule, RuleTable& table) noexcept;
  /// Enters the request in `table` (RuleTable::acquire with this hold's entry cache).
  bool acquire(RuleTable& table, bool parkable = false) {
    return table.acquire(*this, &cache_, parkable);
  }
  /// end_rule: parks the request in `table` for this thread's next begin_rule of the same rule
  /// when nobody wants it, else releases it; either way the caller is done with it.
  static void finish(ThreadHold* hold, RuleTable& table);
  static void recycle(ThreadHold* hold) noexcept;
  /// Returns once granted; false when the table cancelled the request instead.
  bool wait();
  void granted() noexcept override { wake(true); }
  void cancelled() noexcept override { wake(false); }

 private:
  bool is_for(const Rule& rule) const noexcept {
    return this->rule() == rule.get() && !last_rule_.owner_before(rule) && !rule.owner_before(last_rule_);
  }
  void wake(bool granted) noexcept;
  Wakeup wakeup_;
  bool granted_ = false;
  // The table where this request is parked (read by its owner only), or null.
  RuleTable* parked_in_ = nullptr;
  // The rule of the last request: a weak reference, so that a new rule cannot take its address
  // while the entries for the old one are kept.
  std::weak_ptr<const SchedulingRule> last_rule_;
  EntryCache cache_;
};

/// Ends the begin_rule frames above `base` (a phase's leftovers), innermost first, releasing
/// what they hold; returns their names for the report, empty when there were none.
std::string end_frames_above(TaskState& ctx, std::size_t base) noexcept;

}  // namespace detail

/// Owned by its JobManager and by the manager's own (background and job) schedulers, so the rule
/// table outlives every task of theirs, even one still finishing after the manager is gone.
struct JobManager::Impl : std::enable_shared_from_this<JobManager::Impl> {
  Impl(JobManager& self, Options options);
  ~Impl();

  /// The manager is being destroyed: cancels what has not started, waits for what runs (see
  /// ~JobManager), lets its schedulers go and detaches the job side. Once.
  void shut_down() noexcept;

  void begin_rule(const Rule& rule);
  void end_rule(const Rule& rule);
  Rule current_rule() const;

  /// The manager's own scheduler for work with no synchronous thread (serial executors):
  /// async phases only, always running. Made on first use.
  Scheduler& background();
  /// The same for jobs, whose async phases wait in priority (deadline) order for a runner.
  Scheduler& job_scheduler();
  /// The job side of the manager. Made on first use; jobs share it, so it outlives the manager
  /// (detached) while jobs of the manager are left.
  detail::Jobs& jobs();
  std::shared_ptr<detail::Jobs> shared_jobs();
  /// The job side if it was made, else null (for the destructor).
  detail::Jobs* made_jobs() const noexcept { return jobs_.get(); }

  JobManager& self_;
  std::shared_ptr<Workers> workers_;
  detail::RuleTable table_;

 private:
  std::shared_ptr<Scheduler> make_background();

  std::once_flag background_once_;
  std::shared_ptr<Scheduler> background_;
  std::once_flag jobs_once_;
  std::shared_ptr<Scheduler> job_scheduler_;
  std::shared_ptr<detail::Jobs> jobs_;
  // The listeners and provider, taken from the job side at shutdown and dropped with this Impl:
  // after the last of our schedulers' tasks, so a listener's destruction tells that the manager
  // is entirely gone, even when one of its own tasks finished destroying it.
  detail::Jobs::Registrations registrations_;
};

}  // namespace tasklet
