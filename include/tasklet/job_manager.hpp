// tasklet/job_manager.hpp: owns the workers and the rule table that schedulers and jobs share.
//
// A process-wide default (global()) plus instances of your own. Every scheduler belongs to one
// manager; its tasklets' rules and its threads' begin_rule calls go through that manager's rule
// table.
#pragma once

#include <memory>

namespace tasklet {

class Workers;

class JobManager {
 public:
  struct Options {
    /// Worker threads for ASYNC phases and jobs (0: the machine's default concurrency).
    int concurrency = 0;
    /// Use these workers instead of creating a pool.
    std::shared_ptr<Workers> workers;
  };

  /// A new manager. Thread-safe.
  static std::shared_ptr<JobManager> create(Options options);
  static std::shared_ptr<JobManager> create() { return create(Options{}); }
  /// The process-wide manager, made on first use and never destroyed. Thread-safe.
  static const std::shared_ptr<JobManager>& global();

  ~JobManager();
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  /// The workers ASYNC phases of this manager's schedulers use by default.
  const std::shared_ptr<Workers>& workers() const noexcept;

  struct Impl;
  Impl& impl() noexcept { return *impl_; }

 private:
  struct Key {};

 public:
  JobManager(Key, Options options);  // use create()

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tasklet
