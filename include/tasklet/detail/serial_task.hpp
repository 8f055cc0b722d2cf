// tasklet/detail/serial_task.hpp: what a SerialExecutor posts (private, not for users). Here only
// because post() and its kin are templates.
#pragma once

#include "tasklet/export.hpp"

#include <exception>
#include <utility>

#include "tasklet/detail/library_tasklet.hpp"
#include "tasklet/directive.hpp"

namespace tasklet::detail {

/// A serial executor's state: its manager, its rule, its count of tasks and their first error.
/// Defined in the library; it outlives every task, as the executor's destructor waits for them.
class SerialState;

/// One posted task: a tasklet holding the executor's rule whose only phase runs the body. Its
/// destruction, whether it ran or was canceled, counts it out of the executor.
class TASKLET_EXPORT SerialTask : public LibraryTasklet {
 public:
  explicit SerialTask(SerialState& state) noexcept : state_(state) {}
  ~SerialTask() override;
  Directive task() final;
  const SerialState* state() const noexcept { return &state_; }
  /// The engine ended the task unrun, out of memory: wait() rethrows the error.
  void abandoned(std::exception_ptr error) noexcept override;

 private:
  virtual void run_body() = 0;
  SerialState& state_;  // not owned (see SerialState)
};

template <class F>
class SerialTaskOf final : public SerialTask {
 public:
  SerialTaskOf(SerialState& state, F fn) : SerialTask(state), fn_(std::move(fn)) {}

 private:
  void run_body() override { fn_(); }
  F fn_;
};

/// The body of a task posted at a fixed rate: each run is a SerialTask of its own.
class TASKLET_EXPORT RepeatBody {
 public:
  virtual ~RepeatBody() = default;
  virtual void run() = 0;
};

template <class F>
class RepeatBodyOf final : public RepeatBody {
 public:
  explicit RepeatBodyOf(F fn) : fn_(std::move(fn)) {}
  void run() override { fn_(); }

 private:
  F fn_;
};

}  // namespace tasklet::detail
