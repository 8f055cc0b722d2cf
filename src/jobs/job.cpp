// Job's and JobGroup's public methods: each reaches the job's core (src/jobs/job_core.hpp) and
// hands the work to the manager's job side (Jobs).
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "jobs/job_core.hpp"
#include "jobs/jobs.hpp"
#include "tasklet/coroutine.hpp"
#include "tasklet/detail/allocator.hpp"
#include "tasklet/error.hpp"
#include "tasklet/job.hpp"
#include "tasklet/job_group.hpp"

namespace tasklet {

// From the scalable allocator, as make_job's jobs: a job made by the posting thread is mostly freed
// by a worker, and glibc's allocator gives such frees back to the allocating thread's arena under
// its lock.
struct Job::Core final : detail::JobCore, detail::PooledObject {
  using JobCore::JobCore;
  static void drop_steps(Job& job) noexcept;  // defined with Job::Coroutine
  // A nested class of Job: it reaches the protected hooks.
  static constexpr detail::JobHooks hooks_table{
      [](Job& job, ProgressMonitor& monitor) { return job.run(monitor); },
      [](Job& job) { return job.should_schedule(); },
      [](Job& job) { return job.should_run(); },
      [](Job& job) { job.canceling(); },
      &drop_steps,
  };
};

struct JobGroup::Core final : detail::GroupCore {
  using GroupCore::GroupCore;
  static GroupCore& of(JobGroup& group) noexcept { return *group.core_; }
};

namespace detail {

const JobHooks& job_hooks() noexcept { return Job::Core::hooks_table; }

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Job

Job::Job(std::string name, std::shared_ptr<JobManager> manager) : name_(std::move(name)) {
  if (!manager) manager = JobManager::global();
  manager_ = manager;
  core_ = std::make_unique<Core>(*this, detail::shared_jobs_of(*manager));
}

Job::Job(std::string name, const std::shared_ptr<JobManager>& manager, Core& placed) noexcept
    : name_(std::move(name)), manager_(manager) {
  core_.reset(&placed);  // constructed by the derived class, right after this
}

Job::~Job() = default;

// make_job's jobs: the job, its callable and its core in one block, so that making and scheduling
// a job touches one allocation (the core of a user's own Job subclass is a block of its own).
class Job::Function final : public Job {
 public:
  Function(std::string name, std::function<Status(ProgressMonitor&)> fn,
           const std::shared_ptr<JobManager>& manager, std::shared_ptr<detail::Jobs> jobs) noexcept
      : Job(std::move(name), manager, placed_core_),
        placed_core_(*this, std::move(jobs)),
        fn_(std::move(fn)) {}
  ~Function() override { static_cast<void>(core_.release()); }  // a member: destroyed after this

 protected:
  Status run(ProgressMonitor& monitor) override { return fn_(monitor); }

 private:
  Core placed_core_;
  std::function<Status(ProgressMonitor&)> fn_;
};

// make_job's jobs whose run is a coroutine (tasklet/coroutine.hpp): the run is a JobRun whose
// phases resume the coroutine, one step each, so a run that awaits (a rule, a job, a Rescheduler)
// holds no worker meanwhile.
// The job, its coroutine's maker and its core in one block, as make_job's Function jobs.
class Job::Coroutine final : public Job {
 public:
  Coroutine(std::string name, const detail::CoroutineMaker& maker, void* callable,
            const std::shared_ptr<JobManager>& manager, std::shared_ptr<detail::Jobs> jobs)
      : Job(std::move(name), manager, placed_core_), placed_core_(*this, std::move(jobs)), maker_(maker) {
    try {
      maker_.construct(room_, callable);
    } catch (...) {
      static_cast<void>(core_.release());  // a member: unwound after this
      throw;
    }
  }
  ~Coroutine() override {
    steps_.reset();  // a run's coroutine left suspended (its run ended with an error, or never went on)
    maker_.destroy(room_);
    static_cast<void>(core_.release());  // a member: destroyed after this
  }

 protected:
  // Called in each phase of the run: the first starts the coroutine, the others resume it.
  Status run(ProgressMonitor& monitor) override {
    if (!steps_)
      steps_ = detail::TaskSteps<Status>(maker_.make(room_, monitor), *detail::run_state().tasklet, {});
    const Directive next = steps_.step();
    if (next != Directive::done) {
      detail::JobRun::go_on_in(next);
      return Status::ok();  // not the result: the run goes on
    }
    const detail::TaskSteps<Status> ended = std::move(steps_);  // the frame goes with this scope
    if (ended.error()) std::rethrow_exception(ended.error());
    return std::move(ended.value());
  }

 public:
  // Only a coroutine job's run goes on over several phases (detail::JobRun::go_on_in).
  static void drop_steps(Job& job) noexcept { static_cast<Coroutine&>(job).steps_.reset(); }

