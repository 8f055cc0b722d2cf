// Private: the rule table, the one place where every rule is granted and released.
//
// Tasklets, jobs, threads in begin_rule and serial executors all enter RuleRequests here. A request
// is granted only when it conflicts with no held rule and no earlier waiting request (strict FIFO
// among conflicting requests); non-conflicting requests never wait for each other.
//
// Built-in rules are indexed, so a decision costs O(path depth), not O(requests):
//  - a request is a set of (node, mode) entries, as in multi-granularity locking: an exclusive path
//    rule takes X on its node and IX on every ancestor, a shared one S and IS, a mutex rule X on
//    its identity node, a multi rule the union of its children (merged per node: IX + S = SIX);
//  - two requests conflict exactly when some node holds incompatible modes of them;
//  - a waiting entry is "clear" at its node when it is compatible with the granted modes and with
//    every earlier waiting entry there. A request is granted when it is clear at all its nodes.
//  - Each node counts, per mode, its entries that are granted or clear (waiting but clear: both
//    are in a newcomer's way alike), and queues only the entries that are not clear yet, in ticket
//    order. No entry becomes clear before an earlier conflicting one does, so every clear waiting
//    entry of a mode incompatible with a queued entry is older than it: "is an older conflicting
//    entry waiting" needs the counts and the ticket at the front of each queue, never the entries
//    themselves. A release walks each of its nodes from the queue fronts; an entry leaves its queue
//    once, when it becomes clear (amortised O(1)). Entries that are clear on arrival (the intent
//    modes on ancestors, mostly) are never linked, so granting them touches the node's counters
//    only, not other requests' memory.
// Root intents are taken lazily: every path request would take IS or IX on the root, the one node
// that all of them share, and yet only a request for the root itself (a rule on "/", alone or in a
// multi rule) can conflict there. So a path request takes no entry at the root while nobody claims
// it (no S, SIX or X held or waiting there). A newcomer that claims it first gives every live
// request without a root entry its intent entry there (clear: the root holds only intents then),
// and then enters as usual. Each request gets that entry at most once: O(1) amortised.
// Custom rules have no index: a request with a custom part is checked pairwise against every held
// and earlier waiting request (the custom rule asked, as receiver); other requests are checked
// pairwise only against requests with custom parts. Those calls run under the table's lock.
//
// Parking (begin_rule's fast path, inside enter() and leave()): a thread that ends its rule leaves
// its request in the table, granted but idle, so that its next begin_rule of the same rule takes it
// back with one compare-and-swap instead of the table's lock (about a third of the time). A parked request
// never makes anyone wait: a newcomer that would wait for it revokes it first (under the lock), and a
// newcomer that conflicts with an active parkable request marks it wanted, so that its owner releases it for
// real instead of parking it. Parked requests are not counted as held (held_count, is_idle).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cassert>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <oneapi/tbb/mutex.h>
#include <boost/container/flat_map.hpp>
#include <boost/container/small_vector.hpp>

#include "room_for.hpp"
#include "tasklet/detail/allocator.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet::detail {

class RuleTable;
struct RuleNode;

/// Multi-granularity lock modes.
enum class LockMode : std::uint8_t { is, ix, s, six, x };
inline constexpr int lock_mode_count = 5;

class RuleRequest;

/// Where a parkable request (see the top of this file) stands. Its owner moves it between active
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
/// granted(), and of a cancellation by the table's owner through cancelled(); both are called once,
/// outside the table's lock, and the table does not touch the request afterwards.
class RuleRequest {
 public:
  /// `room` entries at `entries` are storage of the subclass (see InlineRuleRequest), kept next to
  /// the request so that granting it touches one block of memory; more go to the heap.
  RuleRequest(RuleEntry* entries, std::uint8_t room) noexcept : entries_(entries), entry_room_(room) {}
  RuleRequest(const RuleRequest&) = delete;
  RuleRequest& operator=(const RuleRequest&) = delete;

  /// The rule requested; whoever owns the request keeps it alive while the request is in the table.
  const SchedulingRule* rule() const noexcept { return rule_; }
  void set_rule(const SchedulingRule* rule) noexcept { rule_ = rule; }
  bool is_held() const noexcept { return held_; }

