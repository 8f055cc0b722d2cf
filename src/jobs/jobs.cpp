// The jobs' side of a manager: its life cycle, the registry of live jobs, and the changes of a job's
// state on the way into the job scheduler (jobs.hpp says what guards what; jobs_ends.cpp is the way
// out of a run).
#include "jobs/jobs.hpp"
#include "jobs/door.hpp"

#include <time.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "scheduler/door.hpp"
#include "tasklet/error.hpp"

namespace tasklet::detail {

namespace jw = job_word;

Directive JobRun::task() {
  if (finishing) {
    core_.jobs().finish_run_later(core_, *this);
    return Directive::done;
  }
  if (continuing) return core_.jobs().go_on(core_, *this);
  return core_.jobs().run(core_, *this);
}

void JobRun::go_on_in(Directive next) noexcept {
  auto& run = static_cast<JobRun&>(*run_state().tasklet);  // a job's run() runs in its JobRun's phase
  run.continuing = true;
  run.kept_steps = true;
  run.then = next;
}

void JobRun::dropped() noexcept {
  core_.jobs().end_unrun(core_, *this, Status::cancel("the scheduler it was to run on was destroyed"));
}

std::string JobRun::describe() const { return "job '" + core_.job().name() + "'"; }
std::string JobRun::job_name() const { return core_.job().name(); }

std::shared_ptr<Job> JobRun::job_of(const Tasklet* tasklet) {
  const auto* run = dynamic_cast<const JobRun*>(tasklet);
  return run != nullptr ? run->core_.owned() : nullptr;
}

std::shared_ptr<Job> job_of_run(const Tasklet* tasklet) { return JobRun::job_of(tasklet); }

void JobRun::abandoned(std::exception_ptr error) noexcept {
  std::string why = "out of memory before the job could start";
  try {
    std::rethrow_exception(error);
  } catch (const std::bad_alloc&) {
  } catch (const ManagerShutDown&) {
    // It waited for its rule when its manager shut down: canceled, as the jobs shutdown found.
    core_.jobs().end_unrun(core_, *this, Status::cancel("the job manager shut down before it ran"));
    return;
  } catch (const std::exception& failure) {
    why = "its rule could not be granted: " + std::string(failure.what());  // by a backend (etcd)
  } catch (...) {
    why = "its rule could not be granted";
  }
  core_.jobs().end_unrun(core_, *this, Status::error(why, error));
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

void Jobs::trace_state(Trace& trace, JobCore& job, const char* state, const Status* result) noexcept {
  try {
    const std::string& name = job.job().name();
    Trace::Args args{{"job", name}, {"state", state}};
    if (result != nullptr) {
      args.emplace_back("result", result->is_ok() ? "ok" : result->is_canceled() ? "cancel" : "error");
      if (!result->is_ok()) args.emplace_back("message", result->message);
    }
    trace.instant("job", "job '" + name + "': " + state, std::move(args));
  } catch (...) {
    // Out of memory: the trace misses this state.
  }
}

namespace {

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

}  // namespace

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  if (timeout == std::chrono::milliseconds::max()) return Clock::time_point::max();
  const Clock::time_point now = Clock::now();
  return timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now)
             ? Clock::time_point::max()
             : now + timeout;
}

Jobs::Jobs(Scheduler& scheduler)
    : scheduler_(&scheduler), domain_(&domain_of(scheduler)), timer_(domain_->timer()) {}

Jobs::~Jobs() {
  // The manager shut us down before it let go; this is only the alarm's last chance.
  {
    std::lock_guard lock(mutex);
    timer_closed_ = true;
  }
  timer_->cancel(due_alarm_);
}

void Jobs::stop() noexcept {
  std::vector<std::shared_ptr<Job>> pending;
  {
    std::lock_guard lock(mutex);
    if (stopping_.exchange(true)) return;
    timer_closed_ = true;
  }
  timer_->cancel(due_alarm_);  // waits for a ring in progress, which finds the timer closed
  try {
    pending = find(nullptr);
  } catch (...) {
  }
  for (auto& job : pending) job->cancel();
}

