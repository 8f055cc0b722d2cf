// Private: how the built-in rules are allocated.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

#include <oneapi/tbb/scalable_allocator.h>

#include "tasklet/scheduling_rule.hpp"

namespace tasklet::rules::detail {

/// The cache line size the rule is kept apart by (x86-64 and most AArch64 cores).
inline constexpr std::size_t cache_line = 64;

/// Makes a shared rule of type R whose object starts on a cache line of its own.
///
/// std::make_shared puts the reference counts right before the object, in the same cache line.
/// Every copy of a Rule (one per tasklet that carries it) writes the counts, and the rule table
/// reads the object (its vtable pointer and note) for every request on another core, so each copy
/// would take the line away from that core.
template <class R, class... Args>
Rule make_rule(Args&&... args);

/// A rule of type R on cache lines of its own (see make_rule).
template <class R>
struct alignas(cache_line) RuleApart {
  template <class... Args>
  explicit RuleApart(Args&&... args) : rule(std::forward<Args>(args)...) {}
  R rule;
};

/// oneTBB's scalable allocator at the type's own alignment: its cache_aligned_allocator aligns to
/// 128 bytes by padding every block with as much again, a third of a fresh path rule's memory.
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() noexcept = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor): rebinding
  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    void* block = scalable_aligned_malloc(n * sizeof(T), alignof(T));
    if (block == nullptr) throw std::bad_alloc();
    return static_cast<T*>(block);
  }
  void deallocate(T* block, std::size_t) noexcept { scalable_aligned_free(block); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept {
    return true;
  }
};

template <class R, class... Args>
Rule make_rule(Args&&... args) {
  // One block, as with std::make_shared; the Rule shares its ownership and points at the rule.
  // oneTBB's allocator: a rule made by the posting thread is mostly freed by a worker, which
  // glibc's allocator makes contend for the arena lock of the thread that allocated it.
  auto block =
      std::allocate_shared<const RuleApart<R>>(AlignedAllocator<RuleApart<R>>{}, std::forward<Args>(args)...);
  const R* rule = &block->rule;
  return Rule(std::move(block), rule);
}

}  // namespace tasklet::rules::detail
