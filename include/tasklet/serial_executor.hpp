// tasklet/serial_executor.hpp: a strand. Tasks run one at a time, in the order they were posted, on
// a JobManager's workers.
//
// It is not a second mechanism: every task is a tasklet holding the executor's mutex rule, so the
// rule table orders them (FIFO among conflicting requests) and a job or tasklet that takes rule()
// joins the same serial order. A waiting task holds no thread.
#pragma once

#include <cstddef>
#include <exception>
#include <future>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "tasklet/detail/allocator.hpp"
#include "tasklet/scheduling_rule.hpp"
#include "tasklet/tasklet_base.hpp"

namespace tasklet {

class JobManager;
namespace detail {
class SerialTask;
}

class SerialExecutor {
 public:
  /// Identifies a posted task, for cancel(). Cheap to copy; does not keep the task alive.
  class Handle {
   public:
    Handle() = default;

   private:
    friend class SerialExecutor;
    explicit Handle(std::weak_ptr<Tasklet> task) : task_(std::move(task)) {}
    std::weak_ptr<Tasklet> task_;
  };

  /// A strand on `manager`'s workers (the global manager when null); `name` names its mutex rule.
  explicit SerialExecutor(std::shared_ptr<JobManager> manager = nullptr, std::string name = {});
  /// Cancels the pending tasks and waits for the running one. Never throws.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  /// Runs `task()` after every task posted before it has finished, never beside another of this
  /// executor's tasks (nor beside a holder of rule()). Thread-safe; does not block. An exception
  /// from the task is kept and rethrown by wait().
  template <class F>
  requires std::is_invocable_v < std::decay_t<F>
  & > Handle post(F&& task);

  /// As post(), handing back the task's outcome: the future holds what `task()` returned, or the
  /// exception it threw (which wait() then does not rethrow). A task cancelled before it ran (by
  /// cancel_all() or the executor's destruction) leaves the future broken: get() throws
  /// std::future_error with std::future_errc::broken_promise. Thread-safe; does not block.
  template <class F>
  requires std::is_invocable_v < std::decay_t<F>
  & > std::future<std::invoke_result_t<std::decay_t<F>&>> submit(F&& task);

  /// Removes a task that has not started; it will never run. False when it has started, finished
  /// or was cancelled already. Thread-safe.
  bool cancel(const Handle& handle);
  /// Removes every task that has not started; returns how many. Thread-safe.
  std::size_t cancel_all();

  /// Blocks until every task posted so far has finished or been cancelled, then rethrows the first
  /// exception a task threw since the last wait(). Must not be called from one of its own tasks.
  /// Called in a job or an async phase, it suspends that oneTBB task instead of blocking the
  /// worker, so the executor's tasks can run even on a single worker.
  void wait();

  /// Tasks posted and not yet finished or cancelled (the running one included).
  std::size_t outstanding() const noexcept;

  /// The mutex rule every task holds.
  const Rule& rule() const noexcept { return rule_; }

  struct State;

 private:
  Handle post_task(std::shared_ptr<detail::SerialTask> task);

  std::shared_ptr<JobManager> manager_;
  Rule rule_;
  std::shared_ptr<State> state_;
};

namespace detail {

/// One posted task (private): a tasklet holding the executor's rule whose only phase runs the
/// body. Its destruction, whether it ran or was cancelled, counts it out of the executor.
class SerialTask : public Tasklet {
 public:
  explicit SerialTask(SerialExecutor::State& state) noexcept : state_(state) {}
  ~SerialTask() override;
  Directive task() final;
  const SerialExecutor::State* state() const noexcept { return &state_; }
  /// The engine ended the task unrun, out of memory: wait() rethrows the error.
  static void abandon(Tasklet& task, std::exception_ptr error) noexcept;

 private:
  virtual void run_body() = 0;
  // Not owned: the executor's destructor waits until every task of it is destroyed.
  SerialExecutor::State& state_;
};

template <class F>
class SerialTaskOf final : public SerialTask {
 public:
  SerialTaskOf(SerialExecutor::State& state, F fn) : SerialTask(state), fn_(std::move(fn)) {}

 private:
  void run_body() override { fn_(); }
  F fn_;
};

}  // namespace detail

template <class F>
requires std::is_invocable_v < std::decay_t<F>
& > SerialExecutor::Handle SerialExecutor::post(F&& task) {
  using Task = detail::SerialTaskOf<std::decay_t<F>>;
  return post_task(std::allocate_shared<Task>(detail::Allocator<Task>{}, *state_, std::forward<F>(task)));
}

template <class F>
requires std::is_invocable_v < std::decay_t<F>
& > std::future<std::invoke_result_t<std::decay_t<F>&>> SerialExecutor::submit(F&& task) {
  using Result = std::invoke_result_t<std::decay_t<F>&>;
  std::promise<Result> promise;
  std::future<Result> future = promise.get_future();
  post([fn = std::decay_t<F>(std::forward<F>(task)), promise = std::move(promise)]() mutable {
    try {
      if constexpr (std::is_void_v<Result>) {
        fn();
        promise.set_value();
      } else {
        promise.set_value(fn());
      }
    } catch (...) {
      promise.set_exception(std::current_exception());
    }
  });
  return future;
}

}  // namespace tasklet
