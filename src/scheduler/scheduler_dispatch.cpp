// How a directive takes a tasklet to its next phase: the synchronous queue, the async batch of the
// synchronous thread, the deadline-ordered lanes of a job scheduler, and the oneTBB tasks that run
// the phases on the workers.
#include <algorithm>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "scheduler/run_state.hpp"
#include "scheduler/scheduler_impl.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/error.hpp"

namespace tasklet {

using detail::TaskletAccess;
namespace st = detail::word;

namespace {

// Async phases started by the synchronous thread are handed to the workers this many at a time:
// one arena submission per batch, then the worker spawns them locally (far cheaper than one
// enqueue each).
constexpr std::size_t async_batch_size = 256;

}  // namespace

// ---------------------------------------------------------------------------------------------
// oneTBB tasks

struct detail::SchedulerImpl::PhaseTask {
  SchedulerImpl* impl;
  mutable TaskletPtr tasklet;
  void operator()() const {
    WorkerTaskScope scope(impl->workers_, *impl);
    impl->run_async_phase(std::move(tasklet));
  }
};

// Takes the earliest phase of the deadline-ordered queue and runs it, after starting the next pick
// (spawned locally: this worker takes it after the phase, unless another worker steals it first,
// or this phase waits suspended and frees the worker).
struct detail::SchedulerImpl::PickTask {
  SchedulerImpl* impl;
  void operator()() const {
    WorkerTaskScope scope(impl->workers_, *impl);
    TaskletPtr next;
    bool more = false;
    {
      std::lock_guard lock(impl->ready_mutex_);
      --impl->pending_picks_;
      if (impl->ready_count_ == 0) return;
      next = impl->take_earliest_ready();
      more = impl->ready_count_ != 0 && impl->pending_picks_ < impl->workers_.concurrency();
      if (more) ++impl->pending_picks_;
    }
    if (more) impl->spawn(PickTask{impl});
    impl->run_async_phase(std::move(next));
  }
};

struct detail::SchedulerImpl::AbandonTask {
  SchedulerImpl* impl;
  mutable TaskletPtr tasklet;
  mutable std::exception_ptr error;
  void operator()() const {
    WorkerTaskScope scope(impl->workers_, *impl);
    impl->tell_abandoned(std::move(tasklet), std::move(error));
  }
};

struct detail::SchedulerImpl::BatchTask {
  SchedulerImpl* impl;
  mutable std::vector<TaskletPtr> tasklets;
  void operator()() const {
    WorkerTaskScope scope(impl->workers_, *impl);
    TaskletPtr last = std::move(tasklets.back());
    tasklets.pop_back();
    for (TaskletPtr& tasklet : tasklets) impl->group_.run(PhaseTask{impl, std::move(tasklet)});
    std::vector<TaskletPtr>().swap(tasklets);
    impl->run_async_phase(std::move(last));
  }
};

// ---------------------------------------------------------------------------------------------
// Directives

void detail::SchedulerImpl::continue_after_phase(TaskletPtr tasklet, Directive directive,
                                                 std::exception_ptr error) noexcept {
  if (error) {
    finish(std::move(tasklet), std::move(error));
    return;
  }
  auto& state = TaskletAccess::state(*tasklet);
  std::uint64_t word = state.load(std::memory_order_acquire);
  for (;;) {
    if (!(word & st::armed)) break;  // not suspended: the directive stands
    const std::uint64_t plain = st::with_generation(st::active, st::generation(word));
    if (word & st::resumed) {
      if (directive != Directive::wait) {
        const Directive resumed_with = st::resume_directive(word);
        state.compare_exchange_strong(word, plain, std::memory_order_acq_rel);
        // Named before the tasklet moves: arguments are evaluated in no set order.
        std::exception_ptr misuse = std::make_exception_ptr(
            AlreadyResumed(tasklet->name() + " was resumed with " + std::string(to_string(resumed_with)) +
                           " but its phase returned " + std::string(to_string(directive)) +
                           " instead of wait; a suspended tasklet must return wait"));
        finish(std::move(tasklet), std::move(misuse));
        return;
      }
      const Directive resumed_with = st::resume_directive(word);
      if (state.compare_exchange_weak(word, plain, std::memory_order_acq_rel)) {
        directive = resumed_with;
        break;
      }
      continue;
    }
    if (directive == Directive::wait) {
      std::unique_lock lock(parked_mutex_);
      const std::uint64_t parked = st::with_generation(st::parked | st::armed, st::generation(word));
      std::unordered_map<Tasklet*, TaskletPtr>::iterator entry;
      try {
        entry = parked_.emplace(tasklet.get(), nullptr).first;
      } catch (...) {
        // No room to park it: it ends (its Rescheduler then finds the suspension over).
        lock.unlock();
        state.compare_exchange_strong(word, st::with_generation(st::active, st::generation(word)),
                                      std::memory_order_acq_rel);
        abandon(std::move(tasklet), std::current_exception());
        return;
      }
      if (state.compare_exchange_strong(word, parked, std::memory_order_acq_rel)) {
        entry->second = std::move(tasklet);
        return;
      }
      parked_.erase(entry);
      continue;  // a resume arrived meanwhile
    }
    // The phase chose another directive: the suspension ends unused.
    if (state.compare_exchange_weak(word, plain, std::memory_order_acq_rel)) break;
  }
  dispatch(std::move(tasklet), directive);
}

void detail::SchedulerImpl::dispatch(TaskletPtr tasklet, Directive directive) noexcept {
  switch (directive) {
    case Directive::sync:
      if (background_) {
        const std::string name = tasklet->name();
        finish(std::move(tasklet), std::make_exception_ptr(IllegalState(
                                       name + " returned sync on a background scheduler, which has no "
                                              "synchronous thread")));
        return;
      }
      enqueue_sync(std::move(tasklet));
      return;
    case Directive::async:
      if (!running_.load(std::memory_order_acquire)) {
        const std::string name = tasklet->name();
        finish(std::move(tasklet), std::make_exception_ptr(SchedulerNotRunning(
                                       name + " returned async while its scheduler's run() is not active")));
        return;
      }
      enqueue_async(std::move(tasklet));
      return;
    case Directive::wait:
      park_unarmed(std::move(tasklet));  // no Rescheduler: only a new suspend() can resume it
      return;
    case Directive::done:
      finish(std::move(tasklet), nullptr);
      return;
  }
}

void detail::SchedulerImpl::enqueue_sync(TaskletPtr tasklet) noexcept {
  const bool from_sync_thread = detail::run_state().sync_of == this;
  bool wake = false;
  bool tell = false;
  try {
    std::lock_guard lock(mutex_);
    sync_queue_.push_back(std::move(tasklet));  // out of memory: not moved
    wake = !from_sync_thread && sleeping_;
    tell = loop_driven_ && !driving_ && !std::exchange(loop_told_, true);
  } catch (...) {
    abandon(std::move(tasklet), std::current_exception());
    return;
  }
  if (wake) wake_.notify_all();
  if (tell) tell_loop();
}

void detail::SchedulerImpl::enqueue_async(TaskletPtr tasklet) noexcept {
  try {
    enqueue_async_or_throw(tasklet);
  } catch (...) {
    abandon(std::move(tasklet), std::current_exception());
  }
}

// Moves `tasklet` only once it is queued: out of memory, it is still the caller's.
void detail::SchedulerImpl::enqueue_async_or_throw(TaskletPtr& tasklet) {
  if (order_ != nullptr) {
    Tasklet* const queued = tasklet.get();
    bool start_pick = false;
    Lane* lane = nullptr;
    {
      std::lock_guard lock(ready_mutex_);
      const Order order = order_(*tasklet);
      lane = &ready_[order.lane];
      lane->emplace_back(order.deadline, std::move(tasklet));
      ++ready_count_;
      start_pick = pending_picks_ < workers_.concurrency();
      if (start_pick) ++pending_picks_;
    }
    if (!start_pick) return;
    try {
      spawn(PickTask{this});
    } catch (...) {
      // No pick for it: taken back out (from the back, where it went), unless a pick took it.
      std::lock_guard lock(ready_mutex_);
      --pending_picks_;
      for (auto at = lane->end(); at != lane->begin();) {
        if ((--at)->tasklet.get() != queued) continue;
        tasklet = std::move(at->tasklet);
        lane->erase(at);
        --ready_count_;
        throw;
      }
    }
    return;
  }
  detail::RunState& here = detail::run_state();
  if (here.handoff_of == this && !here.handoff) {
    // A worker finishing a phase of ours: run this one next on the same worker (a strand's
    // hand-off), instead of a round trip through the arena.
    here.handoff = std::move(tasklet);
  } else if (here.sync_of == this && !tasklet->rule()) {
    // Batched; a tasklet with a rule goes at once, so that a chain of holders starts running
    // while the synchronous thread is still adding to it.
    spawned_.store(true, std::memory_order_relaxed);
    async_batch_.push_back(std::move(tasklet));  // out of memory: not moved
    if (async_batch_.size() >= async_batch_size) {
      try {
        flush_async_batch();
      } catch (...) {
        // Out of memory: the batch stays and goes with the next flush.
      }
    }
  } else {
    PhaseTask task{this, std::move(tasklet)};
    try {
      spawn(std::move(task));
    } catch (...) {
      tasklet = std::move(task.tasklet);
      throw;
    }
  }
}

void detail::SchedulerImpl::order_async_phases_by(OrderOf order) { order_ = order; }

std::string detail::SchedulerImpl::describe_tasklet(const Tasklet& tasklet) const {
  if (describe_ != nullptr) return describe_(tasklet);
  // A job's run on a scheduler that is not its manager's (a job on the synchronous thread).
  if (const auto* library = dynamic_cast<const LibraryTasklet*>(&tasklet)) {
    if (std::string job = library->job_name(); !job.empty()) return "job '" + job + "'";
  }
  return TaskletAccess::has_name(tasklet) ? "tasklet '" + tasklet.name() + "'" : tasklet.name();
}

std::string detail::SchedulerImpl::job_of_tasklet(const Tasklet& tasklet) {
  const auto* library = dynamic_cast<const LibraryTasklet*>(&tasklet);
  return library != nullptr ? library->job_name() : std::string();
}

// The hook is told on a worker: an abandonment comes from a grant or a refusal, which the table
// delivers wherever it was entered or released, perhaps under a lock of the layer above (a job's
// cancel() withdraws under its manager's lock), and the hook takes that layer's locks. Out of
// memory for that task too, it is told here.
void detail::SchedulerImpl::abandon(TaskletPtr tasklet, std::exception_ptr error) noexcept {
  if (dynamic_cast<LibraryTasklet*>(tasklet.get()) == nullptr) {
    finish(std::move(tasklet), std::move(error));
    return;
  }
  AbandonTask task{this, std::move(tasklet), std::move(error)};
  try {
    spawn(std::move(task));
  } catch (...) {
    tell_abandoned(std::move(task.tasklet), std::move(task.error));
  }
}

void detail::SchedulerImpl::tell_abandoned(TaskletPtr tasklet, std::exception_ptr error) noexcept {
  static_cast<LibraryTasklet&>(*tasklet).abandoned(std::move(error));
  finish(std::move(tasklet), nullptr);
}

detail::SchedulerImpl::TaskletPtr detail::SchedulerImpl::take_earliest_ready() noexcept {
  Lane* earliest = nullptr;
  for (auto& lane : ready_) {
    if (!lane.empty() && (earliest == nullptr || lane.front().deadline < earliest->front().deadline))
      earliest = &lane;
  }
  TaskletPtr next = std::move(earliest->front().tasklet);
  earliest->pop_front();
  --ready_count_;
  return next;
}

void detail::SchedulerImpl::take_reserved(std::atomic<std::size_t>& counter, std::size_t& reserved) noexcept {
  constexpr std::size_t block = 64;
  if (reserved == 0) {
    counter.fetch_add(block, std::memory_order_relaxed);
    reserved = block;
  }
  --reserved;
}

void detail::SchedulerImpl::flush_async_batch() {
  enter_rule_batch();
  if (reserved_holds_ != 0) {
    count_out(sync_holds_, std::exchange(reserved_holds_, 0));
  }
  if (reserved_active_ != 0) {
    // Perhaps the last count: nobody is woken, as the synchronous thread looks at it next.
    active_.fetch_sub(std::exchange(reserved_active_, 0), std::memory_order_acq_rel);
  }
  if (async_batch_.empty()) return;
  if (uncounted_in_batch_ != 0) {
    active_.fetch_add(uncounted_in_batch_, std::memory_order_relaxed);
    uncounted_in_batch_ = 0;
  }
  std::vector<TaskletPtr> next;
  next.reserve(async_batch_size);
  BatchTask task{this, std::move(async_batch_)};
  async_batch_ = std::move(next);
  try {
    workers_.arena().enqueue(group_.defer(std::move(task)));
  } catch (...) {
    async_batch_ = std::move(task.tasklets);  // out of memory: kept for the next flush
    throw;
  }
}

}  // namespace tasklet
