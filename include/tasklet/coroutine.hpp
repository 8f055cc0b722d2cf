// tasklet/coroutine.hpp: C++20 coroutines as tasklets.
//
// A Task<T> is a coroutine that a scheduler runs as a tasklet: make_tasklet(task, rule) wraps it,
// and the tasklet's task() resumes the coroutine and returns the directive its last co_await
// chose. No thread, queue or lock of its own: a suspended coroutine is a tasklet between phases.
//
//   tasklet::Task<int> count_lines(std::string file) {
//     co_await tasklet::async();   // on a worker from here on: read the file
//     int lines = read_and_count(file);
//     co_await tasklet::sync();    // back on the scheduler's synchronous thread: report
//     report(file, lines);
//     co_return lines;
//   }
//   auto counting = tasklet::make_tasklet(count_lines("a.txt"), tasklet::rules::path("/a.txt"));
//   scheduler->schedule(counting, tasklet::Directive::sync);
//   scheduler->run();
//   int lines = counting->result();
//
// Awaiting another Task<U> (`co_await other_task()`) runs it inside the awaiting one, on the same
// tasklet (and under its rule): its hops are the awaiter's hops, its co_return value is the
// co_await's value, and its exception comes out of the co_await. An exception that leaves the
// outermost coroutine ends the tasklet with it, as one from a task() does (run() rethrows it).
//
// Waiting holds no thread: `co_await wait(give)`, `co_await job` (or join(job)),
// `co_await when_all(tasks...)` and `co_await hold(rule)` park the tasklet. A join, a when_all and a
// hold go on where they were (a sync phase stays on the synchronous thread, an async one on a
// worker); a wait goes on where the Rescheduler's resume(directive) puts it.
#pragma once

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <stop_token>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "tasklet/api.hpp"
#include "tasklet/detail/allocator.hpp"
#include "tasklet/detail/hold.hpp"
#include "tasklet/detail/library_tasklet.hpp"
#include "tasklet/directive.hpp"
#include "tasklet/error.hpp"
#include "tasklet/job.hpp"
#include "tasklet/scheduler.hpp"
#include "tasklet/scheduling_rule.hpp"
#include "tasklet/status.hpp"
#include "tasklet/tasklet_base.hpp"

namespace tasklet {

template <class T = void>
class Task;

namespace detail {
template <class T>
class TaskSteps;
}  // namespace detail

namespace detail {

/// What the coroutines of one tasklet share (the outermost one and those it awaits inline): the
/// frame to resume at the next phase, and the directive its last co_await chose. It lives in the
/// outermost coroutine's promise, so that a coroutine tasklet is no larger than a plain one.
struct CoroutineStack {
  std::coroutine_handle<> resume_next;
  Tasklet* tasklet = nullptr;  // the tasklet that runs them
  std::stop_token stop;        // given to make_tasklet
  Directive next = Directive::done;
};

/// Whether the calling code runs a sync phase (on a scheduler's synchronous thread): where a
/// coroutine that parks goes on once it is resumed for it.
bool in_sync_phase() noexcept;
/// Scheduler::suspend of `tasklet` by its own scheduler, in its phase (a job's run included).
Rescheduler suspend_in_phase(Tasklet& tasklet);

/// The promise's part that does not depend on the result type.
class CoroutinePromise {
 public:
  std::suspend_always initial_suspend() noexcept { return {}; }  // it starts when its tasklet runs

  struct FinalAwaiter {
    bool await_ready() noexcept { return false; }
    template <class Promise>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<Promise> ended) noexcept {
      CoroutinePromise& promise = ended.promise();
      if (promise.continuation_) {
        // Awaited inline: the awaiter goes on in this phase.
        promise.stack_->resume_next = promise.continuation_;
        return promise.continuation_;
      }
      promise.stack_->next = Directive::done;
      return std::noop_coroutine();
    }
    void await_resume() noexcept {}
  };
  FinalAwaiter final_suspend() noexcept { return {}; }
  void unhandled_exception() noexcept { error_ = std::current_exception(); }

  // Frames come from the library's allocator, as tasklets do.
  static void* operator new(std::size_t bytes) { return allocate_bytes(bytes); }
  static void operator delete(void* frame) noexcept { deallocate_bytes(frame); }

