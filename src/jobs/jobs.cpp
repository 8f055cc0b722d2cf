#include "jobs.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "context.hpp"
#include "domain.hpp"
#include "scheduler_impl.hpp"
#include "tasklet/error.hpp"

namespace tasklet::detail {

Directive JobTasklet::task() {
  if (completion) {
    jobs_.complete(std::move(*completion));
  } else {
    jobs_.run(*this);
  }
  return Directive::done;
}

namespace {

// The Jobs whose timer thread this is (timer_loop sets it): no user code runs there.
thread_local const Jobs* timer_thread_of = nullptr;

// Eclipse's priorities are deadlines: a job may start this much later than one that asked later.
std::chrono::microseconds priority_delay(Priority priority) {
  using std::chrono::milliseconds;
  switch (priority) {
    case Priority::interactive:
      return milliseconds{0};
    case Priority::short_job:
      return milliseconds{50};
    case Priority::long_job:
      return milliseconds{100};
    case Priority::build:
      return milliseconds{500};
    case Priority::decorate:
      return milliseconds{1000};
  }
  return milliseconds{100};
}

std::int64_t deadline_for(Priority priority) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch() +
                                                               priority_delay(priority))
      .count();
}

bool in_family(const Job& job, Family family) {
  if (family == nullptr) return true;
  try {
    return job.belongs_to(family);
  } catch (...) {
    return false;
  }
}

std::shared_ptr<Job> owned(Job& job) {
  std::shared_ptr<Job> self = job.weak_from_this().lock();
  if (!self) throw IllegalState("job '" + job.name() + "' is not owned by a std::shared_ptr");
  return self;
}

}  // namespace

Jobs::Jobs(Scheduler& scheduler) : scheduler_(&scheduler) {}

Jobs::~Jobs() {
  // The manager shut us down before it let go; this is only the timer thread's last chance.
  {
    std::lock_guard lock(mutex);
    stopping_ = true;
  }
  timer_changed_.notify_all();
  if (timer_.joinable()) timer_.join();
}

// Cancels what has not started, stops the timer, waits for running jobs (but the one whose run()
// is on this thread, when the manager is dropped inside it).
void Jobs::shutdown() noexcept {
  std::vector<std::shared_ptr<Job>> pending;
  {
    std::lock_guard lock(mutex);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [key, job] : live_) pending.push_back(job);
  }
  timer_changed_.notify_all();
  if (timer_.joinable()) timer_.join();
  for (auto& job : pending) cancel(*job);
  // Not for what this code is inside of: its own run, or the end of a run (a done listener).
  const Job* here = runs_a_job_here() ? running_job() : nullptr;
  int ending_here = 0;
  for (const CallFrame* call = detail::state().completing_run; call != nullptr; call = call->outer) {
    if (call->owner == this) ++ending_here;
  }
  std::unique_lock lock(mutex);
  changed_.wait(lock, [&] {
    return starting_ == 0 && ending_ <= ending_here &&
           (live_.empty() || (live_.size() == 1 && live_.count(here) == 1));
  });
}

Jobs::Registrations Jobs::detach() noexcept {
  Registrations registrations;
  std::lock_guard lock(mutex);
  detached_ = true;
  scheduler_ = nullptr;
  registrations.listeners.swap(listeners_);
  registrations.provider.swap(provider_);
  held_.clear();
  held_entered_.clear();
  return registrations;
}

bool Jobs::runs_a_job_here() const noexcept {
  const Job* job = running_job();
  return job != nullptr && job->impl_->jobs.get() == this;
}

void Jobs::destroy_after_this_run(std::shared_ptr<Domain> manager) noexcept {
  shutdown();
  std::lock_guard lock(mutex);
  dying_after_ = running_job();
  dying_ = std::move(manager);
}

void Jobs::schedule_refused(const Job& job) const {
  throw IllegalState("schedule: job '" + job.name() + "' belongs to a job manager that " +
                     (detached_ ? "has been destroyed" : "is shutting down"));
}

// ---------------------------------------------------------------------------------------------
// Entering and leaving the states

// Gives back a job's group slot (it goes to sleep, or waits out a suspension) and lets the next
// throttled job of the group in.
void Jobs::release_group_slot(Job& job, std::vector<std::shared_ptr<JobTasklet>>& to_start) {
  Job::Impl& state = job.impl();
  if (!state.holds_group_slot) return;
  state.holds_group_slot = false;
  std::shared_ptr<Job> next;
  {
    auto& g = state.group->impl();
    std::lock_guard group_lock(g.mutex);
    --g.running;
    if (g.state != JobGroup::State::canceling && !g.throttled.empty() && g.admits(state.group->max_threads())) {
      next = std::move(g.throttled.front());
      g.throttled.pop_front();
    }
  }
  if (next) enter_waiting(next, to_start);
}

