// tasklet/rules/rules.hpp: the built-in scheduling rules and their factory functions.
//
//   rules::mutex("light")      conflicts with and contains only itself (MutexRule)
//   rules::named_mutex("t42")  the same lock as every named_mutex("t42") (NamedMutexRule)
//   rules::path("/project")    exclusive lock on a path and its subtree (PathRule, write)
//   rules::read_path("/p/src") shared lock: excludes writers at, above or below, not readers
//   rules::combine(a, b)       both at once (MultiRule), flattened and reduced
//
// Every factory returns a new immutable rule (identity matters: end_rule and mutex conflicts
// compare objects), safe to share between threads. The rules use only the public SchedulingRule
// interface and describe themselves through key() so that the rule table can index them. See
// docs/rules.md for the semantics, the laws and how to write a custom rule.
#pragma once

#include "tasklet/export.hpp"

#include <concepts>
#include <cstddef>
#include <initializer_list>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <boost/container/small_vector.hpp>

#include "tasklet/error.hpp"  // InvalidPath and InvalidRule, which the factories throw
#include "tasklet/rules/multi_rule.hpp"
#include "tasklet/rules/mutex_rule.hpp"
#include "tasklet/rules/path_rule.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet::rules {

/// A new MutexRule named `name` (for diagnostics only). Throws only std::bad_alloc.
[[nodiscard]] TASKLET_EXPORT Rule mutex(std::string name = {});

/// A new NamedMutexRule: conflicts with and contains every named mutex of the same `name`, in
/// this process and, through a manager that shares rules (tasklet::etcd), in others. Throws
/// InvalidRule for an empty name or one with a NUL byte.
[[nodiscard]] TASKLET_EXPORT Rule named_mutex(std::string name);

/// A new exclusive (write) PathRule on the normalised `path`. Throws InvalidPath naming the input
/// when it is empty, relative, goes above the root with "..", or holds a NUL byte.
[[nodiscard]] TASKLET_EXPORT Rule path(std::string_view path);

/// The same as path(): an exclusive (write) PathRule. Throws InvalidPath.
[[nodiscard]] TASKLET_EXPORT Rule write_path(std::string_view path);

/// A new shared (read) PathRule on the normalised `path`. Throws InvalidPath.
[[nodiscard]] TASKLET_EXPORT Rule read_path(std::string_view path);

/// Eclipse's MultiRule.combine: `b` when `a` is null, `a` when `b` is null or is `a`, `a` when it
/// contains `b`, `b` when it contains `a`, otherwise a rule holding both (flattened and reduced,
/// as combine(range)). Throws only what a custom rule's contains throws, or std::bad_alloc.
[[nodiscard]] TASKLET_EXPORT Rule combine(Rule a, Rule b);

/// Combines the rules of `rules`: flattens multi rules, drops nulls and rules contained by another
/// (of two equivalent rules the first is kept). Returns null when nothing is left, the rule itself
/// when one is left, else a MultiRule. Throws only what a custom rule's contains throws, or
/// std::bad_alloc.
[[nodiscard]] inline Rule combine(std::initializer_list<Rule> rules) {
  return MultiRule::combine({rules.begin(), rules.size()});
}

/// An input range whose elements convert to Rule (vectors, arrays, lists, views, generators).
template <class R>
concept RuleRange =
    std::ranges::input_range<R> && std::convertible_to<std::ranges::range_reference_t<R>, Rule>;

/// Combines any input range of rules, as above. Contiguous ranges of Rule are read in place;
/// others are first collected (up to eight rules without allocating).
template <RuleRange R>
[[nodiscard]] Rule combine(R&& rules) {
  if constexpr (std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                std::same_as<std::ranges::range_value_t<R>, Rule>) {
    return MultiRule::combine(
        std::span<const Rule>(std::ranges::data(rules), static_cast<std::size_t>(std::ranges::size(rules))));
  } else {
    boost::container::small_vector<Rule, 8> collected;
    if constexpr (std::ranges::sized_range<R>)
      collected.reserve(static_cast<std::size_t>(std::ranges::size(rules)));
    for (auto&& rule : rules) collected.emplace_back(std::forward<decltype(rule)>(rule));
    return MultiRule::combine({collected.data(), collected.size()});
  }
}

}  // namespace tasklet::rules
