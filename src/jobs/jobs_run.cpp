// A job's run, as the phases of its JobRun on the manager's job scheduler: taking its turn, the
// monitor and the events before it, the job's own run(), finishing later, and the run's end.
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

namespace {

// In a run's phase: the run is over before the job says so, its rule is free by the time join()
// returns.
void release_run_rule() noexcept {
  const RunState& here = run_state();
  release_phase_rule(here);
}

}  // namespace

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
  // A hand-over on the timer thread (a delayed job whose sync scheduler is gone) does not tell
  // listeners there.
  if (timer_->runs_here()) {
    complete_off_timer(std::move(ended));
  } else {
    complete(std::move(ended));
  }
}

// The run's end holds the job (RunEnd::owner) until complete() is done with it; the registry holds it
// until then too, and complete() unlists it last.
Directive Jobs::run(JobCore& job, JobRun& run) noexcept {
  // Nothing starts once the manager shuts down: a run the shutdown's cancels have not reached yet
  // (a runner freed by canceling a running job takes the next one) ends unrun too.
  const bool stopping = stopping_.load(std::memory_order_acquire);
  const std::optional<bool> turn = take_turn(job, run, stopping);
  if (!turn) return Directive::done;
  bool canceled = *turn;  // before the run started
  bool go = false;
  try {
    go = !canceled && job.hooks().should_run(job.job());
  } catch (...) {
  }
  const bool told = has_listeners(job);
  std::shared_ptr<ProgressMonitor> monitor;
  std::exception_ptr no_monitor;  // out of memory for the plain monitor
  if (go) {
    if (told) tell_before_run(job, PendingEvent::Kind::about_to_run);
    monitor = monitor_for(job, no_monitor);
    go = monitor != nullptr;  // no monitor: the run cannot start
  }
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
  if (!go) return end_before_run(job, canceled, stopping, no_monitor);
  if (Trace* traced = trace()) [[unlikely]]
    trace_state(*traced, job, "running");
  if (told) tell_before_run(job, PendingEvent::Kind::running);  // both are told before the run starts
  return run_step(job, run, *running_monitor);
}

std::optional<bool> Jobs::take_turn(JobCore& job, JobRun& run, bool stopping) {
  std::unique_lock job_lock(job.lock);
  const std::uint32_t word = job.load();
  if (job.run != &run || jw::phase(word) != JobState::waiting) return std::nullopt;  // taken back meanwhile
  job.run = nullptr;
  const bool canceled = (word & jw::canceled) != 0 || stopping;
  const bool suspended = suspended_.load(std::memory_order_acquire);
  if (!suspended || canceled) {
    job.change(JobState::waiting, jw::started);
    return canceled;
  }
  job_lock.unlock();
  if (!hold_back(job)) return std::nullopt;
  return true;
}

// The manager is suspended: the job waits again, from the start, holding nothing; resume() lets it
// in first. True when it was canceled meanwhile (its run ends it, unrun).
bool Jobs::hold_back(JobCore& job) {
  if (auto* seam = before_holding_back.load(std::memory_order_acquire)) seam(job.job());
  ToStart let_in;
  bool canceled = false;
  {
    std::lock_guard lock(mutex);
    {
      std::lock_guard relock(job.lock);
      canceled = (job.load() & jw::canceled) != 0;
      if (canceled) {
        job.change(JobState::waiting, jw::started);
      } else {
        job.change(JobState::waiting, 0, jw::taken);
      }
    }
    if (!canceled) {
      release_group_slot(job, let_in);
      // A resume() since the look above has let the held jobs in already: this one waits again at
      // once instead of until the next resume().
      if (suspended_.load(std::memory_order_relaxed)) {
        held_entered_.push_back(&job);
      } else {
        enter_waiting(job, let_in);
      }
    }
  }
  start(let_in);
  return canceled;
}

// The run's monitor: a part of its progress group's monitor (which the part keeps alive; the
// provider is not asked), or the provider's, or a plain one. Null, with the failure in
// `no_monitor`, when there is no memory even for the plain one.
std::shared_ptr<ProgressMonitor> Jobs::monitor_for(JobCore& job, std::exception_ptr& no_monitor) noexcept {
  std::shared_ptr<ProgressMonitor> monitor;
  try {
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
      ProgressMonitor* part = group->split(group_work).release();
      monitor = std::shared_ptr<ProgressMonitor>(part, [group](ProgressMonitor* made) { delete made; });
    } else if (provider) {
      monitor = provider(job.job());
    }
  } catch (...) {
    // Out of memory, or the provider threw (as a null answer): the plain monitor below.
  }
  try {
    if (!monitor) monitor = std::allocate_shared<ProgressMonitor>(Allocator<ProgressMonitor>{});
  } catch (...) {
    no_monitor = std::current_exception();
  }
  return monitor;
}

void Jobs::tell_before_run(JobCore& job, PendingEvent::Kind kind) noexcept {
  try {
    std::lock_guard lock(mutex);
    post(job, kind, JobEvent{job.owned(), {}, {}, nullptr});
  } catch (...) {
    // Out of memory for the event: the listeners are not told of it; the job runs.
  }
  deliver_before_run(job);
}

Directive Jobs::end_before_run(JobCore& job, bool canceled, bool stopping,
                               const std::exception_ptr& no_monitor) noexcept {
  release_run_rule();
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

// In a run's phase, about to end the job: a trace being recorded gets the phase's slice now,
// before a join() can return and its caller stop the trace.
void Jobs::end_traced_phase() noexcept {
  if (TracedPhase* phase = run_state().traced_phase) [[unlikely]]
    phase->end("done");
}

Directive Jobs::go_on(JobCore& job, JobRun& run) noexcept {
  run.continuing = false;
  return run_step(job, run, *job.monitor);  // the job holds its monitor while it runs
}

Directive Jobs::run_step(JobCore& job, JobRun& run, ProgressMonitor& monitor) noexcept {
  Status result;
  try {
    const FrameScope frame(extension_run, &job);
    result = job.hooks().run(job.job(), monitor);
  } catch (const std::exception& error) {
    result = Status::error(error.what(), std::current_exception());
  } catch (...) {
    result = Status::error("unknown exception", std::current_exception());
  }
  RunState& after = run_state();  // the run may have moved to another thread (begin_rule, yield_rule)
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
    if (run.then != Directive::sync || job.on_sync_thread()) return run.then;
    run.continuing = false;
    const std::string message = "job '" + job.job().name() +
                                "' asked to go on in a sync phase (co_await sync()); its runs happen on "
                                "the workers, which have no synchronous thread (see set_sync_scheduler)";
    result = Status::error(message, std::make_exception_ptr(IllegalState(message)));
  }
  // The run ends here: what run() kept for a next phase goes now, so that the next run starts anew.
  if (std::exchange(run.kept_steps, false)) {
    const FrameScope frame(extension_run, &job);
    job.hooks().drop_steps(job.job());
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
    // On the scheduler running this phase: the job scheduler, or the job's sync scheduler.
    extras.finishing_suspension = detail::suspend(*phase_scheduler(run_state()), run);
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
  if (job.on_sync_thread()) {
    const std::shared_ptr<Scheduler> target = sync_target(job);
    if (target == nullptr) {
      throw IllegalState("done(): the scheduler job '" + job.job().name() +
                         "' finishes on has been destroyed");
    }
    detail::resume(*target, run, suspension, Directive::sync);
    return;
  }
  detail::resume(*scheduler_, run, suspension, Directive::async);
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
  release_run_rule();
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
