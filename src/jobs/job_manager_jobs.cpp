// The job side of JobManager: its jobs live in an extension of the manager's domain, made on the
// first use of a job feature.
#include <memory>
#include <utility>

#include "jobs/jobs.hpp"
#include "scheduler/door.hpp"
#include "tasklet/job_manager.hpp"

namespace tasklet::detail {

namespace {

// What a manager keeps for its jobs: their scheduler (a background scheduler whose async phases
// start in deadline order) and their state. The jobs share the
// state, so it outlives the manager (detached) while jobs of the manager are left.
class JobsExtension final : public DomainExtension {
 public:
  explicit JobsExtension(Domain& domain) : scheduler_(domain.make_background()) {
    order_async_phases_by(*scheduler_, &JobTasklet::order_of);
    describe_tasklets_by(*scheduler_, &JobTasklet::describe);
    jobs_ = std::make_shared<Jobs>(*scheduler_);
  }

  const std::shared_ptr<Jobs>& jobs() const noexcept { return jobs_; }

  void stop() noexcept override { jobs_->stop(); }
  void shut_down() noexcept override { jobs_->shutdown(); }
  void let_go() noexcept override {
    scheduler_.reset();
    registrations_ = jobs_->detach();  // dropped with the domain, after its schedulers' last tasks
  }
  bool runs_here() const noexcept override { return jobs_->runs_a_job_here(); }
  void finish_after_this_run(std::shared_ptr<Domain> domain) noexcept override {
    jobs_->destroy_after_this_run(std::move(domain));
  }
  void blocked(const RunState& ctx, const std::string* reason) noexcept override {
    auto& job = *running_job(ctx);
    std::shared_ptr<ProgressMonitor> monitor;
    {
      std::lock_guard lock(job.lock);
      monitor = job.monitor;
    }
    if (!monitor) return;
    try {
      if (reason != nullptr) {
        monitor->set_blocked(*reason);
      } else {
        monitor->clear_blocked();
      }
    } catch (...) {
      // A monitor's hook that throws: the wait goes on all the same.
    }
  }

 private:
  std::shared_ptr<Scheduler> scheduler_;
  std::shared_ptr<Jobs> jobs_;
  Jobs::Registrations registrations_;
};

JobsExtension& extension_of(const JobManager& manager) {
  Domain& owner = domain(manager);
  return owner.extension<JobsExtension>([&] { return std::make_shared<JobsExtension>(owner); });
}

}  // namespace

Jobs& jobs_of(const JobManager& manager) { return *extension_of(manager).jobs(); }

std::shared_ptr<Jobs> shared_jobs_of(const JobManager& manager) { return extension_of(manager).jobs(); }

}  // namespace tasklet::detail

namespace tasklet {

using detail::jobs_of;

std::shared_ptr<Job> JobManager::current_job() const {
  const detail::JobCore* job = detail::running_job();
  return job != nullptr ? job->owned() : nullptr;
}
std::vector<std::shared_ptr<Job>> JobManager::find(Family family) const {
  return jobs_of(*this).find(family);
}
void JobManager::cancel(Family family) { jobs_of(*this).cancel(family); }
bool JobManager::join(Family family, std::chrono::milliseconds timeout) {
  return jobs_of(*this).join(family, timeout);
}
void JobManager::sleep(Family family) { jobs_of(*this).sleep(family); }
void JobManager::wake_up(Family family) { jobs_of(*this).wake_up(family); }
void JobManager::suspend() { jobs_of(*this).suspend(); }
void JobManager::resume() { jobs_of(*this).resume(); }
bool JobManager::is_suspended() const { return jobs_of(*this).is_suspended(); }
bool JobManager::is_idle() const { return jobs_of(*this).is_idle(); }
void JobManager::add_listener(std::shared_ptr<JobListener> listener) {
  jobs_of(*this).add_listener(std::move(listener));
}
void JobManager::remove_listener(const std::shared_ptr<JobListener>& listener) {
  jobs_of(*this).remove_listener(listener);
}
void JobManager::set_progress_provider(ProgressProvider provider) {
  jobs_of(*this).set_progress_provider(std::move(provider));
}

}  // namespace tasklet
