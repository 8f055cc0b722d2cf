#include "tasklet/rules/mutex_rule.hpp"

#include <array>
#include <cstdio>

#include "rules/key_relations.hpp"
#include "tasklet/error.hpp"

namespace tasklet {

bool MutexRule::contains(const SchedulingRule& other) const { return &other == this; }

bool MutexRule::is_conflicting(const SchedulingRule& other) const {
  if (&other == this) return true;
  const RuleKey theirs = other.key();
  if (theirs.kind != RuleKey::Kind::multi) return false;
  const RuleKey mine = key();
  for (const Rule& child : theirs.children) {
    if (rules::detail::atoms_conflict(*this, mine, *child, child->key())) return true;
  }
  return false;
}

std::string MutexRule::to_string() const {
  if (!name_.empty()) return "mutex(" + name_ + ")";
  std::array<char, 48> text{};
  std::snprintf(text.data(), text.size(), "mutex@%p", static_cast<const void*>(this));
  return text.data();
}

RuleKey MutexRule::key() const noexcept { return {RuleKey::Kind::identity, false, {}, {}, {}}; }

NamedMutexRule::NamedMutexRule(std::string name) : name_(std::move(name)) {
  if (name_.empty() || name_.find('\0') != std::string::npos)
    throw InvalidRule("named_mutex: a name must be non-empty and hold no NUL byte (got \"" + name_ + "\")");
}

bool NamedMutexRule::contains(const SchedulingRule& other) const {
  if (&other == this) return true;
  const RuleKey theirs = other.key();
  return theirs.kind == RuleKey::Kind::named && theirs.name == name_;
}

bool NamedMutexRule::is_conflicting(const SchedulingRule& other) const {
  if (&other == this) return true;
  const RuleKey theirs = other.key();
  if (theirs.kind == RuleKey::Kind::named) return theirs.name == name_;
  if (theirs.kind != RuleKey::Kind::multi) return false;
  const RuleKey mine = key();
  for (const Rule& child : theirs.children) {
    if (rules::detail::atoms_conflict(*this, mine, *child, child->key())) return true;
  }
  return false;
}

std::string NamedMutexRule::to_string() const { return "named_mutex(" + name_ + ")"; }

RuleKey NamedMutexRule::key() const noexcept { return {RuleKey::Kind::named, false, {}, name_, {}}; }

}  // namespace tasklet
