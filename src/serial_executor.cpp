#include "tasklet/serial_executor.hpp"

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "job_manager_impl.hpp"
#include "scheduler_impl.hpp"
#include "task_condition.hpp"
#include "tasklet/directive.hpp"
#include "tasklet/error.hpp"
#include "tasklet/rules/rules.hpp"
#include "tasklet/tasklet_base.hpp"
#include "tasklet_state.hpp"

namespace tasklet {

struct SerialExecutor::State {
  explicit State(Rule executor_rule) : rule(std::move(executor_rule)) {}

  // The executor's rule, owned here for its tasks' owning_rule(): the tasks themselves keep a
  // pointer that does not own it, so that a post and a task's end do not each take an atomic step
  // on the rule's count (a line that the posting thread and the workers would pass back and forth).
  const Rule rule;
  // Counted without the lock: posting and finishing touch one atomic, and only a task that may bring
  // it to zero takes the mutex, to wake wait() and the destructor. Tasks do not own the state.
  std::atomic<std::size_t> outstanding{0};
  mutable std::mutex mutex;  // guards first_error and the wake-up of `idle`
  // A wait() in a job or an async phase suspends its oneTBB task instead of blocking the worker
  // that the executor's own tasks may need (with one worker, blocking it would deadlock).
  detail::TaskCondition idle;
  std::exception_ptr first_error;

  bool is_idle() const noexcept { return outstanding.load(std::memory_order_acquire) == 0; }
};

namespace detail {

SerialTask::~SerialTask() {
  // Not the last: one atomic step, no lock.
  std::size_t left = state_.outstanding.load(std::memory_order_relaxed);
  while (left > 1 && !state_.outstanding.compare_exchange_weak(left, left - 1, std::memory_order_acq_rel,
                                                               std::memory_order_relaxed)) {
  }
  if (left > 1) return;
  // Perhaps the last: counted out under the mutex, so that a waiter (the executor's destructor,
  // which then frees the state) sees zero only once this task is done with the state.
  std::lock_guard lock(state_.mutex);
  if (state_.outstanding.fetch_sub(1, std::memory_order_acq_rel) == 1) state_.idle.notify_all();
}

const Rule& SerialTask::owning_rule() const noexcept { return state_.rule; }

Directive SerialTask::task() {
  try {
    run_body();
  } catch (...) {
    std::lock_guard lock(state_.mutex);
    if (!state_.first_error) state_.first_error = std::current_exception();
  }
  return Directive::done;
}

}  // namespace detail

SerialExecutor::SerialExecutor(std::shared_ptr<JobManager> manager, std::string name)
    : manager_(manager ? std::move(manager) : JobManager::global()),
      rule_(rules::mutex(name.empty() ? "serial executor" : std::move(name))),
      state_(std::make_shared<State>(rule_)) {}

SerialExecutor::~SerialExecutor() {
  cancel_all();
  std::unique_lock lock(state_->mutex);
  state_->idle.wait(lock, [this] { return state_->is_idle(); });
}

SerialExecutor::Handle SerialExecutor::post_task(std::shared_ptr<detail::SerialTask> task) {
  state_->outstanding.fetch_add(1, std::memory_order_relaxed);  // the task's destructor counts it out
  // Not owning (see State::rule), and not validated again: the executor made it.
  detail::TaskletAccess::set_trusted_rule(*task, Rule(Rule{}, rule_.get()));
  Handle handle{task};
  // The executor keeps its rule alive throughout: the post may skip the table's lock.
  manager_->impl().background().impl().schedule(std::move(task), Directive::async, /*rule_pinned=*/true);
  return handle;
}

bool SerialExecutor::cancel(const Handle& handle) {
  const std::shared_ptr<Tasklet> task = handle.task_.lock();
  return task && manager_->impl().background().impl().withdraw(*task);
}

std::size_t SerialExecutor::cancel_all() {
  const State* mine = state_.get();
  return manager_->impl().table_.withdraw_waiting(*rule_, [mine](const detail::RuleRequest& request) {
    const auto* task = dynamic_cast<const detail::SerialTask*>(static_cast<const Tasklet*>(request.owner()));
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
