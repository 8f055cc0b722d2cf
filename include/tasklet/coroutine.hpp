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

#include <concepts>
#include <coroutine>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "tasklet/detail/allocator.hpp"
#include "tasklet/detail/coroutine_steps.hpp"
#include "tasklet/directive.hpp"
#include "tasklet/error.hpp"
#include "tasklet/job.hpp"
#include "tasklet/rule_hold.hpp"
#include "tasklet/scheduler.hpp"
#include "tasklet/scheduling_rule.hpp"
#include "tasklet/status.hpp"
#include "tasklet/stop_token.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet {

/// `co_await tasklet::async()`: the coroutine goes on in an async phase, on one of the workers
/// (never on the synchronous thread). Needs the scheduler's run() to be active, as
/// Directive::async does.
[[nodiscard]] inline detail::Hop<Directive::async> async() noexcept { return {}; }
/// `co_await tasklet::sync()`: the coroutine goes on in a sync phase, on the scheduler's
/// synchronous thread (the thread inside run()).
[[nodiscard]] inline detail::Hop<Directive::sync> sync() noexcept { return {}; }

/// `co_await tasklet::wait(give)`: parks the coroutine's tasklet until a Rescheduler resumes it.
/// `give(Rescheduler)` is called before the tasklet parks (in its phase); it hands the Rescheduler
/// to whatever will resume it, and `resume(Directive::sync)` or `resume(Directive::async)` says
/// where the coroutine goes on. A resume that comes before the tasklet has parked is not lost. If
/// `give` throws, the co_await throws it (the coroutine goes on in its phase) and `give` must not
/// have kept the Rescheduler. Throws what Scheduler::suspend throws.
template <std::invocable<Rescheduler> Give>
[[nodiscard]] detail::Parking<std::decay_t<Give>> wait(Give&& give) {
  return {std::forward<Give>(give), nullptr};
}

/// `co_await tasklet::this_stop_token()`: a StopToken holding the token given to make_tasklet (an
/// empty one by default; the coroutines it awaits inline, and those its when_all runs, see the
/// same one). Checking it is up to the coroutine.
[[nodiscard]] inline detail::StopTokenOf this_stop_token() noexcept { return {}; }

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
    template <std::convertible_to<T> U = T>
    void return_value(U&& value) {
      value_.emplace(std::forward<U>(value));
    }
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
    template <std::derived_from<detail::CoroutinePromise> Promise>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<Promise> parent) noexcept {
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

/// The tasklet that runs a Task<T>: each phase resumes the coroutine where its last co_await left
/// it. result() gives the value once it is done.
template <class T>
class CoroutineTasklet final : public Tasklet {
 public:
  explicit CoroutineTasklet(Task<T> task, StopToken stop = {}) noexcept
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
/// end (as any tasklet's), and an optional stop token for this_stop_token() (a std::stop_token, or
/// any StoppableToken: tasklet/stop_token.hpp). Schedule it with the directive its first step
/// needs. Throws InvalidRule for an invalid rule, std::bad_alloc.
template <class T>
std::shared_ptr<CoroutineTasklet<T>> make_tasklet(Task<T> task, Rule rule = nullptr, StopToken stop = {}) {
  using Made = CoroutineTasklet<T>;
  auto tasklet = std::allocate_shared<Made>(detail::Allocator<Made>{}, std::move(task), std::move(stop));
  if (rule) tasklet->set_rule(std::move(rule));
  return tasklet;
}

/// `Status status = co_await tasklet::join(job)` (or `co_await job`): parks the coroutine until
/// the job is over (in state none: its run ended, or it was canceled or never scheduled), then
/// goes on where it was and gives the job's last result. Holds no thread meanwhile.
[[nodiscard]] inline detail::JobEnd join(std::shared_ptr<Job> job) { return detail::JobEnd(std::move(job)); }
[[nodiscard]] inline detail::JobEnd operator co_await(std::shared_ptr<Job> job) {
  return join(std::move(job));
}

/// A job's run that is a coroutine: callable with the job's ProgressMonitor for a Task<Status> or
/// a Task<void>.
template <class F>
concept CoroutineJobBody = std::invocable<F&, ProgressMonitor&> &&
    (std::same_as<std::invoke_result_t<F&, ProgressMonitor&>, Task<Status>> ||
     std::same_as<std::invoke_result_t<F&, ProgressMonitor&>, Task<void>>);

/// A job whose run is a coroutine: each run calls `run(monitor)` for a new Task<Status> (or a
/// Task<void>, which ends ok unless it throws) and resumes it on the manager's workers, under the
/// job's rule, until it returns its Status. A run that ends before its coroutine does (co_await
/// sync(), a begin_rule left open across a co_await) destroys the coroutine before the job is
/// over; the next run starts a new one. While it awaits (co_await hold(rule), a job, wait(), a
/// when_all) the run holds no worker; it stays running, holding the job's rule, and a manager
/// that shuts down waits for it. Cancellation works as for other jobs (this_stop_token() is empty): cancel()
/// cancels the monitor (and calls canceling()), which the coroutine polls. A run goes on only on the workers
/// (co_await sync() ends it with an error, and a Rescheduler from wait() must resume it with
/// Directive::async), unless the job has a sync scheduler (Job::set_sync_scheduler): then it starts
/// on that scheduler's synchronous thread and goes on in its sync() and async() phases. An exception that
/// leaves the coroutine ends the run with an error Status carrying it. `run` lives as long as the job, so a
/// lambda's captures outlive each run's coroutine. Made on `manager` (the global manager when null). Throws
/// std::bad_alloc.
template <CoroutineJobBody F>
std::shared_ptr<Job> make_job(std::string name, F run, std::shared_ptr<JobManager> manager = nullptr) {
  return detail::make_coroutine_job_of(std::move(name), run, std::move(manager));
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

// The templates' machinery, once Task<T> is complete.
#include "tasklet/detail/coroutine_tasks.hpp"
