// Private: how the built-in rules are allocated.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <utility>

#include <oneapi/tbb/scalable_allocator.h>

#include "tasklet/scheduling_rule.hpp"

namespace tasklet::rules::detail {

/// The least block a rule object takes: above the size class of its shared counts (24 bytes with
/// libstdc++, 32 with libc++).
inline constexpr std::size_t least_rule_block = 48;

/// Destroys a rule made by make_rule and frees its block.
template <class R>
struct FreeRule {
  void operator()(const R* rule) const noexcept {
    rule->~R();
    scalable_free(const_cast<R*>(rule));  // NOLINT(cppcoreguidelines-pro-type-const-cast): our block
  }
};

/// Makes a shared rule of type R, its object and its reference counts in blocks of their own (the
/// mutex and multi rules; path rules: make_rule_with_counts).
///
/// Every copy of a Rule (one per tasklet that carries it) writes the counts, and the rule table
/// reads the object (its vtable pointer, key and note) for every request on another core, so they
/// must not share a cache line. std::make_shared puts them side by side; a block that keeps them a
/// line apart takes two lines. oneTBB's allocator keeps each size class in slabs of its own, so a
/// rule's block (at least 48 bytes) never holds the counts (at most 32 bytes) of another rule.
/// oneTBB's allocator also because a rule made on the posting thread is mostly freed by a worker,
/// which glibc's allocator makes contend for the arena lock of the thread that allocated it.
template <class R, class... Args>
Rule make_rule(Args&&... args) {
  void* block = scalable_malloc(std::max(sizeof(R), least_rule_block));
  if (block == nullptr) throw std::bad_alloc();
  const R* rule = nullptr;
  try {
    rule = ::new (block) R(std::forward<Args>(args)...);
  } catch (...) {
    scalable_free(block);
    throw;
  }
  // If the counts cannot be allocated, the constructor frees the rule with FreeRule.
  return Rule(rule, FreeRule<R>{}, tbb::scalable_allocator<R>{});
}

/// Makes a shared rule of type R in one block with its reference counts (std::allocate_shared over
/// oneTBB's allocator), for path rules.
///
/// A path rule is mostly made for one job (`rules::path(file)`) and held by its tasklet alone: its
/// counts are written when it is made and when that copy goes, so sharing a line with the object
/// costs the table nothing, and one block instead of two is one allocation fewer on the posting
/// thread and one block fewer freed on a worker (about a tenth of a tasklet with a fresh path
/// rule). A path rule shared by every tasklet measured the same in one block as in two; a shared
/// mutex rule, whose one node every request reads, lost a third, so mutex rules keep make_rule.
template <class R, class... Args>
Rule make_rule_with_counts(Args&&... args) {
  return std::allocate_shared<R>(tbb::scalable_allocator<R>{}, std::forward<Args>(args)...);
}

}  // namespace tasklet::rules::detail
