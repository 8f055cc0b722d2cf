// Private: what the jobs layer keeps per job and per group.
//
// A job is a tasklet: each run is a JobRun, a tasklet whose only phase is that run, scheduled `async`
// on the manager's job scheduler with the job's rule (so the rule table orders it with every other
// holder) each time the job becomes waiting. The run is the one the job's core holds, handed over
// under the job's ownership; a job scheduled again the moment its run has ended, while the
// scheduler is still letting go of that run, gets a run of its own for once.
//
// A job's state is one word (JobCore::word): its JobState and what is pending on it. Every change
// of the word is made holding the job's own lock (JobCore::lock), except the `joined` bit, which a
// joiner sets atomically; readers (state(), join's first look) read it without a lock.
#pragma once

#include <any>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <oneapi/tbb/mutex.h>

#include "base/door.hpp"
#include "scheduler/door.hpp"
#include "tasklet/detail/allocator.hpp"
#include "tasklet/detail/library_tasklet.hpp"
#include "tasklet/job.hpp"
#include "tasklet/job_group.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet::detail {

class Jobs;
class JobCore;
struct GroupCore;

/// The bits of a job's state word.
namespace job_word {
inline constexpr std::uint32_t phase_mask = 3;              // the JobState
inline constexpr std::uint32_t taken = 1u << 2;             // waiting: its run is handed to the job scheduler
inline constexpr std::uint32_t canceled = 1u << 3;          // waiting and taken: its run ends it, unrun
inline constexpr std::uint32_t rerun = 1u << 4;             // runs once more after this run (or unrun end)
inline constexpr std::uint32_t canceling_called = 1u << 5;  // canceling() was called for this run
inline constexpr std::uint32_t joined = 1u << 6;            // a join() waits for the end of this run
inline constexpr std::uint32_t rerun_pending = 1u << 7;     // none, and its re-run is not queued yet
inline constexpr std::uint32_t started = 1u << 8;           // waiting: its run has begun (should_run, events)
inline constexpr std::uint32_t ending = 1u << 9;            // none, its done event not told yet
inline constexpr std::uint32_t done_called = 1u << 10;      // running: done() came before run() returned
inline constexpr std::uint32_t sync_thread = 1u << 11;      // runs on its sync scheduler (JobExtras)
inline constexpr std::uint32_t one_end = 1u << 12;          // bits 12-31 count the ends, for join()

constexpr JobState phase(std::uint32_t word) noexcept { return static_cast<JobState>(word & phase_mask); }
constexpr std::uint32_t with_phase(std::uint32_t word, JobState phase) noexcept {
  return (word & ~phase_mask) | static_cast<std::uint32_t>(phase);
}
}  // namespace job_word

/// The result a run's end records when it has no memory for the real one: its message fits a
/// string's own room and its exception is made ahead, so copying it allocates nothing.
Status out_of_memory_result() noexcept;

/// A job's kept result: null for ok, or a copy of the last result, or the shared out-of-memory
/// result (never deleted) when there was no memory for the copy.
struct KeptResultDeleter {
  void operator()(Status* kept) const noexcept;
};
using KeptResult = std::unique_ptr<Status, KeptResultDeleter>;

/// Job's protected hooks, reached through function pointers (one table for every job).
struct JobHooks {
  Status (*run)(Job&, ProgressMonitor&);
  bool (*should_schedule)(Job&);
  bool (*should_run)(Job&);
  void (*canceling)(Job&);
  /// A run that went on over several phases (go_on_in) is over: what run() kept for them goes.
  void (*drop_steps)(Job&) noexcept;
};
const JobHooks& job_hooks() noexcept;

/// A registered listener. remove_listener waits until no call of it is in progress, so a removed
/// listener is never called after remove_listener returns (except by a call it is inside of).
struct ListenerSlot {
  explicit ListenerSlot(std::shared_ptr<JobListener> registered) : listener(std::move(registered)) {}
  const std::shared_ptr<JobListener> listener;
  std::atomic<bool> removed{false};
  std::atomic<int> calls{0};  // in progress
};
// Copied on change, so that delivering an event takes the lists as they are without allocating.
using ListenerList = std::vector<std::shared_ptr<ListenerSlot>>;
using Listeners = std::shared_ptr<const ListenerList>;

/// A listener event waiting for delivery.
struct PendingEvent {
  enum class Kind { scheduled, about_to_run, running, done, sleeping, awake };
  Kind kind;
  JobEvent event;
};

/// What a job needs only when it uses listeners, properties or delays: made on first use, so that
/// a plain queued job stays small. Guarded by the manager's lock (Jobs::mutex).
struct JobExtras {
  std::shared_ptr<JobGroup> group;  // fixed while scheduled
  std::map<std::string, std::any> properties;
  Listeners listeners;
  std::deque<PendingEvent> events;
  bool delivering = false;
  bool has_timer = false;
  std::multimap<Clock::time_point, JobCore*>::iterator timer;
  // The progress group each run reports into, for `progress_work` of its units (set in state none).
  std::shared_ptr<ProgressMonitor> progress_group;
  int progress_work = 0;
  // The scheduler on whose synchronous thread its runs happen (set_sync_scheduler; set in state
  // none, so read without the lock once the job is scheduled).
  std::weak_ptr<Scheduler> sync_scheduler;
  // A run that finishes later (Status::finish_later()): it is parked in its suspension until
  // done() hands over its result.
  std::shared_ptr<Tasklet> finishing;
  std::uint32_t finishing_suspension = 0;
  Status finished_with;
};

