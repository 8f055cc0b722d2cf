#include "tasklet/rules/rules.hpp"

#include <array>
#include <memory>
#include <utility>

#include <oneapi/tbb/scalable_allocator.h>

#include "rules/make_rule.hpp"

namespace tasklet {

// Out of line so that the note's allocator stays out of the public header: the rule table takes
// the note from oneTBB's allocator, aligned (RuleTable::note_on).
SchedulingRule::~SchedulingRule() {
  void* note = table_slot_.load(std::memory_order_acquire);
  if (note != seen_once()) scalable_aligned_free(note);
}

}  // namespace tasklet

namespace tasklet::rules {

Rule mutex(std::string name) { return detail::make_rule<MutexRule>(std::move(name)); }

Rule named_mutex(std::string name) { return detail::make_rule<NamedMutexRule>(std::move(name)); }

Rule path(std::string_view path) {
  return detail::make_rule_with_counts<PathRule>(path, PathRule::Mode::exclusive);
}

Rule write_path(std::string_view path) { return rules::path(path); }

Rule read_path(std::string_view path) {
  return detail::make_rule_with_counts<PathRule>(path, PathRule::Mode::shared);
}

Rule combine(Rule a, Rule b) {
  if (!a) return b;
  if (!b || a == b) return a;
  if (a->contains(*b)) return a;
  if (b->contains(*a)) return b;
  const std::array<Rule, 2> both{std::move(a), std::move(b)};
  return MultiRule::combine(both);
}

}  // namespace tasklet::rules
