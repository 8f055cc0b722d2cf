// The jobs' side of Job's operations: schedule, cancel, join, sleep, wake_up, yield_rule, blockers.
// A job's run is in jobs_run.cpp.
#include "jobs/jobs.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "scheduler/door.hpp"
#include "tasklet/error.hpp"

namespace tasklet::detail {

namespace jw = job_word;

// Its rule is the job's while it waits or sleeps; the scheduler is kept while a run or `mutex` is.
std::optional<Status> Jobs::lost_before_run(const JobCore& job) const noexcept {
  if (scheduler_ == nullptr) return std::nullopt;
  try {
    domain_->check_shared(job.rule);
    return std::nullopt;
  } catch (const std::exception& failure) {
    return Status::error("its rule can no longer be held: " + std::string(failure.what()),
                         std::current_exception());
  } catch (...) {
    return Status::error("its rule can no longer be held", std::current_exception());
  }
}

void Jobs::schedule(JobCore& job, std::chrono::milliseconds delay, bool is_rerun) {
  if (delay.count() < 0) throw IllegalState("schedule(" + job.job().name() + "): the delay is negative");
  if (stopping_.load(std::memory_order_acquire) && !is_rerun) schedule_refused(job.job());
  bool wanted = false;
  try {
    wanted = job.hooks().should_schedule(job.job());
  } catch (...) {
    if (is_rerun) drop_rerun(job);
    throw;
  }
  const bool plain = delay.count() == 0 && job.group_core() == nullptr && !has_listeners(job);
  std::shared_ptr<JobRun> run;  // a plain job's, handed over under this one taking of the lock
  std::shared_ptr<Job> owner = job.owned();
  // Any other job takes the manager's lock before it becomes waiting and keeps it until it waits
  // somewhere (or sleeps, or ended at once): a cancel() in between would find it waiting in no
  // queue, end it, and then see it queued all the same.
  std::unique_lock manager_lock(mutex, std::defer_lock);
  if (!plain) manager_lock.lock();
  const Scheduling made = make_waiting(job, {delay, is_rerun, wanted, plain}, owner, run);
  if (made.wake_joiners) wake_joiners();
  if (!made.waiting) return;
  list(job, std::move(owner));
  if (run) {
    submit_run(job, std::move(run));
    return;
  }
  ToStart to_start;
  RunEnd ended;
  if (!manager_lock.owns_lock()) manager_lock.lock();
  if (plain) {
    // It found the manager suspended: it waits out the suspension, unless a cancel() since it
    // became waiting has ended this waiting already.
    const std::uint32_t now = job.load();
    if (jw::phase(now) == JobState::waiting && now / jw::one_end == made.ends && (now & jw::taken) == 0) {
      enter_waiting(job, to_start);
    }
  } else {
    ended = enter_scheduled(job, delay, is_rerun, manager_lock, to_start);
  }
  manager_lock.unlock();
  start(to_start);
  deliver(job);
  if (ended.job != nullptr) complete(std::move(ended));
}

// Under the job's lock: the job in state none becomes waiting (a plain one is handed its `run`
// when the manager is not suspended); a running one, or one whose last end is still being told,
// runs once more after it.
Jobs::Scheduling Jobs::make_waiting(JobCore& job, ScheduleCall call, const std::shared_ptr<Job>& owner,
                                    std::shared_ptr<JobRun>& run) {
  std::lock_guard job_lock(job.lock);
  const std::uint32_t word = job.load();
  Scheduling made{.ends = word / jw::one_end};
  if (call.is_rerun) job.word.fetch_and(~jw::rerun_pending, std::memory_order_acq_rel);
  if (!call.wanted) {
    made.wake_joiners = call.is_rerun && (word & jw::joined) != 0;
    return made;
  }
  // Running, or about to (its run has begun, or a cancel that could not take the run back lets
  // the run end it, unrun): once more after it ends. So too while its last end is still being
  // told to its listeners: they hear this end before the next schedule.
  const JobState phase = jw::phase(word);
  const bool running = phase == JobState::running ||
                       (phase == JobState::waiting && (word & (jw::started | jw::canceled)) != 0);
  if (running || (phase == JobState::none && (word & jw::ending) != 0)) {
    job.change(phase, jw::rerun);
    job.rerun_delay = call.delay;
    return made;
  }
  if (phase != JobState::none) return made;  // already waiting or sleeping (even for a re-run)
  if (stopping_.load(std::memory_order_acquire)) schedule_refused(job.job());
  // A plain job goes straight to the job scheduler, unless the manager is suspended.
  const bool handing = call.plain && !suspended_.load(std::memory_order_acquire);
  if (handing) run = take_run(job, owner);
  job.order.store(next_order_.fetch_add(1, std::memory_order_relaxed), std::memory_order_relaxed);
  if (handing) {
    job.change(JobState::waiting, jw::taken);
    attach_run(job, *run);
  } else {
    job.change(JobState::waiting);
  }
  if (Trace* traced = trace()) [[unlikely]]
    trace_state(*traced, job, "waiting");
  made.waiting = true;
  return made;
}

// Under `mutex`, for a job that is not plain: it enters its group, its listeners hear of the
// schedule, and it sleeps for `delay` or waits. Out of memory on the way (an event, a timer, a
// queue's room): the job goes back to state none, as if this schedule() had not been made, and the
// caller gets the std::bad_alloc.
RunEnd Jobs::enter_scheduled(JobCore& job, std::chrono::milliseconds delay, bool is_rerun,
                             std::unique_lock<std::mutex>& manager_lock, ToStart& to_start) {
  const JobExtras* extras = job.made_extras();
  const std::size_t events_before = extras != nullptr ? extras->events.size() : 0;
  GroupCore* entered_group = nullptr;
  JobGroup::State group_before = JobGroup::State::none;
  try {
    bool canceled_at_once = false;
    if (GroupCore* g = job.group_core())
      canceled_at_once = enter_group(job, *g, is_rerun, entered_group, group_before);
    if (has_listeners(job)) {
      post(job, PendingEvent::Kind::scheduled, JobEvent{job.owned(), {}, delay, nullptr});
    }
    if (canceled_at_once) return finish_run(job, Status::cancel("the job's group is canceling"), to_start);
    if (delay.count() > 0) {
      {
        std::lock_guard job_lock(job.lock);
        job.change(JobState::sleeping);
      }
      if (Trace* traced = trace()) [[unlikely]]
        trace_state(*traced, job, "sleeping");
      arm_timer(job, Clock::now() + delay);
    } else {
      enter_waiting(job, to_start);
    }
    return {};
  } catch (...) {
    undo_schedule(job, entered_group, group_before, events_before);
    manager_lock.unlock();
    unlist_if_over(job);
    if ((job.load() & jw::joined) != 0) wake_joiners();
    throw;
  }
}

// Under `mutex`: the job joins `group`'s active jobs; true when the group is canceling, which ends
// the job at once. Room is made first for the result of every job in it: a run's end on a worker
// pushes its result without allocating (only the copy of the message can fail there). Once that
// room is there, `entered` and `before` (the group's state until then, read under its lock) tell
// undo_schedule() what to take back.
bool Jobs::enter_group(JobCore& job, GroupCore& group, bool is_rerun, GroupCore*& entered,
                       JobGroup::State& before) {
  std::lock_guard group_lock(group.mutex);
  room_for(group.active);
  room_for(group.results, group.active.size() + 1);
  // Jobs scheduled from outside the group's own jobs are its seeds, even when canceled at once.
  const JobCore* parent = running_job();
  job.seed = !is_rerun && !(parent != nullptr && parent->group_core() == &group);
  job.grouped = true;
  entered = &group;
  before = group.state;
  if (group.state == JobGroup::State::canceling) return true;
  group.state = JobGroup::State::active;
  group.active.push_back(&job);
  return false;
}

// Under `mutex`: takes back what a schedule() that ran out of memory did to a job that was in state
// none (see schedule()); it ends nothing, so no end is counted and no event told.
void Jobs::undo_schedule(JobCore& job, GroupCore* group, JobGroup::State group_before,
                         std::size_t events_before) noexcept {
  disarm_timer(job);
  for (auto* queue : {&held_entered_, &held_}) std::erase(*queue, &job);
  if (group != nullptr) {
    std::lock_guard group_lock(group->mutex);
    std::erase(group->throttled, &job);
    std::erase(group->active, &job);
    if (job.holds_group_slot) --group->running;
    if (group->active.empty() && group->throttled.empty()) group->state = group_before;
  }
  job.grouped = job.seed = job.holds_group_slot = false;
  if (JobExtras* extras = job.made_extras()) {
    while (extras->events.size() > events_before) extras->events.pop_back();
  }
  std::lock_guard job_lock(job.lock);
  job.change(JobState::none, 0, jw::taken);
}

namespace {

// A waiting job whose run has started, or is still being handed over: the run ends it, unrun and
// canceled, and join() waits for that (the rule it may hold is free by then). A re-run asked for
// earlier is dropped: the cancel is the last word. False when it started running meanwhile.
bool cancel_handed_run(JobCore& job) {
  std::lock_guard job_lock(job.lock);
  if (job.state() != JobState::waiting) return false;
  job.change(JobState::waiting, jw::canceled, jw::rerun);
  return true;
}

}  // namespace

bool Jobs::cancel(JobCore& job) {
  const std::shared_ptr<Job> owner = job.owned();
  std::shared_ptr<ProgressMonitor> monitor;
  bool call_canceling = false;
  RunEnd ended;
  ToStart to_start;
  {
    std::lock_guard lock(mutex);
    switch (job.state()) {
      case JobState::none: {
        // A schedule() made while its last end is being told is dropped: the cancel is the last word.
        std::lock_guard job_lock(job.lock);
        if ((job.load() & jw::ending) != 0) job.word.fetch_and(~jw::rerun, std::memory_order_acq_rel);
        return true;
      }
      case JobState::sleeping:
        ended = finish_run(job, lost_before_run(job).value_or(Status::cancel()), to_start);
        break;
      case JobState::waiting:
        if (withdraw_waiting(job)) {
          ended = finish_run(job, lost_before_run(job).value_or(Status::cancel()), to_start);
          break;
        }
        if (cancel_handed_run(job)) return false;
        [[fallthrough]];  // it started running meanwhile
      case JobState::running: {
        std::lock_guard job_lock(job.lock);
        if (job.state() != JobState::running) return job.state() == JobState::none;
        const std::uint32_t old = job.change(JobState::running, jw::canceling_called, jw::rerun);
        monitor = job.monitor;
        call_canceling = (old & jw::canceling_called) == 0;
        break;
      }
    }
  }
  if (monitor != nullptr) {
    monitor->set_canceled(true);
    if (call_canceling) {
      try {
        job.hooks().canceling(job.job());
      } catch (...) {
      }
    }
    return false;
  }
  start(to_start);
  if (ended.job != nullptr) complete(std::move(ended));
  return true;
}

// On a worker (a job joining another job) the wait suspends the task, so the job joined can run
// even when every worker is taken by joiners.
bool Jobs::join(JobCore& job, std::chrono::milliseconds timeout) {
  if (running_job() == &job) {
    throw IllegalState("join: job '" + job.job().name() + "' cannot join itself");
  }
  const std::uint32_t seen = job.load();
  if (job.on_sync_thread() && timeout == std::chrono::milliseconds::max() &&
      jw::phase(seen) != JobState::none) {
    if (const std::shared_ptr<Scheduler> target = sync_target(job);
        target && is_synchronous_thread_of(*target)) {
      throw IllegalState("join(job '" + job.job().name() +
                         "') on its sync scheduler's synchronous thread would never return: its run needs "
                         "this thread");
    }
  }
  // Ended, unless a schedule() made while the end was being told runs it again (jw::ending).
  if (jw::phase(seen) == JobState::none && (seen & jw::rerun) == 0) return true;
  const std::uint32_t ends = seen / jw::one_end;
  // Over when an end is counted, or when that schedule() was dropped (a cancel, the shutdown).
  const auto over = [ends](std::uint32_t word) {
    return word / jw::one_end != ends ||
           (jw::phase(word) == JobState::none && (word & (jw::rerun | jw::rerun_pending | jw::ending)) == 0);
  };
  {
    // A job waiting for a rule that the caller holds (or behind requests that do) never ends: a
    // join without a timeout would hang (a timed one ends, and its caller may then let go).
    std::lock_guard job_lock(job.lock);
    if (timeout == std::chrono::milliseconds::max() && job.state() == JobState::waiting &&
        job.run != nullptr && scheduler_ != nullptr) {
      const Tasklet* run = job.run;
      domain_->check_wait("join(job '" + job.job().name() + "')",
                          [run](const RuleRequest& request) { return request.owner() == run; });
    }
  }
  std::unique_lock lock(join_mutex_);
  if (over(job.word.fetch_or(jw::joined, std::memory_order_acq_rel))) return true;
  return joined_.wait_until(
      lock, deadline_after(timeout), [&] { return over(job.load()); }, timer_.get());
}

bool Jobs::sleep(JobCore& job) {
  ToStart to_start;
  {
    std::lock_guard lock(mutex);
    switch (job.state()) {
      case JobState::none:
        return true;
      case JobState::running:
        return false;
      case JobState::sleeping:
        disarm_timer(job);
        return true;
      case JobState::waiting:
        // Started, or canceled and left to its run to end: nothing to put to sleep.
        if ((job.load() & jw::canceled) != 0 || !withdraw_waiting(job)) return false;
        release_group_slot(job, to_start);
        {
          std::lock_guard job_lock(job.lock);
          job.change(JobState::sleeping);
        }
        if (has_listeners(job))
          post(job, PendingEvent::Kind::sleeping, JobEvent{job.owned(), {}, {}, nullptr});
        break;
    }
  }
  start(to_start);
  deliver(job);
  return true;
}

void Jobs::wake_up(JobCore& job, std::chrono::milliseconds delay) {
  ToStart to_start;
  {
    std::lock_guard lock(mutex);
    if (job.state() != JobState::sleeping) return;
    disarm_timer(job);
    if (delay.count() > 0) {
      arm_timer(job, Clock::now() + delay);
      return;
    }
    if (has_listeners(job)) post(job, PendingEvent::Kind::awake, JobEvent{job.owned(), {}, {}, nullptr});
    enter_waiting(job, to_start);
  }
  start(to_start);
  deliver(job);
}

bool Jobs::yield_rule(JobCore& job) {
  const RunState& here = run_state();
  if (running_job(here) != &job || here.tasklet == nullptr || phase_scheduler(here) == nullptr) {
    throw IllegalState("yield_rule: call it from the run() of job '" + job.job().name() + "'");
  }
  return yield_phase_rule(here);
}

std::vector<RuleBlocker> Jobs::blockers(JobCore& job) {
  // Under the job's lock, as cancel's withdrawal: its run cannot be granted and gone meanwhile
  // without the table's lock, under which its request is looked up by its run.
  std::lock_guard job_lock(job.lock);
  if (job.state() != JobState::waiting || job.run == nullptr || scheduler_ == nullptr) return {};
  return domain_->blockers_of(static_cast<const Tasklet*>(job.run));
}

bool Jobs::is_blocking(JobCore& job) {
  std::lock_guard job_lock(job.lock);
  if (job.state() != JobState::running || scheduler_ == nullptr) return false;
  // The tasklet of a request, when it is one of our jobs' (runs and completions; only runs hold
  // rules), on the job scheduler or a job's sync scheduler: the table is this manager's alone.
  // Under the table's lock a request's tasklet is alive.
  const auto job_tasklet = [](const RuleRequest& request) -> const JobTasklet* {
    return dynamic_cast<const JobTasklet*>(static_cast<const Tasklet*>(request.owner()));
  };
  std::size_t mine = 0;
  return domain_->has_conflicting_waiter_if(
      [&](const RuleRequest& held) {
        const JobTasklet* run = job_tasklet(held);
        if (run == nullptr || !run->runs(job)) return false;
        mine = JobTasklet::order_of(*run).lane;
        return true;
      },
      [&](const RuleRequest& waiter) {
        const JobTasklet* run = job_tasklet(waiter);
        return run != nullptr && JobTasklet::order_of(*run).lane < mine;
      });
}

}  // namespace tasklet::detail
