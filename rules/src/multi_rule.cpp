#include "tasklet/rules/multi_rule.hpp"

#include <algorithm>
#include <cstddef>
#include <memory>

#include "rules/key_relations.hpp"
#include "rules/make_rule.hpp"

namespace tasklet {
namespace {

using rules::detail::atom_contains;
using rules::detail::atoms_conflict;

struct Keyed {
  Rule rule;
  RuleKey key;  // spans into *rule, which `rule` keeps alive
};

// The input multi rule whose children are exactly `kept`, in order, if there is one.
Rule input_with_children(std::span<const Rule> inputs, std::span<const Keyed> kept) {
  for (const Rule& input : inputs) {
    if (!input) continue;
    const RuleKey key = input->key();
    if (key.kind != RuleKey::Kind::multi || key.children.size() != kept.size()) continue;
    if (std::equal(kept.begin(), kept.end(), key.children.begin(),
                   [](const Keyed& a, const Rule& b) { return a.rule == b; })) {
      return input;
    }
  }
  return nullptr;
}

}  // namespace

Rule MultiRule::combine(std::span<const Rule> rules) {
  const auto non_null = static_cast<std::size_t>(
      std::count_if(rules.begin(), rules.end(), [](const Rule& rule) { return rule != nullptr; }));
  if (non_null == 0) return nullptr;
  if (non_null == 1)
    return *std::find_if(rules.begin(), rules.end(), [](const Rule& rule) { return rule != nullptr; });

  // Flatten, then keep an antichain: a candidate contained by a kept rule is dropped (so of two
  // equivalent rules the first stays), and a candidate evicts the kept rules it contains.
  boost::container::small_vector<Keyed, 8> kept;
  const auto add = [&kept](const Rule& candidate, const RuleKey& key) {
    for (const Keyed& k : kept) {
      if (k.rule == candidate || atom_contains(*k.rule, k.key, *candidate, key)) return;
    }
    kept.erase(std::remove_if(kept.begin(), kept.end(),
                              [&](const Keyed& k) { return atom_contains(*candidate, key, *k.rule, k.key); }),
               kept.end());
    kept.push_back({candidate, key});
  };
  for (const Rule& rule : rules) {
    if (!rule) continue;
    const RuleKey key = rule->key();
    if (key.kind != RuleKey::Kind::multi) {
      add(rule, key);
      continue;
    }
    for (const Rule& child : key.children) {
      if (child) add(child, child->key());
    }
  }

  if (kept.empty()) return nullptr;
  if (kept.size() == 1) return std::move(kept.front().rule);
  if (Rule same = input_with_children(rules, {kept.data(), kept.size()})) return same;
  Children children;
  children.reserve(kept.size());
  for (Keyed& k : kept) children.push_back(std::move(k.rule));
  return rules::detail::make_rule<MultiRule>(Token{}, std::move(children));
}

bool MultiRule::contains(const SchedulingRule& other) const {
  if (&other == this) return true;
  const RuleKey theirs = other.key();
  const auto some_child_contains = [this](const SchedulingRule& rule, const RuleKey& key) {
    return std::any_of(children_.begin(), children_.end(),
                       [&](const Rule& child) { return atom_contains(*child, child->key(), rule, key); });
  };
  if (theirs.kind != RuleKey::Kind::multi) return some_child_contains(other, theirs);
  return !theirs.children.empty() &&
         std::all_of(theirs.children.begin(), theirs.children.end(),
                     [&](const Rule& child) { return some_child_contains(*child, child->key()); });
}

bool MultiRule::is_conflicting(const SchedulingRule& other) const {
  const RuleKey theirs = other.key();
  if (theirs.kind != RuleKey::Kind::multi) {
    return std::any_of(children_.begin(), children_.end(), [&](const Rule& child) {
      return atoms_conflict(*child, child->key(), other, theirs);
    });
  }
  boost::container::small_vector<RuleKey, 8> their_keys;
  their_keys.reserve(theirs.children.size());
  for (const Rule& child : theirs.children) their_keys.push_back(child->key());
  for (const Rule& mine : children_) {
    const RuleKey my_key = mine->key();
    for (std::size_t i = 0; i < their_keys.size(); ++i) {
      if (atoms_conflict(*mine, my_key, *theirs.children[i], their_keys[i])) return true;
    }
  }
  return false;
}

std::string MultiRule::to_string() const {
  constexpr std::size_t shown = 16;
  std::string text = "multi[";
  for (std::size_t i = 0; i < children_.size() && i < shown; ++i) {
    if (i != 0) text += ", ";
    text += children_[i]->to_string();
  }
  if (children_.size() > shown) text += ", ... " + std::to_string(children_.size() - shown) + " more";
  text += ']';
  return text;
}

RuleKey MultiRule::key() const noexcept { return {RuleKey::Kind::multi, false, {}, {}, children()}; }

}  // namespace tasklet