/// A tasklet of the job scheduler, with its place in that scheduler's order: a lane (priority) and
/// when it may start at the latest.
class JobTasklet : public LibraryTasklet {
 public:
  void prepare(Priority priority, std::int64_t deadline) noexcept {
    priority_ = priority;
    deadline_ = deadline;
  }
  static PhaseOrder order_of(const Tasklet& tasklet) noexcept {
    const auto& self = static_cast<const JobTasklet&>(tasklet);
    return {static_cast<std::size_t>(self.priority_), self.deadline_};
  }
  /// The job scheduler's describe_tasklets_by hook: "job 'name'" for a job's run.
  static std::string describe(const Tasklet& tasklet) {
    return static_cast<const JobTasklet&>(tasklet).describe();
  }
  virtual std::string describe() const { return "the end of a job's run"; }
  /// Whether this is a run of `job`.
  virtual bool runs(const JobCore& job) const noexcept {
    static_cast<void>(job);
    return false;
  }

  /// A job's run: set while it finishes later (its next phase ends it with the result done()
  /// gave). Here, beside the priority, it takes no room of its own.
  bool finishing = false;
  /// A job's run: set when its run() goes on in another phase (a coroutine job's), with the
  /// directive of that phase (go_on_in).
  bool continuing = false;
  Directive then = Directive::async;
  /// A job's run that went on in another phase: what its run() keeps between phases (a
  /// coroutine's frame) goes when the run ends (JobHooks::drop_steps), even before run() did.
  bool kept_steps = false;

 private:
  Priority priority_ = Priority::interactive;
  std::int64_t deadline_ = 0;
};

/// One run of a job: a tasklet whose phase runs the job (Jobs::run), or whose phases do, one step
/// each, for a run that goes on over several.
class JobRun final : public JobTasklet {
 public:
  explicit JobRun(JobCore& core) noexcept : core_(core) {}
  Directive task() override;
  /// Called by a job's run() that has not ended (a coroutine job's, in this run's phase): the
  /// run goes on in the next phase, with `next` (wait: it suspended this run; async), where
  /// run() is called again. Should the run end otherwise (the directive refused, a begin_rule
  /// left open), what run() kept for the next phase goes before the job's end (drop_steps).
  static void go_on_in(Directive next) noexcept;
  /// The job ends unrun, with the error (canceled when its manager shut down).
  void abandoned(std::exception_ptr error) noexcept override;
  /// The scheduler it waited on (a job's sync scheduler) was destroyed: the job ends canceled.
  void dropped() noexcept override;
  std::string describe() const override;
  std::string job_name() const override;
  bool runs(const JobCore& job) const noexcept override { return &core_ == &job; }
  /// The job whose run `tasklet` is, if it is one (jobs/door.hpp's job_of_run).
  static std::shared_ptr<Job> job_of(const Tasklet* tasklet);

 private:
  JobCore& core_;  // alive while the job is listed, which it is until this run has ended it
};

class JobCore {
 public:
  JobCore(Job& job, std::shared_ptr<Jobs> jobs) noexcept : job_(job), jobs_(std::move(jobs)) {}
  JobCore(const JobCore&) = delete;
  JobCore& operator=(const JobCore&) = delete;

  Job& job() const noexcept { return job_; }
  std::shared_ptr<Job> owned() const { return job_.shared_from_this(); }
  Jobs& jobs() const noexcept { return *jobs_; }
  const std::shared_ptr<Jobs>& shared_jobs() const noexcept { return jobs_; }
  static const JobHooks& hooks() noexcept { return job_hooks(); }

  std::uint32_t load() const noexcept { return word.load(std::memory_order_acquire); }
  JobState state() const noexcept { return job_word::phase(load()); }
  /// Its runs happen on its sync scheduler (set in state none: fixed while scheduled).
  bool on_sync_thread() const noexcept { return (load() & job_word::sync_thread) != 0; }
  /// Sets the phase and the `set` bits and clears the `clear` bits (holding `lock`).
  std::uint32_t change(JobState phase, std::uint32_t set = 0, std::uint32_t clear = 0) noexcept;

  /// The extras, made on first use (under the manager's lock).
  JobExtras& extras();
  JobExtras* made_extras() const noexcept { return extras_.get(); }