void Jobs::enter_waiting(const std::shared_ptr<Job>& job,
                         std::vector<std::shared_ptr<JobTasklet>>& to_start) {
  Job::Impl& state = job->impl();
  state.state = JobState::waiting;
  if (suspended_) {
    held_.push_back(job);
    return;
  }
  if (JobGroup* group = state.group.get()) {
    std::lock_guard group_lock(group->impl().mutex);
    if (!group->impl().admits(group->max_threads())) {
      group->impl().throttled.push_back(job);
      return;
    }
    ++group->impl().running;
    state.holds_group_slot = true;
  }
  auto tasklet = std::make_shared<JobTasklet>(job, *this, deadline_for(state.priority));
  if (state.rule) tasklet->set_rule(state.rule);
  tasklet->set_name(job->name());
  state.tasklet = tasklet;
  to_start.push_back(std::move(tasklet));
  ++starting_;
}

// Hands the runs made under the lock to the job scheduler, outside it. A job canceled meanwhile
// could not be taken out of a queue its run was not in yet: it is taken out now (cancel() left it
// waiting, with cancel_requested), or, when a runner has its run already, that run ends it. So a
// canceled job's rule is never taken after the job has ended. Such an end is completed here, on
// the thread that started the run, or, on the timer thread, by the job scheduler: listeners and
// group hooks never run on the timer thread (one of them may drop the manager, whose shutdown
// joins that thread). shutdown waits for these hand-offs, so the scheduler outlives them.
void Jobs::start(std::vector<std::shared_ptr<JobTasklet>>& to_start) {
  if (to_start.empty()) return;
  const int started = static_cast<int>(to_start.size());
  if (auto* seam = before_hand_over.load(std::memory_order_acquire)) {
    for (const auto& tasklet : to_start) seam(*tasklet->job);
  }
  for (const auto& tasklet : to_start) scheduler_->schedule(tasklet, Directive::async);
  std::vector<RunEnd> canceled;
  std::vector<std::shared_ptr<JobTasklet>> let_in;
  {
    std::lock_guard lock(mutex);
    for (const auto& tasklet : to_start) {
      tasklet->handed = true;
      Job& job = *tasklet->job;
      Job::Impl& state = job.impl();
      if (state.tasklet != tasklet || !state.cancel_requested || state.about_to_run) continue;
      if (withdraw_waiting(job)) {
        canceled.push_back(finish_run(job, Status::cancel(), let_in));
      } else {
        state.about_to_run = true;  // a runner has it: its run ends it
      }
    }
    starting_ -= started;
    if (starting_ == 0) notify_changed();
  }
  to_start.clear();
  start(let_in);
  for (auto& end : canceled) {
    if (timer_thread_of != this) {
      complete(std::move(end));
      continue;
    }
    std::shared_ptr<JobTasklet> completion;
    try {
      completion = std::make_shared<JobTasklet>(end.job, *this, deadline_for(end.job->priority()));
      completion->set_name(end.job->name());
      completion->completion = std::move(end);
      scheduler_->schedule(completion, Directive::async);
    } catch (...) {  // out of memory: completed here rather than lost
      complete(completion && completion->completion ? *std::exchange(completion->completion, std::nullopt)
                                                    : std::move(end));
    }
  }
}

// Takes a waiting job out of wherever it waits: true when it is out (and its run, if it had one,
// ended unrun). False when its run cannot be taken back: a runner has it, or it is still being
// handed to the scheduler (start() looks at it again then); the job keeps its run.
bool Jobs::withdraw_waiting(Job& job) {
  Job::Impl& state = job.impl();
  for (auto* queue : {&held_entered_, &held_}) {
    auto held =
        std::find_if(queue->begin(), queue->end(), [&](const auto& entry) { return entry.get() == &job; });
    if (held != queue->end()) {
      queue->erase(held);
      return true;
    }
  }
  if (JobGroup* group = state.group.get()) {
    auto& throttled = group->impl().throttled;
    std::lock_guard group_lock(group->impl().mutex);
    auto found = std::find_if(throttled.begin(), throttled.end(),
                              [&](const auto& entry) { return entry.get() == &job; });
    if (found != throttled.end()) {
      throttled.erase(found);
      return true;
    }
  }
  // Let into the rule table: its request is taken back if it still waits there, or its run if it
  // was granted and waits for a runner (which frees the rule now).
  if (state.tasklet == nullptr) return true;
  if (!detail::impl(*scheduler_).withdraw(*state.tasklet)) return false;
  state.tasklet = nullptr;
  return true;
}

