// tasklet/detail/library_tasklet.hpp: the library's own tasklets (private, not for users).
#pragma once

#include "tasklet/export.hpp"

#include <exception>
#include <string>

#include "tasklet/tasklet.hpp"

namespace tasklet::detail {

/// A tasklet the library makes for work someone waits for elsewhere (a job's run, a serial
/// executor's task, one of when_all's tasks). When the engine ends it without running its next
/// phase (out of memory, its rule refused by a backend, its manager shutting down while it waits
/// for its rule) it tells the tasklet, which reports it where that work is awaited; the engine then
/// records no failure of its own. Any other tasklet's such end is a failure of its scheduler.
class TASKLET_EXPORT LibraryTasklet : public Tasklet {
 public:
  ~LibraryTasklet() override;
  /// Told once, on one of the workers, before the engine lets go of the tasklet; `why` says why
  /// (std::bad_alloc for lack of memory).
  virtual void abandoned(std::exception_ptr why) noexcept = 0;
  /// Its scheduler was destroyed while it waited for a phase (or was parked): told once, outside
  /// every lock, after the engine let go of it. The work it stands for may end there.
  virtual void dropped() noexcept {}
  /// The name of the job whose run this is (empty for other work), for the trace.
  virtual std::string job_name() const { return {}; }

 protected:
  LibraryTasklet() = default;
};

}  // namespace tasklet::detail
