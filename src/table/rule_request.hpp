// Private: a request to the rule table (what every holder enters and leaves), its (node, mode)
// entries, and the queue in which entries wait at a node. What the table decides with them is
// described at the top of rule_table.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <span>
#include <vector>

#include "base/door.hpp"
#include "table/lock_mode.hpp"
#include "tasklet/detail/allocator.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet::detail {

class RuleTable;
struct RuleNode;

class RuleRequest;

/// Where a parkable request (see the top of rule_table.hpp) stands. Its owner moves it between active
/// and parked, and orphans it when it gives it up while parked; a newcomer, under the table's lock,
/// moves it from active to wanted, and from parked or orphaned through revoking to revoked (or, for
/// an orphan, deletes it).
enum class Park : std::uint8_t {
  none,      // not parkable, or out of the table
  active,    // in the table for its owner (waiting or held)
  wanted,    // active, and a conflicting request came: its owner must release it for real
  parked,    // granted, idle: its owner may take it back without the lock
  revoking,  // being taken out of the table by a newcomer (under the lock)
  revoked,   // taken out of the table: its owner may reuse the object
  orphaned,  // parked, and its owner gave it up: the table deletes it when it takes it out
};

/// One (node, mode) pair of a request; queued at its node while the request waits. Its request is
/// the one whose entries hold it: a queue slot names the request, and the walk knows the node.
/// One word: the node's address, with the mode and the clear flag in its low bits (nodes are
/// aligned to 16), so that a path rule of depth 4 keeps its five entries in 40 bytes.
class RuleEntry {
 public:
  RuleNode* node() const noexcept { return reinterpret_cast<RuleNode*>(bits_ & ~tag_mask); }
  void set_node(RuleNode& node) noexcept {
    const auto address = reinterpret_cast<std::uintptr_t>(&node);
    assert((address & tag_mask) == 0);
    bits_ = address | (bits_ & tag_mask);
  }
  LockMode mode() const noexcept { return static_cast<LockMode>(bits_ & mode_mask); }
  void set_mode(LockMode mode) noexcept { bits_ = (bits_ & ~mode_mask) | static_cast<std::uintptr_t>(mode); }
  bool clear() const noexcept { return (bits_ & clear_bit) != 0; }
  void set_clear(bool clear) noexcept { bits_ = clear ? bits_ | clear_bit : bits_ & ~clear_bit; }

 private:
  static constexpr std::uintptr_t mode_mask = 7;
  static constexpr std::uintptr_t clear_bit = 8;
  static constexpr std::uintptr_t tag_mask = mode_mask | clear_bit;
  std::uintptr_t bits_ = 0;
};
static_assert(sizeof(RuleEntry) == 8, "RuleEntry grew: memory per queued job (DESIGN section 5)");

/// The entries of one mode at one node that are not clear yet, in ticket order. A vector of
/// one-word slots read from the front, so that a walk can fetch the requests ahead where a linked
/// list would take a cache miss per link. A slot is the request's address with the entry's index
/// in its low bits (a hint: see RuleRequest::entry_at); a withdrawn entry leaves a hole that keeps
/// the request's ticket instead (tickets stay in order, for erase's binary search), skipped when it
/// reaches the front. The consumed prefix is dropped once it is half of the vector (amortised O(1)).
class WaitQueue {
 public:
  /// Slot hints 0 to 5 are the entry's index; 6 means "6 or more"; 7 marks a hole.
  static constexpr std::uintptr_t scan_hint = 6;