  virtual ~RuleRequest() {
    if (entry_heap_log_ != 0) deallocate_bytes(entries_);
  }
  virtual void granted() noexcept = 0;
  virtual void cancelled() noexcept = 0;
  /// The table ran out of memory entering the request: it never was in the table (nothing of the
  /// table changed), and its owner is told instead of granted or cancelled. By default, as cancelled.
  virtual void refused() noexcept { cancelled(); }
  /// Who asked (a tasklet, for instance), so that its request can be found and withdrawn.
  virtual const void* owner() const noexcept { return nullptr; }
  /// Whether leave() may park this request (see the top of this file) instead of releasing it;
  /// asked when it is entered. Its owner then keeps it until it enters it again or discards it.
  virtual bool parkable() const noexcept { return false; }

 protected:
  /// Three bits of the subclass's own, kept in a byte the request has spare: set them before the
  /// request enters the table and read them once it was granted or cancelled (they share the byte
  /// with flags the table writes under its lock meanwhile).
  std::uint8_t own_bits() const noexcept { return own_bits_; }
  void set_own_bits(std::uint8_t bits) noexcept { own_bits_ = bits & 7u; }

 private:
  friend class RuleTable;
  friend class WaitQueue;

  std::span<RuleEntry> entries() noexcept { return {entries_, entry_count_}; }
  std::span<const RuleEntry> entries() const noexcept { return {entries_, entry_count_}; }
  std::size_t entry_capacity() const noexcept {
    return entry_heap_log_ != 0 ? std::size_t{1} << entry_heap_log_ : entry_room_;
  }
  void reserve_entries(std::size_t count) {
    if (count <= entry_capacity()) return;
    const std::size_t capacity = std::bit_ceil(count);
    auto* moved = static_cast<RuleEntry*>(allocate_bytes(capacity * sizeof(RuleEntry)));
    std::copy_n(entries_, entry_count_, moved);
    if (entry_heap_log_ != 0) deallocate_bytes(entries_);
    entries_ = moved;
    entry_heap_log_ = static_cast<std::uint8_t>(std::countr_zero(capacity));
  }
  RuleEntry& push_entry() {
    reserve_entries(entry_count_ + std::size_t{1});
    RuleEntry& entry = entries_[entry_count_++];
    entry = RuleEntry{};
    return entry;
  }
  void clear_entries() noexcept { entry_count_ = 0; }
  /// The entry at `node` of a queue slot's request (a request has one entry per node); `hint` is
  /// its index, or WaitQueue::scan_hint for "that or more".
  RuleEntry& entry_at(std::size_t hint, const RuleNode& node) noexcept {
    if (hint < WaitQueue::scan_hint) return entries_[hint];
    std::size_t at = hint;
    while (entries_[at].node() != &node) ++at;
    return entries_[at];
  }

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
  RuleEntry* entries_;  // the subclass's room, or the heap
  std::uint32_t entry_count_ = 0;
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
static_assert(sizeof(RuleRequest) <= 48, "RuleRequest grew: memory per queued job (DESIGN section 5)");

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
  std::array<RuleEntry, N> room;
};

/// A RuleRequest with room for N entries in place: a mutex rule takes 1, a path rule of depth d
/// up to d + 1 (d while nobody claims the root), a multi rule the union of its parts.
template <std::size_t N>
class InlineRuleRequest : private EntryStorage<N>, public RuleRequest {
 protected:
  InlineRuleRequest() noexcept : RuleRequest(this->room.data(), static_cast<std::uint8_t>(N)) {}
};

/// How many entries a request for `rule` takes, at most (a guide for choosing N above).
std::size_t entry_count_hint(const SchedulingRule& rule) noexcept;

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

namespace tasklet::detail {

/// Requests newly granted by a release or cancellation, to notify outside the lock.
using Grants = boost::container::small_vector<RuleRequest*, 4>;
/// Requests the table owns and deletes once it has let its lock go.
using Orphans = boost::container::small_vector<RuleRequest*, 8>;

class RuleTable {
 public:
  RuleTable();
  ~RuleTable();
  RuleTable(const RuleTable&) = delete;
  RuleTable& operator=(const RuleTable&) = delete;

  // The one way in and the one way out, for every holder: tasklets (and so jobs and serial tasks)
  // and threads in begin_rule.

