// Private: the rule table's lock, which can also add up how long it is held.
//
// Built with TASKLET_TABLE_OCCUPANCY (CMake option of the same name; the `scaling` preset, for
// tasklet_bench_scaling), every hold is timed and summed per table: the benchmark divides the sum
// over all tables by the wall time to get the lock's occupancy, and from it the worker count at
// which the lock would be saturated. Normal builds compile the timing out: the lock is oneTBB's
// mutex, nothing more.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <oneapi/tbb/mutex.h>

#ifndef TASKLET_TABLE_OCCUPANCY
#define TASKLET_TABLE_OCCUPANCY 0
#endif
#if TASKLET_TABLE_OCCUPANCY && (defined(__x86_64__) || defined(__i386__))
#include <x86intrin.h>
#endif

namespace tasklet::detail {

#if TASKLET_TABLE_OCCUPANCY
/// The clock that times the lock's holds: the time-stamp counter where there is one (a few
/// nanoseconds to read, where the steady clock takes tens), else the steady clock's nanoseconds.
inline std::uint64_t table_clock() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}
#endif

/// For the occupancy: the clock's reading now and, summed over every table of the process, how
/// long their locks have been held, in the clock's ticks (held / (now - then) is the share of the
/// time between two readings). nullopt when the library was built without
/// TASKLET_TABLE_OCCUPANCY. Thread-safe.
/// A table has a lock per shard: `locks` has each live lock's own sum, by the lock's address.
struct TableLockReading {
  std::uint64_t now;
  std::uint64_t held;
  std::vector<std::pair<const void*, std::uint64_t>> locks;
};
std::optional<TableLockReading> read_table_lock() noexcept;
/// The largest share of the time between two readings for which any one lock was held (the lock
/// that saturates first). 0 when no lock lived through both.
double busiest_lock_share(const TableLockReading& before, const TableLockReading& after) noexcept;

// Held for a few hundred nanoseconds at a time by the posting thread and the releasing workers:
// oneTBB's mutex spins briefly before it sleeps, where a plain futex mutex would turn every
// collision into a sleep and a wake-up that cost more than the work.
class TableMutex {
 public:
#if TASKLET_TABLE_OCCUPANCY
  TableMutex();
  ~TableMutex();
  TableMutex(const TableMutex&) = delete;
  TableMutex& operator=(const TableMutex&) = delete;
#endif

  void lock() {
    mutex_.lock();
    start();
  }
  bool try_lock() {
    if (!mutex_.try_lock()) return false;
    start();
    return true;
  }
  void unlock() {
    stop();
    mutex_.unlock();
  }

 private:
#if TASKLET_TABLE_OCCUPANCY
  friend std::optional<TableLockReading> read_table_lock() noexcept;
  void start() noexcept { since_ = table_clock(); }
  // On the lock's own cache line, which the holder has already: a shared counter would cost a
  // transfer between cores per hold, inside the hold.
  void stop() noexcept {
    held_.store(held_.load(std::memory_order_relaxed) + (table_clock() - since_), std::memory_order_relaxed);
  }
  std::uint64_t since_ = 0;             // written and read by the lock's holder only
  std::atomic<std::uint64_t> held_{0};  // written by the holder, read by read_table_lock()
#else
  static void start() noexcept {}
  static void stop() noexcept {}
#endif
  oneapi::tbb::mutex mutex_;
};

}  // namespace tasklet::detail
