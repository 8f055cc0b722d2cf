// tasklet/asio.hpp: a scheduler whose synchronous thread is a Boost.Asio io_context's thread.
//
// Its sync phases run as handlers of the io_context, among the application's own; async phases run
// on the workers as always. Header-only on top of Scheduler::poll() and SchedulerOptions::wake_loop;
// needs Boost.Asio's headers (Boost::headers).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "tasklet/scheduler.hpp"

namespace tasklet::asio {

namespace detail {

// Posts a poll to the io_context when the scheduler asks (one at a time), and holds work on the
// io_context while the scheduler has work, so that io_context::run() returns only once both are
// idle, as Scheduler::run() would.
class LoopDriver final : public std::enable_shared_from_this<LoopDriver> {
 public:
  explicit LoopDriver(boost::asio::io_context& io) noexcept : io_(io) {}

  // Any thread, never under the scheduler's locks.
  void wake() {
    if (posted_.exchange(true, std::memory_order_acq_rel)) return;  // a poll is on its way
    try {
      boost::asio::post(io_, [self = shared_from_this()] { self->turn(); });
    } catch (...) {
      posted_.store(false, std::memory_order_release);
      throw;
    }
  }

  std::weak_ptr<Scheduler> scheduler;

 private:
  using Work = boost::asio::executor_work_guard<boost::asio::io_context::executor_type>;

  // On the io_context's thread. A phase's failure leaves io_context::run() as a handler's
  // exception does; the work held is settled first.
  void turn() {
    posted_.store(false, std::memory_order_release);
    const std::shared_ptr<Scheduler> owner = scheduler.lock();
    if (!owner) {
      work_.reset();  // the scheduler is gone, and what it had with it
      return;
    }
    struct Settle {
      LoopDriver& driver;
      Scheduler& scheduler;
      ~Settle() {
        if (!scheduler.has_work()) {
          driver.work_.reset();
        } else if (!driver.work_) {
          driver.work_.emplace(driver.io_.get_executor());
        }
      }
    } settle{*this, *owner};
    owner->poll();
  }

  boost::asio::io_context& io_;
  std::atomic<bool> posted_{false};
  std::optional<Work> work_;  // touched on the io_context's thread, or once nothing can post
};

}  // namespace detail

/// A scheduler whose sync phases run as handlers of `io`, on whichever thread runs it: run `io`
/// on one thread (the synchronous thread), or the phases still run one at a time but on several.
/// It keeps the guarantees of Scheduler::run(): sync phases run in FIFO order; io.run() keeps
/// going while the scheduler has work (tasklets or KeepAlive guards) and returns once both are
/// idle; a phase's exception leaves io.run() (call it again to go on; failures() lists them);
/// WaitCycle leaves it when the io thread's begin_rule scopes hold what a tasklet waits for.
/// Destroying the scheduler drops what never started, as ever, and lets io.run() return. Async
/// phases may start at any time (the scheduler is always running). `options.wake_loop` must be
/// empty (std::invalid_argument otherwise): it is the io_context's. `io` must outlive the
/// scheduler. Thread-safe.
inline std::shared_ptr<Scheduler> make_scheduler(boost::asio::io_context& io, SchedulerOptions options = {}) {
  if (options.wake_loop) {
    throw std::invalid_argument(
        "tasklet::asio::make_scheduler: options.wake_loop must be empty; it is set "
        "to post to the io_context");
  }
  auto driver = std::make_shared<detail::LoopDriver>(io);
  options.wake_loop = [driver] { driver->wake(); };
  std::shared_ptr<Scheduler> scheduler = Scheduler::create(std::move(options));
  driver->scheduler = scheduler;  // no work yet, so no wake call before this
  return scheduler;
}

}  // namespace tasklet::asio
