// tasklet/job_group.hpp: jobs that run at most N at a time and finish as one.
#pragma once

#include "tasklet/export.hpp"

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tasklet/status.hpp"

namespace tasklet {

class Job;

class TASKLET_EXPORT JobGroup : public std::enable_shared_from_this<JobGroup> {
 public:
  enum class State { none, active, canceling };

  /// `max_threads` of its jobs run at once (0: no limit). The group stays active until
  /// `seed_jobs` jobs scheduled from outside its own jobs have finished, and its jobs have all ended.
  JobGroup(std::string name, int max_threads = 0, int seed_jobs = 0);
  virtual ~JobGroup();
  JobGroup(const JobGroup&) = delete;
  JobGroup& operator=(const JobGroup&) = delete;

  const std::string& name() const noexcept { return name_; }
  int max_threads() const noexcept { return max_threads_; }
  State state() const;

  /// Cancels every job of the group and refuses new ones until the group is over.
  void cancel();
  /// Waits until the group is over; false when the time ran out. Called from a job, it frees that
  /// job's worker while it waits.
  bool join(std::chrono::milliseconds timeout = std::chrono::milliseconds::max());
  /// Jobs waiting, sleeping or running.
  std::vector<std::shared_ptr<Job>> active_jobs() const;
  /// The combined result of the last complete run of the group.
  Status result() const;

  /// The group's state in the jobs layer (defined inside the library, not for users).
  struct Core;

 protected:
  /// After each job that ends with a non-ok result (but the last): whether to cancel the rest.
  /// Default: any job failed. Called where the job ended (its worker, or the thread that canceled
  /// it), outside the manager's locks. No job of the group is let in until it returns (jobs
  /// scheduled meanwhile wait in the group's queue), so it must not wait for another job of the
  /// group. An exception means "cancel".
  virtual bool should_cancel(const Status& last_result, int failed, int canceled);
  /// The group's result from its jobs' results. Default: error if any failed, else cancel if any
  /// was canceled, else ok; the non-ok results become children.
  virtual Status compute_group_result(const std::vector<Status>& results);

 private:
  std::string name_;
  int max_threads_;
  std::unique_ptr<Core> core_;
};

}  // namespace tasklet
