#include <string>
#include <utility>

#include "context.hpp"
#include "job_manager_impl.hpp"
#include "jobs.hpp"
#include "scheduler_impl.hpp"
#include "tasklet/error.hpp"

namespace tasklet {

namespace detail {

namespace {

// The thread's idle request, parked in a table or out of every table. At thread exit a parked one
// is handed to its table (which may be gone by then only if it revoked the request first).
struct SpareHold {
  ThreadHold* hold = nullptr;
  ~SpareHold() {
    if (hold != nullptr && !RuleTable::orphan(*hold)) delete hold;
  }
};
thread_local SpareHold spare;

}  // namespace

ThreadHold* ThreadHold::resume(const Rule& rule, RuleTable& table) noexcept {
  ThreadHold* hold = spare.hold;
  // Requests submitted before (by this thread, perhaps) come first: they go through the lock.
  if (hold == nullptr || hold->parked_in_ != &table || !hold->is_for(rule) || table.has_submitted())
    return nullptr;
  hold->parked_in_ = nullptr;
  if (!RuleTable::resume(*hold)) return nullptr;  // revoked: out of the table, still the spare
  spare.hold = nullptr;
  return hold;
}

ThreadHold* ThreadHold::make(const Rule& rule, RuleTable& table) {
  ThreadHold* hold = std::exchange(spare.hold, nullptr);
  if (hold != nullptr && hold->parked_in_ != nullptr) {
    if (hold->parked_in_ == &table) {
      table.unpark(*hold);
    } else if (RuleTable::orphan(*hold)) {
      hold = nullptr;  // its own table deletes it when it takes it out
    }
    if (hold != nullptr) hold->parked_in_ = nullptr;
  }
  if (hold == nullptr) hold = new ThreadHold;
  const bool same = hold->is_for(rule);
  if (!same) hold->last_rule_ = rule;
  hold->cache_.same_rule = same;
  hold->set_rule(rule.get());
  hold->wakeup_.reset();
  hold->granted_ = false;
  return hold;
}

void ThreadHold::finish(ThreadHold* hold, RuleTable& table) {
  if (spare.hold == nullptr && RuleTable::park(*hold)) {
    hold->parked_in_ = &table;
    spare.hold = hold;
    return;
  }
  table.release(*hold);
  recycle(hold);
}

void ThreadHold::recycle(ThreadHold* hold) noexcept {
  if (spare.hold != nullptr) {
    delete hold;
  } else {
    spare.hold = hold;
  }
}

bool ThreadHold::wait() {
  wakeup_.wait();
  return granted_;
}

void ThreadHold::wake(bool granted) noexcept {
  granted_ = granted;
  wakeup_.wake();  // the waiter may be gone once this returns: touch nothing
}

// Ends the frames a phase left open, innermost first; returns their names for the report.
std::string end_frames_above(TaskState& ctx, std::size_t base) noexcept {
  std::string names;
  while (ctx.rule_stack.size() > base) {
    RuleFrame frame = std::move(ctx.rule_stack.back());
    ctx.rule_stack.pop_back();
    if (!names.empty()) names += ", ";
    names += describe(frame.rule);
    if (frame.hold != nullptr) {
      frame.manager->table_.release(*frame.hold);
      ThreadHold::recycle(frame.hold);
    }
  }
  return names;
}

}  // namespace detail

using detail::context;

JobManager::Impl::Impl(JobManager& self, Options options)
    : self_(self),
      workers_(options.workers ? std::move(options.workers) : Workers::create(options.concurrency)) {}

JobManager::Impl::~Impl() = default;

void JobManager::Impl::shut_down() noexcept {
  // Jobs that have not started are canceled and running ones waited for; then every other waiting
  // request is cancelled (tasklets end unrun, threads are told); running background work is
  // waited for by the background schedulers' destructors (the job scheduler's also lets the last
  // runners deliver their done events), or, when one of their own tasks lets them go, by the task
  // that finishes their destruction, which keeps us (and so the rule table) alive until then. The
  // job side outlives us while jobs refer to it: detached. Its listeners go with us (~Impl).
  if (jobs_) jobs_->shutdown();
  table_.cancel_all_waiting();
  job_scheduler_.reset();
  background_.reset();
  if (jobs_) registrations_ = jobs_->detach();
  jobs_.reset();
}

std::shared_ptr<Scheduler> JobManager::Impl::make_background() {
  // The manager owns its background schedulers, so they must not own the manager back: an
  // aliasing pointer that owns this Impl (shut_down lets the schedulers go, breaking the cycle),
  // so the rule table outlives the schedulers' last tasks.
  std::shared_ptr<JobManager> unowned(shared_from_this(), &self_);
  auto scheduler = Scheduler::create(SchedulerOptions{std::move(unowned), workers_, 0});
  scheduler->impl().make_background();
  return scheduler;
}

Scheduler& JobManager::Impl::background() {
  std::call_once(background_once_, [this] { background_ = make_background(); });
  return *background_;
}

Scheduler& JobManager::Impl::job_scheduler() {
  jobs();
  return *job_scheduler_;
}

detail::Jobs& JobManager::Impl::jobs() {
  std::call_once(jobs_once_, [this] {
    job_scheduler_ = make_background();
    job_scheduler_->impl().order_async_phases_by(&detail::JobTasklet::deadline_of, workers_->concurrency());
    jobs_ = std::make_shared<detail::Jobs>(*job_scheduler_);
  });
  return *jobs_;
}

std::shared_ptr<detail::Jobs> JobManager::Impl::shared_jobs() {
  jobs();
  return jobs_;
}

void JobManager::Impl::begin_rule(const Rule& rule) {
  auto& ctx = detail::state();
  ctx.rule_stack.push_back(detail::RuleFrame{rule, this, nullptr});
  if (!rule) return;

  // The outermost rule in force: the running phase's tasklet rule, else the first non-null frame.
  const Rule* outer = nullptr;
  JobManager::Impl* outer_manager = nullptr;
  if (ctx.phase_rule != nullptr && *ctx.phase_rule) {
    outer = ctx.phase_rule;
    outer_manager = ctx.phase_manager;
  } else {
    for (std::size_t i = 0; i + 1 < ctx.rule_stack.size(); ++i) {
      if (ctx.rule_stack[i].rule) {
        outer = &ctx.rule_stack[i].rule;
        outer_manager = ctx.rule_stack[i].manager;
        break;
      }
    }
  }
  if (outer != nullptr) {
    if (outer_manager != this) {
      throw IllegalState("begin_rule(" + describe(rule) + "): this thread holds " + describe(*outer) +
                         " from another job manager; rules nest only within one manager");
    }
    if (!(*outer)->contains(*rule)) {
      throw RuleNotContained("begin_rule(" + describe(rule) + ") does not match the outer scope rule " +
                             describe(*outer) +
                             " held by this thread: a nested rule must be contained by it");
    }
    return;
  }
  Scheduler::Impl::enter_pending_rules(ctx);  // what this thread started before comes first
  if (detail::ThreadHold* parked = detail::ThreadHold::resume(rule, table_)) {
    ctx.rule_stack.back().hold = parked;  // validated when it was first acquired
    return;
  }
  validate_rule(rule);
  detail::ThreadHold* hold = detail::ThreadHold::make(rule, table_);
  ctx.rule_stack.back().hold = hold;
  if (!hold->acquire(table_, true) && !hold->wait()) {
    ctx.rule_stack.back().hold = nullptr;
    detail::ThreadHold::recycle(hold);
    throw IllegalState("begin_rule(" + describe(rule) + "): the job manager shut down while waiting");
  }
}

void JobManager::Impl::end_rule(const Rule& rule) {
  auto& ctx = detail::state();
  if (ctx.rule_stack.size() <= ctx.phase_base) {
    throw RuleMismatch("end_rule(" + describe(rule) + ") without a matching begin_rule on this thread" +
                       (ctx.phase_of != nullptr ? " in this phase" : ""));
  }
  detail::RuleFrame& top = ctx.rule_stack.back();
  if (top.rule.get() != rule.get() || top.manager != this) {
    throw RuleMismatch("end_rule(" + describe(rule) + ") does not match the most recent begin_rule(" +
                       describe(top.rule) + ") on this thread");
  }
  detail::ThreadHold* hold = top.hold;
  if (hold == nullptr) {
    ctx.rule_stack.pop_back();
    return;
  }
  const Rule held = std::move(top.rule);  // alive until the table is done with the request
  ctx.rule_stack.pop_back();
  detail::ThreadHold::finish(hold, table_);
}

Rule JobManager::Impl::current_rule() const {
  const auto& ctx = detail::state();
  const auto innermost_from = [&](std::size_t begin, std::size_t end) -> Rule {
    for (std::size_t i = end; i > begin; --i) {
      const detail::RuleFrame& frame = ctx.rule_stack[i - 1];
      if (frame.rule && frame.manager == this) return frame.rule;
    }
    return nullptr;
  };
  const std::size_t base = std::min(ctx.phase_base, ctx.rule_stack.size());
  if (Rule rule = innermost_from(base, ctx.rule_stack.size())) return rule;
  if (ctx.phase_rule != nullptr && *ctx.phase_rule && ctx.phase_manager == this) return *ctx.phase_rule;
  return innermost_from(0, base);
}

JobManager::JobManager(Key, Options options) : impl_(std::make_shared<Impl>(*this, std::move(options))) {}

JobManager::~JobManager() {
  detail::Jobs* jobs = impl_->made_jobs();
  if (jobs != nullptr && jobs->runs_a_job_here()) {
    // Dropped inside the run() of one of its own jobs, which the destructor would wait for: the
    // job's runner finishes destroying it once that run is over.
    jobs->destroy_after_this_run(std::move(impl_));
    return;
  }
  impl_->shut_down();
}

std::shared_ptr<JobManager> JobManager::create(Options options) {
  return std::make_shared<JobManager>(Key{}, std::move(options));
}

const std::shared_ptr<JobManager>& JobManager::global() {
  // Never destroyed: schedulers and jobs may outlive static destruction order.
  static const auto* manager = new std::shared_ptr<JobManager>(create());
  return *manager;
}

void JobManager::begin_rule(const Rule& rule) { impl_->begin_rule(rule); }

std::shared_ptr<Job> JobManager::current_job() const {
  Job* job = detail::state().job;
  return job != nullptr ? job->shared_from_this() : nullptr;
}
std::vector<std::shared_ptr<Job>> JobManager::find(Family family) const { return impl_->jobs().find(family); }
void JobManager::cancel(Family family) { impl_->jobs().cancel(family); }
bool JobManager::join(Family family, std::chrono::milliseconds timeout) {
  return impl_->jobs().join(family, timeout);
}
void JobManager::sleep(Family family) { impl_->jobs().sleep(family); }
void JobManager::wake_up(Family family) { impl_->jobs().wake_up(family); }
void JobManager::suspend() { impl_->jobs().suspend(); }
void JobManager::resume() { impl_->jobs().resume(); }
bool JobManager::is_suspended() const { return impl_->jobs().is_suspended(); }
bool JobManager::is_idle() const { return impl_->jobs().is_idle(); }
void JobManager::add_listener(std::shared_ptr<JobListener> listener) {
  impl_->jobs().add_listener(std::move(listener));
}
void JobManager::remove_listener(const std::shared_ptr<JobListener>& listener) {
  impl_->jobs().remove_listener(listener);
}
void JobManager::set_progress_provider(ProgressProvider provider) {
  impl_->jobs().set_progress_provider(std::move(provider));
}
void JobManager::end_rule(const Rule& rule) { impl_->end_rule(rule); }
Rule JobManager::current_rule() const { return impl_->current_rule(); }

JobManager::RuleStats JobManager::rule_stats() const {
  return RuleStats{impl_->table_.held_count(), impl_->table_.waiting_count()};
}

const std::shared_ptr<Workers>& JobManager::workers() const noexcept { return impl_->workers_; }

RuleScope::RuleScope(JobManager& manager, Rule rule) : manager_(manager), rule_(std::move(rule)) {
  try {
    manager_.begin_rule(rule_);
  } catch (...) {
    manager_.end_rule(rule_);
    throw;
  }
}

RuleScope::~RuleScope() {
  try {
    manager_.end_rule(rule_);
  } catch (...) {
    // Only a scope ended out of order by hand can get here; destructors never throw.
  }
}

}  // namespace tasklet
