// Suspension: a tasklet parked in `wait` until a Rescheduler resumes it (a resume that comes
// before the wait is not lost: the tasklet's state word keeps it).
#include <mutex>
#include <string>
#include <utility>

#include "scheduler/scheduler_impl.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/error.hpp"

namespace tasklet {

using detail::TaskletAccess;
namespace st = detail::word;

// suspend() of an idle tasklet: parked, owned by the scheduler. False when its state word changed
// meanwhile (`word` has the new one).
bool detail::SchedulerImpl::park_idle(Tasklet& tasklet, TaskletPtr& owned, std::uint64_t& word,
                                      std::uint32_t generation) {
  if (!owned) owned = tasklet.weak_from_this().lock();
  if (!owned) throw IllegalState("suspend: " + tasklet.name() + " is not owned by a std::shared_ptr");
  {
    std::lock_guard lock(parked_mutex_);
    const auto entry = parked_.emplace(&tasklet, nullptr).first;  // out of memory: nothing changed
    if (!TaskletAccess::state(tasklet).compare_exchange_strong(
            word, st::with_generation(st::parked | st::armed, generation), std::memory_order_acq_rel)) {
      parked_.erase(entry);
      return false;
    }
    TaskletAccess::set_scheduler(tasklet, &self_);
    entry->second = std::move(owned);
  }
  // Nothing can end it before suspend() returns its Rescheduler: counted outside the lock, so that
  // a loop's wake call is not made under it.
  count_in();
  return true;
}

std::uint32_t detail::SchedulerImpl::suspend(Tasklet& tasklet) {
  // An idle tasklet is parked here, so the scheduler must be able to own it; an active one (its own
  // phase suspends it) is owned already, perhaps by an aliasing pointer (a job's own run).
  TaskletPtr owned;
  auto& state = TaskletAccess::state(tasklet);
  std::uint64_t word = state.load(std::memory_order_acquire);
  for (;;) {
    if (word & st::armed) {
      throw AlreadyScheduled("suspend: " + tasklet.name() +
                             " is already suspended; resume its outstanding Rescheduler");
    }
    // Never 0, which names no suspension (see ~Suspension).
    const std::uint32_t generation = st::generation(word) + 1 == 0 ? 1 : st::generation(word) + 1;
    switch (st::phase(word)) {
      case st::idle:
        if (park_idle(tasklet, owned, word, generation)) return generation;
        continue;
      case st::active:
        if (detail::run_state().tasklet != &tasklet || TaskletAccess::scheduler(tasklet) != &self_) {
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

void detail::SchedulerImpl::check_resumable(const Tasklet& tasklet, std::uint64_t word,
                                            std::uint32_t generation, Directive directive) const {
  if (!(word & st::armed) || st::generation(word) != generation ||
      TaskletAccess::scheduler(tasklet) != &self_) {
    throw AlreadyResumed("resume(" + std::string(to_string(directive)) + "): the suspension of " +
                         tasklet.name() + " was already resumed or has ended");
  }
  if (word & st::resumed) {
    throw AlreadyResumed("resume(" + std::string(to_string(directive)) + "): " + tasklet.name() +
                         " was already resumed with " + std::string(to_string(st::resume_directive(word))));
  }
  if (directive == Directive::sync && background_) {
    throw IllegalState("resume(sync) of " + tasklet.name() +
                       ": its scheduler (a job manager's, for jobs and serial executors) has no synchronous "
                       "thread; resume(async). The tasklet stays parked");
  }
  // The tasklet counts in active_, so run() cannot stop between this check and the dispatch.
  if (directive == Directive::async && !running_.load(std::memory_order_acquire)) {
    throw SchedulerNotRunning("resume(async) of " + tasklet.name() +
                              ": the scheduler's run() is not active; the tasklet stays parked");
  }
}

void detail::SchedulerImpl::resume(const TaskletPtr& tasklet, std::uint32_t generation, Directive directive) {
  resume_suspension(tasklet, generation, directive, true);
  if (directive == Directive::sync) drain_inline();
}

// A parked tasklet leaves parked_ as it becomes active; null when its state word changed meanwhile
// (`word` has the new one).
detail::SchedulerImpl::TaskletPtr detail::SchedulerImpl::unpark(Tasklet& tasklet, std::uint64_t& word,
                                                                std::uint32_t generation) {
  std::lock_guard lock(parked_mutex_);
  if (!TaskletAccess::state(tasklet).compare_exchange_strong(
          word, st::with_generation(st::active, generation), std::memory_order_acq_rel)) {
    return nullptr;
  }
  auto entry = parked_.find(&tasklet);
  assert(entry != parked_.end());
  TaskletPtr owned = std::move(entry->second);
  parked_.erase(entry);
  return owned;
}

// With `checked`, throws what check_resumable finds; without, the caller is the engine itself and
// knows the suspension is current and unused.
void detail::SchedulerImpl::resume_suspension(const TaskletPtr& tasklet, std::uint32_t generation,
                                              Directive directive, bool checked) {
  auto& state = TaskletAccess::state(*tasklet);
  std::uint64_t word = state.load(std::memory_order_acquire);
  for (;;) {
    if (checked) check_resumable(*tasklet, word, generation, directive);
    if (st::phase(word) == st::parked) {
      TaskletPtr owned = unpark(*tasklet, word, generation);
      if (!owned) continue;
      dispatch(std::move(owned), directive);
      return;
    }
    // Its phase has not returned yet: leave the directive for continue_after_phase (sticky resume).
    if (state.compare_exchange_weak(word, word | st::resumed_with(directive), std::memory_order_acq_rel))
      return;
  }
}

void detail::SchedulerImpl::end_suspension(TaskletPtr tasklet, std::uint32_t generation) noexcept {
  auto& state = TaskletAccess::state(*tasklet);
  std::uint64_t word = state.load(std::memory_order_acquire);
  for (;;) {
    if (!(word & st::armed) || (word & st::resumed) || st::generation(word) != generation ||
        TaskletAccess::scheduler(*tasklet) != &self_) {
      return;  // used, or over already
    }
    if (st::phase(word) != st::parked) {
      // Its phase has not returned: if it returns wait, it parks unarmed (park_unarmed decides).
      if (state.compare_exchange_weak(word, word & ~st::armed, std::memory_order_acq_rel)) return;
      continue;
    }
    TaskletPtr lost;
    {
      std::lock_guard lock(parked_mutex_);
      auto entry = parked_.find(tasklet.get());
      if (entry == parked_.end()) return;  // being dropped with its scheduler
      // Owned by parked_ and by `tasklet` only: nobody can suspend it again.
      const bool owned_outside = entry->second.use_count() > 2 + held_rule_references(*entry->second);
      const std::uint64_t next =
          owned_outside ? word & ~st::armed : st::with_generation(st::active, st::generation(word));
      if (!state.compare_exchange_strong(word, next, std::memory_order_acq_rel)) continue;
      if (!owned_outside) {
        lost = std::move(entry->second);
        parked_.erase(entry);
      }
    }
    tasklet.reset();
    if (lost) {
      end_lost(std::move(lost));
    } else {
      note_loose();
    }
    return;
  }
}

// The reference a tasklet's granted request keeps (see TaskletHold): an owner inside the engine.
long detail::SchedulerImpl::held_rule_references(const Tasklet& tasklet) noexcept {
  const RuleRequest* hold = TaskletAccess::hold(tasklet);
  return hold != nullptr && hold->owner() == &tasklet ? 1 : 0;
}

void detail::SchedulerImpl::park_unarmed(TaskletPtr tasklet) noexcept {
  auto& state = TaskletAccess::state(*tasklet);
  if (tasklet.use_count() == 1 + held_rule_references(*tasklet) && !background_) {
    end_lost(std::move(tasklet));
    return;
  }
  try {
    std::lock_guard lock(parked_mutex_);
    // Its place first: out of memory, the tasklet is still ours (a node made from it would go).
    parked_.emplace(tasklet.get(), nullptr).first->second = std::move(tasklet);
    state.store(st::with_generation(st::parked, st::generation(state.load())), std::memory_order_release);
  } catch (...) {
    abandon(std::move(tasklet), std::current_exception());  // no room to park it
    return;
  }
  if (!background_) note_loose();
}

void detail::SchedulerImpl::end_lost(TaskletPtr tasklet) noexcept {
  std::exception_ptr error;
  try {
    error = std::make_exception_ptr(TaskletLost(
        tasklet->name() +
        " was parked in wait with no Rescheduler alive and no owner outside its scheduler, " +
        "so nothing could resume it; it has been ended. Suspend it (Scheduler::suspend) in the phase that " +
        "returns wait and keep the Rescheduler until you resume it"));
  } catch (...) {
    error = std::current_exception();  // out of memory: the tasklet still ends, with bad_alloc
  }
  finish(std::move(tasklet), std::move(error));
}

void detail::SchedulerImpl::note_loose() noexcept {
  if (loose_.fetch_add(1, std::memory_order_acq_rel) != 0) return;
  bool sleeping = false;
  {
    std::lock_guard lock(mutex_);
    sleeping = sleeping_;
  }
  if (sleeping) wake_.notify_all();  // run() sleeps without a time limit: it is to check from now on
}

void detail::SchedulerImpl::end_lost_tasklets() noexcept {
  std::vector<TaskletPtr> lost;
  std::size_t loose = 0;
  {
    std::lock_guard lock(parked_mutex_);
    for (auto entry = parked_.begin(); entry != parked_.end();) {
      auto& state = TaskletAccess::state(*entry->first);
      std::uint64_t word = state.load(std::memory_order_acquire);
      if (st::phase(word) != st::parked || (word & st::armed)) {
        ++entry;
        continue;
      }
      if (entry->second.use_count() > 1 + held_rule_references(*entry->first) ||
          !state.compare_exchange_strong(word, st::with_generation(st::active, st::generation(word)),
                                         std::memory_order_acq_rel)) {
        ++loose;  // still owned outside (or suspended again this instant): checked next time
        ++entry;
        continue;
      }
      try {
        lost.push_back(std::move(entry->second));
      } catch (...) {
        // Out of memory: put it back as it was, for the next check.
        state.store(word, std::memory_order_release);
        ++loose;
        ++entry;
        continue;
      }
      entry = parked_.erase(entry);
    }
    loose_.store(loose, std::memory_order_release);
  }
  for (TaskletPtr& tasklet : lost) end_lost(std::move(tasklet));
}

}  // namespace tasklet