  /// The job's lock: guards the changes of `word` and the fields below it (but for those that
  /// name another lock). The small fields come first: they share the word's line with the lock.
  oneapi::tbb::mutex lock;
  bool system = false;
  bool user = false;
  bool seed = false;              // this run counts as a seed of its group (manager's lock)
  bool holds_group_slot = false;  // let in under its group's max_threads (manager's lock)
  bool listed = false;            // in the registry (its shard's lock; see prev and next)
  // Registered with its group for this scheduling (manager's lock): schedule() saw the group. A
  // job that set_group() put in a group after schedule() decided it had none is not counted.
  bool grouped = false;
  bool reports_to_group = false;  // has a progress group (JobExtras); set in state none
  std::atomic<std::uint32_t> word{0};
  Priority priority = Priority::long_job;
  std::chrono::milliseconds rerun_delay{0};
  KeptResult result;                         // of the last run; null: ok
  std::shared_ptr<ProgressMonitor> monitor;  // while running (cancel() may outlive the run)
  // Set when the job leaves state none: find() lists jobs in this order, so wake_up(family) puts
  // them back in the order they were first scheduled. Read by find() without the job's lock.
  std::atomic<std::uint64_t> order{0};
  Rule rule;
  // The run handed to the job scheduler and not started yet (it may still be taken back), or null.
  Tasklet* run = nullptr;

  /// The core of the job's group (JobExtras::group), or null: readable without a lock
  /// (schedule() decides with it first); set with the group.
  GroupCore* group_core() const noexcept { return group_core_.load(std::memory_order_acquire); }
  std::atomic<GroupCore*> group_core_{nullptr};
  // Its link in the ToStart list it is in, if any (see ToStart).
  JobCore* next_to_start = nullptr;

  // Jobs' registry of live jobs (waiting, sleeping, running, or finishing a run): an intrusive
  // list per shard, guarded by the shard's lock. A listed job keeps itself alive: the manager owns
  // a scheduled job until it is done.
  JobCore* prev = nullptr;
  JobCore* next = nullptr;
  std::shared_ptr<Job> keep_alive;

  // The job's own run, handed to the job scheduler whenever the scheduler has let go of it (it
  // is idle): only a job scheduled again while its last run is still being let go of makes one.
  JobRun own_run{*this};

 private:
  Job& job_;
  std::shared_ptr<Jobs> jobs_;
  std::unique_ptr<JobExtras> extras_;
};

static_assert(static_cast<std::size_t>(Priority::decorate) < phase_lane_count);

/// Jobs let in under a lock, to be handed to the job scheduler (or entered) once it is let go, in
/// the order they were let in. Linked through the jobs (JobCore::next_to_start), so that letting a
/// job in never allocates: a run's end lets its successors in even when memory ran out. A job is in
/// one list at a time (it is let in once per waiting).
class ToStart {
 public:
  ToStart() = default;
  ToStart(const ToStart&) = delete;
  ToStart& operator=(const ToStart&) = delete;

  bool empty() const noexcept { return head_ == nullptr; }
  void push_back(JobCore& job) noexcept {
    job.next_to_start = nullptr;
    if (tail_ != nullptr) {
      tail_->next_to_start = &job;
    } else {
      head_ = &job;
    }
    tail_ = &job;
  }
  /// The first, taken out; null when empty.
  JobCore* pop_front() noexcept {
    JobCore* first = head_;
    if (first == nullptr) return nullptr;
    head_ = first->next_to_start;
    if (head_ == nullptr) tail_ = nullptr;
    first->next_to_start = nullptr;
    return first;
  }

 private:
  JobCore* head_ = nullptr;
  JobCore* tail_ = nullptr;
};

/// JobGroup's protected hooks (see JobHooks).
struct GroupHooks {
  bool (*should_cancel)(JobGroup&, const Status&, int, int);
  Status (*compute_group_result)(JobGroup&, const std::vector<Status>&);
};

struct GroupCore {
  GroupCore(JobGroup& group, const GroupHooks& group_hooks, int seeds) noexcept
      : self(group), hooks(group_hooks), seeds_expected(seeds) {}

  JobGroup& self;
  const GroupHooks& hooks;
  mutable std::mutex mutex;  // taken only inside Jobs::mutex, or alone
  TaskCondition changed;     // notified under `mutex`
  JobGroup::State state = JobGroup::State::none;
  int seeds_expected = 0;
  int seeds_done = 0;
  int running = 0;   // jobs let into the rule table and not ended
  int deciding = 0;  // failures whose should_cancel() has not decided yet: nobody is let in
  int failed = 0;
  int canceled = 0;
  // Counts the times the group was over: a failure's should_cancel() decided after its group was
  // over (and perhaps active again) cancels nothing.
  std::uint64_t generation = 0;
  // Waiting for a slot under max_threads, or for should_cancel() to decide.
  std::deque<JobCore*> throttled;
  std::vector<JobCore*> active;
  std::vector<Status> results;
  Status last_result;

  /// Whether a job may be let into the rule table now (under `mutex`).
  bool admits(int more = 0) const noexcept {
    const int limit = self.max_threads();
    return deciding == 0 && (limit <= 0 || running + more < limit);
  }
};

}  // namespace tasklet::detail
