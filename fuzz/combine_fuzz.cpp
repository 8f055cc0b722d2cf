// Fuzzes rules::combine over mutex, path (exclusive and shared), custom and nested multi rules.
//
// The input is a small program: each byte pair adds a rule to a pool, either an atom (one of three
// mutex rules, a path rule on a node of a small tree, exclusive or shared, or one of two custom
// "colour" rules) or the combination of two or three rules already in the pool. Every pool entry
// remembers the atoms it was made of. For every pair (and some triples) of entries the fuzzer
// checks the rule laws (DESIGN section 2.2) and that a combination conflicts exactly when one of
// its atoms conflicts with one of the other side's: combine reduces and flattens, it must never
// change what conflicts. Each combination must also be well formed (flat, no nulls, no child
// contained by another) and pass validate_rule.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tasklet/rules/multi_rule.hpp"
#include "tasklet/rules/rules.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace {

// A user-written rule: conflicts with the same colour only, contains itself only.
class ColourRule final : public tasklet::SchedulingRule {
 public:
  explicit ColourRule(int colour) : colour_(colour) {}
  bool contains(const SchedulingRule& other) const override { return &other == this; }
  bool is_conflicting(const SchedulingRule& other) const override {
    const auto* same = dynamic_cast<const ColourRule*>(&other);
    return same != nullptr && same->colour_ == colour_;
  }
  std::string to_string() const override { return "colour(" + std::to_string(colour_) + ")"; }

 private:
  int colour_;
};

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "combine_fuzz: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) fail(what);
}

struct Entry {
  tasklet::Rule rule;
  std::vector<tasklet::Rule> atoms;  // what it was combined from, flattened; empty for null
  bool has_shared = false;
};

struct Atoms {
  std::array<tasklet::Rule, 3> mutexes{tasklet::rules::mutex("m0"), tasklet::rules::mutex("m1"),
                                       tasklet::rules::mutex("m2")};
  std::array<tasklet::Rule, 2> colours{std::make_shared<ColourRule>(0), std::make_shared<ColourRule>(1)};

  // A path of depth 0-3 over the segments a, b, c, chosen by `code`.
  static std::string path_of(std::uint8_t code) {
    std::string path;
    const int depth = code % 4;
    for (int i = 0; i < depth; ++i) {
      code = static_cast<std::uint8_t>(code / 3 + 7 * i);
      path += '/';
      path += static_cast<char>('a' + code % 3);
    }
    return path.empty() ? "/" : path;
  }
};

bool any_atom_conflicts(const Entry& a, const Entry& b) {
  for (const tasklet::Rule& x : a.atoms) {
    for (const tasklet::Rule& y : b.atoms) {
      if (x->is_conflicting(*y)) return true;
    }
  }
  return false;
}

void check_well_formed(const tasklet::Rule& rule) {
  const auto* multi = dynamic_cast<const tasklet::MultiRule*>(rule.get());
  if (multi == nullptr) return;
  const auto children = multi->children();
  check(children.size() >= 2, "a multi rule with fewer than two children");
  for (std::size_t i = 0; i < children.size(); ++i) {
    check(children[i] != nullptr, "a null child");
    check(dynamic_cast<const tasklet::MultiRule*>(children[i].get()) == nullptr,
          "a multi rule not flattened");
    for (std::size_t j = 0; j < children.size(); ++j) {
      if (i != j) check(!children[i]->contains(*children[j]), "a child contained by another");
    }
  }
}

bool is_custom(const tasklet::Rule& rule) { return dynamic_cast<const ColourRule*>(rule.get()) != nullptr; }

void check_pair(const Entry& a, const Entry& b) {
  if (!a.rule || !b.rule) return;
  const bool conflict = a.rule->is_conflicting(*b.rule);
  // A user's rule need not know multi rules (the engine asks it about each child), so symmetry is
  // only required of the library's side.
  if (!is_custom(a.rule) && !is_custom(b.rule)) {
    check(conflict == b.rule->is_conflicting(*a.rule), "is_conflicting is not symmetric");
  }
  check((conflict || b.rule->is_conflicting(*a.rule)) == any_atom_conflicts(a, b),
        "a combination conflicts otherwise than its inputs");
  if (!a.has_shared && a.rule->contains(*b.rule)) {
    check(conflict, "an exclusive rule contains a rule it does not conflict with");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Atoms atoms;
  std::vector<Entry> pool;
  for (std::size_t at = 0; at + 1 < size && pool.size() < 12; at += 2) {
    const std::uint8_t op = data[at];
    const std::uint8_t arg = data[at + 1];
    Entry entry;
    switch (op % 5) {
      case 0:
        entry.rule = atoms.mutexes[arg % 3];
        break;
      case 1:
        entry.rule = (arg & 0x80u) != 0 ? tasklet::rules::read_path(Atoms::path_of(arg))
                                        : tasklet::rules::path(Atoms::path_of(arg));
        entry.has_shared = (arg & 0x80u) != 0;
        break;
      case 2:
        entry.rule = atoms.colours[arg % 2];
        break;
      default: {
        if (pool.empty()) continue;
        // Combine two or three entries of the pool (chosen by arg), with a null now and then.
        std::vector<tasklet::Rule> inputs;
        const std::size_t count = op % 5 == 3 ? 2 : 3;
        for (std::size_t i = 0; i < count; ++i) {
          const Entry& from = pool[(arg + i * 5u) % pool.size()];
          inputs.push_back(from.rule);
          entry.atoms.insert(entry.atoms.end(), from.atoms.begin(), from.atoms.end());
          entry.has_shared = entry.has_shared || from.has_shared;
        }
        if ((op & 0x40u) != 0) inputs.push_back(nullptr);
        entry.rule = count == 2 && (op & 0x20u) != 0 ? tasklet::rules::combine(inputs[0], inputs[1])
                                                     : tasklet::rules::combine(inputs);
        check(static_cast<bool>(entry.rule) == !entry.atoms.empty(), "combine lost or invented a rule");
        check_well_formed(entry.rule);
        break;
      }
    }
    if (entry.atoms.empty() && entry.rule) entry.atoms.push_back(entry.rule);
    if (entry.rule) {
      check(entry.rule->contains(*entry.rule), "contains is not reflexive");
      tasklet::validate_rule(entry.rule);  // throws (a crash here) for a rule breaking the laws
    }
    pool.push_back(std::move(entry));
  }
  for (const Entry& a : pool) {
    for (const Entry& b : pool) check_pair(a, b);
  }
  // contains is transitive.
  for (const Entry& a : pool) {
    for (const Entry& b : pool) {
      if (!a.rule || !b.rule || !a.rule->contains(*b.rule)) continue;
      for (const Entry& c : pool) {
        if (c.rule && b.rule->contains(*c.rule))
          check(a.rule->contains(*c.rule), "contains is not transitive");
      }
    }
  }
  return 0;
}
