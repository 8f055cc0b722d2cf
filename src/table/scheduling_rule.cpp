#include "tasklet/scheduling_rule.hpp"

#include "tasklet/error.hpp"

namespace tasklet {
namespace {

// A rule no user rule can know: every valid rule must neither conflict with it nor contain it.
class SentinelRule final : public SchedulingRule {
 public:
  bool contains(const SchedulingRule& other) const override { return &other == this; }
  bool is_conflicting(const SchedulingRule& other) const override { return &other == this; }
  std::string to_string() const override { return "sentinel"; }
};

const SentinelRule& sentinel() {
  static const SentinelRule rule;
  return rule;
}

void validate_one(const SchedulingRule& rule, const SchedulingRule& whole) {
  const auto fail = [&](const char* law) {
    std::string message = "invalid rule " + rule.to_string();
    if (&rule != &whole) message += " (in " + whole.to_string() + ")";
    message += ": ";
    message += law;
    throw InvalidRule(message);
  };
  const RuleKey key = rule.key();
  if (key.kind == RuleKey::Kind::multi) {
    if (key.children.empty()) fail("a multi rule has no children");
    for (const Rule& child : key.children) {
      if (!child) fail("a multi rule has a null child");
      if (child->key().kind == RuleKey::Kind::multi) fail("a multi rule nests another multi rule");
      validate_one(*child, whole);
    }
  }
  if (!rule.contains(rule)) fail("it does not contain itself");
  // Shared rules need not conflict with themselves; a multi rule conflicts with itself exactly when
  // an exclusive child does, and its children were checked above.
  const bool exempt = (key.kind == RuleKey::Kind::path && key.shared) || key.kind == RuleKey::Kind::multi;
  if (!exempt && !rule.is_conflicting(rule)) fail("it does not conflict with itself");
  if (rule.is_conflicting(sentinel())) fail("it conflicts with an unrelated rule");
  if (rule.contains(sentinel())) fail("it contains an unrelated rule");
}

}  // namespace

std::string describe(const SchedulingRule* rule) { return rule ? rule->to_string() : "null"; }

std::string describe(const Rule& rule) { return describe(rule.get()); }

std::string RuleBlocker::to_string() const {
  return owner + (holds ? " holds " : " waits for ") + describe(rule) + (holds ? "" : " (asked earlier)");
}

void validate_rule(const Rule& rule) {
  if (!rule) return;
  // Built-in kinds keep the laws by construction (their key promises as much); checking them on
  // every begin_rule would cost more than the lock itself.
  const RuleKey::Kind kind = rule->key().kind;
  if (kind == RuleKey::Kind::identity || kind == RuleKey::Kind::path || kind == RuleKey::Kind::named) return;
  validate_one(*rule, *rule);
}

}  // namespace tasklet
