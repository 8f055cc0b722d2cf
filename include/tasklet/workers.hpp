// tasklet/workers.hpp: the worker threads that run ASYNC phases (a oneTBB arena underneath).
//
// A JobManager owns one Workers; a scheduler uses its manager's unless SchedulerOptions name
// others. The synchronous thread never joins the arena, so the library keeps oneTBB's process-wide
// worker limit at least `concurrency` (it raises it, never lowers it). To run ASYNC phases in an
// arena of your own, see tasklet/tbb.hpp.
#pragma once

#include "tasklet/export.hpp"

#include <memory>

namespace tasklet {

/// A pool of worker threads for ASYNC phases. Thread-safe; shared by the schedulers using it.
class TASKLET_EXPORT Workers {
 public:
  /// A new arena with `concurrency` worker threads (0: the machine's default concurrency).
  static std::shared_ptr<Workers> create(int concurrency = 0);

  virtual ~Workers();
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  /// How many ASYNC phases can run at once.
  int concurrency() const noexcept;

 protected:
  Workers() = default;  // made by create() or adopt_arena() only
};

}  // namespace tasklet
