#include "jobs.hpp"

#include <time.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "scheduler_impl.hpp"
#include "tasklet/error.hpp"
#include "tasklet_state.hpp"

namespace tasklet::detail {

namespace jw = job_word;

Directive JobRun::task() {
  core_.jobs().run(core_, *this);
  return Directive::done;
}

JobExtras& JobCore::extras() {
  if (!extras_) extras_ = std::make_unique<JobExtras>();
  return *extras_;
}

std::uint32_t JobCore::change(JobState phase, std::uint32_t set, std::uint32_t clear) noexcept {
  std::uint32_t old = word.load(std::memory_order_relaxed);
  while (!word.compare_exchange_weak(old, (jw::with_phase(old, phase) | set) & ~clear,
                                     std::memory_order_acq_rel, std::memory_order_relaxed)) {
  }
  return old;
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

// In microseconds of the monotonic clock's coarse reading (a few milliseconds' resolution, against
// priority delays of 50 ms and more), which costs a fraction of a precise one.
std::int64_t deadline_for(Priority priority) {
  std::int64_t now = 0;
#ifdef CLOCK_MONOTONIC_COARSE
  timespec coarse{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &coarse);
  now = std::int64_t{coarse.tv_sec} * 1'000'000 + coarse.tv_nsec / 1'000;
#else
  now = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count();
#endif
  return now + std::chrono::duration_cast<std::chrono::microseconds>(priority_delay(priority)).count();
}

bool in_family(const Job& job, Family family) {
  if (family == nullptr) return true;
  try {
    return job.belongs_to(family);
  } catch (...) {
    return false;
  }
}

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  if (timeout == std::chrono::milliseconds::max()) return Clock::time_point::max();
  const Clock::time_point now = Clock::now();
  return timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now)
             ? Clock::time_point::max()
             : now + timeout;
}

// Holds a count up while somebody waits for changes of the registry (ends notify only then).
class Watching {
 public:
  explicit Watching(std::atomic<int>& watchers) noexcept : watchers_(watchers) { watchers_.fetch_add(1); }
  ~Watching() { watchers_.fetch_sub(1); }
  Watching(const Watching&) = delete;
  Watching& operator=(const Watching&) = delete;

 private:
  std::atomic<int>& watchers_;
};

}  // namespace

Jobs::Jobs(Scheduler& scheduler) : scheduler_(&scheduler) {}

Jobs::~Jobs() {
  // The manager shut us down before it let go; this is only the timer thread's last chance.
  {
    std::lock_guard lock(mutex);
    timer_stopping_ = true;
  }
  timer_changed_.notify_all();
  if (timer_.joinable()) timer_.join();
}

void Jobs::shutdown() noexcept {
  std::vector<std::shared_ptr<Job>> pending;
  {
    std::lock_guard lock(mutex);
    if (stopping_.exchange(true)) return;
    timer_stopping_ = true;
  }
  timer_changed_.notify_all();
  if (timer_.joinable()) timer_.join();
  try {
    pending = find(nullptr);
  } catch (...) {
  }
  for (auto& job : pending) job->cancel();
  // Not for what this code is inside of: its own run, or the end of a run (a done listener).
  std::size_t mine = runs_a_job_here() ? 1 : 0;
  for (const CallFrame* call = state().completing_run; call != nullptr; call = call->outer) {
    if (call->owner == this) ++mine;
  }
  const auto listed = [this] {
    std::size_t count = 0;
    for (const Shard& shard : shards_) {
      std::lock_guard lock(shard.mutex);
      count += shard.count;
    }
    return count;
  };
  const Watching watching(watchers_);
  std::unique_lock lock(mutex);
  changed_.wait(lock, [&] { return listed() <= mine; });
}

Jobs::Registrations Jobs::detach() noexcept {
  Registrations registrations;
  std::lock_guard lock(mutex);
  detached_ = true;
  scheduler_ = nullptr;
  registrations.listeners.swap(listeners_);
  registrations.provider.swap(provider_);
  has_provider_ = false;
  held_.clear();
  held_entered_.clear();
  return registrations;
}

bool Jobs::runs_a_job_here() const noexcept {
  const JobCore* job = running_job();
  return job != nullptr && &job->jobs() == this;
}

