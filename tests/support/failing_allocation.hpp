// Out of memory on demand. Including this header replaces operator new for the test binary (include
// it in one source file per binary): a thread that arms FailNth sees its n-th allocation fail,
// through operator new and through the library's own allocator (its test seam). Other threads never
// see a failure.
#pragma once

#include <cstdlib>
#include <new>

#include "allocation_seam.hpp"

namespace tasklet::test {

namespace failing {
// The allocation of this thread that fails next: 0 when none is armed.
inline thread_local long allocations_left = 0;
inline thread_local bool failed_one = false;

inline bool this_allocation_fails() noexcept {
  if (allocations_left <= 0 || --allocations_left != 0) return false;
  failed_one = true;
  return true;
}
}  // namespace failing

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