  bool empty() const noexcept { return live_ == 0; }
  /// Room for one more push_back without allocating.
  void make_room() { room_for(slots_); }
  /// The front's ticket (kept here: reading it from the request would touch its memory).
  std::uint64_t front_ticket() const noexcept { return front_ticket_; }
  RuleRequest& front_request() const noexcept { return *request_of(slots_[head_]); }
  std::size_t front_hint() const noexcept { return static_cast<std::size_t>(slots_[head_] & tag_mask); }
  /// The request `ahead` places behind the front, or null (past the end, or a hole).
  const RuleRequest* peek(std::size_t ahead) const noexcept {
    const std::size_t at = head_ + ahead;
    return at < slots_.size() && !is_hole(slots_[at]) ? request_of(slots_[at]) : nullptr;
  }
  /// Queues the index-th entry of `request`, whose ticket is `ticket` (larger than any queued).
  void push_back(RuleRequest& request, std::uint64_t ticket, std::size_t index);
  void pop_front() noexcept {
    --live_;
    ++head_;
    advance();
  }
  /// Takes out the queued entry of the request with `ticket`, found by binary search (the slots
  /// are in ticket order, holes included). For withdrawals: O(log n), touching a few requests.
  void erase(std::uint64_t ticket) noexcept;
  template <class F>
  void for_each(F&& fn) const {
    for (std::size_t at = head_; at < slots_.size(); ++at) {
      if (!is_hole(slots_[at])) fn(*request_of(slots_[at]));
    }
  }

 private:
  using Slot = std::uintptr_t;
  static constexpr Slot tag_mask = 7;
  static constexpr Slot hole_tag = 7;
  static bool is_hole(Slot slot) noexcept { return (slot & tag_mask) == hole_tag; }
  static RuleRequest* request_of(Slot slot) noexcept {
    return reinterpret_cast<RuleRequest*>(slot & ~tag_mask);
  }
  static std::uint64_t ticket_of(Slot slot) noexcept;
  // Skips holes to the next live slot and reads its ticket, or empties the queue.
  void advance() noexcept;

  std::vector<Slot> slots_;
  // 32 bits each: every node that ever queued keeps five queues (four billion entries would take
  // 32 GiB of slots).
  std::uint32_t head_ = 0;  // first live slot, when any
  std::uint32_t live_ = 0;
  std::uint64_t front_ticket_ = 0;
};

/// A holder or would-be holder of a rule. Subclasses learn of a grant that had to wait through
/// granted(), and of a cancellation by the table's owner through canceled(); both are called once,
/// outside the table's lock, and the table does not touch the request afterwards.
class RuleRequest {
 public:
  /// `room` (at least 1) entries right behind the request are storage of the subclass (see
  /// InlineRuleRequest), so that granting it touches one block of memory; more go to the heap.
  explicit RuleRequest(std::uint8_t room) noexcept : entry_room_(room) {}
  RuleRequest(const RuleRequest&) = delete;
  RuleRequest& operator=(const RuleRequest&) = delete;

  /// The rule requested; whoever owns the request keeps it alive while the request is in the table.
  const SchedulingRule* rule() const noexcept { return rule_; }
  void set_rule(const SchedulingRule* rule) noexcept { rule_ = rule; }
  bool is_held() const noexcept { return held_; }

  virtual ~RuleRequest() {
    if (entry_heap_log_ != 0) deallocate_bytes(entry_data());
  }
  virtual void granted() noexcept = 0;
  virtual void canceled() noexcept = 0;
  /// The table ran out of memory entering the request: it never was in the table (nothing of the
  /// table changed), and its owner is told instead of granted or canceled. By default, as canceled.
  virtual void refused() noexcept { canceled(); }
  /// A backend behind the table (rule_backend.hpp) could not grant it, for `why`: it is out of the
  /// table, never granted. By default, as canceled.
  // By value: an override keeps it.
  // NOLINTNEXTLINE(performance-unnecessary-value-param)
  virtual void failed(std::exception_ptr /*why*/) noexcept { canceled(); }
  /// The table's owner shuts down while the request waits (RuleTable::cancel_all_waiting): it is
  /// out of the table, never granted. By default, as canceled.
  virtual void closed() noexcept { canceled(); }
  /// Who asked (a tasklet, for instance), so that its request can be found and withdrawn.
  virtual const void* owner() const noexcept { return nullptr; }
  /// Whether a thread blocks while it waits (begin_rule on an ordinary thread), rather than a
  /// tasklet or a suspended task that holds no thread. For the trace's picture.
  virtual bool blocks_thread() const noexcept { return false; }
  /// Who asked and for which rule, for diagnostics (RuleTable::blockers). Called under the table's
  /// lock: the rule is a strong reference, so that the caller can print it outside.
  virtual RuleBlocker describe() const { return {"a request", nullptr, false}; }
  /// The job this request works for (a job's run, or code in it), empty for others: the trace
  /// records it apart from describe()'s text. Called under the table's lock.
  virtual std::string job_name() const { return {}; }
  /// Whether leave() may park this request (see the top of rule_table.hpp) instead of releasing it;
  /// asked when it is entered. Its owner then keeps it until it enters it again or discards it.
  virtual bool parkable() const noexcept { return false; }

