// The rule table's index: the nodes a request's entries go on (the trie of path nodes, one node
// per mutex rule, and the notes that remember a rule's nodes), and freeing the nodes nobody uses.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include <oneapi/tbb/scalable_allocator.h>

#include "table/rule_table.hpp"

namespace tasklet::detail {

std::size_t entry_count_hint(const SchedulingRule& rule) noexcept {
  const RuleKey key = rule.key();
  switch (key.kind) {
    case RuleKey::Kind::identity:
    case RuleKey::Kind::named:
      return 1;
    case RuleKey::Kind::path:
      return PathSegments(key.path).size() + 1;
    case RuleKey::Kind::multi: {
      std::size_t count = 0;
      for (const Rule& child : key.children) {
        if (child) count += entry_count_hint(*child);
      }
      return count;
    }
    case RuleKey::Kind::custom:
      break;
  }
  return 0;
}

bool RuleNode::is_unused() const noexcept { return occupied() == 0 && children.empty(); }

RuleNode& RuleShard::path_node(RuleNode& from, std::string_view segment) {
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

// The note this table keeps on `rule`, or null when another table made the rule's note or this is
// the rule object's first request: a rule made for one job (rules::path(file) per job) is looked up
// once, and a note would only cost an allocation. The second request makes it, with room for
// `room` nodes.
RuleNote* RuleShard::note_on(const SchedulingRule& rule, std::size_t room) {
  using Slot = SchedulingRule::TableSlot;
  void* held = Slot::slot(rule, std::memory_order_acquire);
  if (held == nullptr) {
    if (Slot::replace(rule, held, Slot::seen_once())) return nullptr;
  }
  if (held == Slot::seen_once()) {
    // The note's nodes follow it, a pointer each, on cache lines of its own: the table reads it for
    // every request of a shared rule, and a small block beside it (the rule's counts, which every
    // copy of the rule writes, are in the same size class) would take the line away meanwhile.
    // oneTBB's allocator, as the rule's: a leak checker then sees the note go with the rule, and
    // the worker that frees the rule's last copy does not contend for the allocating thread's arena.
    constexpr std::size_t line = 64;
    // NOLINTNEXTLINE(bugprone-sizeof-expression)
    const std::size_t lines = (sizeof(RuleNote) + room * sizeof(RuleNode*) + line - 1) / line;
    void* block = scalable_aligned_malloc(lines * line, line);
    if (block == nullptr) throw std::bad_alloc();
    auto* made = ::new (block) RuleNote{id_, 0, 0, static_cast<std::uint32_t>(room)};
    if (Slot::replace(rule, held, made)) return made;
    scalable_aligned_free(block);  // another table was first: `held` is its note
  }
  auto* note = static_cast<RuleNote*>(held);
  return note->table == id_ ? note : nullptr;
}

// A rule's node is in its note while no node was freed since it was noted (nodes move only when
// freed, and freeing one advances node_generation_).
RuleNode& RuleShard::identity_node(const SchedulingRule& rule) {
  RuleNote* note = note_on(rule, 1);
  if (note != nullptr && note->count == 1 && note->generation == node_generation_) return *note->nodes()[0];
  std::unique_ptr<RuleNode>& slot = identities_[&rule];
  if (!slot) {
    slot = std::make_unique<RuleNode>();
    slot->identity = &rule;
  }
  if (note != nullptr) {
    note->nodes()[0] = slot.get();
    note->count = 1;
    note->generation = node_generation_;
  }
  return *slot;
}

// `merge`: the request may already have an entry on this node (only the atoms of a multi rule
// can meet on a node), which then takes the stronger of the two modes.
void RuleShard::add_entry(RuleRequest& request, RuleNode& node, LockMode mode, bool merge) {
  if (merge) {
    for (RuleEntry& entry : request.entries()) {
      if (entry.node() == &node) {
        entry.set_mode(supremum(entry.mode(), mode));
        return;
      }
    }
  }
  RuleEntry& entry = request.push_entry();
  entry.set_node(node);
  entry.set_mode(mode);
}

// `with_root`: whether a path atom takes its intent entry at the root (see root intents, in
// rule_table.hpp); its own entry there, for a rule on the root, it always takes.
void RuleShard::add_atom(RuleRequest& request, const SchedulingRule& atom, const RuleKey& key, bool merge,
                         bool with_root) {
  // A part takes the entries of the atoms in its own shard only.
  if (RuleTable::is_part(request) && key.kind != RuleKey::Kind::multi && key.kind != RuleKey::Kind::custom &&
      (RuleTable::atom_shards(atom, key) & bit()) == 0)
    return;
  switch (key.kind) {
    case RuleKey::Kind::identity:
      add_entry(request, identity_node(atom), LockMode::x, merge);
      return;
    case RuleKey::Kind::named:
      add_entry(request, path_node(names_, key.name), LockMode::x, merge);
      return;
    case RuleKey::Kind::path:
      add_path(request, atom, key, merge, with_root);
      return;
    case RuleKey::Kind::multi:
      for (const Rule& child : key.children) {
        if (child) add_atom(request, *child, child->key(), true, with_root);
      }
      return;
    case RuleKey::Kind::custom:
      request.has_custom_ = true;
      return;
  }
}

// A path rule's entries: an intent on each node above its own (the root's only `with_root`), its
// mode on its own. A note kept on the rule object remembers the nodes while the tree is unchanged.
void RuleShard::add_path(RuleRequest& request, const SchedulingRule& atom, const RuleKey& key, bool merge,
                         bool with_root) {
  const PathSegments segments(key.path);
  const std::size_t count = segments.size() + 1;
  if (!merge) request.reserve_entries(count);
  const LockMode intent = key.shared ? LockMode::is : LockMode::ix;
  const LockMode target = key.shared ? LockMode::s : LockMode::x;
  RuleNote* note = note_on(atom, count);
  if (note != nullptr && note->count == count && note->generation == node_generation_) {
    const std::size_t first = with_root || count == 1 ? 0 : 1;
    if (merge) {
      for (std::size_t i = first; i < count; ++i)
        add_entry(request, *note->nodes()[i], i + 1 == count ? target : intent, true);
      return;
    }
    // Alone in the request (reserved above): the entries are written in place.
    RuleEntry* entry = request.entry_data() + request.entry_count_;
    for (std::size_t i = first; i < count; ++i, ++entry) {
      *entry = RuleEntry{};
      entry->set_node(*note->nodes()[i]);
      entry->set_mode(i + 1 == count ? target : intent);
    }
    request.entry_count_ = static_cast<std::uint16_t>(request.entry_count_ + count - first);
    return;
  }
  RuleNode* node = &root_;
  std::size_t depth = 0;
  for (const std::string_view segment : segments) {
    if (with_root || node != &root_) add_entry(request, *node, intent, merge);
    if (note != nullptr) note->nodes()[depth++] = node;
    node = &path_node(*node, segment);
  }
  add_entry(request, *node, target, merge);
  if (note != nullptr) {
    note->nodes()[depth] = node;
    note->count = static_cast<std::uint32_t>(count);
    note->generation = node_generation_;
  }
}

// Unused nodes are kept while there are few of them, so that taking and releasing the same rules
// over and over allocates nothing; past the limits, a node is freed when its last user leaves. A
// kept identity node may outlive its rule: it is unused, so a new rule at the same address simply
// takes it over.
void RuleShard::prune(RuleNode& node) {
  if (node.identity != nullptr) {
    if (identities_.size() <= kept_identity_nodes || !node.is_unused()) return;
    identities_.erase(node.identity);
  } else {
    if (path_nodes_ <= kept_path_nodes || &node == &root_ || &node == &names_ || !node.is_unused()) return;
    RuleNode& parent = *node.parent;
    parent.children.erase(parent.children.find(std::string_view(node.segment)));
    --path_nodes_;
  }
  ++node_generation_;
}

}  // namespace tasklet::detail
