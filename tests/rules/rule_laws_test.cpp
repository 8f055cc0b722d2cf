// Property tests: the laws of DESIGN 2.2 over thousands of random built-in and custom rules,
// checked against a reference model written independently of the library (paths as strings
// with a trailing '/', multi rules as sets of atoms).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tasklet/rules/rules.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet {
namespace {

// A well-behaved custom rule (the shape docs/rules.md recommends): rules with the same tag
// conflict with and contain each other; a multi rule is treated as the union of its children.
class TagRule final : public SchedulingRule {
 public:
  explicit TagRule(int tag) : tag_(tag) {}

  [[nodiscard]] bool contains(const SchedulingRule& other) const override {
    if (&other == this) return true;
    if (const auto* tagged = dynamic_cast<const TagRule*>(&other)) return tagged->tag_ == tag_;
    const RuleKey key = other.key();
    return key.kind == RuleKey::Kind::multi && std::all_of(key.children.begin(), key.children.end(),
                                                           [this](const Rule& c) { return contains(*c); });
  }

  [[nodiscard]] bool is_conflicting(const SchedulingRule& other) const override {
    if (const auto* tagged = dynamic_cast<const TagRule*>(&other)) return tagged->tag_ == tag_;
    const RuleKey key = other.key();
    return key.kind == RuleKey::Kind::multi &&
           std::any_of(key.children.begin(), key.children.end(),
                       [this](const Rule& c) { return is_conflicting(*c); });
  }

  [[nodiscard]] std::string to_string() const override { return "tag(" + std::to_string(tag_) + ")"; }

 private:
  int tag_;
};

// --- the reference model ---------------------------------------------------------------------

struct Atom {
  enum class Kind : std::uint8_t { mutex, tag, path, named };
  Kind kind;
  int id = 0;          // mutex: index in the pool (same index, same object); tag: the tag; named: the name
  std::string prefix;  // path: "/" for the root, else "/a/b/" (normalised, trailing '/')
  bool shared = false;
};

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

bool model_atoms_conflict(const Atom& a, const Atom& b) {
  if (a.kind != b.kind) return false;
  if (a.kind != Atom::Kind::path) return a.id == b.id;
  return !(a.shared && b.shared) && (starts_with(a.prefix, b.prefix) || starts_with(b.prefix, a.prefix));
}

bool model_atom_contains(const Atom& outer, const Atom& inner) {
  if (outer.kind != inner.kind) return false;
  if (outer.kind != Atom::Kind::path) return outer.id == inner.id;
  return starts_with(inner.prefix, outer.prefix) && (!outer.shared || inner.shared);
}

struct Sample {
  Rule rule;
  std::vector<Atom> atoms;  // what the rule was built from (before any reduction)
};

bool model_conflict(const Sample& x, const Sample& y) {
  for (const Atom& a : x.atoms) {
    for (const Atom& b : y.atoms) {
      if (model_atoms_conflict(a, b)) return true;
    }
  }
  return false;
}

bool model_contains(const Sample& x, const Sample& y) {
  if (x.rule == y.rule) return true;
  return std::all_of(y.atoms.begin(), y.atoms.end(), [&](const Atom& b) {
    return std::any_of(x.atoms.begin(), x.atoms.end(),
                       [&](const Atom& a) { return model_atom_contains(a, b); });
  });
}

bool all_shared(const Sample& x) {
  return std::all_of(x.atoms.begin(), x.atoms.end(), [](const Atom& a) { return a.shared; });
}

// --- random rules ----------------------------------------------------------------------------

class Generator {
 public:
  explicit Generator(std::uint32_t seed) : rng_(seed) {
    for (int i = 0; i < 3; ++i) mutexes_.push_back(rules::mutex("m" + std::to_string(i)));
  }

