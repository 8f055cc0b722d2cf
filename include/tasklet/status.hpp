// tasklet/status.hpp: the outcome of a job's run (or of a job group).
#pragma once

#include "tasklet/export.hpp"

#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace tasklet {

/// ok, cancel, or error with a message and the captured exception. A group's status carries the
/// non-ok results of its jobs as children. finish_later is only for a job's run() to return: the
/// run goes on until Job::done() gives its result (Eclipse's ASYNC_FINISH); no job ends with it.
struct TASKLET_EXPORT Status {
  enum class Severity { ok, cancel, error, finish_later };

  Severity severity = Severity::ok;
  std::string message;
  std::exception_ptr exception;  ///< set when the error came from an exception
  std::vector<Status> children;  ///< a group's non-ok job results

  static Status ok() { return {}; }
  static Status cancel(std::string message = "canceled") {
    return Status{Severity::cancel, std::move(message), nullptr, {}};
  }
  static Status error(std::string message, std::exception_ptr exception = nullptr) {
    return Status{Severity::error, std::move(message), std::move(exception), {}};
  }
  /// Returned by a job's run(): the job keeps its rule and stays running until its done() is
  /// called, from any thread.
  static Status finish_later() { return Status{Severity::finish_later, "finishes later", nullptr, {}}; }

  bool is_ok() const noexcept { return severity == Severity::ok; }
  bool is_canceled() const noexcept { return severity == Severity::cancel; }
  bool is_error() const noexcept { return severity == Severity::error; }
  bool finishes_later() const noexcept { return severity == Severity::finish_later; }
};

}  // namespace tasklet
