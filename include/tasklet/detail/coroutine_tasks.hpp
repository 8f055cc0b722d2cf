// tasklet/detail/coroutine_tasks.hpp: the templates behind tasklet/coroutine.hpp's coroutine
// tasklets, when_all and coroutine jobs (private, not for users). Included at the end of
// tasklet/coroutine.hpp: they need Task<T> complete.
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "tasklet/api.hpp"
#include "tasklet/coroutine.hpp"
#include "tasklet/detail/allocator.hpp"
#include "tasklet/detail/library_tasklet.hpp"

namespace tasklet::detail {

/// A Task<T> run step by step by a tasklet: a CoroutineTasklet, or the run of a coroutine job.
/// Owns the coroutine; empty once moved from.
template <class T>
class TaskSteps {
 public:
  TaskSteps() noexcept = default;
  TaskSteps(Task<T> task, Tasklet& runner, StopToken stop) noexcept
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
  WhenAllTask(Task<void> run, std::shared_ptr<All> all, StopToken stop) noexcept
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
  auto make_children(const StopToken& stop, std::index_sequence<I...>) {
    using Child = WhenAllTask<AllOf<T...>>;
    return std::make_tuple(std::allocate_shared<Child>(
        Allocator<Child>{}, RunChild<T>::template run<I>(std::move(std::get<I>(tasks_)), all_), all_,
        stop)...);
  }
  std::tuple<Task<T>...> tasks_;
  std::shared_ptr<AllOf<T...>> all_;
};

inline Task<Status> ended_ok(Task<void> run) {
  co_await std::move(run);
  co_return Status::ok();
}

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

template <class F>
std::shared_ptr<Job> make_coroutine_job_of(std::string name, F& run, std::shared_ptr<JobManager> manager) {
  return make_coroutine_job(std::move(name), maker_of<F>, &run, std::move(manager));
}

}  // namespace tasklet::detail
