// tasklet_bench_scheduler: the scheduler's rows of the performance contract (DESIGN section 5),
// each measured beside its baseline in the same run and reported as a ratio.
//
//   throughput     N trivial tasklets, each one ASYNC phase, started from a sync phase and awaited
//                  by run(), against raw tbb::task_group::run of the same lambdas       (<= 1.5x)
//   round trip     one tasklet alternating sync -> async -> sync, against two threads
//                  ping-ponging through a std::mutex and std::condition_variable          (<= 2x)
//   memory         bytes per tasklet queued for sync or parked in wait (with the block its
//                  Rescheduler shares), beyond the user's callable (growth of resident memory,
//                  each row in a fresh child process)
//                                                                                         (<= 256)
//
// Usage: tasklet_bench_scheduler [--repeats=K] [--max-n=N] [--quick] [--only=WORD] [--csv=FILE]
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_group.h>
#include <oneapi/tbb/version.h>

#include "harness.hpp"
#include "tasklet.hpp"
#include "tasklet/coroutine.hpp"

namespace {

using tasklet::Directive;
using tasklet::bench::Comparison;
using tasklet::bench::comparison_row;
using tasklet::bench::fail;
using tasklet::bench::figure_row;
using tasklet::bench::Options;
using tasklet::bench::Report;

// ---------------------------------------------------------------------------------------------
// a) No-rule throughput

// Each sample runs the workload often enough to do at least this many jobs, so that small N is
// not measured at the resolution of one wake-up.
std::size_t repetitions_for(std::size_t n, const Options& options) {
  const std::size_t min_jobs = options.quick ? 10'000 : 200'000;
  return n >= min_jobs ? 1 : (min_jobs + n - 1) / n;
}

void bench_throughput(Report& report, const Options& options) {
  const auto scheduler = tasklet::Scheduler::create();
  std::atomic<std::size_t> counter{0};

  for (std::size_t n = 1'000; n <= options.max_n; n *= 10) {
    const std::size_t reps = repetitions_for(n, options);

    const auto baseline = [&] {
      for (std::size_t r = 0; r < reps; ++r) {
        counter.store(0, std::memory_order_relaxed);
        oneapi::tbb::task_group group;
        for (std::size_t i = 0; i < n; ++i) {
          group.run([&counter] { counter.fetch_add(1, std::memory_order_relaxed); });
        }
        group.wait();
        if (counter.load() != n)
          fail("task_group ran " + std::to_string(counter.load()) + " of " + std::to_string(n));
      }
    };

    const auto ours = [&] {
      for (std::size_t r = 0; r < reps; ++r) {
        counter.store(0, std::memory_order_relaxed);
        // ASYNC needs an active run(), so a seed's sync phase schedules the jobs.
        auto seed = tasklet::make_tasklet([&counter, &sched = *scheduler, n] {
          for (std::size_t i = 0; i < n; ++i) {
            sched.schedule(tasklet::make_tasklet([&counter] {
                             counter.fetch_add(1, std::memory_order_relaxed);
                             return Directive::done;
                           }),
                           Directive::async);
          }
          return Directive::done;
        });
        scheduler->schedule(std::move(seed), Directive::sync);
        scheduler->run();
        if (counter.load() != n)
          fail("scheduler ran " + std::to_string(counter.load()) + " of " + std::to_string(n));
      }
    };

    const Comparison result = tasklet::bench::compare(options.repeats, n * reps, baseline, ours);
    // The contract names 10^6; the smaller sizes show the trend.
    const std::optional<double> target = n == 1'000'000 ? std::optional<double>(1.5) : std::nullopt;
    report.add(comparison_row("no rule: async tasklets vs task_group", n, result, target));
  }
}

// ---------------------------------------------------------------------------------------------
// b) sync -> async -> sync round trip

// The baseline's second thread: answers every ping with a pong through a mutex and condition
// variables, as a synchronous thread and one worker would hand work back and forth by hand.
class PingPongPartner {
 public:
  PingPongPartner() : thread_([this] { serve(); }) {}
  ~PingPongPartner() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    ping_.notify_one();
    thread_.join();
  }
  PingPongPartner(const PingPongPartner&) = delete;
  PingPongPartner& operator=(const PingPongPartner&) = delete;