 private:
  Core placed_core_;
  const detail::CoroutineMaker& maker_;
  alignas(void*) unsigned char room_[detail::CoroutineMaker::room];  // the callable, or its address
  detail::TaskSteps<Status> steps_;  // the running coroutine, between the phases of its run
};

void Job::Core::drop_steps(Job& job) noexcept { Coroutine::drop_steps(job); }

std::shared_ptr<Job> detail::make_coroutine_job(std::string name, const CoroutineMaker& maker, void* callable,
                                                std::shared_ptr<JobManager> manager) {
  static_assert(sizeof(Job::Coroutine) <= sizeof(Job::Function), "a coroutine job outgrew make_job's block");
  if (!manager) manager = JobManager::global();
  auto jobs = detail::shared_jobs_of(*manager);
  return std::allocate_shared<Job::Coroutine>(detail::Allocator<Job::Coroutine>{}, std::move(name), maker,
                                              callable, manager, std::move(jobs));
}

namespace {

// Settings that are fixed while the job is scheduled (under the job's lock).
void require_none(const Job& job, const detail::JobCore& core, const char* what) {
  if (core.state() != JobState::none) {
    throw TaskletActive(std::string(what) + " of job '" + job.name() +
                        "' cannot change while it is scheduled");
  }
}

}  // namespace

void Job::schedule(std::chrono::milliseconds delay) { core_->jobs().schedule(*core_, delay, false); }
bool Job::cancel() { return core_->jobs().cancel(*core_); }
void Job::join() { core_->jobs().join(*core_, std::chrono::milliseconds::max()); }
bool Job::join(std::chrono::milliseconds timeout) { return core_->jobs().join(*core_, timeout); }
bool Job::sleep() { return core_->jobs().sleep(*core_); }
void Job::wake_up(std::chrono::milliseconds delay) { core_->jobs().wake_up(*core_, delay); }
bool Job::yield_rule() { return core_->jobs().yield_rule(*core_); }
std::vector<RuleBlocker> Job::blockers() const { return core_->jobs().blockers(*core_); }
bool Job::is_blocking() const { return core_->jobs().is_blocking(*core_); }
void Job::done(Status result) { core_->jobs().done(*core_, std::move(result)); }

JobState Job::state() const { return core_->state(); }

Status Job::result() const {
  std::lock_guard lock(core_->lock);
  return core_->result ? *core_->result : Status::ok();
}

void Job::set_name(std::string name) {
  std::lock_guard lock(core_->lock);
  require_none(*this, *core_, "the name");
  name_ = std::move(name);
}

void Job::set_rule(Rule rule) {
  validate_rule(rule);
  std::lock_guard lock(core_->lock);
  require_none(*this, *core_, "the rule");
  core_->rule = std::move(rule);
}

Rule Job::rule() const {
  std::lock_guard lock(core_->lock);
  return core_->rule;
}

void Job::set_priority(Priority priority) {
  std::lock_guard lock(core_->lock);
  core_->priority = priority;  // a waiting job keeps its place; the next wait uses the new one
}

Priority Job::priority() const {
  std::lock_guard lock(core_->lock);
  return core_->priority;
}

void Job::set_system(bool system) {
  std::lock_guard lock(core_->lock);
  require_none(*this, *core_, "the system flag");
  core_->system = system;
}

bool Job::is_system() const {
  std::lock_guard lock(core_->lock);
  return core_->system;
}

void Job::set_user(bool user) {
  std::lock_guard lock(core_->lock);
  require_none(*this, *core_, "the user flag");
  core_->user = user;
}

bool Job::is_user() const {
  std::lock_guard lock(core_->lock);
  return core_->user;
}

void Job::set_group(std::shared_ptr<JobGroup> group) {
  // Under the manager's job lock too: a run's end leaves its group under that lock after the job
  // is in state none, and must find the group it was in.
  std::lock_guard manager_lock(core_->jobs().mutex);
  std::lock_guard lock(core_->lock);
  require_none(*this, *core_, "the group");
  if (group == nullptr && core_->made_extras() == nullptr) return;
  detail::JobExtras& extras = core_->extras();
  core_->group_core_.store(group ? &JobGroup::Core::of(*group) : nullptr, std::memory_order_release);
  extras.group = std::move(group);
}

std::shared_ptr<JobGroup> Job::group() const {
  std::lock_guard lock(core_->jobs().mutex);
  const detail::JobExtras* extras = core_->made_extras();
  return extras != nullptr ? extras->group : nullptr;
}

void Job::set_progress_group(std::shared_ptr<ProgressMonitor> group, int work) {
  if (work < 0) throw std::invalid_argument("set_progress_group(" + name() + "): negative work");
  std::lock_guard manager_lock(core_->jobs().mutex);
  std::lock_guard lock(core_->lock);
  require_none(*this, *core_, "the progress group");
  if (group == nullptr && core_->made_extras() == nullptr) return;
  detail::JobExtras& extras = core_->extras();
  core_->reports_to_group = group != nullptr;
  extras.progress_group = std::move(group);
  extras.progress_work = work;
}

std::shared_ptr<ProgressMonitor> Job::progress_group() const {
  std::lock_guard lock(core_->jobs().mutex);
  const detail::JobExtras* extras = core_->made_extras();
  return extras != nullptr ? extras->progress_group : nullptr;
}

void Job::set_sync_scheduler(const std::shared_ptr<Scheduler>& scheduler) {
  std::lock_guard manager_lock(core_->jobs().mutex);
  if (scheduler != nullptr) core_->jobs().check_sync_scheduler(*scheduler, *this);
  std::lock_guard lock(core_->lock);
  require_none(*this, *core_, "the sync scheduler");
  if (scheduler == nullptr && core_->made_extras() == nullptr) return;
  core_->extras().sync_scheduler = scheduler;
  if (scheduler != nullptr) {
    core_->change(JobState::none, detail::job_word::sync_thread);
  } else {
    core_->change(JobState::none, 0, detail::job_word::sync_thread);
  }
}

std::shared_ptr<Scheduler> Job::sync_scheduler() const {
  std::lock_guard lock(core_->jobs().mutex);
  const detail::JobExtras* extras = core_->made_extras();
  return extras != nullptr ? extras->sync_scheduler.lock() : nullptr;
}

void Job::set_property(const std::string& key, std::any value) {
  std::lock_guard lock(core_->jobs().mutex);
  auto& properties = core_->extras().properties;
  if (value.has_value()) {
    properties[key] = std::move(value);
  } else {
    properties.erase(key);
  }
}

std::any Job::property(const std::string& key) const {
  std::lock_guard lock(core_->jobs().mutex);
  const detail::JobExtras* extras = core_->made_extras();
  if (extras == nullptr) return {};
  const auto found = extras->properties.find(key);
  return found == extras->properties.end() ? std::any{} : found->second;
}

void Job::add_listener(std::shared_ptr<JobListener> listener) {
  core_->jobs().add_listener(*core_, std::move(listener));
}

void Job::remove_listener(const std::shared_ptr<JobListener>& listener) {
  core_->jobs().remove_listener(*core_, listener);
}

bool Job::belongs_to(Family /*family*/) const { return false; }

std::shared_ptr<Job> make_job(std::string name, std::function<Status(ProgressMonitor&)> fn,
                              std::shared_ptr<JobManager> manager) {
  // With std::allocate_shared's counts, one block of the pool's 384-byte class: a queued job (with
  // the request it waits with in the rule table) stays within DESIGN section 5's 512 bytes. That
  // is with libstdc++'s 32-byte std::function; the job's own part is checked on every library
  // (libc++'s std::function is 48 bytes, 16-aligned: there the block is one class up).
  using Callable = std::function<Status(ProgressMonitor&)>;
  static_assert(sizeof(Job::Function) - sizeof(Callable) <= 384 - 16 - 32,
                "make_job's block outgrew its size class");
  if (!manager) manager = JobManager::global();
  std::shared_ptr<detail::Jobs> jobs = detail::shared_jobs_of(*manager);
  return std::allocate_shared<Job::Function>(detail::Allocator<Job::Function>{}, std::move(name),
                                             std::move(fn), manager, std::move(jobs));
}

// ---------------------------------------------------------------------------------------------
// JobGroup

JobGroup::JobGroup(std::string name, int max_threads, int seed_jobs)
    : name_(std::move(name)), max_threads_(max_threads) {
  static constexpr detail::GroupHooks hooks{
      [](JobGroup& group, const Status& last, int failed, int canceled) {
        return group.should_cancel(last, failed, canceled);
      },
      [](JobGroup& group, const std::vector<Status>& results) { return group.compute_group_result(results); },
  };
  core_ = std::make_unique<Core>(*this, hooks, seed_jobs);
}

JobGroup::~JobGroup() = default;

JobGroup::State JobGroup::state() const {
  std::lock_guard lock(core_->mutex);
  return core_->state;
}

void JobGroup::cancel() {
  detail::JobCore* any = nullptr;
  {
    std::lock_guard lock(core_->mutex);
    if (!core_->active.empty()) any = core_->active.front();
  }
  if (any != nullptr) any->jobs().group_cancel(*core_);
}

bool JobGroup::join(std::chrono::milliseconds timeout) {
  const auto now = detail::Clock::now();
  const auto deadline =
      timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(detail::Clock::time_point::max() - now)
          ? detail::Clock::time_point::max()
          : now + timeout;
  std::unique_lock lock(core_->mutex);
  // A job (or another task of ours) joining a group waits without holding its worker; the timer of
  // the manager of one of the group's jobs ends a timed wait.
  std::shared_ptr<detail::Jobs> jobs;
  if (!core_->active.empty()) {
    jobs = core_->active.front()->shared_jobs();
  } else if (const detail::JobCore* current = detail::running_job(); current != nullptr) {
    jobs = current->shared_jobs();
  }
  return core_->changed.wait_until(
      lock, deadline, [this] { return core_->state == State::none; }, jobs ? jobs->timer() : nullptr);
}

std::vector<std::shared_ptr<Job>> JobGroup::active_jobs() const {
  std::lock_guard lock(core_->mutex);
  std::vector<std::shared_ptr<Job>> jobs;
  jobs.reserve(core_->active.size());
  for (const detail::JobCore* job : core_->active) jobs.push_back(job->owned());
  return jobs;
}

Status JobGroup::result() const {
  std::lock_guard lock(core_->mutex);
  return core_->last_result;
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

}  // namespace tasklet
