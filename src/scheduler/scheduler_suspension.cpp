// Suspension: a tasklet parked in `wait` until a Rescheduler resumes it (a resume that comes
// before the wait is not lost: the tasklet's state word keeps it).
#include <mutex>
#include <string>
#include <utility>

#include "scheduler_impl.hpp"
#include "tasklet/error.hpp"
#include "tasklet_state.hpp"

namespace tasklet {

using detail::TaskletAccess;
namespace st = detail::word;

std::uint32_t detail::SchedulerImpl::suspend(Tasklet& tasklet) {
  TaskletPtr owned = tasklet.weak_from_this().lock();
  if (!owned) throw IllegalState("suspend: " + tasklet.name() + " is not owned by a std::shared_ptr");
  auto& state = TaskletAccess::state(tasklet);
  std::uint64_t word = state.load(std::memory_order_acquire);
  for (;;) {
    if (word & st::armed) {
      throw AlreadyScheduled("suspend: " + tasklet.name() +
                             " is already suspended; resume its outstanding Rescheduler");
    }
    const std::uint32_t generation = st::generation(word) + 1;
    switch (st::phase(word)) {
      case st::idle: {
        std::lock_guard lock(parked_mutex_);
        if (!state.compare_exchange_strong(word, st::with_generation(st::parked | st::armed, generation),
                                           std::memory_order_acq_rel)) {
          continue;
        }
        TaskletAccess::set_scheduler(tasklet, &self_);
        if (!background_) active_.fetch_add(1, std::memory_order_relaxed);
        parked_.emplace(&tasklet, std::move(owned));
        return generation;
      }
      case st::active:
        if (detail::state().tasklet != &tasklet || TaskletAccess::scheduler(tasklet) != &self_) {
          throw AlreadyScheduled("suspend: " + tasklet.name() +
                                 " is queued or running elsewhere; only its own phase may suspend it");
        }
        break;
      case st::parked:
        if (TaskletAccess::scheduler(tasklet) != &self_) {
          throw AlreadyScheduled("suspend: " + tasklet.name() + " is parked in another scheduler");
        }
        break;
      default:
        assert(false && "corrupt tasklet state");
    }
    if (state.compare_exchange_weak(word, st::with_generation(word | st::armed, generation),
                                    std::memory_order_acq_rel)) {
      return generation;
    }
  }
}

void detail::SchedulerImpl::resume(const TaskletPtr& tasklet, std::uint32_t generation, Directive directive) {
  auto& state = TaskletAccess::state(*tasklet);
  std::uint64_t word = state.load(std::memory_order_acquire);
  for (;;) {
    if (!(word & st::armed) || st::generation(word) != generation ||
        TaskletAccess::scheduler(*tasklet) != &self_) {
      throw AlreadyResumed("resume(" + std::string(to_string(directive)) + "): the suspension of " +
                           tasklet->name() + " was already resumed or has ended");
    }
    if (word & st::resumed) {
      throw AlreadyResumed("resume(" + std::string(to_string(directive)) + "): " + tasklet->name() +
                           " was already resumed with " + std::string(to_string(st::resume_directive(word))));
    }
    // The tasklet counts in active_, so run() cannot stop between this check and the dispatch.
    if (directive == Directive::async && !running_.load(std::memory_order_acquire)) {
      throw SchedulerNotRunning("resume(async) of " + tasklet->name() +
                                ": the scheduler's run() is not active; the tasklet stays parked");
    }
    if (st::phase(word) == st::parked) {
      TaskletPtr owned;
      {
        std::lock_guard lock(parked_mutex_);
        if (!state.compare_exchange_strong(word, st::with_generation(st::active, generation),
                                           std::memory_order_acq_rel)) {
          continue;
        }
        auto entry = parked_.find(tasklet.get());
        assert(entry != parked_.end());
        owned = std::move(entry->second);
        parked_.erase(entry);
      }
      dispatch(std::move(owned), directive);
      if (directive == Directive::sync) drain_inline();
      return;
    }
    // Its phase has not returned yet: leave the directive for continue_after_phase (sticky resume).
    if (state.compare_exchange_weak(word, word | st::resumed_with(directive), std::memory_order_acq_rel))
      return;
  }
}

}  // namespace tasklet
