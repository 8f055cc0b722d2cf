// tasklet/rules/multi_rule.hpp: a rule made of several unrelated rules (Eclipse's MultiRule).
//
// A MultiRule holds its children flattened (no child is itself a multi rule), without nulls or
// duplicates, and reduced: no child is contained by another child. It conflicts with a rule when
// some child conflicts with it (a multi rule on the other side is expanded into its children), and
// contains a rule as Eclipse defines it: itself; a multi rule each of whose children is contained
// by some child of this one; any other rule that some child contains. A multi rule is therefore
// all-or-nothing: a holder gets every child at once or waits.
//
// Multi rules are created only by rules::combine (tasklet/rules/rules.hpp), which keeps the
// invariants above and returns a plain child instead when only one is left. The key is
// RuleKey::Kind::multi with the children, which the rule table indexes one by one.
// Rules are immutable: all members are safe to call concurrently.
#pragma once

#include "tasklet/export.hpp"

#include <span>
#include <string>
#include <utility>

#include <boost/container/small_vector.hpp>

#include "tasklet/scheduling_rule.hpp"

namespace tasklet {

/// The union of two or more unrelated rules, acquired all at once. Immutable; thread-safe.
class TASKLET_EXPORT MultiRule final : public SchedulingRule {
  struct Token {
    explicit Token() = default;
  };

 public:
  /// Children storage: up to four children live inside the rule object.
  using Children = boost::container::small_vector<Rule, 4>;

  /// Not for direct use (the token is private): build multi rules with rules::combine.
  MultiRule(Token, Children children) : children_(std::move(children)) {}

  /// Combines `rules` as rules::combine(range) does: flattens multi rules, drops nulls and
  /// children contained by another child (of two equivalent children the first is kept). Returns
  /// null when nothing is left, the single rule when one is left (an input multi rule is returned
  /// itself when the result would have exactly its children), else a new MultiRule. Calls the
  /// inputs' contains; throws only what a custom rule throws, or std::bad_alloc.
  [[nodiscard]] static Rule combine(std::span<const Rule> rules);

  /// The children: at least two, none null, none a multi rule, none contained by another.
  [[nodiscard]] std::span<const Rule> children() const noexcept {
    return {children_.data(), children_.size()};
  }

  /// True when `other` is this object; when `other` is a multi rule and each of its children is
  /// contained by some child of this one; otherwise when some child contains `other`.
  /// Throws only what a custom child throws.
  [[nodiscard]] bool contains(const SchedulingRule& other) const override;

  /// True when some child conflicts with `other` (or with some child of `other` when it is a
  /// multi rule). Each pair is asked in both directions, so a custom rule is heard whichever
  /// side it is on. Throws only what a custom rule throws.
  [[nodiscard]] bool is_conflicting(const SchedulingRule& other) const override;

  /// `multi[child, child, ...]` (very long lists are cut short with a count of the rest).
  [[nodiscard]] std::string to_string() const override;

  /// Kind::multi and the children (valid for the rule's lifetime).
  [[nodiscard]] RuleKey key() const noexcept override;

 private:
  Children children_;
};

}  // namespace tasklet
