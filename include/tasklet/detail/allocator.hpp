// tasklet/detail/allocator.hpp: where the engine's small per-job objects come from.
//
// Tasklets made by make_tasklet, rule requests and serial-executor tasks are allocated on the thread
// that schedules them and freed on the worker that ends them. The library routes them to a oneTBB
// memory pool, whose per-thread caches take a block freed on another thread back without a
// process-wide lock and never coalesce it with cold neighbours (glibc's malloc does both). The pool
// keeps the memory it took from the system: the peak of queued work stays reserved for reuse rather
// than being given back and faulted in again with every burst. A build of the library with a
// sanitizer uses operator new instead, so that the sanitizer sees every block.
// Not part of the public API: the names may change.
#pragma once

#include "tasklet/export.hpp"

#include <cstddef>
#include <new>

namespace tasklet::detail {

/// Allocates `bytes` aligned for any scalar type. Throws std::bad_alloc.
[[nodiscard]] TASKLET_EXPORT void* allocate_bytes(std::size_t bytes);
/// Frees a block from allocate_bytes (null is ignored).
TASKLET_EXPORT void deallocate_bytes(void* block) noexcept;

/// A standard allocator over allocate_bytes, for std::allocate_shared and containers.
template <class T>
struct Allocator {
  using value_type = T;
  Allocator() noexcept = default;
  template <class U>
  Allocator(const Allocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor): rebinding
  [[nodiscard]] T* allocate(std::size_t n) {
    static_assert(alignof(T) <= alignof(std::max_align_t), "over-aligned types need their own allocator");
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(allocate_bytes(n * sizeof(T)));
  }
  void deallocate(T* block, std::size_t) noexcept { deallocate_bytes(block); }
  template <class U>
  bool operator==(const Allocator<U>&) const noexcept {
    return true;
  }
};

/// Gives a class operator new and delete over allocate_bytes.
struct TASKLET_EXPORT PooledObject {
  static void* operator new(std::size_t bytes) { return allocate_bytes(bytes); }
  static void operator delete(void* block) noexcept { deallocate_bytes(block); }
};

}  // namespace tasklet::detail