 protected:
  /// Three bits of the subclass's own, kept in a byte the request has spare: set them before the
  /// request enters the table and read them once it was granted or canceled (they share the byte
  /// with flags the table writes under its lock meanwhile).
  std::uint8_t own_bits() const noexcept { return own_bits_; }
  void set_own_bits(std::uint8_t bits) noexcept { own_bits_ = bits & 7u; }

 private:
  friend class RuleTable;
  friend class RuleShard;
  friend class WaitQueue;

  // The room in place (right behind the request, see InlineRuleRequest), or, once the entries
  // moved to the heap, the heap block, whose address is then kept in the room's first word: a
  // pointer of its own would make every request 8 bytes larger.
  RuleEntry* room() const noexcept {
    return std::launder(reinterpret_cast<RuleEntry*>(const_cast<char*>(reinterpret_cast<const char*>(this)) +
                                                     sizeof(RuleRequest)));
  }
  RuleEntry* entry_data() const noexcept {
    if (entry_heap_log_ == 0) return room();
    RuleEntry* heap = nullptr;
    // The room holds the pointer itself: its size is meant.
    // NOLINTNEXTLINE(bugprone-sizeof-expression)
    std::memcpy(&heap, static_cast<const void*>(room()), sizeof heap);
    return heap;
  }
  std::span<RuleEntry> entries() noexcept { return {entry_data(), entry_count_}; }
  std::span<const RuleEntry> entries() const noexcept { return {entry_data(), entry_count_}; }
  std::size_t entry_capacity() const noexcept {
    return entry_heap_log_ != 0 ? std::size_t{1} << entry_heap_log_ : entry_room_;
  }
  void reserve_entries(std::size_t count) {
    if (count <= entry_capacity()) return;
    if (count > max_entries) throw std::bad_alloc();  // refused, as out of memory
    const std::size_t capacity = std::bit_ceil(count);
    auto* moved = static_cast<RuleEntry*>(allocate_bytes(capacity * sizeof(RuleEntry)));
    RuleEntry* before = entry_data();
    std::copy_n(before, entry_count_, moved);
    if (entry_heap_log_ != 0) deallocate_bytes(before);
    // NOLINTNEXTLINE(bugprone-sizeof-expression): the pointer itself goes into the room
    std::memcpy(static_cast<void*>(room()), &moved, sizeof moved);
    entry_heap_log_ = static_cast<std::uint8_t>(std::countr_zero(capacity));
  }
  RuleEntry& push_entry() {
    reserve_entries(entry_count_ + std::size_t{1});
    RuleEntry& entry = entry_data()[entry_count_++];
    entry = RuleEntry{};
    return entry;
  }
  void clear_entries() noexcept { entry_count_ = 0; }
  /// The entry at `node` of a queue slot's request (a request has one entry per node); `hint` is
  /// its index, or WaitQueue::scan_hint for "that or more".
  RuleEntry& entry_at(std::size_t hint, const RuleNode& node) noexcept {
    RuleEntry* data = entry_data();
    if (hint < WaitQueue::scan_hint) return data[hint];
    std::size_t at = hint;
    while (data[at].node() != &node) ++at;
    return data[at];
  }

