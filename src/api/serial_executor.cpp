#include "tasklet/serial_executor.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "base/door.hpp"
#include "scheduler/door.hpp"
#include "tasklet/directive.hpp"
#include "tasklet/error.hpp"
#include "tasklet/rules/rules.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet::detail {

// The state outlives every task: the executor's destructor waits until each has been destroyed.
class SerialState {
 public:
  SerialState(std::shared_ptr<JobManager> given, Rule held) noexcept
      : manager(std::move(given)), rule(std::move(held)) {}

  const std::shared_ptr<JobManager> manager;
  const Rule rule;
  // Tasks posted and not yet destroyed; only a count that may bring it to zero takes the mutex,
  // to wake wait() and the destructor.
  std::atomic<std::size_t> outstanding{0};
  mutable std::mutex mutex;  // guards first_error and the wake-up of `idle`
  // A wait() in a job or an async phase suspends its oneTBB task instead of blocking the worker
  // that the executor's own tasks may need (with one worker, blocking it would deadlock).
  TaskCondition idle;
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

namespace {

Scheduler& background_of(JobManager& manager) { return domain(manager).background(); }

// Hands a task to the manager's background scheduler, due after `delay`; its destructor counts it
// out of the executor again.
void post_serial(SerialState& state, std::shared_ptr<SerialTask> task, Clock::duration delay) {
  state.outstanding.fetch_add(1, std::memory_order_relaxed);
  TaskletAccess::set_trusted_rule(*task, state.rule);  // the executor made it: valid
  background_of(*state.manager).schedule_after(delay, std::move(task), Directive::async);
}

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
  Repeat(SerialState& state, std::shared_ptr<RepeatBody> body, Duration period) noexcept
      : state_(state), body_(std::move(body)), period_(period) {}

  // The first run, due `first_due`, in the executor's cancel_all() count `epoch`.
  void start(Clock::time_point first_due);
  // Under the repeat lock: posts the run due at next_due_. Out of memory, nothing is posted.
  void post_next_locked();
  // One run: the body, then the next run unless the repeat is over.
  void run_once();
  // cancel(): no run starts from now on; false when it was over already.
  bool end();

 private:
  // Not owned: the executor's destructor ends every repeat and waits for its runs.
  SerialState& state_;
  std::shared_ptr<RepeatBody> body_;
  const Duration period_;
  // Under the executor's repeat lock.
  Clock::time_point next_due_{};
  std::weak_ptr<Tasklet> pending_;  // the run posted last
  std::uint64_t epoch_ = 0;         // the executor's cancel_all() count when it was posted
  bool over_ = false;
};

namespace {
class RepeatRun final : public SerialTask {
 public:
  RepeatRun(SerialState& state, std::shared_ptr<Repeat> repeat) noexcept
      : SerialTask(state), repeat_(std::move(repeat)) {}

 private:
  void run_body() override { repeat_->run_once(); }
  std::shared_ptr<Repeat> repeat_;
};
}  // namespace

void Repeat::start(Clock::time_point first_due) {
  std::lock_guard lock(state_.repeat_mutex);
  epoch_ = state_.epoch;
  next_due_ = first_due;
  post_next_locked();
}

void Repeat::post_next_locked() {
  auto run = std::allocate_shared<RepeatRun>(Allocator<RepeatRun>{}, state_, shared_from_this());
  pending_ = run;
  const Clock::duration delay = next_due_ - Clock::now();  // late: due at once
  post_serial(state_, std::move(run), delay);
}

void Repeat::run_once() {
  try {
    body_->run();
  } catch (...) {
    end();
    throw;  // kept for wait()
  }
  std::lock_guard lock(state_.repeat_mutex);
  if (over_ || epoch_ != state_.epoch) {
    over_ = true;
    return;
  }
  next_due_ += period_;
  try {
    post_next_locked();
  } catch (...) {
    over_ = true;  // out of memory: it stops, and wait() says why
    throw;
  }
}

bool Repeat::end() {
  std::shared_ptr<Tasklet> pending;
  {
    std::lock_guard lock(state_.repeat_mutex);
    if (std::exchange(over_, true)) return false;
    pending = pending_.lock();
  }
  if (pending) withdraw(background_of(*state_.manager), *pending);  // false when it runs already
  return true;
}

}  // namespace tasklet::detail

namespace tasklet {

namespace {
std::shared_ptr<JobManager> or_global(std::shared_ptr<JobManager> manager) {
  return manager ? std::move(manager) : std::shared_ptr<JobManager>(JobManager::global());
}

// A strand's rule must be valid and conflict with itself, or its tasks would run together.
Rule checked_strand_rule(Rule rule) {
  validate_rule(rule);
  if (!rule || !rule->is_conflicting(*rule)) {
    throw InvalidRule("SerialExecutor(" + describe(rule) +
                      "): a strand's rule must conflict with itself, or its tasks would run together");
  }
  return rule;
}
}  // namespace

SerialExecutor::SerialExecutor(std::shared_ptr<JobManager> manager, std::string name)
    : state_(std::make_shared<detail::SerialState>(
          or_global(std::move(manager)), rules::mutex(name.empty() ? "serial executor" : std::move(name)))) {}

SerialExecutor::SerialExecutor(std::shared_ptr<JobManager> manager, Rule rule)
    : state_(std::make_shared<detail::SerialState>(or_global(std::move(manager)),
                                                   checked_strand_rule(std::move(rule)))) {}

const Rule& SerialExecutor::rule() const noexcept { return state_->rule; }

SerialExecutor::~SerialExecutor() {
  cancel_all();
  std::unique_lock lock(state_->mutex);
  state_->idle.wait(lock, [this] { return state_->is_idle(); });
}

SerialExecutor::Handle SerialExecutor::post_task(std::shared_ptr<detail::SerialTask> task, Duration delay) {
  Handle handle{task};
  detail::post_serial(*state_, std::move(task), delay);
  return handle;
}

SerialExecutor::Handle SerialExecutor::post_repeating(std::shared_ptr<detail::RepeatBody> body,
                                                      Duration initial_delay, Duration period) {
  auto repeat = std::allocate_shared<detail::Repeat>(detail::Allocator<detail::Repeat>{}, *state_,
                                                     std::move(body), period);
  repeat->start(detail::Clock::now() + std::max(initial_delay, Duration::zero()));
  return Handle{std::weak_ptr<detail::Repeat>(repeat)};
}

bool SerialExecutor::cancel(const Handle& handle) {
  if (const std::shared_ptr<detail::Repeat> repeat = handle.repeat_.lock()) return repeat->end();
  const std::shared_ptr<Tasklet> task = handle.task_.lock();
  return task && detail::withdraw(detail::background_of(*state_->manager), *task);
}

std::size_t SerialExecutor::cancel_all() {
  {
    // A repeat posts its next run under this lock: either before (then it is withdrawn below) or
    // after, seeing the new epoch.
    std::lock_guard lock(state_->repeat_mutex);
    ++state_->epoch;
  }
  const detail::SerialState* mine = state_.get();
  const auto is_mine = [mine](const Tasklet& tasklet) {
    const auto* task = dynamic_cast<const detail::SerialTask*>(&tasklet);
    return task != nullptr && task->state() == mine;
  };
  return detail::withdraw_all(detail::background_of(*state_->manager), *state_->rule, is_mine);
}

void SerialExecutor::wait() {
  // Its tasks wait for its rule: a caller that holds it would wait for itself.
  const SchedulingRule* mine = state_->rule.get();
  detail::domain(*state_->manager)
      .check_wait("wait() on serial executor '" + describe(state_->rule) + "'",
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