  int below(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  std::mt19937& rng() { return rng_; }

  // Depth 0..5 over a small alphabet ("ab" checks that "/a" is not an ancestor of "/ab"); the
  // input is written with noise that normalisation must remove.
  Sample path() {
    static const std::array<std::string, 3> alphabet = {"a", "b", "ab"};
    const int depth = below(6);
    std::string clean = "/";
    std::string noisy;
    for (int i = 0; i < depth; ++i) {
      const std::string& segment = alphabet[static_cast<std::size_t>(below(3))];
      clean += segment + "/";
      switch (below(6)) {
        case 0:
          noisy += "//";
          break;
        case 1:
          noisy += "/./";
          break;
        case 2:
          noisy += "/zz/../";
          break;
        default:
          noisy += "/";
          break;
      }
      noisy += segment;
    }
    if (noisy.empty() || below(4) == 0) noisy += "/";
    const bool shared = below(2) == 0;
    Atom atom{Atom::Kind::path, 0, clean, shared};
    return {shared ? rules::read_path(noisy) : rules::write_path(noisy), {atom}};
  }

  Sample atom() {
    const int pick = below(20);
    if (pick < 3) {
      const int id = below(static_cast<int>(mutexes_.size()));
      return {mutexes_[static_cast<std::size_t>(id)], {Atom{Atom::Kind::mutex, id, {}, false}}};
    }
    if (pick < 5) {
      const int tag = below(2);
      return {std::make_shared<const TagRule>(tag), {Atom{Atom::Kind::tag, tag, {}, false}}};
    }
    if (pick < 7) {
      // A new object every time: the name alone makes two of them the same lock.
      const int name = below(3);
      return {rules::named_mutex("n" + std::to_string(name)), {Atom{Atom::Kind::named, name, {}, false}}};
    }
    return path();
  }

  Sample combined(int nesting) {
    const int count = 2 + below(3);
    std::vector<Sample> parts;
    parts.reserve(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i)
      parts.push_back(nesting > 0 && below(3) == 0 ? combined(nesting - 1) : atom());
    Sample result;
    if (below(2) == 0) {
      for (const Sample& part : parts) result.rule = rules::combine(result.rule, part.rule);
    } else {
      std::vector<Rule> list;
      list.reserve(parts.size());
      for (const Sample& part : parts) list.push_back(part.rule);
      result.rule = rules::combine(list);
    }
    for (const Sample& part : parts)
      result.atoms.insert(result.atoms.end(), part.atoms.begin(), part.atoms.end());
    return result;
  }

  Sample any() { return below(4) == 0 ? combined(1) : atom(); }

  std::vector<Sample> pool(std::size_t size) {
    std::vector<Sample> samples;
    samples.reserve(size);
    while (samples.size() < size) samples.push_back(any());
    return samples;
  }

 private:
  std::mt19937 rng_;
  std::vector<Rule> mutexes_;
};

std::vector<std::uint32_t> seeds() {
  if (const char* text = std::getenv("TASKLET_RULES_SEED")) {  // NOLINT(concurrency-mt-unsafe)
    return {static_cast<std::uint32_t>(std::strtoul(text, nullptr, 10))};
  }
  return {20240601U, 7U, 424242U, 99991U, 31337U};
}

std::string describe_pair(const Sample& x, const Sample& y) {
  return x.rule->to_string() + " vs " + y.rule->to_string();
}

// Checks the structure combine promises: flattened, no nulls, reduced.
void expect_well_formed(const Rule& rule) {
  if (!rule) return;
  const RuleKey key = rule->key();
  if (key.kind != RuleKey::Kind::multi) return;
  ASSERT_GE(key.children.size(), 2U) << rule->to_string();
  for (std::size_t i = 0; i < key.children.size(); ++i) {
    ASSERT_NE(key.children[i], nullptr) << rule->to_string();
    ASSERT_NE(key.children[i]->key().kind, RuleKey::Kind::multi) << rule->to_string();
    for (std::size_t j = 0; j < key.children.size(); ++j) {
      if (i != j) {
        ASSERT_FALSE(key.children[i]->contains(*key.children[j])) << rule->to_string();
      }
    }
  }
}

constexpr std::size_t pool_size = 240;

TEST(RuleLawsTest, PairwiseLawsMatchTheModel) {
  for (const std::uint32_t seed : seeds()) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " (rerun with TASKLET_RULES_SEED=" + std::to_string(seed) +
                 ")");
    Generator gen(seed);
    const std::vector<Sample> pool = gen.pool(pool_size);
    const std::size_t n = pool.size();
    std::vector<char> contains(n * n);
    std::size_t conflicts = 0;
    std::size_t containments = 0;
    std::size_t read_write_conflicts = 0;
    std::size_t multi_conflicts = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const Sample& x = pool[i];
      for (std::size_t j = 0; j < n; ++j) {
        const Sample& y = pool[j];
        const bool xy = x.rule->is_conflicting(*y.rule);
        ASSERT_EQ(xy, y.rule->is_conflicting(*x.rule)) << "symmetry: " << describe_pair(x, y);
        ASSERT_EQ(xy, model_conflict(x, y)) << "conflict: " << describe_pair(x, y);
        const bool k = x.rule->contains(*y.rule);
        ASSERT_EQ(k, model_contains(x, y)) << "contains: " << describe_pair(x, y);
        contains[i * n + j] = static_cast<char>(k);
        if (i == j) {
          ASSERT_TRUE(k) << "reflexive containment: " << x.rule->to_string();
          ASSERT_EQ(xy, !all_shared(x)) << "self-conflict: " << x.rule->to_string();
          continue;
        }
        // An exclusive container conflicts with what it contains.
        if (k && !all_shared(y)) {
          ASSERT_TRUE(xy) << "containment implies conflict: " << describe_pair(x, y);
        }
        // Readers never conflict with each other, and a reader contains only readers.
        if (all_shared(x) && all_shared(y)) {
          ASSERT_FALSE(xy) << "readers: " << describe_pair(x, y);
        }
        if (all_shared(x) && k) {
          ASSERT_TRUE(all_shared(y)) << "read contains write: " << describe_pair(x, y);
        }
        conflicts += xy;
        containments += k;
        if (xy && all_shared(x) != all_shared(y)) ++read_write_conflicts;
        if (xy && (x.atoms.size() > 1 || y.atoms.size() > 1)) ++multi_conflicts;
      }
    }
    // Transitive containment, over the matrix the rules themselves produced.
    for (std::size_t a = 0; a < n; ++a) {
      for (std::size_t b = 0; b < n; ++b) {
        if (!contains[a * n + b]) continue;
        for (std::size_t c = 0; c < n; ++c) {
          if (contains[b * n + c]) {
            ASSERT_TRUE(contains[a * n + c])
                << "transitivity: " << pool[a].rule->to_string() << " ⊇ " << pool[b].rule->to_string()
                << " ⊇ " << pool[c].rule->to_string();
          }
        }
      }
    }
    // Not vacuous: relations occur often, and so do their absences.
    const auto pairs = static_cast<double>(n * (n - 1));
    EXPECT_GT(static_cast<double>(conflicts) / pairs, 0.15) << conflicts;
    EXPECT_LT(static_cast<double>(conflicts) / pairs, 0.85) << conflicts;
    EXPECT_GT(static_cast<double>(containments) / pairs, 0.05) << containments;
    EXPECT_GT(static_cast<double>(read_write_conflicts) / pairs, 0.05) << read_write_conflicts;
    EXPECT_GT(static_cast<double>(multi_conflicts) / pairs, 0.05) << multi_conflicts;
  }
}

