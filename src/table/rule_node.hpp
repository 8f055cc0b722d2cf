// Private: a node of the rule table's index, where requests' entries are counted or wait in the
// queue of their mode, and the note through which a rule object remembers its nodes in the table
// that indexed it (kept in the rule's table slot).
#pragma once

#include <array>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <boost/container/flat_map.hpp>

#include "table/lock_mode.hpp"
#include "table/rule_request.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet::detail {

/// A node of the index. What the table's decisions read and write (the counts, the bits, the
/// queues' address) fills the first cache line; the trie's links, read only when a rule's nodes are
/// looked up, come after. With thousands of nodes in use the table outgrows a core's cache, and
/// every line a decision touches is a miss.
struct alignas(64) RuleNode {  // also aligns RuleEntry's tag bits
  // Per mode: the entries granted or clear (held requests' entries and waiting requests' clear
  // ones: to a newcomer both are in the way alike), and of those the waiting ones. Granting a
  // request that waited moves nothing between the bits, so it only lowers clear_waiting.
  std::array<std::uint32_t, lock_mode_count> counted_entries{};
  std::array<std::uint32_t, lock_mode_count> clear_waiting{};
  std::uint8_t queued = 0;   // bit per mode: waiting(mode) is not empty
  std::uint8_t counted = 0;  // bit per mode: counted_entries[mode] is not zero

  /// Bit per mode: some entry of that mode is granted or waits here.
  std::uint8_t occupied() const noexcept { return static_cast<std::uint8_t>(queued | counted); }

  /// The entries of `mode` that are not clear yet, in ticket order. Only once some entry of that
  /// mode has waited here (see make_queue): most nodes never queue anything, and most that do
  /// queue one mode only (exclusive at a path, intention at its ancestors), so they stay small.
  WaitQueue& waiting(std::size_t mode) const noexcept { return *(*queues_)[mode]; }
  void make_queue(std::size_t mode) {
    if (queues_ == nullptr) queues_ = std::make_unique<Queues>();
    if ((*queues_)[mode] == nullptr) (*queues_)[mode] = std::make_unique<WaitQueue>();
  }

  /// One more granted or clear entry of `mode` (reads and writes this line only).
  void count(std::size_t mode) noexcept {
    ++counted_entries[mode];
    counted = static_cast<std::uint8_t>(counted | 1u << mode);
  }
  /// One fewer.
  void uncount(std::size_t mode) noexcept {
    assert(counted_entries[mode] != 0);
    if (--counted_entries[mode] == 0) counted = static_cast<std::uint8_t>(counted & ~(1u << mode));
  }
  /// Recomputes the mode's queued bit after its queue changed.
  void refresh_queued(std::size_t mode) noexcept {
    const auto bit = static_cast<std::uint8_t>(1u << mode);
    queued = static_cast<std::uint8_t>(waiting(mode).empty() ? queued & ~bit : queued | bit);
  }

 private:
  using Queues = std::array<std::unique_ptr<WaitQueue>, lock_mode_count>;
  std::unique_ptr<Queues> queues_;

 public:
  // Path trie links (identity nodes have none; they remember their rule instead).
  const SchedulingRule* identity = nullptr;
  RuleNode* parent = nullptr;
  std::string segment;
  boost::container::flat_map<std::string, std::unique_ptr<RuleNode>, std::less<>> children;

  bool is_unused() const noexcept;
};

/// A rule table's note on a rule object (in its table slot): the nodes of its path, root first,
/// or its identity node, as the table found them while its node generation was `generation`.
/// Made by the first table that indexes the rule, with room for all its nodes after it, and freed
/// by the rule's destructor; only that table reads or writes the nodes, under its lock. Other
/// tables look the rule up every time.
struct RuleNote {
  std::uint64_t table;       // RuleTable::id_ of the table that keeps it (set before it is shared)
  std::uint64_t generation;  // RuleTable::node_generation_ when the nodes were noted
  std::uint32_t count;       // nodes noted; 0: none yet
  std::uint32_t room;
  RuleNode** nodes() noexcept { return reinterpret_cast<RuleNode**>(this + 1); }
};
static_assert(sizeof(RuleNote) % alignof(RuleNode*) == 0);

}  // namespace tasklet::detail

/// Where the table keeps its note on a rule (a nested class of SchedulingRule: it may reach it).
class tasklet::SchedulingRule::TableSlot {
 public:
  /// The slot: null (never requested), seen_once() or the note.
  static void* slot(const SchedulingRule& rule, std::memory_order order) noexcept {
    return rule.table_slot_.load(order);
  }
  static void* seen_once() noexcept { return SchedulingRule::seen_once(); }
  /// The note, or null when there is none yet.
  static detail::RuleNote* note(const SchedulingRule& rule, std::memory_order order) noexcept {
    void* held = slot(rule, order);
    return held == seen_once() ? nullptr : static_cast<detail::RuleNote*>(held);
  }
  /// Sets the slot to `value` if it still holds `expected`; else `expected` becomes what is there.
  static bool replace(const SchedulingRule& rule, void*& expected, void* value) noexcept {
    return rule.table_slot_.compare_exchange_strong(expected, value, std::memory_order_acq_rel,
                                                    std::memory_order_acquire);
  }
};
