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

// The state outlives every task (the executor's destructor waits for them) and owns the rule the
// tasks point at (detail::TaskletOwner). A task counts twice until it is done with the state: once
// until it is destroyed, once until the delivery of its grant (or cancellation) is over, which may
// come after it is destroyed. Both counts go in one word (tasks in the low half, deliveries in the
// high half), so that the last to leave knows it; the background scheduler does not count them,
// and a post writes no cache line that the workers write besides this one and the table's.
struct SerialExecutor::State final : detail::TaskletOwner {
  using TaskletOwner::TaskletOwner;

  static constexpr std::uint64_t one_task = 1;
  static constexpr std::uint64_t one_delivery = std::uint64_t{1} << 32;

  // Counted without the lock; only a count that may bring the word to zero takes the mutex, to
  // wake wait() and the destructor.
  std::atomic<std::uint64_t> outstanding{0};
  mutable std::mutex mutex;  // guards first_error and the wake-up of `idle`
  // A wait() in a job or an async phase suspends its oneTBB task instead of blocking the worker
  // that the executor's own tasks may need (with one worker, blocking it would deadlock).
  detail::TaskCondition idle;
  std::exception_ptr first_error;

  bool is_idle() const noexcept { return outstanding.load(std::memory_order_acquire) == 0; }
  // Takes `count` (one_task or one_delivery) out of the word. Not the last: one atomic step, no
  // lock. Perhaps the last: under the mutex, so that a waiter (the executor's destructor, which
  // then frees the state) sees zero only once this thread is done with the state.
  void count_out(std::uint64_t count) noexcept {
    std::uint64_t left = outstanding.load(std::memory_order_relaxed);
    while (left > count && !outstanding.compare_exchange_weak(left, left - count, std::memory_order_acq_rel,
                                                              std::memory_order_relaxed)) {
    }
    if (left > count) return;
    std::lock_guard lock(mutex);
    if (outstanding.fetch_sub(count, std::memory_order_acq_rel) == count) idle.notify_all();
  }
  void delivered() noexcept override { count_out(one_delivery); }
};

namespace detail {

SerialTask::~SerialTask() { state_.count_out(SerialExecutor::State::one_task); }

TaskletOwner* SerialTask::library_owner() const noexcept { return &state_; }

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
  // The task's destructor counts the task out, the delivery of its grant or cancellation the other.
  state_->outstanding.fetch_add(State::one_task + State::one_delivery, std::memory_order_relaxed);
  // Not owning (the state owns it), and not validated again: the executor made it.
  detail::TaskletAccess::set_trusted_rule(*task, Rule(Rule{}, rule_.get()));
  Handle handle{task};
  try {
    // The executor keeps its rule alive throughout: the post may skip the table's lock.
    detail::impl(detail::domain(*manager_).background()).schedule(std::move(task), Directive::async, /*rule_pinned=*/true);
  } catch (...) {
    state_->count_out(State::one_delivery);  // it never reached the table: no delivery will come
    throw;
  }
  return handle;
}

bool SerialExecutor::cancel(const Handle& handle) {
  const std::shared_ptr<Tasklet> task = handle.task_.lock();
  return task && detail::impl(detail::domain(*manager_).background()).withdraw(*task);
}

std::size_t SerialExecutor::cancel_all() {
  const State* mine = state_.get();
  return detail::domain(*manager_).table_.withdraw_waiting(*rule_, [mine](const detail::RuleRequest& request) {
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
  return static_cast<std::size_t>(state_->outstanding.load(std::memory_order_acquire) &
                                  (State::one_delivery - 1));
}

}  // namespace tasklet
