// A scheduler's life (options, destruction, what a run() left), how tasklets enter and leave it,
// and its public surface.
#include <algorithm>
#include <array>
#include <cassert>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include <oneapi/tbb/task_arena.h>

#include "scheduler/domain.hpp"
#include "scheduler/run_state.hpp"
#include "scheduler/scheduler_impl.hpp"
#include "scheduler/tasklet_state.hpp"
#include "tasklet/error.hpp"

namespace tasklet {

using detail::context;
using detail::TaskletAccess;
namespace st = detail::word;

namespace detail {
ThreadOptions& thread_options() noexcept {
  thread_local ThreadOptions options;
  return options;
}
}  // namespace detail

namespace {

// The options a new scheduler inherits on this thread: inside a phase or run loop, those of the
// scheduler running it; elsewhere the thread's configured ones.
const SchedulerOptions& inherited_options() noexcept {
  const auto& now = detail::run_state();
  if (now.phase_of) return now.phase_of->options_;
  if (now.sync_of) return now.sync_of->options_;
  return detail::thread_options().configured;
}

SchedulerOptions resolve(SchedulerOptions options) {
  const SchedulerOptions& inherited = inherited_options();
  if (!options.manager) options.manager = inherited.manager ? inherited.manager : JobManager::global();
  if (!options.workers) {
    if (options.concurrency > 0) {
      options.workers = Workers::create(options.concurrency);
    } else if (inherited.workers && (!inherited.manager || inherited.manager == options.manager)) {
      options.workers = inherited.workers;
    } else {
      options.workers = options.manager->workers();
    }
  }
  options.concurrency = options.workers->concurrency();
  return options;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Life cycle

detail::SchedulerImpl::SchedulerImpl(Scheduler& self, SchedulerOptions options)
    : self_(self),
      options_(resolve(std::move(options))),
      domain_(detail::domain(*options_.manager)),
      workers_(detail::impl(*options_.workers)),
      loop_driven_(static_cast<bool>(options_.wake_loop)) {
  // A loop's thread takes the sync phases whenever it polls: async phases may start at any time.
  if (loop_driven_) running_.store(true, std::memory_order_relaxed);
}

detail::SchedulerImpl::~SchedulerImpl() {
  going_.store(true, std::memory_order_release);
  close_delays();  // first: no delay starts a tasklet while the rest is taken apart
  // What a run() that ended abnormally left: requests not entered yet end unrun (with the async
  // batch, in drop_pending), and the counts taken ahead go back.
  for (std::size_t i = 0; i < entering_.size(); ++i) {
    TaskletPtr& tasklet = *entering_tasklets_[i];
    TaskletAccess::set_hold(*tasklet, nullptr);
    async_batch_.push_back(std::move(tasklet));
    delete entering_[i];
    ++reserved_holds_;
  }
  entering_.clear();
  entering_tasklets_.clear();
  count_out(sync_holds_, std::exchange(reserved_holds_, 0));
  // Tasklets still waiting for their rules end unrun; one whose grant is being delivered right now
  // (by a releasing thread, outside the table's lock) is let through first. The search is over
  // every live request of the manager, so it is skipped when none of ours can be among them.
  if (holds_.load(std::memory_order_acquire) != 0 || sync_holds_.load(std::memory_order_acquire) != 0) {
    domain_.table_.withdraw_waiting_if([this](const detail::RuleRequest& request) {
      const auto* tasklet = static_cast<const Tasklet*>(request.owner());
      return tasklet != nullptr && TaskletAccess::scheduler(*tasklet) == &self_;
    });
  }
  forget_deliveries_here();  // those on this thread that led here are not waited for
  // count_out wakes this when a count reaches zero.
  for (auto* count : {&holds_, &sync_holds_}) {
    for (std::size_t left = count->load(std::memory_order_acquire); left != 0;
         left = count->load(std::memory_order_acquire)) {
      count->wait(left, std::memory_order_acquire);
    }
  }
  drop_pending();
  if (spawned_.load(std::memory_order_acquire)) {
    // Wait for the tails of our oneTBB tasks (the phase that finished last may still be leaving).
    // Waited for from outside the arena (joining it could take the slot its last task needs),
    // and isolated, so a worker waiting here runs none of its own arena's other work.
    oneapi::tbb::this_task_arena::isolate([this] { group_.wait(); });
  }
}

void detail::SchedulerImpl::drop_pending() noexcept {
  std::vector<TaskletPtr> dropped;
  {
    std::lock_guard lock(mutex_);
    dropped.swap(sync_queue_);
  }
  for (TaskletPtr& tasklet : async_batch_) dropped.push_back(std::move(tasklet));
  async_batch_.clear();
  {
    std::lock_guard lock(parked_mutex_);
    for (auto& entry : parked_) dropped.push_back(std::move(entry.second));
    parked_.clear();
  }
  for (TaskletPtr& tasklet : dropped) {
    // One granted its rule holds it (queued for a phase, in the async batch, or parked in wait):
    // it goes back to the table, which may let others' tasklets through (ours were withdrawn).
    release_rule(*tasklet);
    auto& state = TaskletAccess::state(*tasklet);
    TaskletAccess::set_scheduler(*tasklet, nullptr);
    state.store(st::with_generation(st::idle, st::generation(state.load())), std::memory_order_release);
    if (!background_) active_.fetch_sub(1, std::memory_order_acq_rel);
  }
  for (TaskletPtr& tasklet : dropped) {
    if (auto* library = dynamic_cast<LibraryTasklet*>(tasklet.get())) library->dropped();
  }
  dropped.clear();  // users' destructors run here, outside every lock
}

void detail::SchedulerImpl::make_implicit_for_this_thread() { implicit_owner_ = std::this_thread::get_id(); }

void detail::SchedulerImpl::make_background() {
  background_ = true;
  running_.store(true, std::memory_order_release);
}

// ---------------------------------------------------------------------------------------------
// Entering and leaving the scheduler

void detail::SchedulerImpl::claim(Tasklet& tasklet, const char* action) {
  auto& state = TaskletAccess::state(tasklet);
  std::uint64_t word = state.load(std::memory_order_acquire);
  do {
    if (st::phase(word) != st::idle) {
      throw AlreadyScheduled(std::string(action) + ": " + tasklet.name() +
                             " is already active (scheduled, running, parked or waiting for its rule)");
    }
  } while (!state.compare_exchange_weak(word, st::with_generation(st::active, st::generation(word)),
                                        std::memory_order_acq_rel, std::memory_order_acquire));
  TaskletAccess::set_scheduler(tasklet, &self_);
}

void detail::SchedulerImpl::unclaim(Tasklet& tasklet) noexcept {
  auto& state = TaskletAccess::state(tasklet);
  TaskletAccess::set_scheduler(tasklet, nullptr);
  state.store(st::with_generation(st::idle, st::generation(state.load())), std::memory_order_release);
}

// Counts a new tasklet that will start with `async`, if run() is active. A caller that already has
// a stake in active_ (the synchronous thread, a phase of this scheduler) keeps run() from
// returning, so reading running_ suffices; anyone else decides under the lock run() exits under.
bool detail::SchedulerImpl::run_is_active_for_caller() {
  if (background_) return true;  // always running, and not counting (see active_)
  const auto& ctx = detail::run_state();
  if (ctx.sync_of == this || ctx.phase_of == this) {
    if (!running_.load(std::memory_order_acquire)) return false;
    active_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  bool first = false;
  {
    std::lock_guard lock(mutex_);
    if (!running_.load(std::memory_order_relaxed)) return false;
    first = active_.fetch_add(1, std::memory_order_relaxed) == 0;
  }
  if (first && loop_driven_) tell_loop();
  return true;
}

void detail::SchedulerImpl::count_claimed(Tasklet& tasklet, Directive directive, const char* action) {
  if (directive != Directive::async) {
    count_in();
    return;
  }
  if (run_is_active_for_caller()) return;
  unclaim(tasklet);
  throw SchedulerNotRunning(std::string(action) + "(" + tasklet.name() +
                            ", async): the scheduler's run() is not active, so no synchronous thread could "
                            "take the tasklet back");
}

void detail::SchedulerImpl::schedule(TaskletPtr tasklet, Directive directive) {
  if (!tasklet) throw std::invalid_argument("schedule: null tasklet");
  if (directive == Directive::done) {
    if (tasklet->is_active()) throw AlreadyScheduled("schedule: " + tasklet->name() + " is already active");
    return;
  }
  claim(*tasklet, "schedule");
  bool reserved = false;  // counted from the synchronous thread's block, else (if at all) in active_
  if (directive == Directive::async && detail::run_state().sync_of == this &&
      running_.load(std::memory_order_relaxed)) {
    // The synchronous thread inside run(): the tasklet goes into the async batch, and is counted
    // when the batch is submitted (one atomic add per batch instead of one per tasklet); one with
    // a rule starts at once, counted from a block taken ahead.
    if (tasklet->rule()) {
      take_reserved(active_, reserved_active_);
      reserved = true;
    } else {
      ++uncounted_in_batch_;
    }
  } else {
    count_claimed(*tasklet, directive, "schedule");
  }
  try {
    start(tasklet, directive);
  } catch (...) {
    // Out of memory taking its rule: as if it had not been scheduled (only a tasklet with a rule
    // gets here, so it was counted one by one).
    if (reserved) {
      ++reserved_active_;
    } else {
      uncount_active();
    }
    unclaim(*tasklet);
    throw;
  }
  if (directive == Directive::sync) drain_inline();
}

bool detail::SchedulerImpl::withdraw(Tasklet& tasklet) {
  if (withdraw_delayed([&](const Tasklet& delayed) { return &delayed == &tasklet; }) != 0) return true;
  const Rule& rule = tasklet.rule();
  if (rule && domain_.table_.withdraw_waiting(*rule, [&](const detail::RuleRequest& request) {
        return request.owner() == &tasklet;
      }) != 0) {
    return true;
  }
  // Granted but still queued for a worker: take it out and end it, which frees its rule now.
  TaskletPtr queued;
  if (order_ != nullptr) {
    std::lock_guard lock(ready_mutex_);
    for (auto& lane : ready_) {
      const auto entry = std::find_if(
          lane.begin(), lane.end(), [&](const ReadyPhase& ready) { return ready.tasklet.get() == &tasklet; });
      if (entry == lane.end()) continue;
      queued = std::move(entry->tasklet);
      lane.erase(entry);
      --ready_count_;
      break;
    }
  }
  if (!queued && !background_) {
    // Granted and queued for the synchronous thread, whose turn has not taken it yet (a background
    // scheduler has none: a job's cancel does not take its lock for nothing).
    std::lock_guard lock(mutex_);
    const auto entry = std::find_if(sync_queue_.begin(), sync_queue_.end(),
                                    [&](const TaskletPtr& ready) { return ready.get() == &tasklet; });
    if (entry != sync_queue_.end()) {
      queued = std::move(*entry);
      sync_queue_.erase(entry);
    }
  }
  if (!queued) return false;
  finish(std::move(queued), nullptr);
  return true;
}

void detail::SchedulerImpl::finish(TaskletPtr tasklet, std::exception_ptr error) noexcept {
  if (error) record_failure(*tasklet, std::move(error));
  release_rule(*tasklet);
  unclaim(*tasklet);
  tasklet.reset();  // the scheduler's last reference: a finished tasklet may be destroyed here
  uncount_active();
}

// A KeepAlive guard counts as an active tasklet, so that run() waits for it like for one.
void detail::SchedulerImpl::keep_alive() noexcept {
  keep_alives_.fetch_add(1, std::memory_order_relaxed);
  count_in();
}

void detail::SchedulerImpl::count_in() noexcept {
  if (background_) return;
  if (active_.fetch_add(1, std::memory_order_acq_rel) == 0 && loop_driven_) [[unlikely]]
    tell_loop();
}

void detail::SchedulerImpl::let_go() noexcept {
  keep_alives_.fetch_sub(1, std::memory_order_relaxed);
  uncount_active();
}

void detail::SchedulerImpl::uncount_active() noexcept {
  if (background_ || active_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  bool sleeping = false;
  {
    std::lock_guard lock(mutex_);
    sleeping = sleeping_;
  }
  // Outside the lock, so the woken thread does not block on it. The scheduler outlives this
  // call: its destructor waits for our oneTBB tasks, and other callers hold a reference.
  if (sleeping) wake_.notify_all();
  if (loop_driven_) tell_loop();
}

// Outside every lock. A loop that cannot take the call (out of memory posting it) hears at the
// next one: the call is made again when another sync phase becomes ready.
void detail::SchedulerImpl::tell_loop() noexcept {
  try {
    options_.wake_loop();
  } catch (...) {
    std::lock_guard lock(mutex_);
    loop_told_ = false;
  }
}

void detail::SchedulerImpl::record_failure(const Tasklet& tasklet, std::exception_ptr error) noexcept {
  try {
    Failure failure{tasklet.name(), std::move(error)};
    std::lock_guard lock(mutex_);
    failures_.push_back(std::move(failure));
  } catch (...) {
    // Out of memory while recording: the failure is lost rather than the process.
  }
}

// ---------------------------------------------------------------------------------------------
// Public surface

namespace detail {

SchedulerHandle::SchedulerHandle(SchedulerOptions options)
    : impl(std::make_unique<SchedulerImpl>(*this, std::move(options))) {}

SchedulerHandle::~SchedulerHandle() {
  if (run_state().task_of == impl.get()) {
    // Destroyed from inside one of its own oneTBB tasks, which the destructor would wait for:
    // let a task outside the group finish the job once this one has returned.
    auto& arena = impl->workers_.arena();
    arena.enqueue([owned = std::shared_ptr<SchedulerImpl>(std::move(impl))] { (void)owned; });
    return;
  }
  // The engine's destructor ends its waiting tasklets, which reach it through this handle
  // (detail::impl): `impl` must still point at it meanwhile. ~unique_ptr does not promise that
  // (libc++'s sets it to null first), so it is deleted here and only then let go of.
  delete impl.get();
  static_cast<void>(impl.release());
}

}  // namespace detail

Scheduler::~Scheduler() = default;

std::shared_ptr<Scheduler> Scheduler::create(SchedulerOptions options) {
  return std::make_shared<detail::SchedulerHandle>(std::move(options));
}

void Scheduler::run() { detail::impl(*this).run(); }

std::size_t Scheduler::poll() {
  return detail::impl(*this).run_until(std::chrono::steady_clock::time_point::min(), "poll()");
}

std::size_t Scheduler::run_for(std::chrono::steady_clock::duration duration) {
  const auto now = std::chrono::steady_clock::now();
  const auto max = std::chrono::steady_clock::time_point::max();
  return detail::impl(*this).run_until(duration >= max - now ? max : now + duration, "run_for()");
}

std::size_t Scheduler::run_until(std::chrono::steady_clock::time_point deadline) {
  return detail::impl(*this).run_until(deadline, "run_until()");
}

Scheduler& Scheduler::schedule(std::shared_ptr<Tasklet> tasklet, Directive directive) {
  detail::impl(*this).schedule(std::move(tasklet), directive);
  return *this;
}

Scheduler& Scheduler::schedule_after(std::chrono::steady_clock::duration delay,
                                     std::shared_ptr<Tasklet> tasklet, Directive directive) {
  detail::impl(*this).schedule_after(delay, std::move(tasklet), directive);
  return *this;
}

Rescheduler Scheduler::suspend(Tasklet& tasklet) {
  // Made first: out of memory, nothing is suspended.
  using Made = detail::Suspension;
  // In its own phase, the phase's owning reference: it may alias another object (a job's own run).
  const detail::RunState& here = detail::run_state();
  std::weak_ptr<Tasklet> suspended = here.tasklet == &tasklet && here.phase_owner != nullptr
                                         ? std::weak_ptr<Tasklet>(*here.phase_owner)
                                         : tasklet.weak_from_this();
  auto made =
      std::allocate_shared<Made>(detail::Allocator<Made>{}, weak_from_this(), std::move(suspended), 0);
  made->generation = detail::impl(*this).suspend(tasklet);
  return Rescheduler(std::move(made));
}

Scheduler::KeepAlive Scheduler::keep_alive() {
  std::shared_ptr<Scheduler> self = weak_from_this().lock();
  if (!self) throw IllegalState("keep_alive: the scheduler is not owned by a std::shared_ptr");
  detail::impl(*this).keep_alive();
  return KeepAlive(std::move(self));
}

Scheduler::KeepAlive& Scheduler::KeepAlive::operator=(KeepAlive&& other) noexcept {
  if (this != &other) {
    reset();
    scheduler_ = std::move(other.scheduler_);
  }
  return *this;
}

void Scheduler::KeepAlive::reset() noexcept {
  if (scheduler_ == nullptr) return;
  detail::impl(*scheduler_).let_go();
  scheduler_.reset();
}

bool Scheduler::is_running() const noexcept {
  return detail::impl(*this).running_.load(std::memory_order_acquire);
}

bool Scheduler::has_work() const noexcept {
  return detail::impl(*this).active_.load(std::memory_order_acquire) != 0;
}

std::size_t Scheduler::active_count() const noexcept {
  const detail::SchedulerImpl& impl = detail::impl(*this);
  const std::size_t active = impl.active_.load(std::memory_order_acquire);
  const std::size_t guards = impl.keep_alives_.load(std::memory_order_acquire);
  return active > guards ? active - guards : 0;
}

std::vector<Failure> Scheduler::failures() const {
  const detail::SchedulerImpl& impl = detail::impl(*this);
  std::lock_guard lock(impl.mutex_);
  return impl.failures_;
}

const std::shared_ptr<JobManager>& Scheduler::manager() const noexcept {
  return detail::impl(*this).options_.manager;
}

namespace {

// The scheduler and tasklet a Rescheduler names, for `action`; throws AlreadyResumed when either
// is gone (or it names nothing).
std::pair<std::shared_ptr<Scheduler>, std::shared_ptr<Tasklet>> resumable(
    const detail::Suspension* suspension, const char* action, Directive directive) {
  const std::string call = std::string(action) + "(" + std::string(to_string(directive)) + "): ";
  if (suspension == nullptr) throw AlreadyResumed(call + "an empty Rescheduler");
  std::shared_ptr<Scheduler> scheduler = suspension->scheduler.lock();
  std::shared_ptr<Tasklet> tasklet = suspension->tasklet.lock();
  if (!scheduler || !tasklet)
    throw AlreadyResumed(call + "the suspended tasklet or its scheduler no longer exists");
  return {std::move(scheduler), std::move(tasklet)};
}

}  // namespace

void Rescheduler::resume(Directive directive) const {
  const auto [scheduler, tasklet] = resumable(suspension_.get(), "resume", directive);
  detail::impl(*scheduler).resume(tasklet, suspension_->generation, directive);
}

void Rescheduler::resume_after(std::chrono::steady_clock::duration delay, Directive directive) const {
  const auto [scheduler, tasklet] = resumable(suspension_.get(), "resume_after", directive);
  detail::impl(*scheduler).resume_after(tasklet, suspension_, delay, directive);
}

detail::Suspension::~Suspension() {
  if (generation == 0) return;  // suspend() refused: no suspension was made
  const std::shared_ptr<Scheduler> owner = scheduler.lock();
  if (!owner) return;
  if (std::shared_ptr<Tasklet> suspended = tasklet.lock())
    impl(*owner).end_suspension(std::move(suspended), generation);
}

}  // namespace tasklet
