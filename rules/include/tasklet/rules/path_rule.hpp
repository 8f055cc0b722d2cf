// tasklet/rules/path_rule.hpp: hierarchical path rules, exclusive (write) or shared (read).
//
// A PathRule locks a node of a tree of resources named by an absolute path ("/project/src/a.cpp")
// together with everything under it. Two exclusive rules conflict when one path is an
// ancestor-or-equal of the other, segment by segment ("/a/b" is an ancestor of "/a/b/c" but not
// of "/a/bc"). A shared (read) rule conflicts with exclusive rules at, above or below it and never
// with another shared rule, so many readers of a subtree run in parallel while a writer excludes
// them. Path rules conflict with no rule other than path rules (and multi rules holding one).
//
// Containment (nesting, begin_rule inside a held rule): an exclusive rule contains every path rule,
// shared or exclusive, at or under its path; a shared rule contains only shared rules at or under
// its path (no upgrade from read to write by nesting). A path rule contains a multi rule when it
// contains every child of it.
//
// Normalisation: the input must be absolute (start with '/'); repeated and trailing '/' are
// folded; "." segments are dropped; ".." removes the previous segment. Empty or relative input,
// ".." above the root and a NUL byte throw InvalidPath naming the input. "/" is the root (no
// segments), an ancestor of every path. Segments are opaque bytes (UTF-8 is fine) compared
// bytewise; no case folding, no Unicode normalisation, no file-system access.
//
// The key is RuleKey::Kind::path with the shared flag and the normalised path, which the rule table
// splits into segments to index the rule in a trie. A rule keeps only its normalised path (inside
// the rule up to 15 bytes) and its mode. Rules are immutable: all members are safe to call
// concurrently.
#pragma once

#include "tasklet/export.hpp"

#include <cstdint>
#include <string>
#include <string_view>

#include "tasklet/scheduling_rule.hpp"

namespace tasklet {

/// A lock on a path and its subtree, exclusive (write) or shared (read). Immutable; thread-safe.
class TASKLET_EXPORT PathRule final : public SchedulingRule {
 public:
  /// Exclusive rules exclude everything related to their path; shared ones only exclusive rules.
  enum class Mode : std::uint8_t { exclusive, shared };

  /// A rule on the normalised form of `path`. Throws InvalidPath (naming the input) for empty or
  /// relative input, ".." above the root, or a NUL byte.
  PathRule(std::string_view path, Mode mode);
  /// A copy is a rule object of its own (SchedulingRule).
  PathRule(const PathRule& other) = default;
  PathRule& operator=(const PathRule& other) = default;
  ~PathRule() override = default;

  /// The normalised path: "/" for the root, else "/seg/seg" with no trailing '/'.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  /// The normalised segments, root first; none for "/". Views of path(), valid for the rule's
  /// lifetime.
  [[nodiscard]] PathSegments segments() const noexcept { return PathSegments(path_); }

  /// The mode given at construction.
  [[nodiscard]] Mode mode() const noexcept { return mode_; }

  /// True for a shared (read) rule.
  [[nodiscard]] bool is_shared() const noexcept { return mode_ == Mode::shared; }

  /// True when this rule's path is `other`'s path or one of its ancestors (segment-wise).
  [[nodiscard]] bool is_ancestor_or_equal_of(const PathRule& other) const noexcept {
    return is_ancestor_or_equal(path_, other.path_);
  }

  /// See the header overview. Never throws unless a custom child of a multi rule does.
  [[nodiscard]] bool contains(const SchedulingRule& other) const override;

  /// See the header overview. Never throws unless a custom child of a multi rule does.
  [[nodiscard]] bool is_conflicting(const SchedulingRule& other) const override;

  /// `path(/a/b)` for an exclusive rule, `read_path(/a/b)` for a shared one.
  [[nodiscard]] std::string to_string() const override;

  /// Kind::path, the shared flag and path() (valid for the rule's lifetime).
  [[nodiscard]] RuleKey key() const noexcept override;

  /// The normalised form of `path` as described in the header overview. Throws InvalidPath.
  [[nodiscard]] static std::string normalize(std::string_view path);

  /// True when the normalised path `ancestor` equals `descendant` or is an ancestor of it, segment
  /// by segment ("/a/b" is above "/a/b/c", not above "/a/bc"). The root "/" is above everything.
  [[nodiscard]] static bool is_ancestor_or_equal(std::string_view ancestor,
                                                 std::string_view descendant) noexcept;

  /// The conflict relation between two path keys (both Kind::path): related paths conflict
  /// unless both are shared.
  [[nodiscard]] static bool keys_conflict(const RuleKey& a, const RuleKey& b) noexcept;

  /// The containment relation between two path keys (both Kind::path): `inner` is at or under
  /// `outer`, and `outer` is exclusive or `inner` is shared.
  [[nodiscard]] static bool key_contains(const RuleKey& outer, const RuleKey& inner) noexcept;

 private:
  std::string path_;  // normalised: "/" or "/seg/seg"
  Mode mode_;
};

}  // namespace tasklet
