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
#pragma once

#include <coroutine>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "tasklet/detail/allocator.hpp"
#include "tasklet/directive.hpp"
#include "tasklet/error.hpp"
#include "tasklet/scheduling_rule.hpp"
#include "tasklet/tasklet_base.hpp"

namespace tasklet {

template <class T = void>
class Task;

namespace detail {

/// What the coroutines of one tasklet share (the outermost one and those it awaits inline): the
/// frame to resume at the next phase, and the directive its last co_await chose.
struct CoroutineStack {
  std::coroutine_handle<> resume_next;
  Directive next = Directive::done;
};

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

  CoroutineStack* stack_ = nullptr;
  std::coroutine_handle<> continuation_;  // the coroutine awaiting this one inline, if any
  std::exception_ptr error_;
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

  /// Awaiting a Task runs it inside the awaiting coroutine (the same tasklet).
  struct Awaiter {
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
    T await_resume() { return take(child); }
  };
  Awaiter operator co_await() && noexcept { return Awaiter{std::exchange(handle_, nullptr)}; }

 private:
  template <class U>
  friend class CoroutineTasklet;
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
  explicit CoroutineTasklet(Task<T> task) noexcept : handle_(std::exchange(task.handle_, nullptr)) {
    handle_.promise().stack_ = &stack_;
    stack_.resume_next = handle_;
  }
  ~CoroutineTasklet() override {
    if (handle_) handle_.destroy();
  }

  /// Resumes the coroutine; the directive of the co_await it stopped at (done at its end). An
  /// exception that left the coroutine comes out of here, ending the tasklet with it.
  Directive task() override {
    if (!stack_.resume_next || finished_) throw IllegalState(name() + ": the coroutine has ended");
    stack_.resume_next.resume();
    if (stack_.next == Directive::done) {
      finished_ = true;
      if (handle_.promise().error_) std::rethrow_exception(handle_.promise().error_);
    }
    return stack_.next;
  }

  /// Whether the coroutine has ended (returned or thrown).
  bool finished() const noexcept { return finished_; }
  /// The value it returned (a reference to it; for Task<void>, nothing). Throws what the coroutine
  /// threw, and IllegalState before it has ended. Not synchronised with the tasklet's phases: call
  /// it once run() returned, or from the thread that saw the tasklet end.
  decltype(auto) result() const {
    if (!finished_) throw IllegalState(name() + ": result() before the coroutine ended");
    if (handle_.promise().error_) std::rethrow_exception(handle_.promise().error_);
    if constexpr (!std::is_void_v<T>) return static_cast<const T&>(*handle_.promise().value_);
  }

 private:
  std::coroutine_handle<typename Task<T>::promise_type> handle_;
  detail::CoroutineStack stack_;
  bool finished_ = false;
};

/// Wraps a coroutine as a tasklet with an optional rule, held from before its first step to its
/// end (as any tasklet's). Schedule it with the directive its first step needs. Throws InvalidRule
/// for an invalid rule.
template <class T>
std::shared_ptr<CoroutineTasklet<T>> make_tasklet(Task<T> task, Rule rule = nullptr) {
  using Made = CoroutineTasklet<T>;
  auto tasklet = std::allocate_shared<Made>(detail::Allocator<Made>{}, std::move(task));
  if (rule) tasklet->set_rule(std::move(rule));
  return tasklet;
}

}  // namespace tasklet
