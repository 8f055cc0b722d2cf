#include <mutex>
#include <utility>

#include "context.hpp"
#include "domain.hpp"
#include "jobs.hpp"
#include "tasklet/error.hpp"
#include "tasklet/job.hpp"
#include "tasklet/job_group.hpp"

namespace tasklet {

// ---------------------------------------------------------------------------------------------
// Job

Job::Job(std::string name, std::shared_ptr<JobManager> manager)
    : name_(std::move(name)), impl_(std::make_unique<Impl>()) {
  if (!manager) manager = JobManager::global();
  manager_ = manager;
  impl_->jobs = detail::shared_jobs_of(*manager);
}

Job::~Job() = default;

namespace {

// Settings that are fixed while the job is scheduled.
void require_none(const Job& job, const Job::Impl& state, const char* what) {
  if (state.state != JobState::none) {
    throw TaskletActive(std::string(what) + " of job '" + job.name() +
                        "' cannot change while it is scheduled");
  }
}
}  // namespace

void Job::schedule(std::chrono::milliseconds delay) { impl_->jobs->schedule(*this, delay, false); }
bool Job::cancel() { return impl_->jobs->cancel(*this); }
void Job::join() { impl_->jobs->join(*this, std::chrono::milliseconds::max()); }
bool Job::join(std::chrono::milliseconds timeout) { return impl_->jobs->join(*this, timeout); }
bool Job::sleep() { return impl_->jobs->sleep(*this); }
void Job::wake_up(std::chrono::milliseconds delay) { impl_->jobs->wake_up(*this, delay); }
bool Job::yield_rule() { return impl_->jobs->yield_rule(*this); }

JobState Job::state() const {
  std::lock_guard lock(impl_->jobs->mutex);
  return impl_->state;
}

Status Job::result() const {
  std::lock_guard lock(impl_->jobs->mutex);
  return impl_->result;
}

void Job::set_rule(Rule rule) {
  validate_rule(rule);
  std::lock_guard lock(impl_->jobs->mutex);
  require_none(*this, *impl_, "the rule");
  impl_->rule = std::move(rule);
}

Rule Job::rule() const {
  std::lock_guard lock(impl_->jobs->mutex);
  return impl_->rule;
}

void Job::set_priority(Priority priority) {
  std::lock_guard lock(impl_->jobs->mutex);
  impl_->priority = priority;  // a waiting job keeps its place; the next wait uses the new one
}

Priority Job::priority() const {
  std::lock_guard lock(impl_->jobs->mutex);
  return impl_->priority;
}

void Job::set_system(bool system) {
  std::lock_guard lock(impl_->jobs->mutex);
  require_none(*this, *impl_, "the system flag");
  impl_->system = system;
}

bool Job::is_system() const {
  std::lock_guard lock(impl_->jobs->mutex);
  return impl_->system;
}

void Job::set_user(bool user) {
  std::lock_guard lock(impl_->jobs->mutex);
  require_none(*this, *impl_, "the user flag");
  impl_->user = user;
}

bool Job::is_user() const {
  std::lock_guard lock(impl_->jobs->mutex);
  return impl_->user;
}

void Job::set_group(std::shared_ptr<JobGroup> group) {
  std::lock_guard lock(impl_->jobs->mutex);
  require_none(*this, *impl_, "the group");
  impl_->group = std::move(group);
}

std::shared_ptr<JobGroup> Job::group() const {
  std::lock_guard lock(impl_->jobs->mutex);
  return impl_->group;
}

void Job::set_property(const std::string& key, std::any value) {
  std::lock_guard lock(impl_->jobs->mutex);
  if (value.has_value()) {
    impl_->properties[key] = std::move(value);
  } else {
    impl_->properties.erase(key);
  }
}

std::any Job::property(const std::string& key) const {
  std::lock_guard lock(impl_->jobs->mutex);
  auto found = impl_->properties.find(key);
  return found == impl_->properties.end() ? std::any{} : found->second;
}

void Job::add_listener(std::shared_ptr<JobListener> listener) {
  std::lock_guard lock(impl_->jobs->mutex);
  detail::Jobs::add_to(impl_->listeners, std::move(listener));
}

void Job::remove_listener(const std::shared_ptr<JobListener>& listener) {
  impl_->jobs->remove_from(impl_->listeners, listener);
}

bool Job::belongs_to(Family /*family*/) const { return false; }

namespace {
class FunctionJob final : public Job {
 public:
  FunctionJob(std::string name, std::function<Status(ProgressMonitor&)> fn,
              std::shared_ptr<JobManager> manager)
      : Job(std::move(name), std::move(manager)), fn_(std::move(fn)) {}

 protected:
  Status run(ProgressMonitor& monitor) override { return fn_(monitor); }

 private:
  std::function<Status(ProgressMonitor&)> fn_;
};
}  // namespace

std::shared_ptr<Job> make_job(std::string name, std::function<Status(ProgressMonitor&)> fn,
                              std::shared_ptr<JobManager> manager) {
  return std::make_shared<FunctionJob>(std::move(name), std::move(fn), std::move(manager));
}

// ---------------------------------------------------------------------------------------------
// JobGroup

JobGroup::JobGroup(std::string name, int max_threads, int seed_jobs)
    : name_(std::move(name)), max_threads_(max_threads), impl_(std::make_unique<Impl>()) {
  impl_->seeds_expected = seed_jobs;
}

JobGroup::~JobGroup() = default;

JobGroup::State JobGroup::state() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->state;
}