void Jobs::shutdown() noexcept {
  stop();
  {
    std::lock_guard lock(mutex);
    if (std::exchange(shut_down_, true)) return;
  }
  // Not for what this code is inside of: its own run, or the end of a run (a done listener).
  const std::size_t mine = (runs_a_job_here() ? 1U : 0U) + frames_of(completing_run, this);
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
  domain_ = nullptr;
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

void Jobs::wake_joiners() {
  std::lock_guard lock(join_mutex_);
  joined_.notify_all();
}

// A re-run that will not happen after all (refused, or not wanted): joiners waiting for it go on.
void Jobs::drop_rerun(JobCore& job) {
  std::uint32_t old = 0;
  {
    std::lock_guard job_lock(job.lock);
    old = job.word.fetch_and(~jw::rerun_pending, std::memory_order_acq_rel);
  }
  if ((old & jw::joined) != 0) wake_joiners();
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
  if (GroupCore* g = job.grouped ? job.group_core() : nullptr) {
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
  to_start.push_back(job);
}

void Jobs::start(ToStart& to_start) {
  while (JobCore* job = to_start.pop_front()) hand_over(*job);
}

// Hands a waiting job's run to the job scheduler (the job is `taken`). A cancel() meanwhile could
// not take back a run that is in no queue yet: the run is taken back now if it still can be (the
// hand-over ends the job), or else its run ends it. So a canceled job's rule is never taken after
// the job has ended. Such an end is completed on this thread, or, on the timer thread, by the job
// scheduler: listeners and group hooks never run on the timer thread (one of them may drop the
// manager, whose shutdown joins that thread).
// Under the job's lock, for a job about to be handed over: its own run, or a new one while the
// scheduler is still letting go of the own one. Throws std::bad_alloc before anything changed.
std::shared_ptr<JobRun> Jobs::take_run(JobCore& job, const std::shared_ptr<Job>& owner) {
  if (job.run != &job.own_run && !job.own_run.is_active()) return {owner, &job.own_run};
  return std::allocate_shared<JobRun>(Allocator<JobRun>{}, job);
}

// Under the job's lock: the run takes the job's rule and priority, and is the job's run now.
void Jobs::attach_run(JobCore& job, JobRun& run) noexcept {
  run.prepare(job.priority, deadline_for(job.priority));
  // Validated by set_rule; null too, as the run may be the job's own from a time it had a rule.
  TaskletAccess::set_trusted_rule(run, job.rule);
  run.continuing = false;
  job.run = &run;
}

void Jobs::hand_over(JobCore& job) {
  std::shared_ptr<Job> owner = job.owned();
  std::shared_ptr<JobRun> run;
  try {
    std::lock_guard job_lock(job.lock);
    run = take_run(job, owner);
    attach_run(job, *run);
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
  submit_run(job, std::move(run));
}

void Jobs::submit_run(JobCore& job, std::shared_ptr<JobRun> run) {
  if (auto* seam = before_hand_over.load(std::memory_order_acquire)) seam(job.job());
  Tasklet* handed = run.get();
  if (job.on_sync_thread()) [[unlikely]] {
    if (!submit_to_sync_thread(job, std::move(run))) return;
  } else {
    scheduler_->schedule(std::move(run), Directive::async);
  }
  // A cancel() from now on finds the run in the scheduler; one that came earlier left this bit.
  if ((job.load() & jw::canceled) == 0) return;
  ToStart let_in;
  RunEnd end;
  {
    // Under the lock cancel() takes it back under: the run is freed once it is taken back.
    std::lock_guard lock(mutex);
    {
      std::lock_guard job_lock(job.lock);
      if (job.run != handed || (job.load() & jw::canceled) == 0 || !withdraw_run(job, *handed)) return;
      job.run = nullptr;
    }
    end = finish_run(job, Status::cancel(), let_in);
  }
  start(let_in);
  if (timer_->runs_here()) {
    complete_off_timer(std::move(end));
  } else {
    complete(std::move(end));
  }
}

// A job on a scheduler's synchronous thread: its run is one of that scheduler's sync phases. False
// when it could not be handed there (that scheduler is gone, or out of memory): the job has ended.
bool Jobs::submit_to_sync_thread(JobCore& job, std::shared_ptr<JobRun> run) {
  Tasklet& handed = *run;
  const std::shared_ptr<Scheduler> target = sync_target(job);
  try {
    if (target == nullptr) throw IllegalState("the scheduler it runs on has been destroyed");
    target->schedule(std::move(run), Directive::sync);
    return true;
  } catch (const std::exception& failure) {
    end_unrun(job, handed,
              Status::error("job '" + job.job().name() +
                                "' could not be handed to its sync scheduler: " + failure.what(),
                            std::current_exception()));
  }
  return false;
}

void Jobs::check_sync_scheduler(const Scheduler& scheduler, const Job& job) const {
  if (domain_ != &domain_of(scheduler)) {
    throw std::invalid_argument("set_sync_scheduler(" + job.name() +
                                "): the scheduler belongs to another job manager than the job");
  }
  if (!has_synchronous_thread(scheduler)) {
    throw std::invalid_argument("set_sync_scheduler(" + job.name() +
                                "): the scheduler has no synchronous thread");
  }
}

std::shared_ptr<Scheduler> Jobs::sync_target(const JobCore& job) noexcept {
  const JobExtras* extras = job.made_extras();
  return extras != nullptr ? extras->sync_scheduler.lock() : nullptr;
}

bool Jobs::withdraw_run(const JobCore& job, Tasklet& run) {
  if (job.on_sync_thread()) {
    const std::shared_ptr<Scheduler> target = sync_target(job);
    return target != nullptr && withdraw(*target, run);
  }
  return scheduler_ != nullptr && withdraw(*scheduler_, run);
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
  // Out of memory to queue it: completed where the engine tells this, on a worker (or, with no memory
  // for that either, where it happened).
  void abandoned(std::exception_ptr /*error*/) noexcept override { jobs_.complete(std::move(end_)); }

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
  if (GroupCore* g = job.grouped ? job.group_core() : nullptr) {
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
  if (job.run == nullptr || !withdraw_run(job, *job.run)) return false;
  job.run = nullptr;
  job.change(JobState::waiting, 0, jw::taken);
  return true;
}

}  // namespace tasklet::detail