  /// Enters a request for request.rule() (not null). Its granted() is called once its turn comes:
  /// at once on this thread, or later on the thread whose release lets it through. It counts as
  /// requested now (before anything this thread enters later), even when another thread holds the
  /// table's lock: the request is then left for that thread to enter before it lets go. A parked
  /// request (see leave()) is taken back without the lock when nobody came for it meanwhile.
  /// Calls custom rules' checks under the lock. The table notes the nodes of a built-in rule in
  /// the rule object from its second request on (see RuleNote).
  void enter(RuleRequest& request);
  /// As enter() for each request in turn (in that order), with one atomic step, but entering none
  /// of them on this thread: the next thread to take the lock, or to call drain(), enters them,
  /// before anything else. The caller must see to it that drain() runs afterwards (on any thread).
  /// For a thread that makes work for others faster than they get through it. Lock-free.
  void enter_all(std::span<RuleRequest* const> requests) noexcept;
  /// Enters what was entered with enter_all and notifies the requests granted, unless another
  /// thread holds the lock (that thread then enters it before it lets go). Never waits for the lock.
  void drain() noexcept;

  /// Leaves a held request and hands the requests this lets through to the caller to notify. True
  /// when the request was parked instead (a parkable() one that no conflicting request wants): it
  /// stays in the table, granted but idle, until its owner enters it again (taking it back) or
  /// discards it. Lock-free when it parks.
  bool leave(RuleRequest& request, Grants& grants);
  /// As leave(request, grants), notifying the requests let through itself.
  bool leave(RuleRequest& request);
  /// Its owner gives up a parked request without touching its table (which may be another
  /// thread's to destroy): true when the table now owns it, and deletes it when it next parks
  /// another request, revokes it or is destroyed; false when a newcomer took it out of the table
  /// already, and the caller still owns it. Lock-free.
  static bool discard(RuleRequest& request) noexcept;

  /// Withdraws a waiting request; false when it was granted meanwhile (its granted() runs or ran).
  bool withdraw(RuleRequest& request);

  /// Withdraws the waiting requests for exactly `rule` (the same object) that `matches` accepts,
  /// calls their cancelled() outside the lock, and returns how many. `matches` runs under the lock.
  template <class Predicate>
  std::size_t withdraw_waiting(const SchedulingRule& rule, Predicate&& matches);

  /// Withdraws every waiting request that `matches` accepts, calls their cancelled() outside the
  /// lock, and returns how many. `matches` runs under the lock. O(live requests).
  template <class Predicate>
  std::size_t withdraw_waiting_if(Predicate&& matches);

  /// Whether some waiting request conflicts with `held` (a held request).
  bool has_conflicting_waiter(const RuleRequest& held);

  /// Whether submitted requests wait to be entered, or a lock holder is entering those it took
  /// (a parked request must not be taken back past them: they came first).
  bool has_submitted() const noexcept {
    return submitted_.load(std::memory_order_acquire) != 0 ||
           entering_submitted_.load(std::memory_order_acquire);
  }

  /// Cancels every waiting request (their cancelled() is called). For the owner's shutdown.
  void cancel_all_waiting();

  /// True when no rule is held and no request waits. Thread-safe.
  bool is_idle();
  /// Held and waiting request counts. Thread-safe.
  std::size_t held_count();
  std::size_t waiting_count();

  /// Tells the owners of `grants`, and of the requests refused for lack of memory meanwhile.
  void notify(const Grants& grants) noexcept;

 private:
  // The table's lock, taken for one operation. Requests submitted meanwhile are entered first, in
  // the order they came, so that the operation comes after them; after the lock is let go, those
  // that came while it was held are entered by this thread, unless another holds the lock again
  // (which then does the same). Their grants join `grants`, which the caller notifies afterwards.
  class Locked {
   public:
    Locked(RuleTable& table, Grants& grants) : table_(table), grants_(grants) {
      table_.mutex_.lock();
      table_.enter_submitted(grants_, orphans_);
    }
    ~Locked() {
      table_.mutex_.unlock();
      table_.settle(grants_, orphans_);
      for (RuleRequest* orphan : orphans_) delete orphan;
    }
    Locked(const Locked&) = delete;
    Locked& operator=(const Locked&) = delete;
    // Parked requests revoked and owned by the table: deleted once the lock is let go.
    Orphans& orphans() noexcept { return orphans_; }

