// tasklet/serial_executor.hpp: a strand. Tasks run one at a time, in the order they were posted, on
// a JobManager's workers.
//
// It is not a second mechanism: every task is a tasklet holding the executor's mutex rule, so the
// rule table orders them (FIFO among conflicting requests) and a job or tasklet that takes rule()
// joins the same serial order. A waiting task holds no thread.
#pragma once

#include "tasklet/export.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <exception>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "tasklet/detail/allocator.hpp"
#include "tasklet/detail/serial_task.hpp"
#include "tasklet/scheduling_rule.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet {

/// What a SerialExecutor runs: callable with no arguments (as an lvalue of its own, decayed type).
template <class F>
concept Runnable = std::invocable < std::decay_t<F>
& > ;

class JobManager;
namespace detail {
class Repeat;
}  // namespace detail

class TASKLET_EXPORT SerialExecutor {
 public:
  using Duration = std::chrono::steady_clock::duration;

  /// Identifies a posted task (or a repeating one), for cancel(). Cheap to copy; does not keep the
  /// task alive.
  class Handle {
   public:
    Handle() = default;

   private:
    friend class SerialExecutor;
    explicit Handle(std::weak_ptr<Tasklet> task) : task_(std::move(task)) {}
    explicit Handle(std::weak_ptr<detail::Repeat> repeat) : repeat_(std::move(repeat)) {}
    std::weak_ptr<Tasklet> task_;
    std::weak_ptr<detail::Repeat> repeat_;
  };

  /// A strand on `manager`'s workers (the global manager when null); `name` names its mutex rule.
  explicit SerialExecutor(std::shared_ptr<JobManager> manager = nullptr, std::string name = {});
  /// A strand whose tasks hold `rule` instead of a mutex of its own: every holder of a conflicting
  /// rule joins its order. With rules::named_mutex on a manager made by tasklet::etcd's
  /// make_job_manager, the strand's order spans every process that uses the name. Throws
  /// InvalidRule naming the rule when it is null or does not conflict with itself (its tasks would
  /// not run one at a time).
  SerialExecutor(std::shared_ptr<JobManager> manager, Rule rule);
  /// Cancels the pending tasks and waits for the running one. Never throws.
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  /// Runs `task()` after every task posted before it has finished, never beside another of this
  /// executor's tasks (nor beside a holder of rule()); delayed tasks join that order only once
  /// they are due. An exception from the task is kept and rethrown by wait(). Thread-safe; waits
  /// only for flow control (as Scheduler::schedule does) while more than 1,024 tasks wait.
  template <Runnable F>
  Handle post(F&& task);

  /// As post(), once `delay` has passed: the task waits on the manager's one timer (the executor
  /// has no thread), then joins the serial order. Tasks due at the same moment run in the order
  /// they were posted. cancel() and cancel_all() remove it at once. Thread-safe; with a delay of
  /// zero or less it is post().
  template <Runnable F>
  Handle post_after(Duration delay, F&& task);

  /// Runs `task()` first once `initial_delay` has passed, then at a fixed rate: the n-th run is due
  /// `initial_delay + n * period` after this call, whatever the runs before it took (a late run
  /// does not move the later ones; runs never overlap, and one due while another runs waits for
  /// it). Repeats until cancel() of the handle, cancel_all(), the executor's destruction, or a run
  /// that throws (its exception is kept for wait()). wait() waits for it to be canceled.
  /// Throws std::invalid_argument for a period that is not positive. Thread-safe; as post() when
  /// the first run is due at once.
  template <Runnable F>
  Handle post_at_fixed_rate(Duration initial_delay, Duration period, F&& task);

  /// As post(), handing back the task's outcome: the future holds what `task()` returned, or the
  /// exception it threw (which wait() then does not rethrow). A task canceled before it ran (by
  /// cancel_all() or the executor's destruction) leaves the future broken: get() throws
  /// std::future_error with std::future_errc::broken_promise. Thread-safe; waits as post() does.
  template <Runnable F>
  std::future<std::invoke_result_t<std::decay_t<F>&>> submit(F&& task);

  /// Removes a task that has not started (waiting for its delay or its turn); it will never run.
  /// False when it has started, finished or was canceled already. For a repeating task: no run
  /// starts from now on (the pending one is removed, a running one finishes); false when it was
  /// over already. Thread-safe.
  bool cancel(const Handle& handle);
  /// Removes every task that has not started, delayed ones included, and ends every repeating task
  /// (as cancel() does); returns how many tasks were removed. Thread-safe.
  std::size_t cancel_all();

  /// Blocks until every task posted so far has finished or been canceled, then rethrows the first
  /// exception a task threw since the last wait(). Must not be called from one of its own tasks.
  /// Called in a job or an async phase, it suspends that oneTBB task instead of blocking the
  /// worker, so the executor's tasks can run even on a single worker. Throws WaitCycle when the
  /// caller holds the executor's rule (begin_rule(rule())) while tasks wait for it.
  void wait();

  /// Tasks posted and not yet finished or canceled (the running one included).
  std::size_t outstanding() const noexcept;

  /// The mutex rule every task holds.
  const Rule& rule() const noexcept;

 private:
  Handle post_task(std::shared_ptr<detail::SerialTask> task, Duration delay = Duration::zero());
  Handle post_repeating(std::shared_ptr<detail::RepeatBody> body, Duration initial_delay, Duration period);

  std::shared_ptr<detail::SerialState> state_;
};

template <Runnable F>
SerialExecutor::Handle SerialExecutor::post(F&& task) {
  using Task = detail::SerialTaskOf<std::decay_t<F>>;
  return post_task(std::allocate_shared<Task>(detail::Allocator<Task>{}, *state_, std::forward<F>(task)));
}

template <Runnable F>
SerialExecutor::Handle SerialExecutor::post_after(Duration delay, F&& task) {
  using Task = detail::SerialTaskOf<std::decay_t<F>>;
  return post_task(std::allocate_shared<Task>(detail::Allocator<Task>{}, *state_, std::forward<F>(task)),
                   delay);
}

template <Runnable F>
SerialExecutor::Handle SerialExecutor::post_at_fixed_rate(Duration initial_delay, Duration period, F&& task) {
  if (period <= Duration::zero())
    throw std::invalid_argument("post_at_fixed_rate: the period must be positive");
  using Body = detail::RepeatBodyOf<std::decay_t<F>>;
  return post_repeating(std::allocate_shared<Body>(detail::Allocator<Body>{}, std::forward<F>(task)),
                        initial_delay, period);
}

template <Runnable F>
std::future<std::invoke_result_t<std::decay_t<F>&>> SerialExecutor::submit(F&& task) {
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
