// tasklet/detail/coroutine_steps.hpp: the machinery under tasklet/coroutine.hpp (private, not for
// users): the promise the coroutines of one tasklet share, and the awaiters of its co_awaits.
#pragma once

#include "tasklet/export.hpp"

#include <atomic>
#include <coroutine>
#include <cstddef>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include "tasklet/detail/allocator.hpp"
#include "tasklet/detail/hold.hpp"
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

template <class T = void>
class Task;
class JobManager;
class ProgressMonitor;

namespace detail {

template <class T>
class TaskSteps;
template <class... T>
class AllEnded;

/// What the coroutines of one tasklet share (the outermost one and those it awaits inline): the
/// frame to resume at the next phase, and the directive its last co_await chose. It lives in the
/// outermost coroutine's promise, so that a coroutine tasklet is no larger than a plain one.
struct TASKLET_EXPORT CoroutineStack {
  std::coroutine_handle<> resume_next;
  Tasklet* tasklet = nullptr;  // the tasklet that runs them
  StopToken stop;              // given to make_tasklet
  Directive next = Directive::done;
};

/// Whether the calling code runs a sync phase (on a scheduler's synchronous thread): where a
/// coroutine that parks goes on once it is resumed for it.
TASKLET_EXPORT bool in_sync_phase() noexcept;
/// Scheduler::suspend of `tasklet` by its own scheduler, in its phase (a job's run included).
TASKLET_EXPORT Rescheduler suspend_in_phase(Tasklet& tasklet);

/// The promise's part that does not depend on the result type.
class TASKLET_EXPORT CoroutinePromise {
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
struct TASKLET_EXPORT StopTokenOf {
  StopToken token;
  bool await_ready() const noexcept { return false; }
  template <class Promise>
  requires std::is_base_of_v<CoroutinePromise, Promise>
  bool await_suspend(std::coroutine_handle<Promise> here) noexcept {
    token = here.promise().stack_->stop;
    return false;  // goes on at once
  }
  StopToken await_resume() const noexcept { return token; }
};

/// Takes a rule for the coroutine's tasklet (see hold()).
struct TASKLET_EXPORT RuleWait {
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
      case HoldAnswer::canceled:
        throw IllegalState("hold(" + describe(rule) + "): the job manager shut down while " +
                           tasklet->name() + " waited for the rule");
      case HoldAnswer::refused:
        throw std::bad_alloc();
      default:
        return RuleHold(nullptr);  // nested: the tasklet's own rule covers it
    }
  }
};

/// Waits for a job's end (see join(job)).
class TASKLET_EXPORT JobEnd {
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

/// What a coroutine job does with the callable make_job was given, erased: the callable lives in
/// `room` bytes of the job itself when it fits (a lambda capturing two references, say), else on
/// the heap with its address there. Smaller than a std::function, so that a coroutine job, with its
/// running coroutine's handle, takes no more room than a plain make_job job.
struct TASKLET_EXPORT CoroutineMaker {
  static constexpr std::size_t room = 16;
  void (*construct)(void* room, void* callable);  // moves the callable in; throws what that throws
  Task<Status> (*make)(void* room, ProgressMonitor& monitor);
  void (*destroy)(void* room) noexcept;
};

TASKLET_EXPORT std::shared_ptr<Job> make_coroutine_job(std::string name, const CoroutineMaker& maker,
                                                       void* callable, std::shared_ptr<JobManager> manager);

/// make_job() of a coroutine job: the callable `run` is moved into the job (see CoroutineMaker).
template <class F>
std::shared_ptr<Job> make_coroutine_job_of(std::string name, F& run, std::shared_ptr<JobManager> manager);

}  // namespace detail
}  // namespace tasklet
