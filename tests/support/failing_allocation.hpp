// Out of memory on demand. Including this header replaces operator new for the test binary (include
// it in one source file per binary): a thread that arms FailNth sees its n-th allocation fail,
// through operator new and through the library's own allocator (its test seam); a thread that calls
// FailLater::arm sees its n-th allocation fail from then on, whatever code it goes on to run (a
// worker, after the job body that armed it returned), until another thread disarms it. Other
// threads never see a failure.
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>

#include "base/allocation_seam.hpp"

namespace tasklet::test {

namespace failing {
// The allocation of this thread that fails next: 0 when none is armed.
inline thread_local long allocations_left = 0;
inline thread_local bool failed_one = false;

// FailLater's: the armed thread (the address of its `marker`), what it has left, whether it failed.
inline thread_local const char marker = 0;
inline std::atomic<const char*> armed_thread{nullptr};
inline std::atomic<long> armed_left{0};
inline std::atomic<bool> armed_failed{false};

inline bool this_allocation_fails() noexcept {
  if (armed_thread.load(std::memory_order_acquire) == &marker) {
    if (armed_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return false;
    armed_failed.store(true, std::memory_order_release);
    return true;
  }
  if (allocations_left <= 0 || --allocations_left != 0) return false;
  failed_one = true;
  return true;
}
}  // namespace failing

/// Fails the n-th allocation the calling thread makes after arm(), until disarm() (from any thread).
/// One thread at a time.
struct FailLater {
  static void arm(long n) noexcept {
    failing::armed_failed.store(false);
    failing::armed_left.store(n);
    detail::allocation_fails = &failing::this_allocation_fails;
    failing::armed_thread.store(&failing::marker, std::memory_order_release);
  }
  /// Disarms, and says whether the armed allocation has failed.
  static bool disarm() noexcept {
    failing::armed_thread.store(nullptr, std::memory_order_release);
    detail::allocation_fails = nullptr;
    return failing::armed_failed.load();
  }
};

/// Fails the n-th allocation of this thread while it lives.
class FailNth {
 public:
  explicit FailNth(long n) noexcept {
    failing::failed_one = false;
    failing::allocations_left = n;
    detail::allocation_fails = &failing::this_allocation_fails;
  }
  ~FailNth() {
    failing::allocations_left = 0;
    detail::allocation_fails = nullptr;
  }
  FailNth(const FailNth&) = delete;
  FailNth& operator=(const FailNth&) = delete;
  /// Whether the allocation armed has failed.
  bool fired() const noexcept { return failing::failed_one; }
};

}  // namespace tasklet::test

void* operator new(std::size_t bytes) {
  if (tasklet::test::failing::this_allocation_fails()) throw std::bad_alloc();
  if (void* block = std::malloc(bytes == 0 ? 1 : bytes)) return block;
  throw std::bad_alloc();
}
// Not inlined: GCC would see free() on a pointer from operator new (-Wmismatched-new-delete).
__attribute__((noinline)) void operator delete(void* block) noexcept { std::free(block); }
__attribute__((noinline)) void operator delete(void* block, std::size_t) noexcept { std::free(block); }
