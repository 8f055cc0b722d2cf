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

namespace tasklet {

struct SerialExecutor::State {
  // Counted without the lock: posting and finishing touch one atomic, and only the task that brings
  // it to zero takes the mutex, to wake wait() and the destructor.
  std::atomic<std::size_t> outstanding{0};
  mutable std::mutex mutex;  // guards first_error and the wake-up of `idle`
  // A wait() in a job or an async phase suspends its oneTBB task instead of blocking the worker
  // that the executor's own tasks may need (with one worker, blocking it would deadlock).
  detail::TaskCondition idle;
  std::exception_ptr first_error;

  bool is_idle() const noexcept { return outstanding.load(std::memory_order_acquire) == 0; }
};

namespace {

// One posted task: an async phase under the executor's rule. Its destruction, whether it ran or
// was cancelled, is what counts it out.
class SerialTask final : public Tasklet {
 public:
  SerialTask(std::shared_ptr<SerialExecutor::State> state, std::unique_ptr<SerialExecutor::Body_> body)
      : state_(std::move(state)), body_(std::move(body)) {}
  ~SerialTask() override {
    if (state_->outstanding.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    // Under the mutex: ordered with a waiter between its check and its sleep.
    std::lock_guard lock(state_->mutex);
    state_->idle.notify_all();
  }
  Directive task() override {
    try {
      body_->run();
    } catch (...) {
      std::lock_guard lock(state_->mutex);
      if (!state_->first_error) state_->first_error = std::current_exception();
    }
    body_.reset();
    return Directive::done;
  }
  const SerialExecutor::State* state() const noexcept { return state_.get(); }

 private:
  std::shared_ptr<SerialExecutor::State> state_;
  std::unique_ptr<SerialExecutor::Body_> body_;
};

}  // namespace

SerialExecutor::SerialExecutor(std::shared_ptr<JobManager> manager, std::string name)
    : manager_(manager ? std::move(manager) : JobManager::global()),
      rule_(rules::mutex(name.empty() ? "serial executor" : std::move(name))),
      state_(std::make_shared<State>()) {}

SerialExecutor::~SerialExecutor() {
  cancel_all();
  std::unique_lock lock(state_->mutex);
  state_->idle.wait(lock, [this] { return state_->is_idle(); });
}

SerialExecutor::Handle SerialExecutor::post_erased(std::unique_ptr<Body_> body) {
  auto task = std::allocate_shared<SerialTask>(detail::Allocator<SerialTask>{}, state_, std::move(body));
  state_->outstanding.fetch_add(1, std::memory_order_relaxed);  // the task's destructor counts it out
  task->set_rule(rule_);
  Handle handle{task};
  manager_->impl().background().schedule(std::move(task), Directive::async);
  return handle;
}

bool SerialExecutor::cancel(const Handle& handle) {
  const std::shared_ptr<Tasklet> task = handle.task_.lock();
  return task && manager_->impl().background().impl().withdraw(*task);
}

std::size_t SerialExecutor::cancel_all() {
  const State* mine = state_.get();
  return manager_->impl().table_.withdraw_waiting(*rule_, [mine](const detail::RuleRequest& request) {
    const auto* task = dynamic_cast<const SerialTask*>(static_cast<const Tasklet*>(request.owner()));
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
