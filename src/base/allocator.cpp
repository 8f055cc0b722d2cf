#include "tasklet/detail/allocator.hpp"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TASKLET_PLAIN_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define TASKLET_PLAIN_ALLOCATOR 1
#endif
#endif

#ifndef TASKLET_PLAIN_ALLOCATOR
#include <oneapi/tbb/scalable_allocator.h>
#endif

namespace tasklet::detail {

void* allocate_bytes(std::size_t bytes) {
#ifdef TASKLET_PLAIN_ALLOCATOR
  return ::operator new(bytes);
#else
  void* block = scalable_malloc(bytes == 0 ? 1 : bytes);
  if (block == nullptr) throw std::bad_alloc();
  return block;
#endif
}

void deallocate_bytes(void* block) noexcept {
#ifdef TASKLET_PLAIN_ALLOCATOR
  ::operator delete(block);
#else
  scalable_free(block);
#endif
}

}  // namespace tasklet::detail
