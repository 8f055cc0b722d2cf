// Private to the rules library: relations between two rules, neither of them a multi rule,
// decided from their keys when both are built-in kinds (no virtual calls beyond key()), and by
// asking the rules themselves when one is custom. The RuleKey contract makes the two agree.
#pragma once

#include "tasklet/rules/path_rule.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet::rules::detail {

/// Whether `a` and `b` conflict. A custom rule is asked in both directions, so it is heard
/// whichever side it is on (built-in rules answer false for rules they do not know).
inline bool atoms_conflict(const SchedulingRule& a, const RuleKey& key_a, const SchedulingRule& b,
                           const RuleKey& key_b) {
  using Kind = RuleKey::Kind;
  if (key_a.kind == Kind::custom || key_b.kind == Kind::custom) {
    return a.is_conflicting(b) || b.is_conflicting(a);
  }
  if (key_a.kind != key_b.kind) return false;
  if (key_a.kind == Kind::path) return PathRule::keys_conflict(key_a, key_b);
  if (key_a.kind == Kind::named) return key_a.name == key_b.name;
  return &a == &b;  // identity
}

/// Whether `outer` contains `inner`. Only a custom `outer` is asked: a built-in rule contains no
/// rule it does not know.
inline bool atom_contains(const SchedulingRule& outer, const RuleKey& key_outer, const SchedulingRule& inner,
                          const RuleKey& key_inner) {
  using Kind = RuleKey::Kind;
  if (key_outer.kind == Kind::custom) return outer.contains(inner);
  if (&outer == &inner) return true;
  if (key_outer.kind != key_inner.kind) return false;
  if (key_outer.kind == Kind::path) return PathRule::key_contains(key_outer, key_inner);
  if (key_outer.kind == Kind::named) return key_outer.name == key_inner.name;
  return false;  // identity: only the same object
}

}  // namespace tasklet::rules::detail