TEST(RuleLawsTest, CombineOfTwoBehavesAsTheUnion) {
  for (const std::uint32_t seed : seeds()) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " (rerun with TASKLET_RULES_SEED=" + std::to_string(seed) +
                 ")");
    Generator gen(seed);
    const std::vector<Sample> pool = gen.pool(pool_size);
    const auto pick = [&]() -> const Sample& {
      return pool[static_cast<std::size_t>(gen.below(static_cast<int>(pool.size())))];
    };
    std::size_t union_conflicts = 0;
    std::size_t checks = 0;
    for (int round = 0; round < 1500; ++round) {
      const Sample& a = pick();
      const Sample& b = pick();
      const Rule ab = rules::combine(a.rule, b.rule);
      const Rule ba = rules::combine(b.rule, a.rule);
      ASSERT_NE(ab, nullptr);
      expect_well_formed(ab);
      ASSERT_TRUE(ab->contains(*a.rule)) << ab->to_string() << " should contain " << a.rule->to_string();
      ASSERT_TRUE(ab->contains(*b.rule)) << ab->to_string() << " should contain " << b.rule->to_string();
      ASSERT_EQ(rules::combine(a.rule, nullptr), a.rule);
      ASSERT_EQ(rules::combine(nullptr, a.rule), a.rule);
      ASSERT_EQ(rules::combine(a.rule, a.rule), a.rule);
      for (int k = 0; k < 12; ++k) {
        const Sample& z = pick();
        const bool expected = a.rule->is_conflicting(*z.rule) || b.rule->is_conflicting(*z.rule);
        ASSERT_EQ(ab->is_conflicting(*z.rule), expected) << ab->to_string() << " vs " << z.rule->to_string();
        ASSERT_EQ(z.rule->is_conflicting(*ab), expected) << z.rule->to_string() << " vs " << ab->to_string();
        ASSERT_EQ(ba->is_conflicting(*z.rule), expected) << ba->to_string() << " vs " << z.rule->to_string();
        // The combination is the least rule containing both: z contains it iff z contains each.
        ASSERT_EQ(z.rule->contains(*ab), z.rule->contains(*a.rule) && z.rule->contains(*b.rule))
            << z.rule->to_string() << " ⊇? " << ab->to_string();
        union_conflicts += expected;
        ++checks;
      }
    }
    EXPECT_GT(union_conflicts, checks / 10);
    EXPECT_LT(union_conflicts, checks - checks / 10);
  }
}

