// Private: what a JobManager owns.
#pragma once

#include <memory>

#include "tasklet/job_manager.hpp"
#include "tasklet/workers.hpp"

namespace tasklet {

struct JobManager::Impl {
  explicit Impl(Options options);

  std::shared_ptr<Workers> workers;
};

}  // namespace tasklet
