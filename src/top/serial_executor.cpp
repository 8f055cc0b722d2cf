#include "tasklet/serial_executor.hpp"

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "domain.hpp"
#include "scheduler_impl.hpp"
#include "task_condition.hpp"
#include "tasklet/directive.hpp"
#include "tasklet/error.hpp"
#include "tasklet/rules/rules.hpp"
#include "tasklet/tasklet_base.hpp"
#include "tasklet_state.hpp"

namespace tasklet {

// The state outlives every task: the executor's destructor waits until each has been destroyed.
struct SerialExecutor::State {
  // Tasks posted and not yet destroyed; only a count that may bring it to zero takes the mutex,
  // to wake wait() and the destructor.
  std::atomic<std::size_t> outstanding{0};
  mutable std::mutex mutex;  // guards first_error and the wake-up of `idle`
  // A wait() in a job or an async phase suspends its oneTBB task instead of blocking the worker
  // that the executor's own tasks may need (with one worker, blocking it would deadlock).
  detail::TaskCondition idle;
  std::exception_ptr first_error;

  bool is_idle() const noexcept { return outstanding.load(std::memory_order_acquire) == 0; }
  // Perhaps the last: under the mutex, so that a waiter (the executor's destructor, which then
  // frees the state) sees zero only once this thread is done with the state.
  void count_out() noexcept {
    std::size_t left = outstanding.load(std::memory_order_relaxed);
    while (left > 1 && !outstanding.compare_exchange_weak(left, left - 1, std::memory_order_acq_rel,
                                                          std::memory_order_relaxed)) {
    }
    if (left > 1) return;
    std::lock_guard lock(mutex);
    if (outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) idle.notify_all();
  }
};

namespace detail {

SerialTask::~SerialTask() { state_.count_out(); }

Directive SerialTask::task() {
  try {
    run_body();
  } catch (...) {
    std::lock_guard lock(state_.mutex);
    if (!state_.first_error) state_.first_error = std::current_exception();
  }
  return Directive::done;
}

// The manager's background scheduler runs serial tasks only.
void SerialTask::abandon(Tasklet& task, std::exception_ptr error) noexcept {
  SerialExecutor::State& shared = static_cast<SerialTask&>(task).state_;
  std::lock_guard lock(shared.mutex);
  if (!shared.first_error) shared.first_error = std::move(error);
}

}  // namespace detail

namespace {
detail::SchedulerImpl& background_of(JobManager& manager) {
  return detail::impl(detail::domain(manager).background());
}
}  // namespace

SerialExecutor::SerialExecutor(std::shared_ptr<JobManager> manager, std::string name)
    : manager_(manager ? std::move(manager) : JobManager::global()),
      rule_(rules::mutex(name.empty() ? "serial executor" : std::move(name))),
      state_(std::make_shared<State>()) {
  background_of(*manager_).on_abandoned(&detail::SerialTask::abandon);
}

SerialExecutor::~SerialExecutor() {
  cancel_all();
  std::unique_lock lock(state_->mutex);
  state_->idle.wait(lock, [this] { return state_->is_idle(); });
}

SerialExecutor::Handle SerialExecutor::post_task(std::shared_ptr<detail::SerialTask> task) {
  state_->outstanding.fetch_add(1, std::memory_order_relaxed);  // the task's destructor counts it out
  detail::TaskletAccess::set_trusted_rule(*task, rule_);        // the executor made it: valid
  Handle handle{task};
  background_of(*manager_).schedule(std::move(task), Directive::async);
  return handle;
}

bool SerialExecutor::cancel(const Handle& handle) {
  const std::shared_ptr<Tasklet> task = handle.task_.lock();
  return task && background_of(*manager_).withdraw(*task);
}

std::size_t SerialExecutor::cancel_all() {
  const State* mine = state_.get();
  return background_of(*manager_).withdraw_waiting(*rule_, [mine](const Tasklet& tasklet) {
    const auto* task = dynamic_cast<const detail::SerialTask*>(&tasklet);
    return task != nullptr && task->state() == mine;
  });
}

void SerialExecutor::wait() {
  std::exception_ptr error;
  {
    std::unique_lock lock(state_->mutex);
    state_->idle.wait(lock, [this] { return state_->is_idle(); });
    error = std::exchange(state_->first_error, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

std::size_t SerialExecutor::outstanding() const noexcept {
  return state_->outstanding.load(std::memory_order_acquire);
}

}  // namespace tasklet