// Throttled jobs of the group that its max_threads lets in now (under the group's lock).
std::vector<std::shared_ptr<Job>> Jobs::take_admissible(JobGroup& group) {
  auto& g = group.impl();
  std::vector<std::shared_ptr<Job>> let_in;
  while (g.state != JobGroup::State::canceling && !g.throttled.empty() &&
         g.admits(group.max_threads(), static_cast<int>(let_in.size()))) {
    let_in.push_back(std::move(g.throttled.front()));
    g.throttled.pop_front();
  }
  return let_in;
}

// The job's run (or its wait to run) is over: state none, result kept, group told. Called under
// the lock; what needs user code (the group's hooks) or listeners is left in the returned RunEnd
// for complete(), outside the lock.
RunEnd Jobs::finish_run(Job& job, Status result, std::vector<std::shared_ptr<JobTasklet>>& to_start) {
  Job::Impl& state = job.impl();
  disarm_timer(job);
  state.state = JobState::none;
  state.about_to_run = false;
  state.cancel_requested = false;
  state.tasklet = nullptr;
  state.result = result;
  ++state.ends;
  ++ending_;  // until complete() has told the listeners
  RunEnd end;
  end.job = owned(job);
  end.rerun = state.rerun && !stopping_;
  end.rerun_delay = state.rerun_delay;
  state.rerun = false;
  end.done = JobEvent{end.job, result, std::chrono::milliseconds{0}, nullptr};

  if (JobGroup* group = state.group.get()) {
    auto& g = group->impl();
    std::vector<std::shared_ptr<Job>> let_in;
    {
      std::lock_guard group_lock(g.mutex);
      std::erase_if(g.active, [&](const auto& entry) { return entry.get() == &job; });
      if (state.seed) ++g.seeds_done;
      state.seed = false;
      if (state.holds_group_slot) --g.running;
      state.holds_group_slot = false;
      g.results.push_back(result);
      if (result.is_error()) ++g.failed;
      if (result.is_canceled()) ++g.canceled;
      end.group = state.group;
      end.group_over = g.active.empty() && g.throttled.empty() && g.seeds_done >= g.seeds_expected;
      if (end.group_over) {
        end.group_results = std::move(g.results);
        g.results.clear();
      } else {
        end.ask_should_cancel = !result.is_ok() && g.state == JobGroup::State::active;
      }
      end.failed = g.failed;
      end.canceled = g.canceled;
      // After a failure, should_cancel() decides (in complete()) before any job of the group is
      // let in: the throttled ones, and those scheduled meanwhile, which are throttled too.
      if (end.ask_should_cancel) {
        ++g.deciding;
      } else {
        let_in = take_admissible(*group);
      }
    }
    for (auto& next : let_in) enter_waiting(next, to_start);
  }
  if (end.rerun) {
    state.rerun_pending = true;  // still busy for join(family) and is_idle() until it is queued again
  } else {
    live_.erase(&job);
  }
  notify_changed();
  return end;
}

// The part of a run's end that runs user code: the group's hooks, then the done event.
void Jobs::complete(RunEnd end) {
  CallFrame frame{this, detail::state().completing_run};
  detail::state().completing_run = &frame;
  complete_run(std::move(end));
  detail::state().completing_run = frame.outer;  // the listeners may have moved it to another thread
  std::lock_guard lock(mutex);
  --ending_;
  if (stopping_) notify_changed();  // only shutdown waits for it
}

