// tasklet/scheduling_rule.hpp: the rule interface every piece of the engine is built on.
//
// A SchedulingRule says which other rules it excludes (is_conflicting) and which it may nest
// (contains). Tasklets, jobs and threads (begin_rule) hold rules; the rule table never lets two
// holders of conflicting rules run at once and grants conflicting requests in request order.
//
// Laws every rule must keep (validate_rule checks the cheap ones):
//  - is_conflicting is symmetric, and reflexive for exclusive rules (a shared read rule conflicts
//    neither with itself nor with other reads);
//  - contains is reflexive and transitive;
//  - an exclusive rule that contains another also conflicts with it;
//  - a rule neither conflicts with nor contains a rule it knows nothing about.
//
// The rule table calls a custom rule's is_conflicting while holding its internal lock: keep it
// short, non-blocking and free of calls back into the library.
#pragma once

#include "tasklet/export.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>

namespace tasklet {

class SchedulingRule;

/// Rules are shared and immutable; their identity (the object) matters to end_rule.
using Rule = std::shared_ptr<const SchedulingRule>;

/// What the rule table may use to index a rule instead of comparing it pairwise with every held
/// and waiting rule. A rule that describes itself with a key promises that its is_conflicting and
/// contains agree with the key's meaning towards every other keyed rule:
///  - identity: conflicts with and contains exactly itself (the same object), nothing else;
///  - path: a hierarchical path, normalised ("/" for the root, else "/seg/seg": no empty, "." or
///    ".." segment, no trailing '/'; PathSegments splits it). Exclusive paths conflict with every
///    path at, above or below them; shared paths conflict only with exclusive ones at, above or
///    below them;
///  - multi: the union of its children (no child is itself multi);
///  - named: conflicts with and contains exactly the named rules of the same name, whatever object
///    they are; a manager that shares rules across processes shares these (see rules::named_mutex);
///  - custom (the default): no index; the table asks is_conflicting pairwise, always with the
///    custom rule as the receiver, because built-in rules know nothing of it.
struct TASKLET_EXPORT RuleKey {
  enum class Kind : std::uint8_t { custom, identity, path, multi, named };
  Kind kind = Kind::custom;
  bool shared = false;             ///< path: a shared (read) rule
  std::string_view path;           ///< path: the normalised path
  std::string_view name;           ///< named: the name
  std::span<const Rule> children;  ///< multi: flattened children, never empty
};

/// The segments of a normalised path ("/" or "/seg/seg"), root first, as views of it: a forward
/// range over a RuleKey's path (the root has none). Holds only a view; never allocates.
class PathSegments {
 public:
  class iterator {
   public:
    using value_type = std::string_view;
    using reference = std::string_view;
    using pointer = void;
    using difference_type = std::ptrdiff_t;
    using iterator_category = std::input_iterator_tag;  // yields views by value
    using iterator_concept = std::forward_iterator_tag;
    iterator() = default;
    std::string_view operator*() const noexcept { return path_.substr(at_, end_ - at_); }
    iterator& operator++() noexcept {
      if (end_ >= path_.size()) {
        at_ = end_ = path_.size();
      } else {  // a normalised path has a segment after every '/'
        at_ = end_ + 1;
        end_ = std::min(path_.find('/', at_), path_.size());
      }
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator before = *this;
      ++*this;
      return before;
    }
    bool operator==(const iterator& other) const noexcept { return at_ == other.at_; }

   private:
    friend class PathSegments;
    iterator(std::string_view path, std::size_t at) noexcept : path_(path), at_(at), end_(at) {
      if (at_ < path_.size()) end_ = std::min(path_.find('/', at_), path_.size());
    }
    std::string_view path_;
    std::size_t at_ = 0;   // where the segment starts; path_.size() (or more) at the end
    std::size_t end_ = 0;  // one past it
  };

  explicit PathSegments(std::string_view path) noexcept : path_(path) {}

  iterator begin() const noexcept { return {path_, path_.size() <= 1 ? path_.size() : 1}; }
  iterator end() const noexcept { return {path_, path_.size()}; }
  bool empty() const noexcept { return path_.size() <= 1; }
  /// The first segment; the path must not be the root.
  std::string_view front() const noexcept { return *begin(); }
  /// The number of segments (counts them).
  std::size_t size() const noexcept {
    std::size_t count = 0;
    for (const char c : path_) count += c == '/' ? 1 : 0;
    return empty() ? 0 : count;
  }

 private:
  std::string_view path_;
};

/// The interface of every scheduling rule, built-in or user-written.
/// Implementations must be thread-safe for concurrent const calls (rules are immutable).
class TASKLET_EXPORT SchedulingRule {
 public:
  /// Frees the rule table's note on this rule, if it made one.
  virtual ~SchedulingRule();

  /// True when a thread holding this rule may begin `other` inside it (nesting).
  virtual bool contains(const SchedulingRule& other) const = 0;

  /// True when holders of this rule and of `other` must never run at the same time.
  virtual bool is_conflicting(const SchedulingRule& other) const = 0;

  /// A readable description used in diagnostics and error messages (default: the address).
  virtual std::string to_string() const {
    char text[40];
    std::snprintf(text, sizeof text, "rule@%p", static_cast<const void*>(this));
    return text;
  }

  /// How the rule table may index this rule; custom rules keep the default (none).
  /// The spans must stay valid for the rule's lifetime.
  virtual RuleKey key() const noexcept { return {}; }

  /// The rule table's access to its slot below (defined inside the library, not for users).
  class TableSlot;

 protected:
  SchedulingRule() = default;
  /// A copy is another rule: it does not share the original's note (below).
  SchedulingRule(const SchedulingRule&) noexcept {}
  SchedulingRule& operator=(const SchedulingRule&) noexcept { return *this; }

 private:
  // One opaque slot for the rule table: where the first table to index this rule found its nodes,
  // so that the next request for the same rule object looks nothing up. The table marks it
  // seen_once() at a rule's first request and sets it at the second, to a block from
  // the library's allocator that the rule frees (a rule made for one job costs no note).
  static void* seen_once() noexcept { return &seen_once_mark; }
  static inline char seen_once_mark = 0;
  mutable std::atomic<void*> table_slot_{nullptr};
};

/// Who a waiting rule request waits for (JobManager's lock listener, Job::blockers).
struct TASKLET_EXPORT RuleBlocker {
  /// "job 'name'", "tasklet 'name'" (or "tasklet@<address>" when unnamed), or "thread <id>".
  std::string owner;
  /// The rule it holds or asked for.
  Rule rule;
  /// True when it holds a conflicting rule (a hard block); false when it asked earlier for a
  /// conflicting rule, and strict FIFO puts the waiter behind it (a soft block).
  bool holds = false;
  /// "job 'index' holds path(/repo/src)", "thread 1402 waits for path(/repo) (asked earlier)".
  std::string to_string() const;
};

/// `rule->to_string()`, or "null" for an empty rule.
TASKLET_EXPORT std::string describe(const Rule& rule);
TASKLET_EXPORT std::string describe(const SchedulingRule* rule);

/// Checks the laws that can be checked cheaply: the rule contains and conflicts with itself (only
/// shared path rules are exempt from self-conflict), and neither conflicts with nor contains a
/// private sentinel rule it cannot know. Multi rules are checked child by child. Rules whose key
/// says identity, path or named are trusted as the built-in ones, not checked. Null rules are valid.
/// Throws InvalidRule naming the rule. Thread-safe.
TASKLET_EXPORT void validate_rule(const Rule& rule);

}  // namespace tasklet
