// Requests and rules for tests of the rule table on its own (no scheduler above it).
#pragma once

#include <string>
#include <utility>

#include "table/rule_table.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet::test {

/// A request that counts its answers and names itself in the table's readings (owner() is
/// itself, for blockers_of). `may_park`: it offers to stay parked in the table when released.
struct Probe final : detail::InlineRuleRequest<4> {
  explicit Probe(Rule rule, std::string label = "probe") : kept(std::move(rule)), name(std::move(label)) {
    set_rule(kept.get());
  }
  const Rule& rule() const noexcept { return kept; }
  void granted() noexcept override { ++grants; }
  void canceled() noexcept override { ++cancels; }
  bool parkable() const noexcept override { return may_park; }
  const void* owner() const noexcept override { return this; }
  RuleBlocker describe() const override { return {name, kept, false}; }

  Rule kept;
  std::string name;
  int grants = 0;
  int cancels = 0;
  bool may_park = false;
};

/// A user-written rule without an index: conflicts with the same colour and with every path under
/// "/c<colour>", as a custom rule that knows path rules may.
class ColourRule final : public SchedulingRule {
 public:
  explicit ColourRule(int colour) : colour_(colour) {}
  bool contains(const SchedulingRule& other) const override { return &other == this; }
  bool is_conflicting(const SchedulingRule& other) const override {
    if (const auto* same = dynamic_cast<const ColourRule*>(&other)) return same->colour_ == colour_;
    const RuleKey key = other.key();
    return key.kind == RuleKey::Kind::path && !PathSegments(key.path).empty() &&
           PathSegments(key.path).front() == "c" + std::to_string(colour_);
  }
  std::string to_string() const override { return "colour(" + std::to_string(colour_) + ")"; }

 private:
  int colour_;
};

}  // namespace tasklet::test
