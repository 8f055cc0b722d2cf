#include "tasklet/serial_executor.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "base/task_condition.hpp"
#include "scheduler/domain.hpp"
#include "scheduler/scheduler_impl.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/directive.hpp"
#include "tasklet/error.hpp"
#include "tasklet/rules/rules.hpp"
#include "tasklet/tasklet_base.hpp"

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
  // Repeating tasks: each posts its next run under this lock, and stops once cancel() marked it
  // over or cancel_all() counted up `epoch` since it was posted.
  std::mutex repeat_mutex;
  std::uint64_t epoch = 0;

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

namespace {
SchedulerImpl& background_of(JobManager& manager) { return impl(domain(manager).background()); }
}  // namespace

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

void SerialTask::abandoned(std::exception_ptr error) noexcept {
  std::lock_guard lock(state_.mutex);
  if (!state_.first_error) state_.first_error = std::move(error);
}

// A task posted at a fixed rate: its body, its schedule, and the run posted next.
class Repeat : public std::enable_shared_from_this<Repeat> {
 public:
  using Duration = SerialExecutor::Duration;
  Repeat(SerialExecutor& executor, std::shared_ptr<RepeatBody> body, Duration period) noexcept
      : executor_(executor), body_(std::move(body)), period_(period) {}

  // Under the repeat lock: posts the run due at next_due_. Out of memory, nothing is posted.
  void post_next_locked(SerialExecutor::State& state);
  // One run: the body, then the next run unless the repeat is over.
  void run_once();
  // cancel(): no run starts from now on; false when it was over already.
  bool end();

 private:
  // Not owned: the executor's destructor ends every repeat and waits for its runs.
  SerialExecutor& executor_;
  std::shared_ptr<RepeatBody> body_;
  const Duration period_;
  // Under the executor's repeat lock.
  Clock::time_point next_due_{};
  std::weak_ptr<Tasklet> pending_;  // the run posted last
  std::uint64_t epoch_ = 0;         // the executor's cancel_all() count when it was posted
  bool over_ = false;

  friend class tasklet::SerialExecutor;
};

namespace {
class RepeatRun final : public SerialTask {
 public:
  RepeatRun(SerialExecutor::State& state, std::shared_ptr<Repeat> repeat) noexcept
      : SerialTask(state), repeat_(std::move(repeat)) {}

 private:
  void run_body() override { repeat_->run_once(); }
  std::shared_ptr<Repeat> repeat_;
};
}  // namespace

void Repeat::post_next_locked(SerialExecutor::State& state) {
  auto run = std::allocate_shared<RepeatRun>(Allocator<RepeatRun>{}, state, shared_from_this());
  pending_ = run;
  const Clock::duration delay = next_due_ - Clock::now();  // late: due at once
  executor_.post_task(std::move(run), delay);
}

void Repeat::run_once() {
  SerialExecutor::State& state = *executor_.state_;
  try {
    body_->run();
  } catch (...) {
    end();
    throw;  // kept for wait()
  }
  std::lock_guard lock(state.repeat_mutex);
  if (over_ || epoch_ != state.epoch) {
    over_ = true;
    return;
  }
  next_due_ += period_;
  try {
    post_next_locked(state);
  } catch (...) {
    over_ = true;  // out of memory: it stops, and wait() says why
    throw;
  }
}

bool Repeat::end() {
  std::shared_ptr<Tasklet> pending;
  {
    std::lock_guard lock(executor_.state_->repeat_mutex);
    if (std::exchange(over_, true)) return false;
    pending = pending_.lock();
  }
  if (pending) background_of(*executor_.manager_).withdraw(*pending);  // false when it runs already
  return true;
}

}  // namespace detail

SerialExecutor::SerialExecutor(std::shared_ptr<JobManager> manager, std::string name)
    : manager_(manager ? std::move(manager) : std::shared_ptr<JobManager>(JobManager::global())),
      rule_(rules::mutex(name.empty() ? "serial executor" : std::move(name))),
      state_(std::make_shared<State>()) {}

SerialExecutor::SerialExecutor(std::shared_ptr<JobManager> manager, Rule rule)
    : manager_(manager ? std::move(manager) : std::shared_ptr<JobManager>(JobManager::global())),
      rule_(std::move(rule)),
      state_(std::make_shared<State>()) {
  validate_rule(rule_);
  if (!rule_ || !rule_->is_conflicting(*rule_)) {
    throw InvalidRule("SerialExecutor(" + describe(rule_) +
                      "): a strand's rule must conflict with itself, or its tasks would run together");
  }
}

SerialExecutor::~SerialExecutor() {
  cancel_all();
  std::unique_lock lock(state_->mutex);
  state_->idle.wait(lock, [this] { return state_->is_idle(); });
}

SerialExecutor::Handle SerialExecutor::post_task(std::shared_ptr<detail::SerialTask> task, Duration delay) {
  state_->outstanding.fetch_add(1, std::memory_order_relaxed);  // the task's destructor counts it out
  detail::TaskletAccess::set_trusted_rule(*task, rule_);        // the executor made it: valid
  Handle handle{task};
  detail::background_of(*manager_).schedule_after(delay, std::move(task), Directive::async);
  return handle;
}

SerialExecutor::Handle SerialExecutor::post_repeating(std::shared_ptr<detail::RepeatBody> body,
                                                      Duration initial_delay, Duration period) {
  auto repeat = std::allocate_shared<detail::Repeat>(detail::Allocator<detail::Repeat>{}, *this,
                                                     std::move(body), period);
  std::lock_guard lock(state_->repeat_mutex);
  repeat->epoch_ = state_->epoch;
  repeat->next_due_ = detail::Clock::now() + std::max(initial_delay, Duration::zero());
  repeat->post_next_locked(*state_);
  return Handle{std::weak_ptr<detail::Repeat>(repeat)};
}

bool SerialExecutor::cancel(const Handle& handle) {
  if (const std::shared_ptr<detail::Repeat> repeat = handle.repeat_.lock()) return repeat->end();
  const std::shared_ptr<Tasklet> task = handle.task_.lock();
  return task && detail::background_of(*manager_).withdraw(*task);
}

std::size_t SerialExecutor::cancel_all() {
  {
    // A repeat posts its next run under this lock: either before (then it is withdrawn below) or
    // after, seeing the new epoch.
    std::lock_guard lock(state_->repeat_mutex);
    ++state_->epoch;
  }
  const State* mine = state_.get();
  const auto is_mine = [mine](const Tasklet& tasklet) {
    const auto* task = dynamic_cast<const detail::SerialTask*>(&tasklet);
    return task != nullptr && task->state() == mine;
  };
  detail::SchedulerImpl& background = detail::background_of(*manager_);
  const std::size_t delayed = background.withdraw_delayed(is_mine);
  return delayed + background.withdraw_waiting(*rule_, is_mine);
}

void SerialExecutor::wait() {
  // Its tasks wait for its rule: a caller that holds it would wait for itself.
  const SchedulingRule* mine = rule_.get();
  detail::domain(*manager_).check_wait("wait() on serial executor '" + describe(rule_) + "'",
                                       [mine](const detail::RuleRequest& request) {
                                         return request.rule() == mine && request.owner() != nullptr;
                                       });
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
