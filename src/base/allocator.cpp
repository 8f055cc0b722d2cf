#include "tasklet/detail/allocator.hpp"

#include "base/allocation_seam.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TASKLET_PLAIN_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TASKLET_PLAIN_ALLOCATOR 1
#endif
#endif

#ifndef TASKLET_PLAIN_ALLOCATOR
#include <cstdint>
#include <cstdlib>

#include <oneapi/tbb/scalable_allocator.h>
#endif

namespace tasklet::detail {

#ifndef TASKLET_PLAIN_ALLOCATOR
namespace {

void* take_from_system(std::intptr_t /*pool*/, std::size_t& bytes) { return std::malloc(bytes); }
int give_to_system(std::intptr_t /*pool*/, void* region, std::size_t /*bytes*/) {
  std::free(region);
  return 0;
}

// A oneTBB memory pool that keeps the regions it took: oneTBB's default pool gives a region back to
// the system as soon as its last block is freed, so a burst of jobs paid a page fault every few
// objects each time it came back (about two thirds of make_job's time). The peak of queued work stays
// reserved for the next burst instead. Null if the pool cannot be made: the default pool then.
rml::MemoryPool* keeping_pool() noexcept {
  static rml::MemoryPool* const pool = [] {
    const rml::MemPoolPolicy policy(&take_from_system, &give_to_system, 0, /*fixedPool=*/false,
                                    /*keepAllMemory=*/true);
    rml::MemoryPool* made = nullptr;
    return rml::pool_create_v1(0, &policy, &made) == rml::POOL_OK ? made : nullptr;
  }();
  return pool;
}

}  // namespace
#endif

std::atomic<bool (*)()> allocation_fails{nullptr};

void* allocate_bytes(std::size_t bytes) {
  if (auto* fails = allocation_fails.load(std::memory_order_relaxed); fails != nullptr && fails()) {
    throw std::bad_alloc();
  }
#ifdef TASKLET_PLAIN_ALLOCATOR
  return ::operator new(bytes);
#else
  if (bytes == 0) bytes = 1;
  rml::MemoryPool* pool = keeping_pool();
  void* block = pool != nullptr ? rml::pool_malloc(pool, bytes) : scalable_malloc(bytes);
  if (block == nullptr) throw std::bad_alloc();
  return block;
#endif
}

void deallocate_bytes(void* block) noexcept {
#ifdef TASKLET_PLAIN_ALLOCATOR
  ::operator delete(block);
#else
  if (block == nullptr) return;
  if (rml::MemoryPool* pool = keeping_pool()) {
    rml::pool_free(pool, block);
  } else {
    scalable_free(block);
  }
#endif
}

}  // namespace tasklet::detail