void Jobs::complete_run(RunEnd end) {
  if (end.group && end.group_over) {
    Status combined;
    try {
      combined = end.group->compute_group_result(end.group_results);
    } catch (...) {
      combined = Status::error("compute_group_result threw", std::current_exception());
    }
    {
      std::lock_guard group_lock(end.group->impl().mutex);
      auto& g = end.group->impl();
      g.last_result = combined;
      g.state = JobGroup::State::none;
      g.failed = g.canceled = g.seeds_done = 0;
      g.changed.notify_all();
    }
    end.done.group_result = std::make_shared<const Status>(std::move(combined));
  } else if (end.group && end.ask_should_cancel) {
    bool cancel_group = true;
    try {
      cancel_group = end.group->should_cancel(end.done.result, end.failed, end.canceled);
    } catch (...) {
    }
    // Canceling first: the jobs throttled while it decided are canceled, not let in.
    if (cancel_group) group_cancel(*end.group);
    std::vector<std::shared_ptr<JobTasklet>> to_start;
    {
      std::lock_guard lock(mutex);
      std::vector<std::shared_ptr<Job>> let_in;
      {
        std::lock_guard group_lock(end.group->impl().mutex);
        --end.group->impl().deciding;
        let_in = take_admissible(*end.group);
      }
      for (auto& next : let_in) enter_waiting(next, to_start);
    }
    start(to_start);
  }
  {
    std::lock_guard lock(mutex);
    post(*end.job, PendingEvent::Kind::done, std::move(end.done));
  }
  deliver(*end.job);
  if (end.rerun) {
    try {
      schedule(*end.job, end.rerun_delay, true);
    } catch (...) {
      std::lock_guard lock(mutex);
      end.job->impl().rerun_pending = false;
      live_.erase(end.job.get());
      notify_changed();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Job operations

void Jobs::schedule(Job& job, std::chrono::milliseconds delay, bool is_rerun) {
  if (delay.count() < 0) throw IllegalState("schedule(" + job.name() + "): the delay is negative");
  std::shared_ptr<Job> self = owned(job);
  {
    std::lock_guard lock(mutex);
    if (stopping_ && !is_rerun) schedule_refused(job);
  }
  const bool wanted = job.should_schedule();
  std::vector<std::shared_ptr<JobTasklet>> to_start;
  bool canceled_at_once = false;
  std::optional<RunEnd> ended;
  {
    std::unique_lock lock(mutex);
    Job::Impl& state = job.impl();
    if (is_rerun) {
      state.rerun_pending = false;
      if (!wanted) {
        live_.erase(&job);
        notify_changed();
        return;
      }
    } else if (!wanted) {
      return;
    }
    // Running, or about to (a cancel that could not take the run back lets it end the job, unrun):
    // once more after it ends.
    if (state.state == JobState::running || state.about_to_run || state.cancel_requested) {
      state.rerun = true;
      state.rerun_delay = delay;
      return;
    }
    if (state.state != JobState::none) return;  // already waiting or sleeping (even for a re-run)
    if (stopping_) schedule_refused(job);
    live_[&job] = self;
    if (JobGroup* group = state.group.get()) {
      std::lock_guard group_lock(group->impl().mutex);
      auto& g = group->impl();
      // Jobs scheduled from outside the group's own jobs are its seeds, even when canceled at once.
      Job* parent = running_job();
      state.seed = !is_rerun && !(parent != nullptr && parent->impl().group.get() == group);
      if (g.state == JobGroup::State::canceling) {
        canceled_at_once = true;
      } else {
        g.state = JobGroup::State::active;
        g.active.push_back(self);
      }
    }
    post(job, PendingEvent::Kind::scheduled, JobEvent{self, {}, delay, nullptr});
    if (canceled_at_once) {
      ended = finish_run(job, Status::cancel("the job's group is canceling"), to_start);
    } else if (delay.count() > 0) {
      state.state = JobState::sleeping;
      arm_timer(job, Clock::now() + delay);
    } else {
      enter_waiting(self, to_start);
    }
  }
  start(to_start);
  deliver(job);
  if (ended) complete(std::move(*ended));
}

bool Jobs::cancel(Job& job) {
  bool call_canceling = false;
  std::shared_ptr<ProgressMonitor> monitor;
  std::optional<RunEnd> ended;
  std::vector<std::shared_ptr<JobTasklet>> to_start;
  {
    std::lock_guard lock(mutex);
    Job::Impl& state = job.impl();
    switch (state.state) {
      case JobState::none:
        return true;
      case JobState::sleeping:
        ended = finish_run(job, Status::cancel(), to_start);
        break;
      case JobState::waiting:
        if (!state.about_to_run && withdraw_waiting(job)) {
          state.rerun = false;  // asked for while an earlier cancel was pending: this one wins
          ended = finish_run(job, Status::cancel(), to_start);
          break;
        }
        // A runner has its run, or is about to be given it: the run ends it, unrun and canceled,
        // and join() waits for that (the rule it may hold is free by then).
        state.cancel_requested = true;
        if (state.tasklet != nullptr && state.tasklet->handed) state.about_to_run = true;
        return false;
      case JobState::running:
        monitor = state.monitor;
        call_canceling = !state.canceling_called;
        state.canceling_called = true;
        break;
    }
  }
  if (monitor != nullptr) {
    monitor->set_canceled(true);
    if (call_canceling) {
      try {
        job.canceling();
      } catch (...) {
      }
    }
    return false;
  }
  start(to_start);
  if (ended) complete(std::move(*ended));
  return true;
}

namespace {
Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  if (timeout == std::chrono::milliseconds::max()) return Clock::time_point::max();
  const Clock::time_point now = Clock::now();
  return timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now)
             ? Clock::time_point::max()
             : now + timeout;
}
}  // namespace

// On a worker (a job joining another job) the wait suspends the task and leaves the runner limit,
// so the job joined can run even when every runner is taken by joiners.
bool Jobs::join(Job& job, std::chrono::milliseconds timeout) {
  if (running_job() == &job) {
    throw IllegalState("join: job '" + job.name() + "' cannot join itself");
  }
  std::unique_lock lock(mutex);
  Job::Impl& state = job.impl();
  if (state.state == JobState::none) return true;
  const std::uint64_t ends = state.ends;
  return changed_.wait_until(
      lock, deadline_after(timeout), [&] { return state.ends != ends; }, this);
}

bool Jobs::sleep(Job& job) {
  std::vector<std::shared_ptr<JobTasklet>> to_start;
  {
    std::lock_guard lock(mutex);
    Job::Impl& state = job.impl();
    switch (state.state) {
      case JobState::none:
        return true;
      case JobState::running:
        return false;
      case JobState::sleeping:
        disarm_timer(job);
        return true;
      case JobState::waiting:
        // About to run, or canceled and left to its run to end: nothing to put to sleep.
        if (state.about_to_run || state.cancel_requested || !withdraw_waiting(job)) return false;
        release_group_slot(job, to_start);
        state.state = JobState::sleeping;
        post(job, PendingEvent::Kind::sleeping, JobEvent{owned(job), {}, {}, nullptr});
        break;
    }
  }
  start(to_start);
  deliver(job);
  return true;
}

void Jobs::wake_up(Job& job, std::chrono::milliseconds delay) {
  std::vector<std::shared_ptr<JobTasklet>> to_start;
  {
    std::lock_guard lock(mutex);
    Job::Impl& state = job.impl();
    if (state.state != JobState::sleeping) return;
    disarm_timer(job);
    if (delay.count() > 0) {
      arm_timer(job, Clock::now() + delay);
      return;
    }
    post(job, PendingEvent::Kind::awake, JobEvent{owned(job), {}, {}, nullptr});
    enter_waiting(owned(job), to_start);
  }
  start(to_start);
  deliver(job);
}

bool Jobs::yield_rule(Job& job) {
  const TaskState& here = detail::state();
  if (here.job != &job || here.tasklet == nullptr || here.phase_of == nullptr) {
    throw IllegalState("yield_rule: call it from the run() of job '" + job.name() + "'");
  }
  return here.phase_of->yield_rule(*here.tasklet);
}

// ---------------------------------------------------------------------------------------------
// One run

void Jobs::run(JobTasklet& tasklet) noexcept {
  const std::shared_ptr<Job> job = tasklet.job;
  Job::Impl& state = job->impl();
  JobManager::ProgressProvider provider;
  bool canceled = false;  // before the run was handed to this runner
  {
    std::vector<std::shared_ptr<JobTasklet>> let_in;
    std::unique_lock lock(mutex);
    if (state.tasklet.get() != &tasklet || state.state != JobState::waiting)
      return;  // canceled or put to sleep
    state.tasklet = nullptr;
    if (suspended_ && !state.cancel_requested) {
      state.about_to_run = false;  // waits again, from the start
      held_entered_.push_back(job);  // waits holding nothing; resume() lets it in first
      release_group_slot(*job, let_in);
      lock.unlock();
      start(let_in);
      return;
    }
    state.about_to_run = true;
    provider = provider_;
    canceled = state.cancel_requested;
  }

  bool go = false;
  try {
    go = !canceled && job->should_run();
  } catch (...) {
  }
  std::shared_ptr<ProgressMonitor> monitor;
  std::vector<std::shared_ptr<JobTasklet>> to_start;
  std::optional<RunEnd> ended;
  if (go) {
    {
      std::lock_guard lock(mutex);
      post(*job, PendingEvent::Kind::about_to_run, JobEvent{job, {}, {}, nullptr});
    }
    deliver_before_run(*job);
    try {
      if (provider) monitor = provider(*job);
    } catch (...) {
    }
    if (!monitor) monitor = std::make_unique<ProgressMonitor>();
  }
  const auto release_rule = [] {
    // The run is over before the job says so: its rule is free by the time join() returns.
    const TaskState& here = detail::state();
    if (here.phase_of != nullptr && here.tasklet != nullptr) here.phase_of->release_rule(*here.tasklet);
  };
  {
    std::lock_guard lock(mutex);
    if (!go || state.cancel_requested) {
      release_rule();
      ended = finish_run(
          *job, Status::cancel(state.cancel_requested ? "canceled before it ran" : "should_run() said no"),
          to_start);
      go = false;
    } else {
      state.about_to_run = false;
      state.state = JobState::running;
      state.monitor = monitor;
      state.canceling_called = false;
      post(*job, PendingEvent::Kind::running, JobEvent{job, {}, {}, nullptr});
    }
  }
  if (!go) {
    deliver(*job);
    start(to_start);
    if (ended) complete(std::move(*ended));
    return;
  }
  deliver_before_run(*job);  // about_to_run and running are told before the run starts

  TaskState& here = detail::state();
  Job* outer = static_cast<Job*>(here.job);
  here.job = job.get();
  Status result;
  try {
    result = job->run(*monitor);
  } catch (const std::exception& error) {
    result = Status::error(error.what(), std::current_exception());
  } catch (...) {
    result = Status::error("unknown exception", std::current_exception());
  }
  try {
    monitor->done();
  } catch (...) {
  }
  TaskState& after = detail::state();  // the run may have moved to another thread (begin_rule, yield_rule)
  after.job = outer;
  // Rules begun in run() and left open are released now, before join() can return, and fail the run.
  if (const std::string open = end_frames_above(after, after.phase_base);
      !open.empty() && !result.is_error()) {
    const std::string message = "job '" + job->name() + "' began " + open +
                                " in run() and did not end it; rules begun in a run must be ended in it "
                                "(they have been released)";
    result = Status::error(message, std::make_exception_ptr(RuleMismatch(message)));
  }
  release_rule();

  {
    std::lock_guard lock(mutex);
    state.monitor = nullptr;
    ended = finish_run(*job, std::move(result), to_start);
  }
  start(to_start);
  complete(std::move(*ended));

  std::shared_ptr<Domain> dying;
  {
    std::lock_guard lock(mutex);
    if (dying_after_ == job.get()) {
      dying = std::move(dying_);
      dying_after_ = nullptr;
    }
  }
  if (dying) dying->shut_down();  // the manager dropped inside this run: finish it now that it is over
}

// ---------------------------------------------------------------------------------------------
// Listeners: per job, in order, one at a time, outside the lock

void Jobs::post(Job& job, PendingEvent::Kind kind, JobEvent event) {
  job.impl().events.push_back(PendingEvent{kind, std::move(event)});
}

namespace {

void call_listener(ListenerSlot& slot, const PendingEvent& pending) noexcept {
  // Counted before the removed flag is read, and remove_listener sets the flag before it reads the
  // count (both sequentially consistent): either it waits for this call, or this call sees it.
  slot.calls.fetch_add(1);
  if (!slot.removed.load()) {
    CallFrame frame{&slot, detail::state().listener_call};
    detail::state().listener_call = &frame;
    JobListener& listener = *slot.listener;
    try {
      switch (pending.kind) {
        case PendingEvent::Kind::scheduled:
          listener.scheduled(pending.event);
          break;
        case PendingEvent::Kind::about_to_run:
          listener.about_to_run(pending.event);
          break;
        case PendingEvent::Kind::running:
          listener.running(pending.event);
          break;
        case PendingEvent::Kind::done:
          listener.done(pending.event);
          break;
        case PendingEvent::Kind::sleeping:
          listener.sleeping(pending.event);
          break;
        case PendingEvent::Kind::awake:
          listener.awake(pending.event);
          break;
      }
    } catch (...) {
      // A listener's failure is its own; the job and the other listeners go on.
    }
    detail::state().listener_call = frame.outer;  // the call may have moved to another thread
  }
  slot.calls.fetch_sub(1);
  if (slot.removed.load()) slot.calls.notify_all();
}

}  // namespace

void Jobs::deliver(Job& job) noexcept {
  std::unique_lock lock(mutex);
  Job::Impl& state = job.impl();
  if (state.delivering) return;  // the thread delivering now will take our events too
  state.delivering = true;
  while (!state.events.empty()) {
    PendingEvent pending = std::move(state.events.front());
    state.events.pop_front();
    Listeners listeners = listeners_;
    listeners.insert(listeners.end(), state.listeners.begin(), state.listeners.end());
    lock.unlock();
    for (const auto& slot : listeners) call_listener(*slot, pending);
    listeners.clear();  // a removed listener may be destroyed here, outside the lock
    lock.lock();
  }
  state.delivering = false;
  delivered_.notify_all();
}

// Delivers the job's pending events, or waits while another thread does, so that about_to_run and
// running have been told before the run starts.
void Jobs::deliver_before_run(Job& job) noexcept {
  deliver(job);
  std::unique_lock lock(mutex);
  Job::Impl& state = job.impl();
  delivered_.wait(lock, [&] { return !state.delivering && state.events.empty(); });
}

// ---------------------------------------------------------------------------------------------
// Timer: delayed schedules and wake-ups, on one thread, sleeping until the earliest is due

void Jobs::start_timer_thread() {
  if (!timer_.joinable()) timer_ = std::thread([this] { timer_loop(); });
  timer_changed_.notify_all();
}

void Jobs::arm_timer(Job& job, Clock::time_point when) {
  Job::Impl& state = job.impl();
  disarm_timer(job);
  state.timer = timers_.emplace(when, owned(job));
  state.has_timer = true;
  start_timer_thread();
}

std::optional<WaitTimer::Alarms::iterator> Jobs::wake_at(Clock::time_point when, Wakeup& wakeup) {
  std::lock_guard lock(mutex);
  if (stopping_) return std::nullopt;
  auto alarm = alarms_.emplace(when, &wakeup);
  wakeup.alarm_armed = true;
  start_timer_thread();
  return alarm;
}

void Jobs::cancel_wake(Wakeup& wakeup, Alarms::iterator alarm) noexcept {
  std::lock_guard lock(mutex);
  if (!wakeup.alarm_armed) return;  // it fired (under this lock, so the wakeup is done with)
  alarms_.erase(alarm);
  wakeup.alarm_armed = false;
}

void Jobs::disarm_timer(Job& job) {
  Job::Impl& state = job.impl();
  if (!state.has_timer) return;
  timers_.erase(state.timer);
  state.has_timer = false;
}

void Jobs::timer_loop() {
  timer_thread_of = this;
  std::unique_lock lock(mutex);
  while (!stopping_) {
    Clock::time_point due = Clock::time_point::max();
    if (!timers_.empty()) due = timers_.begin()->first;
    if (!alarms_.empty()) due = std::min(due, alarms_.begin()->first);
    if (due == Clock::time_point::max()) {
      timer_changed_.wait(lock);
      continue;
    }
    const Clock::time_point now = Clock::now();
    if (now < due) {
      timer_changed_.wait_until(lock, due);
      continue;
    }
    // Timed waits whose time is up: woken under the lock, which they take before they end.
    while (!alarms_.empty() && alarms_.begin()->first <= now) {
      Wakeup* wakeup = alarms_.begin()->second;
      alarms_.erase(alarms_.begin());
      wakeup->alarm_armed = false;
      wakeup->wake();
    }
    if (timers_.empty() || timers_.begin()->first > now) continue;
    std::shared_ptr<Job> job = timers_.begin()->second;
    timers_.erase(timers_.begin());
    job->impl().has_timer = false;
    std::vector<std::shared_ptr<JobTasklet>> to_start;
    if (job->impl().state == JobState::sleeping) enter_waiting(job, to_start);
    lock.unlock();
    start(to_start);  // posts no event: those of the schedule() that armed it are told already
    lock.lock();
  }
  // Stopped: the timed waits still armed go on as thread waits (TaskCondition::wait_until).
  for (auto& [when, wakeup] : alarms_) {
    wakeup->alarm_armed = false;
    wakeup->wake();
  }
  alarms_.clear();
}

// ---------------------------------------------------------------------------------------------
// Families and the manager

void Jobs::notify_changed() noexcept {
  ++changes_;
  changed_.notify_all();
}

bool Jobs::is_live(const Job& job) const { return live_.count(&job) != 0; }

std::vector<std::shared_ptr<Job>> Jobs::find(Family family) const {
  std::vector<std::shared_ptr<Job>> snapshot;
  {
    std::lock_guard lock(mutex);
    for (const auto& [key, job] : live_) snapshot.push_back(job);
  }
  std::erase_if(snapshot, [&](const auto& job) { return !in_family(*job, family); });
  return snapshot;
}

void Jobs::cancel(Family family) {
  for (const auto& job : find(family)) cancel(*job);
}

void Jobs::sleep(Family family) {
  for (const auto& job : find(family)) sleep(*job);
}

void Jobs::wake_up(Family family) {
  for (const auto& job : find(family)) wake_up(*job, std::chrono::milliseconds{0});
}

bool Jobs::join(Family family, std::chrono::milliseconds timeout) {
  if (const Job* current = running_job(); current != nullptr && in_family(*current, family)) {
    throw IllegalState("join(family) from job '" + current->name() +
                       "' of that family would wait for itself");
  }
  const Clock::time_point deadline = deadline_after(timeout);
  for (;;) {
    // Membership is user code (belongs_to): decide it outside the lock, then wait for any change.
    std::vector<std::shared_ptr<Job>> members = find(family);
    std::unique_lock lock(mutex);
    const auto busy = [&] {
      return std::any_of(members.begin(), members.end(), [&](const auto& job) {
        const JobState now = job->impl().state;
        if (!is_live(*job)) return false;
        if (suspended_) return now == JobState::running;
        return now != JobState::none || job->impl().rerun_pending;
      });
    };
    if (!busy()) return true;
    const std::uint64_t seen = changes_;
    if (!changed_.wait_until(
            lock, deadline, [&] { return changes_ != seen; }, this))
      return false;
  }
}

void Jobs::suspend() {
  std::lock_guard lock(mutex);
  suspended_ = true;
}

void Jobs::resume() {
  std::vector<std::shared_ptr<JobTasklet>> to_start;
  {
    std::lock_guard lock(mutex);
    suspended_ = false;
    std::deque<std::shared_ptr<Job>> held = std::move(held_entered_);
    held_entered_.clear();
    for (auto& job : held_) held.push_back(std::move(job));
    held_.clear();
    for (auto& job : held) {
      if (job->impl().state == JobState::waiting) enter_waiting(job, to_start);
    }
  }
  start(to_start);
}

bool Jobs::is_suspended() const {
  std::lock_guard lock(mutex);
  return suspended_;
}

bool Jobs::is_idle() const {
  std::lock_guard lock(mutex);
  return std::none_of(live_.begin(), live_.end(), [](const auto& entry) {
    const JobState state = entry.second->impl().state;
    return state == JobState::waiting || state == JobState::running || entry.second->impl().rerun_pending;
  });
}

void Jobs::add_listener(std::shared_ptr<JobListener> listener) {
  std::lock_guard lock(mutex);
  add_to(listeners_, std::move(listener));
}

void Jobs::remove_listener(const std::shared_ptr<JobListener>& listener) {
  remove_from(listeners_, listener);
}

void Jobs::add_to(Listeners& listeners, std::shared_ptr<JobListener> listener) {
  if (listener) listeners.push_back(std::make_shared<ListenerSlot>(std::move(listener)));
}

void Jobs::remove_from(Listeners& listeners, const std::shared_ptr<JobListener>& listener) {
  Listeners removed;
  {
    std::lock_guard lock(mutex);
    for (auto slot = listeners.begin(); slot != listeners.end();) {
      if ((*slot)->listener == listener) {
        removed.push_back(std::move(*slot));
        slot = listeners.erase(slot);
      } else {
        ++slot;
      }
    }
  }
  for (const auto& slot : removed) {
    slot->removed.store(true);
    // Calls in progress elsewhere end first; the ones this code is inside of cannot.
    int mine = 0;
    for (const CallFrame* call = detail::state().listener_call; call != nullptr; call = call->outer) {
      if (call->owner == slot.get()) ++mine;
    }
    for (int now = slot->calls.load(); now > mine; now = slot->calls.load()) slot->calls.wait(now);
  }
}

void Jobs::set_progress_provider(JobManager::ProgressProvider provider) {
  std::lock_guard lock(mutex);
  provider_ = std::move(provider);
}

void Jobs::group_cancel(JobGroup& group) {
  std::vector<std::shared_ptr<Job>> members;
  {
    std::lock_guard lock(mutex);
    std::lock_guard group_lock(group.impl().mutex);
    if (group.impl().state == JobGroup::State::none) return;
    group.impl().state = JobGroup::State::canceling;
    members = group.impl().active;
    for (auto& job : group.impl().throttled) members.push_back(job);
  }
  for (auto& job : members) cancel(*job);
}

}  // namespace tasklet::detail