  /// One round trip: wakes the partner and waits until it answers.
  void round_trip() {
    std::unique_lock lock(mutex_);
    partner_turn_ = true;
    ping_.notify_one();
    pong_.wait(lock, [this] { return !partner_turn_; });
  }

 private:
  void serve() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ping_.wait(lock, [this] { return partner_turn_ || stop_; });
      if (stop_) return;
      partner_turn_ = false;
      pong_.notify_one();
    }
  }

  std::mutex mutex_;
  std::condition_variable ping_;
  std::condition_variable pong_;
  bool partner_turn_ = false;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

void bench_round_trip(Report& report, const Options& options) {
  const std::size_t rounds = options.quick ? 1'000 : 20'000;
  const auto scheduler = tasklet::Scheduler::create();
  PingPongPartner partner;
  const std::thread::id sync_thread = std::this_thread::get_id();

  const auto baseline = [&] {
    for (std::size_t r = 0; r < rounds; ++r) partner.round_trip();
  };

  const auto ours = [&] {
    std::size_t remaining = rounds;
    bool next_is_sync = true;
    std::size_t misplaced = 0;
    auto tasklet = tasklet::make_tasklet([&] {
      const bool on_sync_thread = std::this_thread::get_id() == sync_thread;
      if (on_sync_thread != next_is_sync) ++misplaced;
      if (next_is_sync) {
        if (remaining == 0) return Directive::done;
        next_is_sync = false;
        return Directive::async;
      }
      --remaining;
      next_is_sync = true;
      return Directive::sync;
    });
    scheduler->schedule(std::move(tasklet), Directive::sync);
    scheduler->run();
    if (remaining != 0) fail("round trip stopped early");
    if (misplaced != 0) fail(std::to_string(misplaced) + " phases ran on the wrong thread");
  };

  const Comparison result = tasklet::bench::compare(options.repeats, rounds, baseline, ours);
  report.add(comparison_row("sync->async->sync vs mutex+condvar", rounds, result, 2.0));

  // The same round trip written as a coroutine, against the tasklet's.
  const auto coroutine = [&] {
    std::size_t misplaced = 0;
    auto hops = [](std::size_t count, std::thread::id sync_id,
                   std::size_t& wrong) -> tasklet::Task<std::size_t> {
      std::size_t done = 0;
      for (; done < count; ++done) {
        co_await tasklet::async();
        if (std::this_thread::get_id() == sync_id) ++wrong;
        co_await tasklet::sync();
        if (std::this_thread::get_id() != sync_id) ++wrong;
      }
      co_return done;
    };
    auto tasklet = tasklet::make_tasklet(hops(rounds, sync_thread, misplaced));
    scheduler->schedule(tasklet, Directive::sync);
    scheduler->run();
    if (tasklet->result() != rounds) fail("coroutine round trip stopped early");
    if (misplaced != 0) fail(std::to_string(misplaced) + " coroutine segments ran on the wrong thread");
  };
  const Comparison versus_tasklet = tasklet::bench::compare(options.repeats, rounds, ours, coroutine);
  report.add(comparison_row("coroutine sync->async->sync vs tasklet", rounds, versus_tasklet, 1.2));
}

// ---------------------------------------------------------------------------------------------
// c) Memory per queued tasklet

// A coroutine without locals, for the memory rows of coroutine tasklets.
tasklet::Task<void> trivial_coroutine() { co_return; }

// The user's part of every tasklet below: a callable without state.
constexpr auto trivial_job = [] { return Directive::done; };
using TrivialTasklet = tasklet::FunctionTasklet<std::decay_t<decltype(trivial_job)>>;

double per_tasklet(std::size_t before, std::size_t after, std::size_t n) {
  const double delta = after > before ? static_cast<double>(after - before) : 0.0;
  return delta / static_cast<double>(n) - static_cast<double>(sizeof(trivial_job));
}