void Jobs::destroy_after_this_run(std::shared_ptr<Domain> domain) noexcept {
  shutdown();
  std::lock_guard lock(mutex);
  dying_ = std::move(domain);
  dying_after_.store(running_job(), std::memory_order_release);
}

void Jobs::schedule_refused(const Job& job) const {
  throw IllegalState("schedule: job '" + job.name() + "' belongs to a job manager that " +
                     (detached_ ? "has been destroyed" : "is shutting down"));
}

// ---------------------------------------------------------------------------------------------
// The registry of live jobs

void Jobs::list(JobCore& job, std::shared_ptr<Job> owner) {
  Shard& shard = shard_of(job);
  std::lock_guard lock(shard.mutex);
  if (job.listed) return;
  job.listed = true;
  job.keep_alive = std::move(owner);
  job.prev = nullptr;
  job.next = shard.head;
  if (shard.head != nullptr) shard.head->prev = &job;
  shard.head = &job;
  ++shard.count;
}

// A job leaves the registry once its end is complete and it is not about to run again; a schedule()
// that made it waiting meanwhile keeps it (it reads the state under the shard's lock).
void Jobs::unlist_if_over(JobCore& job) {
  std::shared_ptr<Job> owner;  // dropped outside the lock: it may be the last reference
  {
    Shard& shard = shard_of(job);
    std::lock_guard lock(shard.mutex);
    const std::uint32_t word = job.load();
    if (!job.listed || jw::phase(word) != JobState::none || (word & jw::rerun_pending) != 0) return;
    job.listed = false;
    if (job.prev != nullptr) {
      job.prev->next = job.next;
    } else {
      shard.head = job.next;
    }
    if (job.next != nullptr) job.next->prev = job.prev;
    --shard.count;
    owner = std::move(job.keep_alive);
  }
  changed();
}

template <class Visit>
void Jobs::for_each_listed(Visit&& visit) const {
  for (const Shard& shard : shards_) {
    std::lock_guard lock(shard.mutex);
    for (JobCore* job = shard.head; job != nullptr; job = job->next) visit(*job);
  }
}