   private:
    RuleTable& table_;
    Grants& grants_;
    Orphans orphans_;
  };
  void enter_submitted(Grants& grants, Orphans& orphans) noexcept;
  // put_in, or, when it ran out of memory (before it changed anything), the request's refusal.
  void put_in_or_refuse(RuleRequest& request, Grants& grants, Orphans& orphans) noexcept;
  void push_refused(RuleRequest& request) noexcept;
  void make_room(RuleRequest& request, bool every_entry, Grants& grants, Orphans& orphans, bool parkable);
  struct SubmittedRun;
  static constexpr std::uintptr_t run_tag = 1;
  static std::uintptr_t& submitted_link(std::uintptr_t entry) noexcept;
  void push_submitted(std::uintptr_t newest, std::uintptr_t& oldest_link) noexcept;
  void enter_together(SubmittedRun& run, Grants& grants, Orphans& orphans) noexcept;
  // Reads the table under the lock, after entering what was submitted.
  template <class Read>
  auto read_settled(Read&& read) {
    Grants grants;
    const auto value = [&] {
      Locked lock(*this, grants);
      return read();
    }();
    notify(grants);
    return value;
  }
  bool has_conflicting_waiter_locked(const RuleRequest& held) const noexcept;
  void settle(Grants& grants, Orphans& orphans) noexcept;

  // live_ in two parts, each request knowing its position: O(1) insertion and removal, touching
  // at most two other requests (those moved to keep the parts whole).
  void insert_live(RuleRequest& request, bool rootless);
  void erase_live(RuleRequest& request) noexcept;
  void place_live(RuleRequest& request, std::size_t at) noexcept;
  void remove_custom(RuleRequest& request) noexcept;
  // Root intents (see the top of this file): whether the root is claimed, and giving every rootless
  // live request its intent entry there, for a newcomer that claims it.
  bool root_claimed() const noexcept;
  void give_root_intents() noexcept;
  void add_root_intent(RuleRequest& request);

  // Withdraws the waiting requests that collect(std::vector<RuleRequest*>&) lists under the lock.
  template <class Collect>
  std::size_t withdraw_collected(Collect&& collect);
  void add_atom(RuleRequest& request, const SchedulingRule& atom, const RuleKey& key, bool merge,
                bool with_root);
  RuleNote* note_on(const SchedulingRule& rule, std::size_t room);
  static void add_entry(RuleRequest& request, RuleNode& node, LockMode mode, bool merge);
  // Out of memory while queueing terminates: a half-queued request would break the table.
  static void enqueue(RuleRequest& request, std::size_t index) noexcept;
  static void dequeue(const RuleEntry& entry, std::uint64_t ticket) noexcept;
  RuleNode& path_node(RuleNode& from, std::string_view segment);
  RuleNode& identity_node(const SchedulingRule& rule);
  static bool conflicts_pairwise(const RuleRequest& a, const RuleRequest& b) noexcept;
  static bool customs_say_conflict(const RuleRequest& custom, const RuleRequest& other) noexcept;
  static bool clear_at(const RuleNode& node, LockMode mode, std::uint64_t ticket) noexcept;
  bool blocked_by_custom(const RuleRequest& request) const noexcept;
  static bool conflicting(const RuleRequest& a, const RuleRequest& b) noexcept;
  bool put_in(RuleRequest& request, Grants& grants, Orphans& orphans);
  bool revoke_parked(const RuleRequest& request, Grants& grants, Orphans& orphans);
  void drop_orphans(Grants& grants, Orphans& orphans) noexcept;
  static bool park(RuleRequest& request) noexcept;
  static bool resume(RuleRequest& request) noexcept;
  std::uint32_t mark_clear(RuleRequest& request) noexcept;
  std::size_t parked_idle() const noexcept;
  void grant(RuleRequest& request, Grants& grants);
  void walk(RuleNode& node, Grants& grants);
  void recheck_custom_blocked(Grants& grants);
  void unlink_waiting(RuleRequest& request) noexcept;
  void take_out(RuleRequest& request, Grants& grants);
  void prune(RuleNode& node);

