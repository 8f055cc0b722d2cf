// The jobs' side of Job's operations (schedule, cancel, join, sleep, wake_up, yield_rule) and of a
// job's run, on the manager's job scheduler.
#include "jobs/jobs.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "scheduler/scheduler_impl.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/error.hpp"

namespace tasklet::detail {

namespace jw = job_word;

// Its rule is the job's while it waits or sleeps; the scheduler is kept while a run or `mutex` is.
std::optional<Status> Jobs::lost_before_run(const JobCore& job) const noexcept {
  if (scheduler_ == nullptr) return std::nullopt;
  try {
    impl(*scheduler_).domain_.check_shared(job.rule);
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
  bool handing = false;
  // Any other job takes the manager's lock before it becomes waiting and keeps it until it waits
  // somewhere (or sleeps, or ended at once): a cancel() in between would find it waiting in no
  // queue, end it, and then see it queued all the same.
  std::unique_lock manager_lock(mutex, std::defer_lock);
  if (!plain) manager_lock.lock();
  std::uint32_t ends = 0;  // of this job before this waiting
  bool joiners_to_wake = false;
  struct WakeOnReturn {
    Jobs& jobs;
    bool& wake;
    ~WakeOnReturn() {
      if (wake) jobs.wake_joiners();
    }
  } wake_on_return{*this, joiners_to_wake};
  {
    std::lock_guard job_lock(job.lock);
    const std::uint32_t word = job.load();
    ends = word / jw::one_end;
    if (is_rerun) job.word.fetch_and(~jw::rerun_pending, std::memory_order_acq_rel);
    if (!wanted) {
      if (is_rerun && (word & jw::joined) != 0) joiners_to_wake = true;
      return;
    }
    // Running, or about to (its run has begun, or a cancel that could not take the run back lets
    // the run end it, unrun): once more after it ends.
    const JobState phase = jw::phase(word);
    if (phase == JobState::running ||
        (phase == JobState::waiting && (word & (jw::started | jw::canceled)) != 0)) {
      job.change(phase, jw::rerun);
      job.rerun_delay = delay;
      return;
    }
    if (phase != JobState::none) return;  // already waiting or sleeping (even for a re-run)
    if ((word & jw::ending) != 0) {
      // Its last end is still being told to its listeners: it runs again once they have heard it,
      // so that they hear this end before the next schedule.
      job.change(phase, jw::rerun);
      job.rerun_delay = delay;
      return;
    }
    if (stopping_.load(std::memory_order_acquire)) schedule_refused(job.job());
    // A plain job goes straight to the job scheduler, unless the manager is suspended.
    handing = plain && !suspended_.load(std::memory_order_acquire);
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
  }
  list(job, std::move(owner));
  if (handing) {
    submit_run(job, std::move(run));
    return;
  }
  ToStart to_start;
  bool canceled_at_once = false;
  RunEnd ended;
  {
    if (!manager_lock.owns_lock()) manager_lock.lock();
    if (plain) {
      // It found the manager suspended: it waits out the suspension, unless a cancel() since it
      // became waiting has ended this waiting already.
      const std::uint32_t now = job.load();
      if (jw::phase(now) == JobState::waiting && now / jw::one_end == ends && (now & jw::taken) == 0) {
        enter_waiting(job, to_start);
      }
    } else {
      // Out of memory on the way (an event, a timer, a queue's room): the job goes back to state
      // none, as if this schedule() had not been made, and the caller gets the std::bad_alloc.
      const JobExtras* extras = job.made_extras();
      const std::size_t events_before = extras != nullptr ? extras->events.size() : 0;
      GroupCore* entered_group = nullptr;
      JobGroup::State group_before = JobGroup::State::none;
      try {
        if (GroupCore* g = job.group_core()) {
          std::lock_guard group_lock(g->mutex);
          room_for(g->active);
          // Room for the result of every job in it: a run's end on a worker pushes its result
          // without allocating (only the copy of the message can fail there).
          room_for(g->results, g->active.size() + 1);
          // Jobs scheduled from outside the group's own jobs are its seeds, even when canceled at once.
          const JobCore* parent = running_job();
          job.seed = !is_rerun && !(parent != nullptr && parent->group_core() == g);
          job.grouped = true;
          entered_group = g;
          group_before = g->state;
          if (g->state == JobGroup::State::canceling) {
            canceled_at_once = true;
          } else {
            g->state = JobGroup::State::active;
            g->active.push_back(&job);
          }
        }
        if (has_listeners(job)) {
          post(job, PendingEvent::Kind::scheduled, JobEvent{job.owned(), {}, delay, nullptr});
        }
        if (canceled_at_once) {
          ended = finish_run(job, Status::cancel("the job's group is canceling"), to_start);
        } else if (delay.count() > 0) {
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
      } catch (...) {
        undo_schedule(job, entered_group, group_before, events_before);
        manager_lock.unlock();
        unlist_if_over(job);
        if ((job.load() & jw::joined) != 0) wake_joiners();
        throw;
      }
    }
    manager_lock.unlock();
  }
  start(to_start);
  deliver(job);
  if (ended.job != nullptr) complete(std::move(ended));
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
        {
          // Its run has started, or is still being handed over: the run ends it, unrun and
          // canceled, and join() waits for that (the rule it may hold is free by then). A re-run
          // asked for earlier is dropped: the cancel is the last word.
          std::lock_guard job_lock(job.lock);
          if (job.state() == JobState::waiting) {
            job.change(JobState::waiting, jw::canceled, jw::rerun);
            return false;
          }
        }
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
      impl(*scheduler_)
          .domain_.check_wait("join(job '" + job.job().name() + "')",
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
  const TaskState& here = state();
  if (here.job != &job || here.tasklet == nullptr || here.phase_of == nullptr) {
    throw IllegalState("yield_rule: call it from the run() of job '" + job.job().name() + "'");
  }
  return here.phase_of->yield_rule(*here.tasklet);
}

std::vector<RuleBlocker> Jobs::blockers(JobCore& job) {
  // Under the job's lock, as cancel's withdrawal: its run cannot be granted and gone meanwhile
  // without the table's lock, under which its request is looked up by its run.
  std::lock_guard job_lock(job.lock);
  if (job.state() != JobState::waiting || job.run == nullptr || scheduler_ == nullptr) return {};
  return impl(*scheduler_).domain_.table_.blockers_of(static_cast<const Tasklet*>(job.run));
}

bool Jobs::is_blocking(JobCore& job) {
  std::lock_guard job_lock(job.lock);
  if (job.state() != JobState::running || scheduler_ == nullptr) return false;
  Scheduler* const jobs_scheduler = scheduler_;
  // The tasklet of a request, when it is one of our jobs' (runs and completions; only runs hold
  // rules). Under the table's lock a request's tasklet is alive.
  const auto job_tasklet = [jobs_scheduler](const RuleRequest& request) -> const JobTasklet* {
    const auto* tasklet = static_cast<const Tasklet*>(request.owner());
    if (tasklet == nullptr || TaskletAccess::scheduler(*tasklet) != jobs_scheduler) return nullptr;
    return static_cast<const JobTasklet*>(tasklet);
  };
  std::size_t mine = 0;
  return impl(*scheduler_)
      .domain_.table_.has_conflicting_waiter_if(
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

void Jobs::end_unrun(JobCore& job, Tasklet& run, Status result) noexcept {
  {
    std::lock_guard job_lock(job.lock);
    if (job.run != &run || job.state() != JobState::waiting) return;  // taken back meanwhile
    job.run = nullptr;
    job.change(JobState::waiting, jw::started);
  }
  ToStart to_start;
  RunEnd ended;
  {
    std::lock_guard lock(mutex);
    ended = finish_run(job, std::move(result), to_start);
  }
  start(to_start);
  complete(std::move(ended));
}

// ---------------------------------------------------------------------------------------------
// One run

// The run's end holds the job (RunEnd::owner) until complete() is done with it; the registry holds it
// until then too, and complete() unlists it last.
Directive Jobs::run(JobCore& job, JobRun& run) noexcept {
  bool canceled = false;  // before the run started
  // Nothing starts once the manager shuts down: a run the shutdown's cancels have not reached yet
  // (a runner freed by canceling a running job takes the next one) ends unrun too.
  const bool stopping = stopping_.load(std::memory_order_acquire);
  {
    std::unique_lock job_lock(job.lock);
    const std::uint32_t word = job.load();
    if (job.run != &run || jw::phase(word) != JobState::waiting)
      return Directive::done;  // taken back meanwhile
    job.run = nullptr;
    canceled = (word & jw::canceled) != 0 || stopping;
    const bool suspended = suspended_.load(std::memory_order_acquire);
    if (!suspended || canceled) job.change(JobState::waiting, jw::started);
    if (suspended && !canceled) {
      // Waits again, from the start, holding nothing; resume() lets it in first.
      job_lock.unlock();
      if (auto* seam = before_holding_back.load(std::memory_order_acquire)) seam(job.job());
      ToStart let_in;
      {
        std::lock_guard lock(mutex);
        {
          std::lock_guard relock(job.lock);
          if ((job.load() & jw::canceled) != 0) {
            canceled = true;
            job.change(JobState::waiting, jw::started);
          } else {
            job.change(JobState::waiting, 0, jw::taken);
          }
        }
        if (!canceled) {
          release_group_slot(job, let_in);
          // A resume() since the look above has let the held jobs in already: this one waits
          // again at once instead of until the next resume().
          if (suspended_.load(std::memory_order_relaxed)) {
            held_entered_.push_back(&job);
          } else {
            enter_waiting(job, let_in);
          }
        }
      }
      start(let_in);
      if (!canceled) return Directive::done;
    }
  }

  bool go = false;
  std::exception_ptr no_monitor;  // out of memory for the plain monitor
  try {
    go = !canceled && job.hooks().should_run(job.job());
  } catch (...) {
  }
  const bool told = has_listeners(job);
  std::shared_ptr<ProgressMonitor> monitor;
  if (go) {
    if (told) {
      try {
        std::lock_guard lock(mutex);
        post(job, PendingEvent::Kind::about_to_run, JobEvent{job.owned(), {}, {}, nullptr});
      } catch (...) {
        // Out of memory for the event: the listeners are not told of it; the job runs.
      }
      deliver_before_run(job);
    }
    JobManager::ProgressProvider provider;
    std::shared_ptr<ProgressMonitor> group;
    int group_work = 0;
    if (has_provider_ || job.reports_to_group) {
      std::lock_guard lock(mutex);
      provider = provider_;
      if (const JobExtras* extras = job.made_extras(); extras != nullptr && job.reports_to_group) {
        group = extras->progress_group;
        group_work = extras->progress_work;
      }
    }
    if (group) {
      // A part of the group's monitor, which it keeps alive (the provider is not asked).
      try {
        ProgressMonitor* part = group->split(group_work).release();
        monitor = std::shared_ptr<ProgressMonitor>(part, [group](ProgressMonitor* made) { delete made; });
      } catch (...) {
        // Out of memory: the plain monitor below.
      }
    } else if (provider) {
      try {
        monitor = provider(job.job());
      } catch (...) {
        // As a null answer: the plain monitor below.
      }
    }
    try {
      if (!monitor) monitor = std::allocate_shared<ProgressMonitor>(Allocator<ProgressMonitor>{});
    } catch (...) {
      go = false;  // no monitor: the run cannot start
      no_monitor = std::current_exception();
    }
  }
  const auto release_rule = [] {
    // The run is over before the job says so: its rule is free by the time join() returns.
    const TaskState& here = state();
    if (here.phase_of != nullptr && here.tasklet != nullptr) here.phase_of->release_rule(*here.tasklet);
  };
  // The job holds its monitor while it runs (cancel() reaches it there); end_word() takes it back.
  ProgressMonitor* const running_monitor = monitor.get();
  if (go) {
    std::lock_guard job_lock(job.lock);
    if ((job.load() & jw::canceled) != 0) {
      canceled = true;
      go = false;
    } else {
      job.change(JobState::running, 0, jw::taken | jw::started);
      job.monitor = std::move(monitor);
    }
  }
  if (go) {
    if (Trace* traced = trace()) [[unlikely]]
      trace_state(*traced, job, "running");
  }
  if (!go) {
    release_rule();
    end_traced_phase();
    ToStart to_start;
    RunEnd ended;
    std::optional<Status> lost;
    if (canceled && !stopping) lost = lost_before_run(job);
    {
      std::lock_guard lock(mutex);
      const Status unrun = no_monitor
                               ? Status::error("out of memory for the job's progress monitor", no_monitor)
                           : lost      ? *std::move(lost)
                           : !canceled ? Status::cancel("should_run() said no")
                           : stopping  ? Status::cancel("the job manager shut down before it ran")
                                       : Status::cancel("canceled before it ran");
      ended = finish_run(job, unrun, to_start);
    }
    start(to_start);
    complete(std::move(ended));
    return Directive::done;
  }
  if (told) {
    try {
      std::lock_guard lock(mutex);
      post(job, PendingEvent::Kind::running, JobEvent{job.owned(), {}, {}, nullptr});
    } catch (...) {
      // As for about_to_run.
    }
    deliver_before_run(job);  // about_to_run and running are told before the run starts
  }

  return run_step(job, run, *running_monitor);
}

// In a run's phase, about to end the job: a trace being recorded gets the phase's slice now,
// before a join() can return and its caller stop the trace.
void Jobs::end_traced_phase() noexcept {
  if (TracedPhase* phase = state().traced_phase) [[unlikely]]
    phase->end("done");
}

Directive Jobs::go_on(JobCore& job, JobRun& run) noexcept {
  run.continuing = false;
  return run_step(job, run, *job.monitor);  // the job holds its monitor while it runs
}

Directive Jobs::run_step(JobCore& job, JobRun& run, ProgressMonitor& monitor) noexcept {
  TaskState& here = state();
  void* outer = here.job;
  here.job = &job;
  Status result;
  try {
    result = job.hooks().run(job.job(), monitor);
  } catch (const std::exception& error) {
    result = Status::error(error.what(), std::current_exception());
  } catch (...) {
    result = Status::error("unknown exception", std::current_exception());
  }
  TaskState& after = state();  // the run may have moved to another thread (begin_rule, yield_rule)
  after.job = outer;
  // Rules begun in run() and left open are released now, before join() can return, and fail the run.
  if (const std::string open = end_frames_above(after, after.phase_base); !open.empty()) {
    run.continuing = false;  // a run that goes on ends here instead
    if (!result.is_error()) {
      const std::string message = "job '" + job.job().name() + "' began " + open +
                                  " in run() and did not end it; rules begun in a run must be ended in it "
                                  "(they have been released)";
      result = Status::error(message, std::make_exception_ptr(RuleMismatch(message)));
    }
  }
  if (run.continuing) {
    if (run.then != Directive::sync) return run.then;
    run.continuing = false;
    const std::string message = "job '" + job.job().name() +
                                "' asked to go on in a sync phase (co_await sync()); jobs run on the "
                                "workers, which have no synchronous thread";
    result = Status::error(message, std::make_exception_ptr(IllegalState(message)));
  }
  // The run ends here: what run() kept for a next phase goes now, so that the next run starts anew.
  if (std::exchange(run.kept_steps, false)) {
    after.job = &job;
    job.hooks().drop_steps(job.job());
    after.job = outer;
  }
  if (result.finishes_later()) {
    std::optional<Status> now = finish_later(job, run);
    if (!now) return Directive::wait;
    result = std::move(*now);
  }
  end_started_run(job, std::move(result));
  return Directive::done;
}

std::optional<Status> Jobs::finish_later(JobCore& job, JobRun& run) noexcept {
  try {
    // The phase's own suspension: no Rescheduler, done() resumes it. The engine keeps the run
    // parked, holding its rule, on no worker.
    std::shared_ptr<Tasklet> owned =
        &run == &job.own_run ? std::shared_ptr<Tasklet>(job.owned(), &job.own_run) : run.shared_from_this();
    std::lock_guard lock(mutex);
    JobExtras& extras = job.extras();
    {
      std::lock_guard job_lock(job.lock);
      if ((job.load() & jw::done_called) != 0) {
        job.change(JobState::running, 0, jw::done_called);
        return std::move(extras.finished_with);  // done() came first: end with its result now
      }
    }
    extras.finishing_suspension = impl(*scheduler_).suspend(run);
    extras.finishing = std::move(owned);
    run.finishing = true;
    return std::nullopt;
  } catch (...) {
    return out_of_memory_result();  // the run ends now, with that error
  }
}

void Jobs::done(JobCore& job, Status result) {
  if (result.finishes_later()) {
    throw IllegalState("done(" + job.job().name() + "): a run's result cannot be to finish later");
  }
  std::shared_ptr<Tasklet> run;
  std::uint32_t suspension = 0;
  {
    std::lock_guard lock(mutex);
    JobExtras& extras = job.extras();
    if (!extras.finishing) {
      // Its run may still be in run(), about to return finish_later(): the result waits for it.
      std::lock_guard job_lock(job.lock);
      const std::uint32_t word = job.load();
      if (jw::phase(word) != JobState::running || (word & jw::done_called) != 0) {
        throw IllegalState("done(): job '" + job.job().name() +
                           "' has no run finishing later (its run did not return Status::finish_later(), "
                           "or done() was called already)");
      }
      extras.finished_with = std::move(result);
      job.change(JobState::running, jw::done_called);
      return;
    }
    {
      std::lock_guard job_lock(job.lock);
      job.change(JobState::running, jw::done_called);  // a second done() is refused
    }
    extras.finished_with = std::move(result);
    run = std::move(extras.finishing);
    suspension = extras.finishing_suspension;
  }
  // Perhaps before the run's phase has returned: the resume then waits for it (the sticky resume).
  impl(*scheduler_).resume(run, suspension, Directive::async);
}

void Jobs::finish_run_later(JobCore& job, JobRun& run) noexcept {
  run.finishing = false;
  Status result;
  {
    std::lock_guard lock(mutex);
    result = std::move(job.extras().finished_with);
    std::lock_guard job_lock(job.lock);
    job.change(JobState::running, 0, jw::done_called);  // this done() was for a run finishing later
  }
  end_started_run(job, std::move(result));
}

void Jobs::end_started_run(JobCore& job, Status result) noexcept {
  try {
    if (job.monitor) job.monitor->done();
  } catch (...) {
  }
  // The run is over before the job says so: its rule is free by the time join() returns.
  const TaskState& here = state();
  if (here.phase_of != nullptr && here.tasklet != nullptr) here.phase_of->release_rule(*here.tasklet);
  end_traced_phase();

  ToStart to_start;
  RunEnd ended;
  if (job.group_core() != nullptr) {
    // The job leaves its group as it ends, under one taking of the lock: once it is in state none
    // set_group() may change its group, and the slot and place it had must go back first.
    std::lock_guard lock(mutex);
    ended = end_word(job, std::move(result));
    finish_group(job, ended, to_start);
  } else {
    ended = end_word(job, std::move(result));
  }
  changed();
  start(to_start);
  complete(std::move(ended));

  std::shared_ptr<Domain> dying;
  if (dying_after_.load(std::memory_order_acquire) == &job) {
    std::lock_guard lock(mutex);
    dying = std::move(dying_);
    dying_after_.store(nullptr, std::memory_order_relaxed);
  }
  if (dying) dying->shut_down();  // the manager dropped inside this run: finish it now that it is over
}

}  // namespace tasklet::detail
