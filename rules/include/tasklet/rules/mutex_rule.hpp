// tasklet/rules/mutex_rule.hpp: the identity rule (Eclipse's "mutex" / IdentityRule).
//
// A MutexRule conflicts with and contains only itself, the same object: two tasklets or jobs that
// share one MutexRule never run together and run in the order they asked for it (the light-switch
// guarantee); two different MutexRule objects, even with the same name, are unrelated. Its key is
// RuleKey::Kind::identity, so the rule table indexes it by address instead of comparing it with
// every held rule. Create one with rules::mutex() (tasklet/rules/rules.hpp).
//
// Like every rule it is immutable after construction: all member functions are safe to call
// concurrently.
#pragma once

#include "tasklet/export.hpp"

#include <string>
#include <string_view>
#include <utility>

#include "tasklet/scheduling_rule.hpp"

namespace tasklet {

/// A rule that conflicts with and contains only itself (identity). Immutable; thread-safe.
class TASKLET_EXPORT MutexRule final : public SchedulingRule {
 public:
  /// A mutex named `name` for diagnostics (the name plays no part in conflicts). Throws only
  /// std::bad_alloc.
  explicit MutexRule(std::string name = {}) : name_(std::move(name)) {}

  /// The diagnostic name given at construction (may be empty).
  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// True only for this object itself. Never throws.
  [[nodiscard]] bool contains(const SchedulingRule& other) const override;

  /// True for this object itself, and for a multi rule with a child that conflicts with this
  /// object (this object, or a custom child that says so), so that conflicts stay symmetric.
  /// Throws only what a custom child of a multi rule throws.
  [[nodiscard]] bool is_conflicting(const SchedulingRule& other) const override;

  /// `mutex(name)`, or `mutex@0x...` (the address) when unnamed.
  [[nodiscard]] std::string to_string() const override;

  /// Kind::identity: the table may index this rule by its address.
  [[nodiscard]] RuleKey key() const noexcept override;

 private:
  std::string name_;
};

/// A mutex known by its name: every NamedMutexRule of the same name is the same lock (they conflict
/// with and contain each other), so unrelated code, and other processes through a manager that
/// shares rules across processes (tasklet::etcd), can agree on it by name. Immutable; thread-safe.
/// Create one with rules::named_mutex() (tasklet/rules/rules.hpp).
class TASKLET_EXPORT NamedMutexRule final : public SchedulingRule {
 public:
  /// Throws InvalidRule for an empty name or one with a NUL byte; std::bad_alloc.
  explicit NamedMutexRule(std::string name);
  NamedMutexRule(const NamedMutexRule&) = delete;  // key() points into the object
  NamedMutexRule& operator=(const NamedMutexRule&) = delete;

  [[nodiscard]] const std::string& name() const noexcept { return name_; }

  /// True for every named mutex of the same name. Never throws.
  [[nodiscard]] bool contains(const SchedulingRule& other) const override;

  /// True for every named mutex of the same name, and for a multi rule with a child that
  /// conflicts with this rule. Throws only what a custom child of a multi rule throws.
  [[nodiscard]] bool is_conflicting(const SchedulingRule& other) const override;

  /// `named_mutex(name)`.
  [[nodiscard]] std::string to_string() const override;

  /// Kind::named with the name.
  [[nodiscard]] RuleKey key() const noexcept override;

 private:
  std::string name_;
};

}  // namespace tasklet
