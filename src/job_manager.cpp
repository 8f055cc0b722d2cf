#include "job_manager_impl.hpp"

namespace tasklet {

JobManager::Impl::Impl(Options options)
    : workers(options.workers ? std::move(options.workers) : Workers::create(options.concurrency)) {}

JobManager::JobManager(Key, Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}

JobManager::~JobManager() = default;

std::shared_ptr<JobManager> JobManager::create(Options options) {
  return std::make_shared<JobManager>(Key{}, std::move(options));
}

const std::shared_ptr<JobManager>& JobManager::global() {
  // Never destroyed: schedulers and jobs may outlive static destruction order.
  static const auto* manager = new std::shared_ptr<JobManager>(create());
  return *manager;
}

const std::shared_ptr<Workers>& JobManager::workers() const noexcept { return impl_->workers; }

}  // namespace tasklet