void Jobs::changed() noexcept {
  if (watchers_.load() == 0) return;
  std::lock_guard lock(mutex);
  ++changes_;
  changed_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// Entering and leaving the states

// Gives back a job's group slot (it goes to sleep, or waits out a suspension) and lets the next
// throttled job of the group in. Under `mutex`.
void Jobs::release_group_slot(JobCore& job, ToStart& to_start) {
  if (!job.holds_group_slot) return;
  job.holds_group_slot = false;
  JobCore* next = nullptr;
  {
    GroupCore& g = *job.group_core();
    std::lock_guard group_lock(g.mutex);
    --g.running;
    if (g.state != JobGroup::State::canceling && !g.throttled.empty() && g.admits()) {
      next = g.throttled.front();
      g.throttled.pop_front();
    }
  }
  if (next != nullptr) enter_waiting(*next, to_start);
}

// The job is waiting: it waits out a suspension or for its group's slot, or its run goes to the
// job scheduler (start(), outside the lock). Under `mutex`.
void Jobs::enter_waiting(JobCore& job, ToStart& to_start) {
  {
    std::lock_guard job_lock(job.lock);
    job.change(JobState::waiting);
  }
  if (suspended_.load(std::memory_order_relaxed)) {
    held_.push_back(&job);
    return;
  }
  if (GroupCore* g = job.group_core()) {
    std::lock_guard group_lock(g->mutex);
    if (!g->admits()) {
      g->throttled.push_back(&job);
      return;
    }
    ++g->running;
    job.holds_group_slot = true;
  }
  {
    std::lock_guard job_lock(job.lock);
    job.change(JobState::waiting, jw::taken);
  }
  to_start.push_back(&job);
}

void Jobs::start(ToStart& to_start) {
  for (JobCore* job : to_start) hand_over(*job);
  to_start.clear();
}

// Hands a waiting job's run to the job scheduler (the job is `taken`). A cancel() meanwhile could
// not take back a run that is in no queue yet: the run is taken back now if it still can be (the
// hand-over ends the job), or else its run ends it. So a canceled job's rule is never taken after
// the job has ended. Such an end is completed on this thread, or, on the timer thread, by the job
// scheduler: listeners and group hooks never run on the timer thread (one of them may drop the
// manager, whose shutdown joins that thread).
std::shared_ptr<JobRun> Jobs::make_run(JobCore& job) {
  return std::allocate_shared<JobRun>(Allocator<JobRun>{}, job);
}

// Under the job's lock: the run takes the job's rule and priority, and is the job's run now.
void Jobs::attach_run(JobCore& job, JobRun& run) noexcept {
  run.prepare(job.priority, deadline_for(job.priority));
  if (job.rule) TaskletAccess::set_trusted_rule(run, job.rule);  // validated by set_rule
  job.run = &run;
}

void Jobs::hand_over(JobCore& job) {
  std::shared_ptr<Job> owner = job.owned();
  std::shared_ptr<JobRun> run;
  try {
    run = make_run(job);
  } catch (...) {
    // Out of memory: the job ends with the error instead of waiting forever.
    ToStart let_in;
    RunEnd end;
    {
      std::lock_guard lock(mutex);
      end = finish_run(job, Status::error("out of memory while starting the job", std::current_exception()),
                       let_in);
    }
    start(let_in);
    complete(std::move(end));
    return;
  }
  {
    std::lock_guard job_lock(job.lock);
    attach_run(job, *run);
  }
  submit_run(job, std::move(run));
}

void Jobs::submit_run(JobCore& job, std::shared_ptr<JobRun> run) {
  if (auto* seam = before_hand_over.load(std::memory_order_acquire)) seam(job.job());
  Tasklet* handed = run.get();
  scheduler_->schedule(std::move(run), Directive::async);
  // A cancel() from now on finds the run in the scheduler; one that came earlier left this bit.
  if ((job.load() & jw::canceled) == 0) return;
  ToStart let_in;
  RunEnd end;
  {
    // Under the lock cancel() takes it back under: the run is freed once it is taken back.
    std::lock_guard lock(mutex);
    {
      std::lock_guard job_lock(job.lock);
      if (job.run != handed || (job.load() & jw::canceled) == 0 || !impl(*scheduler_).withdraw(*handed))
        return;
      job.run = nullptr;
    }
    end = finish_run(job, Status::cancel(), let_in);
  }
  start(let_in);
  if (timer_thread_of == this) {
    complete_off_timer(std::move(end));
  } else {
    complete(std::move(end));
  }
}

namespace {
// Completes the end of a run on the job scheduler (interactive: first in line).
class EndCompletion final : public JobTasklet {
 public:
  EndCompletion(Jobs& jobs, RunEnd end) : jobs_(jobs), end_(std::move(end)) {}
  Directive task() override {
    jobs_.complete(std::move(end_));
    return Directive::done;
  }

 private:
  Jobs& jobs_;
  RunEnd end_;
};
}  // namespace

void Jobs::complete_off_timer(RunEnd end) {
  std::shared_ptr<EndCompletion> completion;
  try {
    completion = std::make_shared<EndCompletion>(*this, std::move(end));
  } catch (...) {  // out of memory: completed here rather than lost
    complete(std::move(end));
    return;
  }
  completion->prepare(Priority::interactive, 0);
  scheduler_->schedule(std::move(completion), Directive::async);
}

// Takes a waiting job out of wherever it waits: true when it is out (and its run, if it had one,
// ended unrun). False when its run cannot be taken back: it has started, or it is still being
// handed to the scheduler (hand_over() looks at it again then). Under `mutex`.
bool Jobs::withdraw_waiting(JobCore& job) {
  for (auto* queue : {&held_entered_, &held_}) {
    const auto held = std::find(queue->begin(), queue->end(), &job);
    if (held != queue->end()) {
      queue->erase(held);
      return true;
    }
  }
  if (GroupCore* g = job.group_core()) {
    std::lock_guard group_lock(g->mutex);
    const auto found = std::find(g->throttled.begin(), g->throttled.end(), &job);
    if (found != g->throttled.end()) {
      g->throttled.erase(found);
      return true;
    }
  }
  // Handed to the job scheduler: its request is taken back if it still waits in the rule table, or
  // its run if it was granted and waits for a worker (which frees the rule now).
  std::lock_guard job_lock(job.lock);
  if (job.state() != JobState::waiting) return false;  // its run began, or ended, meanwhile
  if ((job.load() & jw::taken) == 0) return true;
  if (job.run == nullptr || scheduler_ == nullptr || !impl(*scheduler_).withdraw(*job.run)) return false;
  job.run = nullptr;
  job.change(JobState::waiting, 0, jw::taken);
  return true;
}

// Throttled jobs of the group that its max_threads lets in now (under the group's lock).
std::vector<JobCore*> Jobs::take_admissible(GroupCore& group) {
  std::vector<JobCore*> let_in;
  while (group.state != JobGroup::State::canceling && !group.throttled.empty() &&
         group.admits(static_cast<int>(let_in.size()))) {
    let_in.push_back(group.throttled.front());
    group.throttled.pop_front();
  }
  return let_in;
}

// The state word's part of a run's end: state none, result kept, ends counted, joiners told.
RunEnd Jobs::end_word(JobCore& job, Status result) {
  RunEnd end;
  end.job = &job;
  end.owner = job.owned();
  std::uint32_t old = 0;
  {
    std::lock_guard job_lock(job.lock);
    old = job.load();
    end.rerun = (old & jw::rerun) != 0 && !stopping_.load(std::memory_order_relaxed);
    end.rerun_delay = job.rerun_delay;
    job.monitor = nullptr;
    job.run = nullptr;
    job.result = result.is_ok() ? nullptr : std::make_unique<Status>(result);
    // A joiner may set `joined` meanwhile (without the lock): the swap must see it.
    std::uint32_t next = 0;
    do {
      next = jw::with_phase(old, JobState::none) + jw::one_end;
      next &= ~(jw::taken | jw::started | jw::canceled | jw::rerun | jw::canceling_called | jw::joined);
      if (end.rerun) next |= jw::rerun_pending;
    } while (
        !job.word.compare_exchange_weak(old, next, std::memory_order_acq_rel, std::memory_order_acquire));
  }
  end.done = JobEvent{end.owner, std::move(result), std::chrono::milliseconds{0}, nullptr};
  if ((old & jw::joined) != 0) {
    std::lock_guard lock(join_mutex_);
    joined_.notify_all();
  }
  return end;
}

// The group's part of a run's end (under `mutex`): the job leaves the group's counts, and the group
// is over or lets its next jobs in.
void Jobs::finish_group(JobCore& job, RunEnd& end, ToStart& to_start) {
  GroupCore* g = job.group_core();
  if (g == nullptr) return;
  std::vector<JobCore*> let_in;
  {
    std::lock_guard group_lock(g->mutex);
    std::erase(g->active, &job);
    if (job.seed) ++g->seeds_done;
    job.seed = false;
    if (job.holds_group_slot) --g->running;
    job.holds_group_slot = false;
    const Status& result = end.done.result;
    g->results.push_back(result);
    if (result.is_error()) ++g->failed;
    if (result.is_canceled()) ++g->canceled;
    end.group = g;
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
      let_in = take_admissible(*g);
    }
  }
  for (JobCore* next : let_in) enter_waiting(*next, to_start);
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
  CallFrame frame{this, state().completing_run};
  state().completing_run = &frame;
  complete_run(end);
  state().completing_run = frame.outer;  // the listeners may have moved it to another thread
  if (end.rerun) {
    try {
      schedule(*end.job, end.rerun_delay, true);
    } catch (...) {
      std::lock_guard job_lock(end.job->lock);
      end.job->word.fetch_and(~jw::rerun_pending, std::memory_order_acq_rel);
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
      combined = Status::error("compute_group_result threw", std::current_exception());
    }
    {
      std::lock_guard group_lock(end.group->mutex);
      end.group->last_result = combined;
      end.group->state = JobGroup::State::none;
      end.group->failed = end.group->canceled = end.group->seeds_done = 0;
      end.group->changed.notify_all();
    }
    end.done.group_result = std::make_shared<const Status>(std::move(combined));
  } else if (end.group != nullptr && end.ask_should_cancel) {
    bool cancel_group = true;
    try {
      cancel_group =
          end.group->hooks.should_cancel(end.group->self, end.done.result, end.failed, end.canceled);
    } catch (...) {
    }
    // Canceling first: the jobs throttled while it decided are canceled, not let in.
    if (cancel_group) group_cancel(*end.group);
    ToStart to_start;
    {
      std::lock_guard lock(mutex);
      std::vector<JobCore*> let_in;
      {
        std::lock_guard group_lock(end.group->mutex);
        --end.group->deciding;
        let_in = take_admissible(*end.group);
      }
      for (JobCore* next : let_in) enter_waiting(*next, to_start);
    }
    start(to_start);
  }
  if (has_listeners(*end.job)) {
    {
      std::lock_guard lock(mutex);
      post(*end.job, PendingEvent::Kind::done, std::move(end.done));
    }
    deliver(*end.job);
  }
}