void bench_memory(Report& report, const Options& options) {
  const std::size_t n = std::min<std::size_t>(options.max_n, options.quick ? 10'000 : 1'000'000);

  report.add(
      figure_row("memory: sizeof tasklet object", 1, static_cast<double>(sizeof(TrivialTasklet)), "bytes"));

  // Each row in a child process of its own (see in_child_process()).
  const double queued = tasklet::bench::in_child_process([n] {
    // Queued for sync on a scheduler whose run() has not started yet.
    const auto scheduler = tasklet::Scheduler::create();
    const std::size_t before = tasklet::bench::resident_bytes();
    for (std::size_t i = 0; i < n; ++i)
      scheduler->schedule(tasklet::make_tasklet(trivial_job), Directive::sync);
    const std::size_t after = tasklet::bench::resident_bytes();
    if (scheduler->active_count() != n) fail("not every tasklet was queued");
    scheduler->run();
    return per_tasklet(before, after, n);
  });
  report.add(figure_row("memory: queued for sync, per tasklet", n, queued, "bytes", 256.0));
  const double parked = tasklet::bench::in_child_process([n] {
    // Parked by suspend(), each with the Rescheduler that will resume it (kept by the user, in room
    // made before measuring); the scheduler's destructor drops them.
    const auto scheduler = tasklet::Scheduler::create();
    std::vector<tasklet::Rescheduler> reschedulers;
    reschedulers.reserve(n);
    const std::size_t before = tasklet::bench::resident_bytes();
    for (std::size_t i = 0; i < n; ++i) {
      const auto parked_tasklet = tasklet::make_tasklet(trivial_job);
      reschedulers.push_back(scheduler->suspend(*parked_tasklet));
    }
    const std::size_t after = tasklet::bench::resident_bytes();
    if (scheduler->active_count() != n) fail("not every tasklet was parked");
    return per_tasklet(before, after, n);
  });
  report.add(figure_row("memory: parked in wait, per tasklet", n, parked, "bytes", 256.0));

  // The same for coroutine tasklets, without their coroutine frames (the user's locals), measured
  // apart: what the engine adds per coroutine must not exceed what it keeps per plain tasklet.
  const double frame = tasklet::bench::in_child_process([n] {
    std::vector<tasklet::Task<void>> frames;
    frames.reserve(n);
    const std::size_t before = tasklet::bench::resident_bytes();
    for (std::size_t i = 0; i < n; ++i) frames.push_back(trivial_coroutine());
    const std::size_t after = tasklet::bench::resident_bytes();
    return static_cast<double>(after - before) / static_cast<double>(n);
  });
  const double parked_coroutine = tasklet::bench::in_child_process([n] {
    const auto scheduler = tasklet::Scheduler::create();
    std::vector<tasklet::Rescheduler> reschedulers;
    reschedulers.reserve(n);
    const std::size_t before = tasklet::bench::resident_bytes();
    for (std::size_t i = 0; i < n; ++i) {
      const auto parked_tasklet = tasklet::make_tasklet(trivial_coroutine());
      reschedulers.push_back(scheduler->suspend(*parked_tasklet));
    }
    const std::size_t after = tasklet::bench::resident_bytes();
    if (scheduler->active_count() != n) fail("not every coroutine tasklet was parked");
    return static_cast<double>(after - before) / static_cast<double>(n);
  });
  report.add(figure_row("memory: coroutine frame, per coroutine", n, frame, "bytes"));
  report.add(figure_row("memory: parked coroutine tasklet, frame excluded", n, parked_coroutine - frame,
                        "bytes", parked));
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = tasklet::bench::parse_options(argc, argv);

  std::cout << "tasklet scheduler benchmarks: median of " << options.repeats
            << " interleaved runs; ratio = median of (ours / baseline) over back-to-back pairs\n"
            << "hardware threads " << std::thread::hardware_concurrency() << ", oneTBB " << TBB_VERSION_STRING
            << " (runtime interface " << TBB_runtime_interface_version() << "), default concurrency "
            << oneapi::tbb::info::default_concurrency()
            << ", tasklet workers "
            // Asked in a child process: this one must not start the global manager's threads before
            // the memory rows fork (see in_child_process()).
            << tasklet::bench::in_child_process([] {
                 return static_cast<double>(tasklet::JobManager::global()->workers()->concurrency());
               })
            << "\n\n";
  Report::print_header(std::cout);

  Report report("tasklet scheduler benchmarks (ns/op: medians; ratio: median of paired ours/baseline)");
  // First, while this process has no threads: see resident_bytes() and in_child_process().
  if (options.selected("memory")) bench_memory(report, options);
  if (options.selected("throughput")) bench_throughput(report, options);
  if (options.selected("round")) bench_round_trip(report, options);

  tasklet::bench::finish(report, options);
  return 0;
}
