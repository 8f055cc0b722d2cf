// The end of a job's run: its state word and kept result, its group's bookkeeping, and the
// completion that runs user code (the group's hooks, the listeners) and the re-run. Nothing here
// may fail for lack of memory once the end has begun: what cannot be made is left out, never the job.
#include <exception>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "jobs/jobs.hpp"
#include "tasklet/error.hpp"

namespace tasklet::detail {

namespace jw = job_word;

namespace {

// Made before anybody runs out of memory: an exception_ptr to a std::bad_alloc.
const std::exception_ptr out_of_memory_error = std::make_exception_ptr(std::bad_alloc());
Status kept_out_of_memory = Status::error("out of memory", out_of_memory_error);

}  // namespace

Status out_of_memory_result() noexcept { return kept_out_of_memory; }

void KeptResultDeleter::operator()(Status* kept) const noexcept {
  if (kept != &kept_out_of_memory) delete kept;
}

// Throttled jobs of the group that its max_threads lets in now (under the group's lock).
void Jobs::take_admissible(GroupCore& group, ToStart& let_in) noexcept {
  for (int more = 0;
       group.state != JobGroup::State::canceling && !group.throttled.empty() && group.admits(more); ++more) {
    let_in.push_back(*group.throttled.front());
    group.throttled.pop_front();
  }
}

// The state word's part of a run's end: state none, result kept, ends counted, joiners told.
RunEnd Jobs::end_word(JobCore& job, Status result) {
  RunEnd end;
  end.job = &job;
  // A job whose listeners have yet to hear this end stays `ending` until they have (complete()).
  const bool told = has_listeners(job);
  // The event is for the listeners and the group.
  const bool eventful = told || job.group_core() != nullptr;
  // Held until complete() is done with the job: once its state is none, a schedule() may run it
  // again and that run's end unlist it (the registry's reference) while this end is still completing.
  end.owner = job.owned();
  KeptResult kept;
  if (!result.is_ok()) {
    try {
      kept.reset(new Status(result));
    } catch (...) {
      kept.reset(&kept_out_of_memory);  // the job still ends, failed for lack of memory
    }
  }
  std::uint32_t old = 0;
  {
    std::lock_guard job_lock(job.lock);
    old = job.load();
    if ((old & jw::done_called) != 0) {
      // done() came while this run was in run(), which then did not return finish_later().
      try {
        result = Status::error("done() was called on job '" + job.job().name() +
                                   "' while its run() was running, and run() did not return "
                                   "Status::finish_later()",
                               std::make_exception_ptr(IllegalState("done() without finish_later()")));
        kept.reset(new Status(result));
      } catch (...) {
        kept.reset(&kept_out_of_memory);
      }
    }
    end.rerun = (old & jw::rerun) != 0 && !stopping_.load(std::memory_order_relaxed);
    end.rerun_delay = job.rerun_delay;
    end.monitor = std::move(job.monitor);  // a provider's monitor may run user code as it goes
    job.run = nullptr;
    job.result = std::move(kept);
    // Recorded before anyone can see the job over (a join() that returns, then stops the trace).
    if (Trace* traced = trace()) [[unlikely]]
      trace_state(*traced, job, "done", &result);
    // A joiner may set `joined` meanwhile (without the lock): the swap must see it.
    std::uint32_t next = 0;
    do {
      next = jw::with_phase(old, JobState::none) + jw::one_end;
      next &= ~(jw::taken | jw::started | jw::canceled | jw::rerun | jw::canceling_called | jw::joined |
                jw::done_called);
      if (end.rerun) next |= jw::rerun_pending;
      if (told) next |= jw::ending;
    } while (
        !job.word.compare_exchange_weak(old, next, std::memory_order_acq_rel, std::memory_order_acquire));
  }
  if (eventful) end.done = JobEvent{end.owner, std::move(result), std::chrono::milliseconds{0}, nullptr};
  if ((old & jw::joined) != 0) wake_joiners();
  return end;
}

// The group's part of a run's end (under `mutex`): the job leaves the group's counts, and the group
// is over or lets its next jobs in.
void Jobs::finish_group(JobCore& job, RunEnd& end, ToStart& to_start) {
  GroupCore* g = job.group_core();
  if (g == nullptr || !job.grouped) return;
  job.grouped = false;
  ToStart let_in;
  {
    std::lock_guard group_lock(g->mutex);
    std::erase(g->active, &job);
    if (job.seed) ++g->seeds_done;
    job.seed = false;
    if (job.holds_group_slot) --g->running;
    job.holds_group_slot = false;
    const Status& result = end.done.result;
    // schedule() made room for it when the job joined the group: only copying its message can fail.
    try {
      g->results.push_back(result);
    } catch (...) {
      g->results.push_back(out_of_memory_result());
    }
    if (result.is_error()) ++g->failed;
    if (result.is_canceled()) ++g->canceled;
    end.group = g;
    end.group_generation = g->generation;
    end.group_over = g->active.empty() && g->throttled.empty() && g->seeds_done >= g->seeds_expected;
    if (end.group_over) {
      end.group_results = std::move(g->results);
      g->results.clear();
    } else {
      end.ask_should_cancel = !result.is_ok() && g->state == JobGroup::State::active;
    }
    end.failed = g->failed;
    end.canceled = g->canceled;
    // After a failure, should_cancel() decides (in complete()) before any job of the group is let
    // in: the throttled ones, and those scheduled meanwhile, which are throttled too.
    if (end.ask_should_cancel) {
      ++g->deciding;
    } else {
      take_admissible(*g, let_in);
    }
  }
  while (JobCore* next = let_in.pop_front()) enter_waiting(*next, to_start);
}

// A run (or a wait to run) is over. Under `mutex`; what needs user code (the group's hooks) or
// listeners is left in the returned RunEnd for complete(), outside the lock. A re-run asked for
// after the last cancel() follows (a cancel drops the ones asked for before it).
RunEnd Jobs::finish_run(JobCore& job, Status result, ToStart& to_start) {
  disarm_timer(job);
  RunEnd end = end_word(job, std::move(result));
  finish_group(job, end, to_start);
  ++changes_;  // under `mutex`
  changed_.notify_all();
  return end;
}

// The part of a run's end that runs user code: the group's hooks, then the done event; then the
// re-run, or the job leaves the registry.
void Jobs::complete(RunEnd end) {
  {
    const FrameScope frame(completing_run, this);
    complete_run(end);
  }
  if ((end.job->load() & jw::ending) != 0) {  // only end_word() sets it, for this end
    // The end is told: a schedule() made while it was being told runs the job again now.
    std::lock_guard job_lock(end.job->lock);
    const std::uint32_t word = end.job->load();
    if ((word & jw::ending) != 0) {
      const bool late = (word & jw::rerun) != 0 && !end.rerun && !stopping_.load(std::memory_order_relaxed);
      if (late) {
        end.rerun = true;
        end.rerun_delay = end.job->rerun_delay;
      }
      const std::uint32_t old =
          end.job->change(JobState::none, late ? jw::rerun_pending : 0, jw::ending | jw::rerun);
      // A joiner waiting for a schedule() that a cancel() or the shutdown dropped meanwhile.
      if (!late && (old & jw::joined) != 0) wake_joiners();
    }
  }
  if (end.rerun) {
    try {
      schedule(*end.job, end.rerun_delay, true);
    } catch (...) {
      drop_rerun(*end.job);
    }
  }
  unlist_if_over(*end.job);
}

void Jobs::complete_run(RunEnd& end) {
  if (end.group != nullptr && end.group_over) {
    Status combined;
    try {
      combined = end.group->hooks.compute_group_result(end.group->self, end.group_results);
    } catch (...) {
      try {
        combined = Status::error("compute_group_result threw", std::current_exception());
      } catch (...) {
        combined = out_of_memory_result();
      }
    }
    // The listeners' copy first (out of memory, they hear of no group result); then the group's,
    // which is moved and cannot fail: the group is over whatever happens.
    try {
      end.done.group_result = std::make_shared<const Status>(combined);
    } catch (...) {
    }
    {
      std::lock_guard group_lock(end.group->mutex);
      end.group->last_result = std::move(combined);
      end.group->state = JobGroup::State::none;
      ++end.group->generation;
      end.group->failed = end.group->canceled = end.group->seeds_done = 0;
      end.group->changed.notify_all();
    }
  } else if (end.group != nullptr && end.ask_should_cancel) {
    bool cancel_group = true;
    try {
      cancel_group =
          end.group->hooks.should_cancel(end.group->self, end.done.result, end.failed, end.canceled);
    } catch (...) {
    }
    // Canceling first: the jobs throttled while it decided are canceled, not let in.
    if (cancel_group) {
      try {
        group_cancel(*end.group, end.group_generation);
      } catch (...) {
        // Out of memory: the group goes on uncanceled, and its throttled jobs are let in below.
      }
    }
    ToStart to_start;
    {
      std::lock_guard lock(mutex);
      ToStart let_in;
      {
        std::lock_guard group_lock(end.group->mutex);
        --end.group->deciding;
        take_admissible(*end.group, let_in);
      }
      while (JobCore* next = let_in.pop_front()) enter_waiting(*next, to_start);
    }
    start(to_start);
  }
  if (has_listeners(*end.job)) {
    try {
      std::lock_guard lock(mutex);
      post(*end.job, PendingEvent::Kind::done, std::move(end.done));
    } catch (...) {
      // Out of memory for the event: the listeners are not told of this end; the job ends all the
      // same (join() and the state say so).
    }
    deliver(*end.job);
  }
}

}  // namespace tasklet::detail