  CoroutineStack* stack_ = &own_stack_;   // the outermost coroutine's
  std::coroutine_handle<> continuation_;  // the coroutine awaiting this one inline, if any
  std::exception_ptr error_;
  CoroutineStack own_stack_;  // used while this coroutine is the outermost
};

/// A hop: the coroutine goes on in the next phase, where `directive` puts it.
template <Directive directive>
struct Hop {
  bool await_ready() const noexcept { return false; }
  template <class Promise>
  requires std::is_base_of_v<CoroutinePromise, Promise>
  void await_suspend(std::coroutine_handle<Promise> here) const noexcept {
    CoroutineStack& stack = *here.promise().stack_;
    stack.resume_next = here;
    stack.next = directive;
  }
  void await_resume() const noexcept {}
};

}  // namespace detail

/// `co_await tasklet::async()`: the coroutine goes on in an async phase, on one of the workers
/// (never on the synchronous thread). Needs the scheduler's run() to be active, as
/// Directive::async does.
[[nodiscard]] inline detail::Hop<Directive::async> async() noexcept { return {}; }
/// `co_await tasklet::sync()`: the coroutine goes on in a sync phase, on the scheduler's
/// synchronous thread (the thread inside run()).
[[nodiscard]] inline detail::Hop<Directive::sync> sync() noexcept { return {}; }

namespace detail {

/// Parks the coroutine's tasklet and hands its Rescheduler to `give` (see wait()).
template <class Give>
struct Parking {
  Give give;
  std::exception_ptr failed;
  bool await_ready() const noexcept { return false; }
  template <class Promise>
  requires std::is_base_of_v<CoroutinePromise, Promise>
  bool await_suspend(std::coroutine_handle<Promise> here) {
    CoroutineStack& stack = *here.promise().stack_;
    Rescheduler resume = suspend_in_phase(*stack.tasklet);  // throws into the coroutine
    stack.resume_next = here;
    stack.next = Directive::wait;
    try {
      give(std::move(resume));
    } catch (...) {
      // It goes on at once, and the co_await throws (the Rescheduler given was dropped, which ends
      // the suspension).
      failed = std::current_exception();
      return false;
    }
    return true;
  }
  void await_resume() const {
    if (failed) std::rethrow_exception(failed);
  }
};

/// The stop token of the coroutine's tasklet (see this_stop_token()).
struct StopTokenOf {
  std::stop_token token;
  bool await_ready() const noexcept { return false; }
  template <class Promise>
  requires std::is_base_of_v<CoroutinePromise, Promise>
  bool await_suspend(std::coroutine_handle<Promise> here) noexcept {
    token = here.promise().stack_->stop;
    return false;  // goes on at once
  }
  std::stop_token await_resume() const noexcept { return token; }
};

}  // namespace detail

/// `co_await tasklet::wait(give)`: parks the coroutine's tasklet until a Rescheduler resumes it.
/// `give(Rescheduler)` is called before the tasklet parks (in its phase); it hands the Rescheduler
/// to whatever will resume it, and `resume(Directive::sync)` or `resume(Directive::async)` says
/// where the coroutine goes on. A resume that comes before the tasklet has parked is not lost. If
/// `give` throws, the co_await throws it (the coroutine goes on in its phase) and `give` must not
/// have kept the Rescheduler. Throws what Scheduler::suspend throws.
template <class Give>
requires std::is_invocable_v<Give&, Rescheduler>
[[nodiscard]] detail::Parking<std::decay_t<Give>> wait(Give&& give) {
  return {std::forward<Give>(give), nullptr};
}

/// `co_await tasklet::this_stop_token()`: the stop token given to make_tasklet (none by default; the
/// coroutines it awaits inline, and those its when_all runs, see the same one). Checking it is up
/// to the coroutine.
[[nodiscard]] inline detail::StopTokenOf this_stop_token() noexcept { return {}; }

namespace detail {
struct RuleWait;
}  // namespace detail