void JobGroup::cancel() {
  std::vector<std::shared_ptr<Job>> jobs = active_jobs();
  if (jobs.empty()) return;
  jobs.front()->impl().jobs->group_cancel(*this);
}

bool JobGroup::join(std::chrono::milliseconds timeout) {
  const auto now = detail::Clock::now();
  const auto deadline =
      timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(detail::Clock::time_point::max() - now)
          ? detail::Clock::time_point::max()
          : now + timeout;
  std::unique_lock lock(impl_->mutex);
  // A job (or another task of ours) joining a group waits without holding its worker; the timer of
  // the manager of one of the group's jobs ends a timed wait.
  std::shared_ptr<detail::Jobs> timer;
  if (!impl_->active.empty()) {
    timer = impl_->active.front()->impl().jobs;
  } else if (Job* current = detail::running_job(); current != nullptr) {
    timer = current->impl().jobs;
  }
  return impl_->changed.wait_until(
      lock, deadline, [this] { return impl_->state == State::none; }, timer.get());
}

std::vector<std::shared_ptr<Job>> JobGroup::active_jobs() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<std::shared_ptr<Job>> jobs = impl_->active;
  return jobs;
}

Status JobGroup::result() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->last_result;
}

bool JobGroup::should_cancel(const Status& /*last_result*/, int failed, int /*canceled*/) {
  return failed > 0;
}

Status JobGroup::compute_group_result(const std::vector<Status>& results) {
  Status combined;
  for (const Status& result : results) {
    if (result.is_ok()) continue;
    combined.children.push_back(result);
    if (result.is_error()) {
      combined.severity = Status::Severity::error;
    } else if (combined.severity == Status::Severity::ok) {
      combined.severity = Status::Severity::cancel;
    }
  }
  if (!combined.is_ok()) {
    combined.message = "group '" + name_ + "': " + std::to_string(combined.children.size()) + " of " +
                       std::to_string(results.size()) + " jobs did not finish ok";
  }
  return combined;
}

// ---------------------------------------------------------------------------------------------
// ProgressMonitor

bool ProgressMonitor::is_canceled() const noexcept {
  return canceled_.load(std::memory_order_acquire) || (parent_ != nullptr && parent_->is_canceled());
}

void ProgressMonitor::set_canceled(bool canceled) noexcept {
  canceled_.store(canceled, std::memory_order_release);
  try {
    on_canceled(canceled);
  } catch (...) {
  }
}

void ProgressMonitor::begin_task(std::string_view name, int total_work) {
  {
    std::lock_guard lock(mutex_);
    task_name_ = std::string(name);
  }
  total_.store(total_work, std::memory_order_relaxed);
  done_work_.store(0, std::memory_order_relaxed);
  on_begin_task(name, total_work);
}

void ProgressMonitor::worked(int work) {
  if (work > 0) add_work(work);
}

void ProgressMonitor::add_work(double work) {
  const int total = total_.load(std::memory_order_relaxed);
  double before = done_work_.load(std::memory_order_relaxed);
  double after = 0;
  do {
    after = before + work;
    if (total >= 0 && after > total) after = total;
  } while (!done_work_.compare_exchange_weak(before, after, std::memory_order_relaxed));
  if (parent_ != nullptr && total > 0) {
    // Report the share of our progress to the parent, in its units (its hooks outside our lock).
    const double share = parent_share_ * (after / total);
    double delta = 0;
    {
      std::lock_guard lock(mutex_);
      delta = share - reported_to_parent_;
      if (delta > 0) reported_to_parent_ = share;
    }
    if (delta > 0) parent_->add_work(delta);
  }
  on_worked(after, total);
}

void ProgressMonitor::subtask(std::string_view name) {
  {
    std::lock_guard lock(mutex_);
    subtask_name_ = std::string(name);
  }
  on_subtask(name);
}

void ProgressMonitor::done() {
  if (finished_.exchange(true)) return;
  const int total = total_.load(std::memory_order_relaxed);
  if (total > 0) add_work(total - done_work_.load(std::memory_order_relaxed));
  if (parent_ != nullptr) {
    double delta = 0;
    {
      std::lock_guard lock(mutex_);
      delta = parent_share_ - reported_to_parent_;
      reported_to_parent_ = parent_share_;
    }
    if (delta > 0) parent_->add_work(delta);
  }
  on_done();
}

std::string ProgressMonitor::task_name() const {
  std::lock_guard lock(mutex_);
  return task_name_;
}

std::string ProgressMonitor::subtask_name() const {
  std::lock_guard lock(mutex_);
  return subtask_name_;
}

std::unique_ptr<ProgressMonitor> ProgressMonitor::split(int work) {
  auto child = std::make_unique<ProgressMonitor>();
  child->parent_ = this;
  child->parent_share_ = work > 0 ? work : 0;
  return child;
}

}  // namespace tasklet