  static constexpr std::size_t max_entries = 0xffff;
  // Kept small: one of these waits in the table for every queued tasklet with a rule.
  const SchedulingRule* rule_ = nullptr;
  std::uint64_t ticket_ = 0;
  // Before it is entered, its link in RuleTable::submitted_ (tagged); once entered, its standing
  // in the table (put_in sets both fields before anything reads them).
  union Place {
    std::uintptr_t next_submitted;
    struct {
      std::uint32_t unclear;     // nodes where the request is not clear yet
      std::uint32_t live_index;  // position in RuleTable::live_
    } in_table;
  } place_{0};
  std::uint16_t entry_count_ = 0;
  // The table's shard that holds the request (RuleTable::shard_of), or RuleTable::cross_shard for a
  // request entered in several shards through parts (RulePart), or a part's flag with its shard.
  std::uint16_t shard_ = 0;
  std::atomic<Park> park_{Park::none};
  std::uint8_t entry_room_;          // entries in place
  std::uint8_t entry_heap_log_ = 0;  // log2 of the heap block's capacity; 0: in place
  // Read and written only under the table's lock.
  bool parkable_ : 1 = false;  // in RuleTable::parked_
  bool held_ : 1 = false;
  bool in_table_ : 1 = false;
  bool has_custom_ : 1 = false;      // some atom has no index: pairwise checks
  bool custom_blocked_ : 1 = false;  // a pairwise check against a custom rule says wait
  std::uint8_t own_bits_ : 3 = 0;    // the subclass's (own_bits())
};

// A tasklet's hold (this, its entries and the tasklet, its directive in own_bits()) fills a block
// of the scalable allocator: 80 bytes for a mutex rule, 96 for a path rule up to depth 3.
static_assert(sizeof(RuleRequest) <= 40, "RuleRequest grew: memory per queued job (DESIGN section 5)");
// The room of one entry can hold the pointer to entries moved to the heap.
// NOLINTNEXTLINE(bugprone-sizeof-expression)
static_assert(sizeof(RuleRequest) % alignof(RuleEntry) == 0 && sizeof(RuleEntry) >= sizeof(RuleEntry*));

inline std::uint64_t WaitQueue::ticket_of(Slot slot) noexcept {
  return is_hole(slot) ? slot >> 3 : request_of(slot)->ticket_;
}

inline void WaitQueue::push_back(RuleRequest& request, std::uint64_t ticket, std::size_t index) {
  assert(slots_.empty() || ticket_of(slots_.back()) < ticket);
  slots_.push_back(reinterpret_cast<Slot>(&request) | std::min<Slot>(index, scan_hint));
  if (live_++ == 0) front_ticket_ = ticket;
}

inline void WaitQueue::erase(std::uint64_t ticket) noexcept {
  const auto slot = std::partition_point(slots_.begin() + static_cast<std::ptrdiff_t>(head_), slots_.end(),
                                         [ticket](Slot at) { return ticket_of(at) < ticket; });
  assert(slot != slots_.end() && !is_hole(*slot) && ticket_of(*slot) == ticket);
  assert(ticket < (std::uint64_t{1} << 61));
  *slot = ticket << 3 | hole_tag;
  --live_;
  advance();
}

inline void WaitQueue::advance() noexcept {
  if (live_ == 0) {
    slots_.clear();
    head_ = 0;
    return;
  }
  while (is_hole(slots_[head_])) ++head_;
  front_ticket_ = request_of(slots_[head_])->ticket_;
  if (head_ >= 64 && std::size_t{head_} * 2 >= slots_.size()) {
    // Drop the consumed prefix.
    slots_.erase(slots_.begin(), slots_.begin() + static_cast<std::ptrdiff_t>(head_));
    head_ = 0;
  }
}

template <std::size_t N>
struct EntryStorage {
  static_assert(N >= 1 && N < 0xff);
  std::array<RuleEntry, N> slots;
};

/// A RuleRequest with room for N entries in place: a mutex rule takes 1, a path rule of depth d
/// up to d + 1 (d while nobody claims the root), a multi rule the union of its parts.
template <std::size_t N>
class InlineRuleRequest : public RuleRequest, private EntryStorage<N> {
 protected:
  InlineRuleRequest() noexcept : RuleRequest(static_cast<std::uint8_t>(N)) {
    // The room must sit right behind the request (see RuleRequest::room): the first base comes
    // first, and the request's size is a multiple of an entry's alignment.
    assert(reinterpret_cast<const char*>(this->slots.data()) ==
           reinterpret_cast<const char*>(static_cast<RuleRequest*>(this)) + sizeof(RuleRequest));
  }
};

/// How many entries a request for `rule` takes, at most (a guide for choosing N above).
std::size_t entry_count_hint(const SchedulingRule& rule) noexcept;

}  // namespace tasklet::detail
