#include "rule_table.hpp"

#include <cassert>
#include <utility>
#include <vector>

namespace tasklet::detail {
namespace {

constexpr int index_of(LockMode mode) noexcept { return static_cast<int>(mode); }

// Multi-granularity locking's compatibility matrix (Gray et al.).
constexpr bool compatible[lock_mode_count][lock_mode_count] = {
    //           is     ix     s      six    x
    /* is  */ {true, true, true, true, false},
    /* ix  */ {true, true, false, false, false},
    /* s   */ {true, false, true, false, false},
    /* six */ {true, false, false, false, false},
    /* x   */ {false, false, false, false, false},
};

// The weakest mode that is at least as strong as both (for one request's entries on one node).
constexpr LockMode supremum(LockMode a, LockMode b) noexcept {
  if (a == b) return a;
  if (a == LockMode::x || b == LockMode::x) return LockMode::x;
  if (a == LockMode::six || b == LockMode::six) return LockMode::six;
  if (a == LockMode::is) return b;
  if (b == LockMode::is) return a;
  return LockMode::six;  // ix with s
}

RuleEntry* next_in_queue(EntryQueue& queue, RuleEntry& entry) noexcept {
  auto it = EntryQueue::s_iterator_to(entry);
  ++it;
  return it == queue.end() ? nullptr : &*it;
}

// Calls fn on each atom of a rule: the children of a multi rule, else the rule itself.
template <class F>
bool any_atom(const SchedulingRule& rule, F&& fn) {
  const RuleKey key = rule.key();
  if (key.kind != RuleKey::Kind::multi) return fn(rule);
  for (const Rule& child : key.children) {
    if (child && any_atom(*child, fn)) return true;
  }
  return false;
}

}  // namespace

bool RuleNode::is_unused() const noexcept {
  for (std::uint32_t count : granted) {
    if (count != 0) return false;
  }
  for (const EntryQueue& queue : waiting) {
    if (!queue.empty()) return false;
  }
  return children.empty();
}

RuleTable::RuleTable() = default;

RuleTable::~RuleTable() {
  cancel_all_waiting();
  // Held requests belong to their holders, who must have released them; unlink what is left so the
  // intrusive lists do not dangle.
  std::lock_guard lock(mutex_);
  live_.clear();
  customs_.clear();
  blocked_.clear();
}

// ---------------------------------------------------------------------------------------------
// Entering a request

RuleNode& RuleTable::path_node(RuleNode& from, std::string_view segment) {
  auto found = from.children.find(segment);
  if (found != from.children.end()) return *found->second;
  auto node = std::make_unique<RuleNode>();
  node->parent = &from;
  node->segment = std::string(segment);
  RuleNode& made = *node;
  from.children.emplace(made.segment, std::move(node));
  ++path_nodes_;
  return made;
}

RuleNode& RuleTable::identity_node(const SchedulingRule& rule) {
  std::unique_ptr<RuleNode>& slot = identities_[&rule];
  if (!slot) {
    slot = std::make_unique<RuleNode>();
    slot->identity = &rule;
  }
  return *slot;
}

void RuleTable::add_entry(RuleRequest& request, RuleNode& node, LockMode mode) {
  for (RuleEntry& entry : request.entries_) {
    if (entry.node == &node) {
      entry.mode = supremum(entry.mode, mode);
      return;
    }
  }
  RuleEntry& entry = request.entries_.emplace_back();
  entry.request = &request;
  entry.node = &node;
  entry.mode = mode;
}

void RuleTable::add_atom(RuleRequest& request, const SchedulingRule& atom) {
  const RuleKey key = atom.key();
  switch (key.kind) {
    case RuleKey::Kind::identity:
      add_entry(request, identity_node(atom), LockMode::x);
      return;
    case RuleKey::Kind::path: {
      RuleNode* node = &root_;
      const LockMode intent = key.shared ? LockMode::is : LockMode::ix;
      for (const std::string& segment : key.segments) {
        add_entry(request, *node, intent);
        node = &path_node(*node, segment);
      }
      add_entry(request, *node, key.shared ? LockMode::s : LockMode::x);
      return;
    }
    case RuleKey::Kind::multi:
      for (const Rule& child : key.children) {
        if (child) add_atom(request, *child);
      }
      return;
    case RuleKey::Kind::custom:
      request.has_custom_ = true;
      return;
  }
}

// Whether a custom atom of `custom` says it conflicts with some atom of `other`. The custom rule is
// always the one asked: built-in rules know nothing of it. A throwing check counts as a conflict:
// waiting is safe, running together might not be.
bool RuleTable::customs_say_conflict(const RuleRequest& custom, const RuleRequest& other) noexcept {
  return any_atom(*custom.rule_, [&](const SchedulingRule& mine) {
    if (mine.key().kind != RuleKey::Kind::custom) return false;
    return any_atom(*other.rule_, [&](const SchedulingRule& theirs) {
      try {
        return mine.is_conflicting(theirs);
      } catch (...) {
        return true;
      }
    });
  });
}

bool RuleTable::conflicts_pairwise(const RuleRequest& a, const RuleRequest& b) noexcept {
  return (a.has_custom_ && customs_say_conflict(a, b)) || (b.has_custom_ && customs_say_conflict(b, a));
}

// Whether a pairwise check against a custom rule holds `request` back: against every held request
// and every request that came earlier.
bool RuleTable::blocked_by_custom(const RuleRequest& request) const noexcept {
  const auto blocks = [&](const RuleRequest& other) {
    if (&other == &request) return false;
    if (!other.held_ && other.ticket_ > request.ticket_) return false;
    return conflicts_pairwise(request, other);
  };
  if (request.has_custom_) {
    for (const RuleRequest& other : live_) {
      if (blocks(other)) return true;
    }
  } else {
    for (const RuleRequest& other : customs_) {
      if (blocks(other)) return true;
    }
  }
  return false;
}

bool RuleTable::clear_at(const RuleNode& node, const RuleEntry& entry) noexcept {
  const std::uint64_t ticket = entry.request->ticket_;
  for (int mode = 0; mode < lock_mode_count; ++mode) {
    if (compatible[index_of(entry.mode)][mode]) continue;
    if (node.granted[static_cast<std::size_t>(mode)] != 0) return false;
    const EntryQueue& queue = node.waiting[static_cast<std::size_t>(mode)];
    if (!queue.empty() && queue.front().request->ticket_ < ticket) return false;
  }
  return true;
}

bool RuleTable::acquire(RuleRequest& request) {
  assert(request.rule_ != nullptr && !request.in_table_);
  std::lock_guard lock(mutex_);
  request.ticket_ = ++next_ticket_;
  request.entries_.clear();
  request.held_ = false;
  request.has_custom_ = false;
  add_atom(request, *request.rule_);

  const bool custom_blocked = blocked_by_custom(request);
  std::uint32_t unclear = 0;
  for (RuleEntry& entry : request.entries_) {
    entry.clear = clear_at(*entry.node, entry);
    if (!entry.clear) ++unclear;
  }
  request.in_table_ = true;
  live_.push_back(request);
  if (request.has_custom_) customs_.push_back(request);

  if (unclear == 0 && !custom_blocked) {
    for (RuleEntry& entry : request.entries_)
      ++entry.node->granted[static_cast<std::size_t>(index_of(entry.mode))];
    request.held_ = true;
    ++held_;
    return true;
  }
  request.unclear_ = unclear;
  request.custom_blocked_ = custom_blocked;
  for (RuleEntry& entry : request.entries_) {
    const auto mode = static_cast<std::size_t>(index_of(entry.mode));
    RuleNode& node = *entry.node;
    node.waiting[mode].push_back(entry);
    if (!entry.clear && node.frontier[mode] == nullptr) node.frontier[mode] = &entry;
    // Clear entries form a prefix of each mode's queue: a clear newcomer never follows an unclear one.
    assert(entry.clear == (node.frontier[mode] == nullptr) || !entry.clear);
  }
  if (custom_blocked) blocked_.push_back(request);
  return false;
}

// ---------------------------------------------------------------------------------------------
// Granting

void RuleTable::grant(RuleRequest& request, Grants& grants) {
  for (RuleEntry& entry : request.entries_) {
    const auto mode = static_cast<std::size_t>(index_of(entry.mode));
    RuleNode& node = *entry.node;
    assert(entry.clear && node.frontier[mode] != &entry);
    node.waiting[mode].erase(EntryQueue::s_iterator_to(entry));
    ++node.granted[mode];
  }
  request.held_ = true;
  ++held_;
  grants.push_back(&request);
}

// Moves each mode's frontier at `node` past the entries that have become clear, granting the
// requests that are now clear everywhere. Amortised O(1) per entry: an entry is passed once.
void RuleTable::walk(RuleNode& node, Grants& grants) {
  for (std::size_t mode = 0; mode < lock_mode_count; ++mode) {
    RuleEntry* entry = node.frontier[mode];
    while (entry != nullptr && clear_at(node, *entry)) {
      entry->clear = true;
      RuleEntry* next = next_in_queue(node.waiting[mode], *entry);
      node.frontier[mode] = next;
      RuleRequest& request = *entry->request;
      if (--request.unclear_ == 0 && !request.custom_blocked_) grant(request, grants);
      entry = next;
    }
    node.frontier[mode] = entry;
  }
}

void RuleTable::recheck_custom_blocked(Grants& grants) {
  for (auto it = blocked_.begin(); it != blocked_.end();) {
    RuleRequest& request = *it;
    if (blocked_by_custom(request)) {
      ++it;
      continue;
    }
    it = blocked_.erase(it);
    request.custom_blocked_ = false;
    if (request.unclear_ == 0) grant(request, grants);
  }
}

// ---------------------------------------------------------------------------------------------
// Leaving

// Unused nodes are kept while there are few of them, so that taking and releasing the same rules
// over and over allocates nothing; past the limits, a node is freed when its last user leaves. A
// kept identity node may outlive its rule: it is unused, so a new rule at the same address simply
// takes it over.
void RuleTable::prune(RuleNode& node) {
  constexpr std::size_t kept_identity_nodes = 1024;
  constexpr std::size_t kept_path_nodes = 4096;
  if (&node == &root_ || !node.is_unused()) return;
  if (node.identity != nullptr) {
    if (identities_.size() > kept_identity_nodes) identities_.erase(node.identity);
  } else if (path_nodes_ > kept_path_nodes) {
    RuleNode& parent = *node.parent;
    parent.children.erase(parent.children.find(std::string_view(node.segment)));
    --path_nodes_;
  }
}

void RuleTable::unlink_waiting(RuleRequest& request) noexcept {
  for (RuleEntry& entry : request.entries_) {
    const auto mode = static_cast<std::size_t>(index_of(entry.mode));
    RuleNode& node = *entry.node;
    if (node.frontier[mode] == &entry) node.frontier[mode] = next_in_queue(node.waiting[mode], entry);
    node.waiting[mode].erase(EntryQueue::s_iterator_to(entry));
  }
  if (request.custom_blocked_) blocked_.erase(BlockedList::s_iterator_to(request));
}

void RuleTable::leave(RuleRequest& request, Grants& grants) {
  if (request.held_) {
    for (RuleEntry& entry : request.entries_)
      --entry.node->granted[static_cast<std::size_t>(index_of(entry.mode))];
    --held_;
  } else {
    unlink_waiting(request);
  }
  live_.erase(LiveList::s_iterator_to(request));
  if (request.has_custom_) customs_.erase(CustomList::s_iterator_to(request));
  request.in_table_ = false;
  request.held_ = false;
  request.custom_blocked_ = false;

  for (RuleEntry& entry : request.entries_) walk(*entry.node, grants);
  if (!blocked_.empty()) recheck_custom_blocked(grants);
  // Children come after their parents in entries_, so pruning backwards frees leaves first.
  for (auto entry = request.entries_.rbegin(); entry != request.entries_.rend(); ++entry) prune(*entry->node);
  request.entries_.clear();
}

void RuleTable::release(RuleRequest& request, Grants& grants) {
  std::lock_guard lock(mutex_);
  assert(request.in_table_ && request.held_);
  leave(request, grants);
}

void RuleTable::release(RuleRequest& request) {
  Grants grants;
  release(request, grants);
  notify(grants);
}

bool RuleTable::withdraw(RuleRequest& request) {
  Grants grants;
  {
    std::lock_guard lock(mutex_);
    if (!request.in_table_ || request.held_) return false;
    leave(request, grants);
  }
  notify(grants);
  return true;
}

void RuleTable::cancel_all_waiting() {
  std::vector<RuleRequest*> cancelled;
  {
    std::lock_guard lock(mutex_);
    for (RuleRequest& request : live_) {
      if (!request.held_) cancelled.push_back(&request);
    }
    // Every waiter goes, so nobody is left to be let through: unlink without walking.
    for (RuleRequest* request : cancelled) {
      unlink_waiting(*request);
      live_.erase(LiveList::s_iterator_to(*request));
      if (request->has_custom_) customs_.erase(CustomList::s_iterator_to(*request));
      request->in_table_ = false;
      request->custom_blocked_ = false;
      for (auto entry = request->entries_.rbegin(); entry != request->entries_.rend(); ++entry) {
        prune(*entry->node);
      }
      request->entries_.clear();
    }
  }
  for (RuleRequest* request : cancelled) request->cancelled();
}

bool RuleTable::has_conflicting_waiter(const RuleRequest& held) const {
  std::lock_guard lock(mutex_);
  for (const RuleEntry& entry : held.entries_) {
    for (int mode = 0; mode < lock_mode_count; ++mode) {
      if (!compatible[index_of(entry.mode)][mode] &&
          !entry.node->waiting[static_cast<std::size_t>(mode)].empty()) {
        return true;
      }
    }
  }
  // Pairwise only where a custom rule is involved: every waiter when `held` has one, else the
  // requests with custom parts.
  if (held.has_custom_) {
    for (const RuleRequest& waiter : live_) {
      if (!waiter.held_ && conflicts_pairwise(held, waiter)) return true;
    }
  } else {
    for (const RuleRequest& waiter : customs_) {
      if (!waiter.held_ && conflicts_pairwise(held, waiter)) return true;
    }
  }
  return false;
}

void RuleTable::notify(const Grants& grants) noexcept {
  for (RuleRequest* request : grants) request->granted();
}

bool RuleTable::is_idle() const {
  std::lock_guard lock(mutex_);
  return live_.empty();
}

std::size_t RuleTable::held_count() const {
  std::lock_guard lock(mutex_);
  return held_;
}

std::size_t RuleTable::waiting_count() const {
  std::lock_guard lock(mutex_);
  return live_.size() - held_;
}

}  // namespace tasklet::detail