  // Held for a few hundred nanoseconds at a time by the posting thread and the releasing workers:
  // oneTBB's mutex spins briefly before it sleeps, where a plain futex mutex would turn every
  // collision into a sleep and a wake-up that cost more than the work.
  oneapi::tbb::mutex mutex_;
  // What was entered and not put in yet, newest first: requests linked through next_submitted and
  // requests entered together (tagged: see enter_all), each linked to the next older one. On the
  // lock's cache line: a submission pushes here and then tries the lock (on a line of its own,
  // every SerialExecutor post took 7-14 % longer).
  std::atomic<std::uintptr_t> submitted_{0};
  std::atomic<bool> entering_submitted_{false};  // a lock holder took the stack and enters it
  // Requests refused for lack of memory (put_in_or_refuse), linked like the submitted ones, until
  // the next notify() tells their owners.
  std::atomic<std::uintptr_t> refused_{0};
  const std::uint64_t id_;  // distinguishes tables for rule notes (unique for the process's life)
  std::uint64_t next_ticket_ = 0;
  std::size_t held_ = 0;
  RuleNode root_;
  std::size_t path_nodes_ = 0;         // trie nodes below the root
  std::uint64_t node_generation_ = 0;  // nodes freed so far (rule notes' validity)
  // Unused nodes kept for reuse (see prune()).
  static constexpr std::size_t kept_identity_nodes = 1024;
  static constexpr std::size_t kept_path_nodes = 16384;
  std::unordered_map<const SchedulingRule*, std::unique_ptr<RuleNode>> identities_;
  // Every held or waiting request. Those from rootless_from_ on have path entries but none at the
  // root: they entered while nobody claimed the root, and get their intent there when someone does.
  std::vector<RuleRequest*> live_;
  std::size_t rootless_from_ = 0;
  std::vector<RuleRequest*> customs_;  // the live requests with custom parts
  std::vector<RuleRequest*> blocked_;  // waiting requests held back by a custom check, ticket order
  std::vector<RuleRequest*> parked_;   // the parkable requests in the table (one per thread, at most)
};

template <class Collect>
std::size_t RuleTable::withdraw_collected(Collect&& collect) {
  std::vector<RuleRequest*> withdrawn;
  Grants grants;
  {
    Locked lock(*this, grants);
    collect(withdrawn);
    // In the order they came: the owners hear of it in that order, and withdrawing one may let a
    // later one through first.
    std::sort(withdrawn.begin(), withdrawn.end(),
              [](const RuleRequest* a, const RuleRequest* b) { return a->ticket_ < b->ticket_; });
    auto kept = withdrawn.begin();
    for (RuleRequest* request : withdrawn) {
      if (request->held_) continue;  // let through by an earlier withdrawal: it runs after all
      take_out(*request, grants);
      *kept++ = request;
    }
    withdrawn.erase(kept, withdrawn.end());
  }
  notify(grants);
  for (RuleRequest* request : withdrawn) request->cancelled();
  return withdrawn.size();
}

template <class Predicate>
std::size_t RuleTable::withdraw_waiting(const SchedulingRule& rule, Predicate&& matches) {
  return withdraw_collected([&](std::vector<RuleRequest*>& withdrawn) {
    const auto consider = [&](RuleRequest& request) {
      if (!request.held_ && request.rule_ == &rule && matches(static_cast<const RuleRequest&>(request))) {
        withdrawn.push_back(&request);
      }
    };
    auto identity = identities_.end();
    if (rule.key().kind == RuleKey::Kind::identity) identity = identities_.find(&rule);
    if (identity != identities_.end()) {
      // A request for exactly this rule has one entry, queued there unless it is clear, and a
      // clear one waits only when a custom rule holds it back.
      const RuleNode& node = *identity->second;
      for (unsigned left = node.queued; left != 0; left &= left - 1) {
        node.waiting(static_cast<std::size_t>(std::countr_zero(left))).for_each([&](RuleRequest& request) {
          consider(request);
        });
      }
      for (RuleRequest* request : blocked_) {
        if (request->place_.in_table.unclear == 0) consider(*request);
      }
    } else {
      for (RuleRequest* request : live_) consider(*request);
    }
  });
}

template <class Predicate>
std::size_t RuleTable::withdraw_waiting_if(Predicate&& matches) {
  return withdraw_collected([&](std::vector<RuleRequest*>& withdrawn) {
    for (RuleRequest* request : live_) {
      if (!request->held_ && matches(static_cast<const RuleRequest&>(*request))) withdrawn.push_back(request);
    }
  });
}

}  // namespace tasklet::detail