TEST(RuleLawsTest, CombineOfARangeIsOrderInsensitiveAndFlat) {
  for (const std::uint32_t seed : seeds()) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " (rerun with TASKLET_RULES_SEED=" + std::to_string(seed) +
                 ")");
    Generator gen(seed);
    const std::vector<Sample> pool = gen.pool(pool_size);
    const auto pick = [&]() -> const Sample& {
      return pool[static_cast<std::size_t>(gen.below(static_cast<int>(pool.size())))];
    };
    for (int round = 0; round < 600; ++round) {
      std::vector<Rule> list;
      const int count = gen.below(6);
      list.reserve(static_cast<std::size_t>(count));
      for (int i = 0; i < count; ++i) list.push_back(gen.below(5) == 0 ? nullptr : pick().rule);
      const Rule combined = rules::combine(list);
      const bool any = std::any_of(list.begin(), list.end(), [](const Rule& r) { return r != nullptr; });
      ASSERT_EQ(combined != nullptr, any);
      if (!combined) continue;
      expect_well_formed(combined);
      std::vector<Rule> shuffled = list;
      std::shuffle(shuffled.begin(), shuffled.end(), gen.rng());
      const Rule reordered = rules::combine(shuffled);
      // Folding pairwise gives the same behaviour as combining the range at once.
      Rule folded;
      for (const Rule& r : list) folded = rules::combine(folded, r);
      for (const Rule& r : list) {
        if (r) {
          ASSERT_TRUE(combined->contains(*r)) << combined->to_string() << " ⊇ " << r->to_string();
        }
      }
      for (int k = 0; k < 10; ++k) {
        const Rule& z = pick().rule;
        const bool expected =
            std::any_of(list.begin(), list.end(), [&](const Rule& r) { return r && r->is_conflicting(*z); });
        ASSERT_EQ(combined->is_conflicting(*z), expected)
            << combined->to_string() << " vs " << z->to_string();
        ASSERT_EQ(reordered->is_conflicting(*z), expected)
            << reordered->to_string() << " vs " << z->to_string();
        ASSERT_EQ(folded->is_conflicting(*z), expected) << folded->to_string() << " vs " << z->to_string();
      }
    }
  }
}

TEST(RuleLawsTest, ConcurrentConstUseGivesTheSameAnswers) {
  Generator gen(seeds().front());
  const std::vector<Sample> pool = gen.pool(120);
  const auto matrix = [&pool] {
    std::vector<char> result;
    result.reserve(pool.size() * pool.size() * 2);
    for (const Sample& x : pool) {
      for (const Sample& y : pool) {
        result.push_back(static_cast<char>(x.rule->is_conflicting(*y.rule)));
        result.push_back(static_cast<char>(x.rule->contains(*y.rule)));
      }
    }
    return result;
  };
  const std::vector<char> expected = matrix();
  std::vector<std::vector<char>> results(4);
  std::vector<std::thread> threads;
  threads.reserve(results.size());
  for (auto& result : results) threads.emplace_back([&result, &matrix] { result = matrix(); });
  for (std::thread& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
}

}  // namespace
}  // namespace tasklet