// ---------------------------------------------------------------------------------------------
// Job operations

void Jobs::schedule(JobCore& job, std::chrono::milliseconds delay, bool is_rerun) {
  if (delay.count() < 0) throw IllegalState("schedule(" + job.job().name() + "): the delay is negative");
  if (stopping_.load(std::memory_order_acquire) && !is_rerun) schedule_refused(job.job());
  bool wanted = false;
  try {
    wanted = job.hooks().should_schedule(job.job());
  } catch (...) {
    if (is_rerun) {
      std::lock_guard job_lock(job.lock);
      job.word.fetch_and(~jw::rerun_pending, std::memory_order_acq_rel);
    }
    throw;
  }
  const bool plain = delay.count() == 0 && job.group_core() == nullptr && !has_listeners(job);
  // A plain job's run is made ahead, so that it is handed over under this one taking of the lock.
  std::shared_ptr<JobRun> run = plain ? make_run(job) : nullptr;
  std::shared_ptr<Job> owner = job.owned();
  bool handing = false;
  {
    std::lock_guard job_lock(job.lock);
    const std::uint32_t word = job.load();
    if (is_rerun) job.word.fetch_and(~jw::rerun_pending, std::memory_order_acq_rel);
    if (!wanted) return;
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
    if (stopping_.load(std::memory_order_acquire)) schedule_refused(job.job());
    job.order.store(next_order_.fetch_add(1, std::memory_order_relaxed), std::memory_order_relaxed);
    // A plain job goes straight to the job scheduler, unless the manager is suspended.
    handing = plain && !suspended_.load(std::memory_order_acquire);
    if (handing) {
      job.change(JobState::waiting, jw::taken);
      attach_run(job, *run);
    } else {
      job.change(JobState::waiting);
    }
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
    std::lock_guard lock(mutex);
    if (plain) {
      // It found the manager suspended: it waits out the suspension.
      enter_waiting(job, to_start);
    } else {
      if (GroupCore* g = job.group_core()) {
        std::lock_guard group_lock(g->mutex);
        // Jobs scheduled from outside the group's own jobs are its seeds, even when canceled at once.
        const JobCore* parent = running_job();
        job.seed = !is_rerun && !(parent != nullptr && parent->group_core() == g);
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
        arm_timer(job, Clock::now() + delay);
      } else {
        enter_waiting(job, to_start);
      }
    }
  }
  start(to_start);
  deliver(job);
  if (ended.job != nullptr) complete(std::move(ended));
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
      case JobState::none:
        return true;
      case JobState::sleeping:
        ended = finish_run(job, Status::cancel(), to_start);
        break;
      case JobState::waiting:
        if (withdraw_waiting(job)) {
          ended = finish_run(job, Status::cancel(), to_start);
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
  if (jw::phase(seen) == JobState::none) return true;
  std::unique_lock lock(join_mutex_);
  const std::uint32_t now = job.word.fetch_or(jw::joined, std::memory_order_acq_rel);
  const std::uint32_t ends = seen / jw::one_end;
  if (now / jw::one_end != ends) return true;
  return joined_.wait_until(
      lock, deadline_after(timeout), [&] { return job.load() / jw::one_end != ends; }, this);
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

// ---------------------------------------------------------------------------------------------
// One run

void Jobs::run(JobCore& job, Tasklet& run) noexcept {
  const std::shared_ptr<Job> owner = job.owned();
  bool canceled = false;  // before the run started
  {
    std::unique_lock job_lock(job.lock);
    const std::uint32_t word = job.load();
    if (job.run != &run || jw::phase(word) != JobState::waiting) return;  // taken back meanwhile
    job.run = nullptr;
    canceled = (word & jw::canceled) != 0;
    const bool suspended = suspended_.load(std::memory_order_acquire);
    if (!suspended || canceled) job.change(JobState::waiting, jw::started);
    if (suspended && !canceled) {
      // Waits again, from the start, holding nothing; resume() lets it in first.
      job_lock.unlock();
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
          held_entered_.push_back(&job);
          release_group_slot(job, let_in);
        }
      }
      start(let_in);
      if (!canceled) return;
    }
  }

  bool go = false;
  try {
    go = !canceled && job.hooks().should_run(job.job());
  } catch (...) {
  }
  const bool told = has_listeners(job);
  std::shared_ptr<ProgressMonitor> monitor;
  if (go) {
    if (told) {
      {
        std::lock_guard lock(mutex);
        post(job, PendingEvent::Kind::about_to_run, JobEvent{owner, {}, {}, nullptr});
      }
      deliver_before_run(job);
    }
    JobManager::ProgressProvider provider;
    if (has_provider_) {
      std::lock_guard lock(mutex);
      provider = provider_;
    }
    try {
      if (provider) monitor = provider(job.job());
      if (!monitor) monitor = std::allocate_shared<ProgressMonitor>(Allocator<ProgressMonitor>{});
    } catch (...) {
      go = false;  // no monitor: the run cannot start
    }
  }
  const auto release_rule = [] {
    // The run is over before the job says so: its rule is free by the time join() returns.
    const TaskState& here = state();
    if (here.phase_of != nullptr && here.tasklet != nullptr) here.phase_of->release_rule(*here.tasklet);
  };
  if (go) {
    std::lock_guard job_lock(job.lock);
    if ((job.load() & jw::canceled) != 0) {
      canceled = true;
      go = false;
    } else {
      job.change(JobState::running, 0, jw::taken | jw::started);
      job.monitor = monitor;
    }
  }
  if (!go) {
    release_rule();
    ToStart to_start;
    RunEnd ended;
    {
      std::lock_guard lock(mutex);
      ended = finish_run(job, Status::cancel(canceled ? "canceled before it ran" : "should_run() said no"),
                         to_start);
    }
    start(to_start);
    complete(std::move(ended));
    return;
  }
  if (told) {
    {
      std::lock_guard lock(mutex);
      post(job, PendingEvent::Kind::running, JobEvent{owner, {}, {}, nullptr});
    }
    deliver_before_run(job);  // about_to_run and running are told before the run starts
  }

  TaskState& here = state();
  void* outer = here.job;
  here.job = &job;
  Status result;
  try {
    result = job.hooks().run(job.job(), *monitor);
  } catch (const std::exception& error) {
    result = Status::error(error.what(), std::current_exception());
  } catch (...) {
    result = Status::error("unknown exception", std::current_exception());
  }
  try {
    monitor->done();
  } catch (...) {
  }
  TaskState& after = state();  // the run may have moved to another thread (begin_rule, yield_rule)
  after.job = outer;
  // Rules begun in run() and left open are released now, before join() can return, and fail the run.
  if (const std::string open = end_frames_above(after, after.phase_base);
      !open.empty() && !result.is_error()) {
    const std::string message = "job '" + job.job().name() + "' began " + open +
                                " in run() and did not end it; rules begun in a run must be ended in it "
                                "(they have been released)";
    result = Status::error(message, std::make_exception_ptr(RuleMismatch(message)));
  }
  release_rule();

  ToStart to_start;
  RunEnd ended = end_word(job, std::move(result));
  changed();
  if (job.group_core() != nullptr) {
    std::lock_guard lock(mutex);
    finish_group(job, ended, to_start);
  }
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

// ---------------------------------------------------------------------------------------------
// Timer: delayed schedules and wake-ups, on one thread, sleeping until the earliest is due

void Jobs::start_timer_thread() {
  if (!timer_.joinable() && !timer_stopping_) timer_ = std::thread([this] { timer_loop(); });
  timer_changed_.notify_all();
}

void Jobs::arm_timer(JobCore& job, Clock::time_point when) {
  disarm_timer(job);
  JobExtras& extras = job.extras();
  extras.timer = timers_.emplace(when, &job);
  extras.has_timer = true;
  start_timer_thread();
}

void Jobs::disarm_timer(JobCore& job) {
  JobExtras* extras = job.made_extras();
  if (extras == nullptr || !extras->has_timer) return;
  timers_.erase(extras->timer);
  extras->has_timer = false;
}

std::optional<WaitTimer::Alarms::iterator> Jobs::wake_at(Clock::time_point when, Wakeup& wakeup) {
  std::lock_guard lock(mutex);
  if (timer_stopping_) return std::nullopt;
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

void Jobs::timer_loop() {
  timer_thread_of = this;
  std::unique_lock lock(mutex);
  while (!timer_stopping_) {
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
    JobCore& job = *timers_.begin()->second;
    timers_.erase(timers_.begin());
    job.extras().has_timer = false;
    ToStart to_start;
    if (job.state() == JobState::sleeping) enter_waiting(job, to_start);
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

std::vector<std::shared_ptr<Job>> Jobs::find(Family family) const {
  std::vector<std::pair<std::uint64_t, std::shared_ptr<Job>>> listed;
  for_each_listed([&](JobCore& job) {
    if (job.keep_alive) listed.emplace_back(job.order.load(std::memory_order_relaxed), job.keep_alive);
  });
  // In the order they were first scheduled (wake_up(family) keeps it).
  std::sort(listed.begin(), listed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::shared_ptr<Job>> members;
  members.reserve(listed.size());
  for (auto& [order, job] : listed) {
    if (in_family(*job, family)) members.push_back(std::move(job));  // user code, outside the locks
  }
  return members;
}

void Jobs::cancel(Family family) {
  for (const auto& job : find(family)) job->cancel();
}

void Jobs::sleep(Family family) {
  for (const auto& job : find(family)) job->sleep();
}

void Jobs::wake_up(Family family) {
  for (const auto& job : find(family)) job->wake_up();
}

bool Jobs::join(Family family, std::chrono::milliseconds timeout) {
  if (const JobCore* current = running_job(); current != nullptr && in_family(current->job(), family)) {
    throw IllegalState("join(family) from job '" + current->job().name() +
                       "' of that family would wait for itself");
  }
  const Clock::time_point deadline = deadline_after(timeout);
  const Watching watching(watchers_);
  for (;;) {
    std::uint64_t seen = 0;
    {
      std::lock_guard lock(mutex);
      seen = changes_;
    }
    // Membership is user code (belongs_to): decided outside the locks, then wait for any change.
    const std::vector<std::shared_ptr<Job>> members = find(family);
    const bool suspended = is_suspended();
    const bool busy = std::any_of(members.begin(), members.end(), [&](const auto& job) {
      const JobState now = job->state();
      if (suspended) return now == JobState::running;
      return true;  // listed: waiting, sleeping, running, or about to run again
    });
    if (!busy) return true;
    std::unique_lock lock(mutex);
    if (!changed_.wait_until(
            lock, deadline, [&] { return changes_ != seen; }, this))
      return false;
  }
}

void Jobs::suspend() {
  std::lock_guard lock(mutex);
  suspended_.store(true, std::memory_order_release);
}

void Jobs::resume() {
  ToStart to_start;
  {
    std::lock_guard lock(mutex);
    suspended_.store(false, std::memory_order_release);
    std::deque<JobCore*> held = std::move(held_entered_);
    held_entered_.clear();
    for (JobCore* job : held_) held.push_back(job);
    held_.clear();
    for (JobCore* job : held) {
      if (job->state() == JobState::waiting) enter_waiting(*job, to_start);
    }
  }
  start(to_start);
  changed();
}

bool Jobs::is_idle() const {
  bool idle = true;
  for_each_listed([&](JobCore& job) {
    const std::uint32_t word = job.load();
    const JobState now = jw::phase(word);
    if (now == JobState::waiting || now == JobState::running || (word & jw::rerun_pending) != 0) idle = false;
  });
  return idle;
}

void Jobs::group_cancel(GroupCore& group) {
  std::vector<std::shared_ptr<Job>> members;
  {
    std::lock_guard lock(mutex);
    std::lock_guard group_lock(group.mutex);
    if (group.state == JobGroup::State::none) return;
    group.state = JobGroup::State::canceling;
    for (JobCore* job : group.active) members.push_back(job->owned());
    for (JobCore* job : group.throttled) members.push_back(job->owned());
  }
  for (auto& job : members) job->cancel();
}

}  // namespace tasklet::detail