/// What `co_await tasklet::hold(rule)` gives: while it lives, the coroutine's tasklet holds the rule
/// (its rule: current_rule() gives it, begin_rule nests in it, and it is held across every later
/// co_await). It releases the rule when it goes, at the end of its scope, or at release(). Destroy
/// or release it in the coroutine that took it (the steps of its tasklet), never after that
/// coroutine ended. Move-only.
class [[nodiscard]] RuleHold {
 public:
  RuleHold(RuleHold&& other) noexcept : tasklet_(std::exchange(other.tasklet_, nullptr)) {}
  RuleHold& operator=(RuleHold&&) = delete;
  ~RuleHold() { release(); }
  /// Releases the rule now (later calls do nothing): conflicting holders waiting for it may start.
  void release() noexcept {
    if (tasklet_ != nullptr) detail::end_hold(*std::exchange(tasklet_, nullptr));
  }
  /// Whether this guard has a rule to release: false for a hold nested in the tasklet's own rule
  /// (that one covers it) and after release().
  bool owns_rule() const noexcept { return tasklet_ != nullptr; }

 private:
  friend struct detail::RuleWait;
  explicit RuleHold(Tasklet* tasklet) noexcept : tasklet_(tasklet) {}
  Tasklet* tasklet_;
};

namespace detail {

/// Takes a rule for the coroutine's tasklet (see hold()).
struct RuleWait {
  Rule rule;
  Tasklet* tasklet = nullptr;
  HoldAnswer now = HoldAnswer::waiting;
  HoldReply later{};  // set by the engine before it resumes a waiting tasklet
  bool await_ready() const noexcept { return false; }
  template <class Promise>
  requires std::is_base_of_v<CoroutinePromise, Promise>
  bool await_suspend(std::coroutine_handle<Promise> here) {
    CoroutineStack& stack = *here.promise().stack_;
    tasklet = stack.tasklet;
    now = begin_hold(*tasklet, rule, later);  // throws into the coroutine
    if (now != HoldAnswer::waiting) return false;
    stack.resume_next = here;
    stack.next = Directive::wait;
    return true;
  }
  RuleHold await_resume() {
    switch (now == HoldAnswer::waiting ? later.answer : now) {
      case HoldAnswer::granted:
        return RuleHold(tasklet);
      case HoldAnswer::failed:
        std::rethrow_exception(later.failure);
      case HoldAnswer::cancelled:
        throw IllegalState("hold(" + describe(rule) + "): the job manager shut down while " +
                           tasklet->name() + " waited for the rule");
      case HoldAnswer::refused:
        throw std::bad_alloc();
      default:
        return RuleHold(nullptr);  // nested: the tasklet's own rule covers it
    }
  }
};

}  // namespace detail

/// `auto held = co_await tasklet::hold(rule)`: the coroutine's tasklet takes `rule` and holds it
/// until the RuleHold goes. It waits in the rule table in FIFO order with every other holder
/// (tasklets, jobs, begin_rule, serial executors), holding no thread, and goes on where it was
/// (sync or async) holding the rule; when the rule is free it goes on at once. Two-phase rules
/// apply: in a tasklet that holds a rule already (its own, or an outer hold), `rule` must be
/// contained by it and nothing more is taken (RuleNotContained otherwise). A null rule takes
/// nothing. The co_await throws IllegalState inside an open begin_rule scope and when the job
/// manager shuts down while it waits or would wait (the shutdown withdraws every waiting request
/// before it waits for running jobs), InvalidRule, and std::bad_alloc. The tasks of a when_all run
/// as tasklets of their own: they do not hold the awaiter's rules.
[[nodiscard]] inline detail::RuleWait hold(Rule rule) noexcept { return detail::RuleWait{std::move(rule)}; }

/// A coroutine run as a tasklet (make_tasklet), or awaited inline by another Task. Move-only; it
/// owns its coroutine until make_tasklet or co_await takes it. Destroying a Task that never ran
/// destroys its coroutine unrun.
template <class T>
class [[nodiscard]] Task {
 public:
  struct promise_type : detail::CoroutinePromise {
    Task get_return_object() noexcept {
      return Task(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    template <class U = T>
    requires std::is_convertible_v<U&&, T>
    void return_value(U&& value) { value_.emplace(std::forward<U>(value)); }
    std::optional<T> value_;
  };

  Task(Task&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Task& operator=(Task&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~Task() { reset(); }

  /// Awaiting a Task runs it inside the awaiting coroutine (the same tasklet). It owns the awaited
  /// coroutine: one destroyed while suspended (its tasklet dropped) destroys the awaited one too.
  struct Awaiter {
    explicit Awaiter(std::coroutine_handle<promise_type> awaited) noexcept : child(awaited) {}
    Awaiter(const Awaiter&) = delete;
    Awaiter& operator=(const Awaiter&) = delete;
    ~Awaiter() {
      if (child) child.destroy();
    }
    std::coroutine_handle<promise_type> child;
    bool await_ready() const noexcept { return false; }
    template <class Promise>
    requires std::is_base_of_v<detail::CoroutinePromise, Promise> std::coroutine_handle<> await_suspend(
        std::coroutine_handle<Promise> parent)
    noexcept {
      child.promise().stack_ = parent.promise().stack_;
      child.promise().continuation_ = parent;
      child.promise().stack_->resume_next = child;
      return child;
    }
    /// Its value, or its exception.
    T await_resume() { return take(std::exchange(child, nullptr)); }
  };
  Awaiter operator co_await() && noexcept { return Awaiter(std::exchange(handle_, nullptr)); }

 private:
  friend class detail::TaskSteps<T>;
  explicit Task(std::coroutine_handle<promise_type> handle) noexcept : handle_(handle) {}
  void reset() noexcept {
    if (handle_) std::exchange(handle_, nullptr).destroy();
  }
  // The ended coroutine's value or exception; destroys it.
  static T take(std::coroutine_handle<promise_type> ended) {
    struct Destroy {
      std::coroutine_handle<promise_type> handle;
      ~Destroy() { handle.destroy(); }
    } const destroy{ended};
    if (ended.promise().error_) std::rethrow_exception(ended.promise().error_);
    if constexpr (!std::is_void_v<T>) return std::move(*ended.promise().value_);
  }
  std::coroutine_handle<promise_type> handle_;
};

template <>
struct Task<void>::promise_type : detail::CoroutinePromise {
  Task get_return_object() noexcept { return Task(std::coroutine_handle<promise_type>::from_promise(*this)); }
  void return_void() noexcept {}
};

namespace detail {

/// A Task<T> run step by step by a tasklet: a CoroutineTasklet, or the run of a coroutine job.
/// Owns the coroutine; empty once moved from.
template <class T>
class TaskSteps {
 public:
  TaskSteps() noexcept = default;
  TaskSteps(Task<T> task, Tasklet& runner, std::stop_token stop) noexcept
      : handle_(std::exchange(task.handle_, nullptr)) {
    CoroutineStack& stack = *handle_.promise().stack_;
    stack.resume_next = handle_;
    stack.tasklet = &runner;
    stack.stop = std::move(stop);
  }
  TaskSteps(TaskSteps&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  TaskSteps& operator=(TaskSteps&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  ~TaskSteps() { reset(); }

  explicit operator bool() const noexcept { return handle_ != nullptr; }
  /// Resumes the coroutine where its last co_await left it; the directive that co_await chose, or
  /// done once it has ended (returned or thrown: see error()).
  Directive step() {
    CoroutineStack& stack = *handle_.promise().stack_;
    stack.resume_next.resume();
    return stack.next;
  }
  bool done() const noexcept { return handle_.done(); }
  /// What it threw, once ended.
  const std::exception_ptr& error() const noexcept { return handle_.promise().error_; }
  /// What it returned, once ended without an exception.
  auto& value() const noexcept requires(!std::is_void_v<T>) { return *handle_.promise().value_; }
  void reset() noexcept {
    if (handle_) std::exchange(handle_, nullptr).destroy();
  }

 private:
  std::coroutine_handle<typename Task<T>::promise_type> handle_;
};

}  // namespace detail

/// The tasklet that runs a Task<T>: each phase resumes the coroutine where its last co_await left
/// it. result() gives the value once it is done.
template <class T>
class CoroutineTasklet final : public Tasklet {
 public:
  explicit CoroutineTasklet(Task<T> task, std::stop_token stop = {}) noexcept
      : steps_(std::move(task), *this, std::move(stop)) {}

  /// Resumes the coroutine; the directive of the co_await it stopped at (done at its end). An
  /// exception that left the coroutine comes out of here, ending the tasklet with it.
  Directive task() override {
    if (steps_.done()) throw IllegalState(name() + ": the coroutine has ended");
    const Directive next = steps_.step();
    if (next == Directive::done && steps_.error()) std::rethrow_exception(steps_.error());
    return next;
  }

  /// Whether the coroutine has ended (returned or thrown).
  bool finished() const noexcept { return steps_.done(); }
  /// The value it returned (a reference to it; for Task<void>, nothing). Throws what the coroutine
  /// threw, and IllegalState before it has ended. Not synchronised with the tasklet's phases: call
  /// it once run() returned, or from the thread that saw the tasklet end.
  decltype(auto) result() const {
    if (!steps_.done()) throw IllegalState(name() + ": result() before the coroutine ended");
    if (steps_.error()) std::rethrow_exception(steps_.error());
    if constexpr (!std::is_void_v<T>) return static_cast<const T&>(steps_.value());
  }

 private:
  detail::TaskSteps<T> steps_;  // its only state: see CoroutineStack
};

/// Wraps a coroutine as a tasklet with an optional rule, held from before its first step to its
/// end (as any tasklet's), and an optional stop token for this_stop_token(). Schedule it with the
/// directive its first step needs. Throws InvalidRule for an invalid rule.
template <class T>
std::shared_ptr<CoroutineTasklet<T>> make_tasklet(Task<T> task, Rule rule = nullptr,
                                                  std::stop_token stop = {}) {
  using Made = CoroutineTasklet<T>;
  auto tasklet = std::allocate_shared<Made>(detail::Allocator<Made>{}, std::move(task), std::move(stop));
  if (rule) tasklet->set_rule(std::move(rule));
  return tasklet;
}

// ---- Awaiting jobs and several tasks at once

namespace detail {

/// Waits for a job's end (see join(job)).
class JobEnd {
 public:
  explicit JobEnd(std::shared_ptr<Job> job) : job_(std::move(job)) {}
  bool await_ready() const noexcept { return job_ == nullptr; }
  template <class Promise>
  requires std::is_base_of_v<CoroutinePromise, Promise>
  bool await_suspend(std::coroutine_handle<Promise> here) {
    struct Told final : JobListener {
      explicit Told(Rescheduler resume, Directive directive)
          : rescheduler(std::move(resume)), then(directive) {}
      void done(const JobEvent&) override { go_on(); }
      // Once: by the job's end, or by the check after the listener was added.
      void go_on() {
        if (!went_on.exchange(true)) rescheduler.resume(then);
      }
      Rescheduler rescheduler;
      Directive then;
      std::atomic<bool> went_on{false};
    };
    const Directive then = in_sync_phase() ? Directive::sync : Directive::async;
    std::shared_ptr<Told> told;
    const auto give = [&](Rescheduler resume) { told = std::make_shared<Told>(std::move(resume), then); };
    Parking<decltype(give)> parking{give, nullptr};
    parking.await_suspend(here);
    parking.await_resume();
    job_->add_listener(told);  // throws into the coroutine, dropping the Rescheduler: not parked
    listener_ = told;
    if (job_->state() == JobState::none) told->go_on();  // it ended before the listener was there
    return true;
  }
  Status await_resume() {
    if (listener_) job_->remove_listener(listener_);
    return job_ ? job_->result() : Status::ok();
  }

 private:
  std::shared_ptr<Job> job_;
  std::shared_ptr<JobListener> listener_;
};

template <class T>
using Outcome = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

/// What when_all's tasks share: their outcomes, how many are left, and whom to resume.
template <class... T>
struct AllOf {
  std::tuple<std::optional<Outcome<T>>...> values;
  std::exception_ptr error;
  std::atomic<std::size_t> left{sizeof...(T)};
  Rescheduler resume;
  Directive then = Directive::sync;
  std::atomic<bool> error_taken{false};
  void one_ended() {
    if (left.fetch_sub(1, std::memory_order_acq_rel) == 1) resume.resume(then);
  }
  void failed(std::exception_ptr failure) {
    if (!error_taken.exchange(true)) error = std::move(failure);
    one_ended();
  }
};

template <class U>
class RunChild {
 public:
  // One of when_all's tasks, as a tasklet of its own: its outcome goes to `all`, and the last to
  // end resumes the awaiting coroutine.
  template <std::size_t I, class All>
  static Task<void> run(Task<U> task, std::shared_ptr<All> all) {
    try {
      if constexpr (std::is_void_v<U>) {
        co_await std::move(task);
        std::get<I>(all->values).emplace();
      } else {
        std::get<I>(all->values).emplace(co_await std::move(task));
      }
    } catch (...) {
      all->failed(std::current_exception());
      co_return;
    }
    all->one_ended();
  }
};

/// One of when_all's tasks as a tasklet of its own (RunChild's coroutine): should the engine end it
/// unrun (out of memory), that is its failure, so that the awaiter still goes on.
template <class All>
class WhenAllTask final : public LibraryTasklet {
 public:
  WhenAllTask(Task<void> run, std::shared_ptr<All> all, std::stop_token stop) noexcept
      : steps_(std::move(run), *this, std::move(stop)), all_(std::move(all)) {}
  Directive task() override { return steps_.step(); }  // RunChild catches what its task throws
  void abandoned(std::exception_ptr why) noexcept override { all_->failed(std::move(why)); }

 private:
  TaskSteps<void> steps_;
  std::shared_ptr<All> all_;
};

template <class... T>
class AllEnded {
 public:
  explicit AllEnded(Task<T>... tasks) : tasks_(std::move(tasks)...), all_(std::make_shared<AllOf<T...>>()) {}
  bool await_ready() const noexcept { return sizeof...(T) == 0; }
  template <class Promise>
  requires std::is_base_of_v<CoroutinePromise, Promise>
  bool await_suspend(std::coroutine_handle<Promise> here) {
    CoroutineStack& stack = *here.promise().stack_;
    all_->then = in_sync_phase() ? Directive::sync : Directive::async;
    // Made before the awaiter parks: out of memory, nothing has started.
    auto children = make_children(stack.stop, std::index_sequence_for<T...>{});
    const auto give = [this](Rescheduler resume) { all_->resume = std::move(resume); };
    Parking<decltype(give)> parking{give, nullptr};
    parking.await_suspend(here);
    parking.await_resume();
    // Parked: a task that cannot be scheduled counts as ended with that error, so that the awaiter
    // is resumed once those that were scheduled have ended, and the error comes out of the await.
    Scheduler& scheduler = api::current();
    std::exception_ptr refused;
    const auto start = [&](auto& child) {
      if (!refused) {
        try {
          scheduler.schedule(child, all_->then);
          return;
        } catch (...) {
          refused = std::current_exception();
        }
      }
      all_->failed(refused);
    };
    std::apply([&](auto&... child) { (start(child), ...); }, children);
    return true;
  }
  /// The tasks' values in order (std::monostate for a Task<void>); the first exception instead,
  /// once all have ended.
  std::tuple<Outcome<T>...> await_resume() {
    if (all_->error) std::rethrow_exception(all_->error);
    return std::apply([](auto&... value) { return std::tuple<Outcome<T>...>(std::move(*value)...); },
                      all_->values);
  }

 private:
  template <std::size_t... I>
  auto make_children(const std::stop_token& stop, std::index_sequence<I...>) {
    using Child = WhenAllTask<AllOf<T...>>;
    return std::make_tuple(std::allocate_shared<Child>(
        Allocator<Child>{}, RunChild<T>::template run<I>(std::move(std::get<I>(tasks_)), all_), all_,
        stop)...);
  }
  std::tuple<Task<T>...> tasks_;
  std::shared_ptr<AllOf<T...>> all_;
};

}  // namespace detail

/// `Status status = co_await tasklet::join(job)` (or `co_await job`): parks the coroutine until
/// the job is over (in state none: its run ended, or it was canceled or never scheduled), then
/// goes on where it was and gives the job's last result. Holds no thread meanwhile.
[[nodiscard]] inline detail::JobEnd join(std::shared_ptr<Job> job) { return detail::JobEnd(std::move(job)); }
[[nodiscard]] inline detail::JobEnd operator co_await(std::shared_ptr<Job> job) {
  return join(std::move(job));
}

namespace detail {

inline Task<Status> ended_ok(Task<void> run) {
  co_await std::move(run);
  co_return Status::ok();
}

/// What a coroutine job does with the callable make_job was given, erased: the callable lives in
/// `room` bytes of the job itself when it fits (a lambda capturing two references, say), else on
/// the heap with its address there. Smaller than a std::function, so that a coroutine job, with its
/// running coroutine's handle, takes no more room than a plain make_job job.
struct CoroutineMaker {
  static constexpr std::size_t room = 16;
  void (*construct)(void* room, void* callable);  // moves the callable in; throws what that throws
  Task<Status> (*make)(void* room, ProgressMonitor& monitor);
  void (*destroy)(void* room) noexcept;
};

template <class F>
constexpr bool fits_in_room = sizeof(F) <= CoroutineMaker::room &&
                              alignof(F) <= alignof(void*) && std::is_nothrow_move_constructible_v<F>;

template <class F>
F& callable_in(void* room) noexcept {
  if constexpr (fits_in_room<F>) {
    return *std::launder(static_cast<F*>(room));
  } else {
    return **static_cast<F**>(room);
  }
}

template <class F>
inline constexpr CoroutineMaker maker_of{
    [](void* room, void* callable) {
      if constexpr (fits_in_room<F>) {
        ::new (room) F(std::move(*static_cast<F*>(callable)));
      } else {
        *static_cast<F**>(room) = new F(std::move(*static_cast<F*>(callable)));
      }
    },
    [](void* room, ProgressMonitor& monitor) -> Task<Status> {
      if constexpr (std::is_same_v<std::invoke_result_t<F&, ProgressMonitor&>, Task<Status>>) {
        return callable_in<F>(room)(monitor);
      } else {
        return ended_ok(callable_in<F>(room)(monitor));
      }
    },
    [](void* room) noexcept {
      if constexpr (fits_in_room<F>) {
        std::launder(static_cast<F*>(room))->~F();
      } else {
        delete *static_cast<F**>(room);
      }
    },
};

std::shared_ptr<Job> make_coroutine_job(std::string name, const CoroutineMaker& maker, void* callable,
                                        std::shared_ptr<JobManager> manager);

}  // namespace detail

/// A job whose run is a coroutine: each run calls `run(monitor)` for a new Task<Status> (or a
/// Task<void>, which ends ok unless it throws) and resumes it on the manager's workers, under the
/// job's rule, until it returns its Status. A run that ends before its coroutine does (co_await
/// sync(), a begin_rule left open across a co_await) destroys the coroutine before the job is
/// over; the next run starts a new one. While it awaits (co_await hold(rule), a job, wait(), a
/// when_all) the run holds no worker; it stays running, holding the job's rule, and a manager
/// that shuts down waits for it. Cancellation works as for other jobs (this_stop_token() is empty): cancel()
/// cancels the monitor (and calls canceling()), which the coroutine polls. A run goes on only on the workers:
/// co_await sync() ends it with an error, and a Rescheduler from wait() must resume it with
/// Directive::async. An exception that leaves the coroutine ends the run with an error Status
/// carrying it. `run` lives as long as the job, so a lambda's captures outlive each run's
/// coroutine. Made on `manager` (the global manager when null). Throws std::bad_alloc.
template <class F>
requires std::is_same_v<std::invoke_result_t<F&, ProgressMonitor&>, Task<Status>> ||
    std::is_same_v<std::invoke_result_t<F&, ProgressMonitor&>, Task<void>>
        std::shared_ptr<Job> make_job(std::string name, F run,
                                      std::shared_ptr<JobManager> manager = nullptr) {
  return detail::make_coroutine_job(std::move(name), detail::maker_of<F>, &run, std::move(manager));
}

/// `auto [a, b] = co_await tasklet::when_all(task_a(), task_b())`: runs the tasks at once, each as
/// a tasklet of its own on the awaiting coroutine's scheduler, api::current() (in a job's run: its
/// manager's background scheduler), started where the awaiter is (a sync phase, or an async one), parks the
/// awaiter until all have ended, and gives their values in order (std::monostate for a Task<void>); if any
/// threw, the first exception in time (not in argument order), once all have ended. A task the engine
/// cannot go on with (out of memory) counts as ended with std::bad_alloc. The tasks see the awaiter's
/// stop token.
template <class... T>
[[nodiscard]] detail::AllEnded<T...> when_all(Task<T>... tasks) {
  return detail::AllEnded<T...>(std::move(tasks)...);
}

}  // namespace tasklet
