// Private: the rule table, the one place where every rule is granted and released.
//
// Tasklets, jobs, threads in begin_rule and serial executors all enter RuleRequests here. A request
// is granted only when it conflicts with no held rule and no earlier waiting request (strict FIFO
// among conflicting requests); non-conflicting requests never wait for each other.
//
// Built-in rules are indexed, so a decision costs O(path depth), not O(requests):
//  - a request is a set of (node, mode) entries, as in multi-granularity locking: an exclusive path
//    rule takes X on its node and IX on every ancestor, a shared one S and IS, a mutex rule X on
//    its identity node, a named mutex X on its name's node, a multi rule the union of its
//    children (merged per node: IX + S = SIX);
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
// Shards: the table is split by what a rule is on, so that work on disjoint resources takes
// different locks (and keeps different memory in each core's cache). A path picks its shard by
// its first segment, a mutex rule by its address, a named mutex by its name. Each shard is a
// whole table of its own (index, queues, lock, submitted stack, tickets, root intents) for the
// requests that lie in it. A request over several shards (a multi rule over several of them, a
// rule on "/", any rule with a custom part: those are asked pairwise of everything) enters one
// part in each of them, a request of the shard's own that takes the entries there, with all of
// those shards' locks taken in index order at once: every shard sees the parts of two such
// requests in the same order, so strict FIFO holds across shards and no wait can go round a
// cycle (each wait is for a request that entered earlier, in one real-time order). The request is
// granted when its last part is, in whichever shard; it leaves with all its shards' locks taken.
// Readings that span shards (snapshots, wait chains, cancellations) take every shard's lock.
//
// Parking (begin_rule's fast path, inside enter() and leave()): a thread that ends its rule leaves
// its request in the table, granted but idle, so that its next begin_rule of the same rule takes
// it back with one compare-and-swap instead of the table's lock. A parked request never makes
// anyone wait: a newcomer that would wait for it revokes it first (under the lock), and a newcomer
// that conflicts with an active parkable request marks it wanted, so that its owner releases it
// for real instead of parking it. Parked requests are not counted as held (held_count, is_idle).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <oneapi/tbb/mutex.h>
#include <boost/container/small_vector.hpp>

#include "base/door.hpp"
#include "table/rule_backend.hpp"
#include "table/rule_node.hpp"
#include "table/rule_request.hpp"
#include "table/table_mutex.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet::detail {

/// Requests newly granted by a release or cancellation, to notify outside the lock.
using Grants = boost::container::small_vector<RuleRequest*, 4>;
/// Requests the table owns and deletes once it has let its lock go.
using Orphans = boost::container::small_vector<RuleRequest*, 8>;

/// Whether a custom part of `custom` says it conflicts with a part of `other` (a check that throws
/// says it does). Built-in rules know nothing of custom ones: the custom rule is always asked.
bool custom_parts_conflict(const SchedulingRule& custom, const SchedulingRule& other) noexcept;
/// Whether `rule` is custom or a multi rule with a custom part.
bool has_custom_part(const SchedulingRule& rule) noexcept;

class RuleTable;
class RuleShard;
struct CrossRequest;

/// A bit per shard.
using ShardSet = std::uint64_t;

/// A request's part in one shard, for a request over several (see the top of this file). Made and
/// owned by the table; it speaks for the whole request where the shard describes it.
class RulePart final : public InlineRuleRequest<4> {
 public:
  explicit RulePart(CrossRequest& cross) noexcept : cross_(&cross) {}
  CrossRequest& cross() const noexcept { return *cross_; }
  // The table grants and cancels the whole request, never a part.
  void granted() noexcept override {}
  void canceled() noexcept override {}
  const void* owner() const noexcept override;
  bool blocks_thread() const noexcept override;
  RuleBlocker describe() const override;
  std::string job_name() const override;

 private:
  CrossRequest* cross_;
};

/// A request over several shards: its parts, one per shard in index order, in one block with it
/// (one allocation of the library's allocator per request, made and freed on different threads).
/// Lives while the request is in the table (its address in the request's place).
struct CrossRequest {
  /// Made for `whole` over `shards` (two or more); throws std::bad_alloc.
  static CrossRequest* make(RuleRequest& whole, ShardSet shards);
  struct Free {
    void operator()(CrossRequest* cross) const noexcept;
  };
  std::span<RulePart> parts() noexcept { return {reinterpret_cast<RulePart*>(this + 1), count}; }
  RulePart& first() noexcept { return *reinterpret_cast<RulePart*>(this + 1); }

  RuleRequest* whole;
  ShardSet shards;
  std::atomic<std::uint32_t> unclear_parts;  // parts not granted yet; the last grant grants `whole`
  std::uint32_t count;                       // of parts
};
using CrossPtr = std::unique_ptr<CrossRequest, CrossRequest::Free>;

/// One shard: the whole table for the requests that lie in it (see the top of this file). Only
/// RuleTable uses it.
class alignas(64) RuleShard {
 public:
  RuleShard() = default;
  ~RuleShard();
  RuleShard(const RuleShard&) = delete;
  RuleShard& operator=(const RuleShard&) = delete;

 private:
  friend class RuleTable;
  friend class RulePart;

  void attach(RuleTable& table, std::uint16_t index);
  void enter(RuleRequest& request);
  void enter_all(std::span<RuleRequest* const> requests) noexcept;
  bool drain_into(Grants& grants, Orphans& orphans) noexcept;
  bool leave(RuleRequest& request, Grants& grants);
  void hand_over(RuleRequest& from, RuleRequest& to);
  bool has_submitted() const noexcept {
    return submitted_.load(std::memory_order_acquire) != 0 ||
           entering_submitted_.load(std::memory_order_acquire);
  }
  ShardSet bit() const noexcept { return ShardSet{1} << index_; }
  // Calls consider(RuleRequest&) on every request here that may be one for exactly `rule` and
  // waiting (and on others: the caller checks); for an identity rule, only on those at its node.
  template <class Consider>
  void each_waiting_for(const SchedulingRule& rule, Consider&& consider) const;

  void enter_submitted(Grants& grants, Orphans& orphans) noexcept;
  // put_in, or, when it ran out of memory (before it changed anything), the request's refusal.
  void put_in_or_refuse(RuleRequest& request, Grants& grants, Orphans& orphans) noexcept;
  void make_room(RuleRequest& request, bool every_entry, Grants& grants, Orphans& orphans, bool parkable);
  struct SubmittedRun;
  static constexpr std::uintptr_t run_tag = 1;
  static std::uintptr_t& submitted_link(std::uintptr_t entry) noexcept;
  void push_submitted(std::uintptr_t newest, std::uintptr_t& oldest_link) noexcept;
  void enter_together(SubmittedRun& run, Grants& grants, Orphans& orphans) noexcept;
  bool has_conflicting_waiter_locked(const RuleRequest& held) const noexcept;
  // The requests in the way of `mine`, as the requests they are parts of: the active held ones
  // and the earlier waiting ones (not sorted, perhaps repeated across shards).
  struct InTheWay {
    std::vector<const RuleRequest*> held;
    std::vector<const RuleRequest*> earlier;
  };
  void add_blockers(const RuleRequest& mine, InTheWay& found) const;
  // The recorder's side (trace set), under the lock: a request entered (granted at once or not),
  // was granted after waiting, or left (released, withdrawn or canceled). Parts are not recorded:
  // the table records the request they are parts of.
  [[gnu::cold, gnu::noinline]] void trace_entered(Trace& trace, const RuleRequest& request,
                                                  bool granted) noexcept;
  [[gnu::cold, gnu::noinline]] void trace_granted(Trace& trace, const RuleRequest& request) const noexcept;
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

  void add_atom(RuleRequest& request, const SchedulingRule& atom, const RuleKey& key, bool merge,
                bool with_root);
  void add_path(RuleRequest& request, const SchedulingRule& atom, const RuleKey& key, bool merge,
                bool with_root);
  RuleNote* note_on(const SchedulingRule& rule, std::size_t room);
  static void add_entry(RuleRequest& request, RuleNode& node, LockMode mode, bool merge);
  // Out of memory while queueing terminates: a half-queued request would break the table.
  static void enqueue(RuleRequest& request, std::size_t index) noexcept;
  static void dequeue(const RuleEntry& entry, std::uint64_t ticket) noexcept;
  RuleNode& path_node(RuleNode& from, std::string_view segment);
  RuleNode& identity_node(const SchedulingRule& rule);
  static bool conflicts_pairwise(const RuleRequest& a, const RuleRequest& b) noexcept;
  // Parked and idle: in the table for its owner's next hold, waited for by nobody.
  static bool idle_parked(const RuleRequest& request) noexcept;
  static bool customs_say_conflict(const RuleRequest& custom, const RuleRequest& other) noexcept;
  static bool clear_at(const RuleNode& node, LockMode mode, std::uint64_t ticket) noexcept;
  // The request that a pairwise check against a custom rule holds `request` back for, or null.
  const RuleRequest* custom_blocker(const RuleRequest& request) const noexcept;
  static bool conflicting(const RuleRequest& a, const RuleRequest& b) noexcept;
  bool put_in(RuleRequest& request, Grants& grants, Orphans& orphans);
  struct RootStand {
    bool claims;    // it claims the root (not only an intent there)
    bool rootless;  // on a path, without an entry at the root
  };
  RootStand stand_at_root(const RuleRequest& request) const noexcept;
  static void make_queue_room(const RuleRequest& request);
  void hold_entered(RuleRequest& request) noexcept;
  void queue_entered(RuleRequest& request, std::uint32_t unclear, const RuleRequest* blocker);
  bool revoke_parked(const RuleRequest& request, Grants& grants, Orphans& orphans);
  void drop_orphans(Grants& grants, Orphans& orphans) noexcept;
  static bool park(RuleRequest& request) noexcept;
  static bool resume(RuleRequest& request) noexcept;
  std::uint32_t mark_clear(RuleRequest& request) noexcept;
  std::size_t parked_idle() const noexcept;
  void grant(RuleRequest& request, Grants& grants);
  void walk(RuleNode& node, Grants& grants);
  void recheck_custom_blocked(const RuleRequest& leaving, Grants& grants);
  void unlink_waiting(RuleRequest& request) noexcept;
  void take_out(RuleRequest& request, Grants& grants);
  // Takes a request out without letting anyone through: for cancel_all_waiting, which takes every
  // waiting request out.
  void drop(RuleRequest& request) noexcept;
  void prune(RuleNode& node);
  // Requests held or live here that are not parts of a request over several shards.
  std::size_t own_live() const noexcept { return live_.size() - parts_; }
  std::size_t own_held() const noexcept { return held_ - held_parts_; }

  TableMutex mutex_;
  // What was entered and not put in yet, newest first: requests linked through next_submitted and
  // requests entered together (tagged: see enter_all), each linked to the next older one. On the
  // lock's cache line: a submission pushes here and then tries the lock, one line for both.
  std::atomic<std::uintptr_t> submitted_{0};
  std::atomic<bool> entering_submitted_{false};  // a lock holder took the stack and enters it
  std::uint16_t index_ = 0;
  RuleTable* table_ = nullptr;
  std::uint64_t id_ = 0;  // distinguishes shards for rule notes (unique for the process's life)
  std::uint64_t next_ticket_ = 0;
  const RuleRequest* releasing_ = nullptr;  // while a recorder is set: whose exit grants, in take_out
  std::size_t held_ = 0;
  std::size_t held_parts_ = 0;  // of held_, the parts
  std::size_t parts_ = 0;       // of live_, the parts
  RuleNode root_;
  // The parent of one node per named mutex (RuleKey::Kind::named), apart from the paths: no
  // path's entries, root intents included, ever meet a name's.
  RuleNode names_;
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
  // A waiting request held back by a custom check, with one request it waits for: until that one
  // leaves, the request stays held back (what holds it back only goes), so a release rechecks
  // only those it held back rather than every pair.
  struct Blocked {
    RuleRequest* request;
    const RuleRequest* by;
  };
  std::vector<Blocked> blocked_;      // ticket order
  std::vector<RuleRequest*> parked_;  // the parkable requests in the table (one per thread, at most)
};

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
  /// For a thread that makes work for others faster than they get through it. Lock-free, but for a
  /// request over several shards, which this thread enters (taking their locks) in its turn.
  void enter_all(std::span<RuleRequest* const> requests) noexcept;
  /// Enters what was entered with enter_all and notifies the requests granted, unless another
  /// thread holds the lock (that thread then enters it before it lets go). Never waits for the lock.
  void drain() noexcept;

  /// Leaves a held request and hands the requests this lets through to the caller to notify. True
  /// when the request was parked instead (a parkable() one in one shard that no conflicting
  /// request wants): it
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

  /// Moves a held request's place to `to`, a request out of every table and not parkable: `to`
  /// holds the rule from now on, which is never free in between, and `from` is out of the table
  /// (its owner may delete it). For handing a tasklet's rule to a thread. Throws std::bad_alloc
  /// (nothing changed).
  void hand_over(RuleRequest& from, RuleRequest& to);

  /// Withdraws a waiting request; false when it was granted meanwhile (its granted() runs or ran).
  bool withdraw(RuleRequest& request);

  /// Withdraws the waiting requests for exactly `rule` (the same object) that `matches` accepts,
  /// calls their canceled() outside the lock, and returns how many. `matches` runs under the lock.
  template <class Predicate>
  std::size_t withdraw_waiting(const SchedulingRule& rule, Predicate&& matches);

  /// Withdraws every waiting request that `matches` accepts, calls their canceled() outside the
  /// lock, and returns how many. `matches` runs under the lock. O(live requests).
  template <class Predicate>
  std::size_t withdraw_waiting_if(Predicate&& matches);

  /// Whether some waiting request conflicts with `held` (a held request).
  bool has_conflicting_waiter(const RuleRequest& held);
  /// Whether some waiting request that `matches` accepts conflicts with the held request that
  /// `mine` accepts. Both run under the lock. O(live requests).
  template <class Mine, class Predicate>
  bool has_conflicting_waiter_if(Mine&& mine, Predicate&& matches);

  /// Whether submitted requests wait to be entered, or a lock holder is entering those it took
  /// (a parked request must not be taken back past them: they came first).
  bool has_submitted() const noexcept {
    return deferred_.load(std::memory_order_acquire) != nullptr ||
           entering_deferred_.load(std::memory_order_acquire) ||
           std::any_of(shards_.begin(), shards_.end(),
                       [](const RuleShard& shard) { return shard.has_submitted(); });
  }

  /// Whom `waiting` waits for: the active held requests that conflict with it, then the earlier
  /// waiting ones it queues behind, in ticket order; for a request held here that waits in the
  /// backend, whom it waits for there. Empty once it is granted (or out of the table). O(live requests),
  /// under the lock (custom rules are asked, as when they are granted).
  std::vector<RuleBlocker> blockers(const RuleRequest& waiting);
  /// The same for the waiting request whose owner() is `owner` (a job's run); empty when none waits.
  std::vector<RuleBlocker> blockers_of(const void* owner);

  /// One live request as snapshot() saw it.
  struct Seen {
    RuleBlocker who;                    // its owner and rule (`holds`: whether it is held)
    const void* owner = nullptr;        // RuleRequest::owner()
    bool shared = false;                // asks for shared access only (no exclusive mode anywhere)
    std::vector<RuleEntry> entries;     // its (node, mode) pairs, to compare by address only
    bool custom = false;                // has custom parts: asked pairwise
    std::optional<Trace::Nanos> since;  // when it entered, if a recorder saw it
  };
  /// The held requests, then the first `max_waiters` waiting ones in ticket order (`left_out`: how
  /// many more wait), copied under the lock; idle parked requests are left out. O(live requests).
  std::vector<Seen> snapshot(std::size_t max_waiters, std::size_t& left_out);
  /// Whether two requests seen by snapshot() conflict. Outside the lock: custom rules are asked
  /// through the rules the snapshot keeps alive.
  static bool conflict(const Seen& a, const Seen& b) noexcept;

  /// A chain of waits from a waiting request that `start` accepts to a held request in `mine`:
  /// the start request conflicts with the next, which is held or asked earlier, and so on. Empty
  /// when there is none among the first `limit` waiting requests it follows. Both sides described
  /// (RuleBlocker::holds says which are held). `start` runs under the lock. O(limit * live).
  std::vector<RuleBlocker> wait_chain(const std::function<bool(const RuleRequest&)>& start,
                                      std::span<const RuleRequest* const> mine, std::size_t limit);

  /// Cancels every waiting request (their closed() is called). For the owner's shutdown.
  void cancel_all_waiting();

  /// True when no rule is held and no request waits. Thread-safe.
  bool is_idle();
  /// Held and waiting request counts. Thread-safe.
  std::size_t held_count();
  std::size_t waiting_count();

  /// Tells the owners of `grants`, and of the requests refused for lack of memory meanwhile.
  void notify(const Grants& grants) noexcept;

  /// Shares the rules `backend` shares beyond this process (see rule_backend.hpp): their requests
  /// are told of a grant only once the backend granted them too, and never park. Set before the
  /// first request enters; the table keeps it for its life.
  void set_backend(std::shared_ptr<RuleBackend> backend) noexcept {
    backend_ = backend.get();
    backend_owner_ = std::move(backend);
  }
  RuleBackend* backend() const noexcept { return backend_; }
  /// For the backend: takes a request it could not grant out of the table (its owner is then told
  /// with canceled(), by the backend). Nothing when it is not held here.
  void abandon(RuleRequest& request);

  /// The recorder told of every entry, grant and exit from now on (null: none). The caller keeps
  /// it alive as long as the table.
  void set_trace(Trace* trace) noexcept { trace_.store(trace, std::memory_order_release); }
  /// Since when a live request is in the table, if it entered while a recorder was set.
  std::optional<Trace::Nanos> since(const RuleRequest& request) const;

  /// How many shards a table has, and the shard a request over several is in.
  static constexpr std::size_t shard_count = 16;
  static constexpr std::uint16_t cross_shard = 0x7fff;
  static constexpr std::uint16_t part_bit = 0x8000;
  static constexpr ShardSet all_shards = (ShardSet{1} << shard_count) - 1;
  /// The shards a rule's requests enter: one for a mutex, a named mutex or a path below the root,
  /// every one for the root or a custom part, the union of its children's for a multi rule.
  static ShardSet shards_of(const SchedulingRule& rule) noexcept;

 private:
  friend class RuleShard;
  friend class RulePart;
  static_assert(shard_count < 64 && shard_count < cross_shard);

  // The locks of a set of shards, taken in index order for one operation. Requests submitted to a
  // shard meanwhile are entered first, in the order they came, so that the operation comes after
  // them; after a lock is let go, those that came while it was held are entered by this thread,
  // unless another holds the lock again (which then does the same). Their grants join `grants`,
  // which the caller notifies afterwards.
  class Locked {
   public:
    Locked(RuleTable& table, ShardSet shards, Grants& grants);
    ~Locked();
    Locked(const Locked&) = delete;
    Locked& operator=(const Locked&) = delete;
    // Parked requests revoked and owned by the table: deleted once the locks are let go.
    Orphans& orphans() noexcept { return orphans_; }
    // Requests over several shards that left: their parts are deleted once the locks are let go.
    boost::container::small_vector<CrossPtr, 1>& gone() noexcept { return gone_; }

   private:
    RuleTable& table_;
    ShardSet shards_;
    Grants& grants_;
    Orphans orphans_;
    boost::container::small_vector<CrossPtr, 1> gone_;
  };
  template <class F>
  static void each_shard(ShardSet shards, F&& fn) {
    for (ShardSet left = shards; left != 0; left &= left - 1)
      fn(static_cast<std::size_t>(std::countr_zero(left)));
  }
  static ShardSet atom_shards(const SchedulingRule& atom, const RuleKey& key) noexcept;
  static bool single(ShardSet shards) noexcept { return (shards & (shards - 1)) == 0; }
  static std::uint16_t first_shard(ShardSet shards) noexcept {
    return shards == 0 ? 0 : static_cast<std::uint16_t>(std::countr_zero(shards));
  }
  static bool is_part(const RuleRequest& request) noexcept { return (request.shard_ & part_bit) != 0; }
  static std::size_t part_shard(const RuleRequest& part) noexcept { return part.shard_ & (part_bit - 1u); }
  static bool is_cross(const RuleRequest& request) noexcept { return request.shard_ == cross_shard; }
  static CrossRequest& cross_of(const RuleRequest& whole) noexcept {
    return *reinterpret_cast<CrossRequest*>(whole.place_.next_submitted);
  }
  // The request a request in a shard is or is part of.
  static const RuleRequest& whole_of(const RuleRequest& request) noexcept {
    return is_part(request) ? *static_cast<const RulePart&>(request).cross().whole : request;
  }
  static RuleRequest& whole_of(RuleRequest& request) noexcept {
    return is_part(request) ? *static_cast<RulePart&>(request).cross().whole : request;
  }
  // Whether a request in a shard is the one place its whole request is seen from when every shard
  // is read (a part: the part in its first shard).
  static bool seen_here(const RuleRequest& request) noexcept {
    return !is_part(request) || &static_cast<const RulePart&>(request).cross().first() == &request;
  }
  // The shards a request in the table is in (under their locks, or its owner's own).
  static ShardSet shards_held(const RuleRequest& request) noexcept {
    return is_cross(request) ? cross_of(request).shards : ShardSet{1} << request.shard_;
  }
  // A part's grant, under its shard's lock: the whole request, when this was its last part.
  RuleRequest* part_granted(RulePart& part) noexcept;
  void enter_across(RuleRequest& request, ShardSet shards) noexcept;
  // Puts the requests of `run` that `where` (their shards, in order) puts in shard `index` on its
  // stack, in their order.
  using Shards = boost::container::small_vector<std::uint16_t, 16>;
  void submit_to(std::size_t index, std::span<RuleRequest* const> run, const Shards& where) noexcept;
  // enter_all's requests from its first one over several shards on, which it leaves to drain() in
  // a block of their own (entering those takes locks): pushed here, and entered in their order.
  struct Deferred;
  void defer(std::span<RuleRequest* const> requests) noexcept;
  void enter_deferred() noexcept;
  bool deferring() const noexcept {
    return deferred_.load(std::memory_order_acquire) != nullptr ||
           entering_deferred_.load(std::memory_order_acquire);
  }
  // enter() once nothing deferred is in its way.
  void enter_now(RuleRequest& request);
  bool put_in_across(RuleRequest& request, CrossPtr& cross, Grants& grants, Orphans& orphans);
  // Takes a request out of every shard it is in, under their locks.
  void take_out(RuleRequest& request, Locked& lock, Grants& grants);
  void push_refused(RuleRequest& request) noexcept;
  // Reads the table under every shard's lock, after entering what was submitted.
  template <class Read>
  auto read_settled(Read&& read) {
    Grants grants;
    const auto value = [&] {
      Locked lock(*this, all_shards, grants);
      return read();
    }();
    notify(grants);
    return value;
  }
  template <class Each>
  void each_live(Each&& each) const {
    for (const RuleShard& shard : shards_) {
      for (RuleRequest* request : shard.live_) each(shard, *request);
    }
  }
  // Whether the backend shares the request's rule; whether it is held here and waits in the backend.
  bool shared_out(const RuleRequest& request) const noexcept {
    return backend_ != nullptr && !is_part(request) && backend_->shares(*request.rule_);
  }
  bool waits_outside(const RuleRequest& request) const noexcept {
    return request.held_ && backend_ != nullptr && !is_part(request) && backend_->pending(request);
  }
  // Whether a withdrawal may take the request out: waiting here, or held here and waiting in the
  // backend, which then gives it up.
  bool waiting_anywhere(const RuleRequest& request) const noexcept {
    return !request.held_ || waits_outside(request);
  }
  // Tells a request of its grant: at once, or through the backend when it shares the rule.
  void deliver(RuleRequest& request) noexcept {
    if (shared_out(request)) {
      backend_->acquire(*this, request);
    } else {
      request.granted();
    }
  }
  template <class Which>
  std::vector<RuleBlocker> blockers_if(Which&& which);
  static std::vector<RuleBlocker> described(const RuleShard::InTheWay& found);
  // Who is in the way of a waiting request, in every shard it is in.
  void add_blockers(const RuleRequest& mine, RuleShard::InTheWay& found) const;
  [[gnu::cold, gnu::noinline]] static void trace_left(Trace& trace, const RuleRequest& request,
                                                      bool held) noexcept;
  [[gnu::cold, gnu::noinline]] void trace_entered(Trace& trace, const RuleRequest& request,
                                                  bool granted) noexcept;
  // What both trace_entered record; add_blockers(RuleShard::InTheWay&) finds who is in the way of
  // a request that waits.
  template <class AddBlockers>
  static void trace_entry(Trace& trace, const RuleRequest& request, bool granted,
                          AddBlockers&& add_blockers) noexcept;
  // `to` takes the place of `from`, a holder, in the table (hand_over): its ticket, its place among
  // the live requests, its shard and what it holds besides its entries.
  static void take_place(const RuleRequest& from, RuleRequest& to) noexcept;
  // Withdraws the waiting requests that collect(std::vector<RuleRequest*>&) lists under the locks of
  // `shards`.
  template <class Collect>
  std::size_t withdraw_collected(ShardSet shards, Collect&& collect);
  // wait_chain()'s search: each step a request and the step it was reached from (itself for a start).
  struct ChainStep {
    const RuleRequest* request;
    std::size_t from;
  };
  std::vector<RuleBlocker> step_chain(std::vector<ChainStep>& steps, std::size_t at,
                                      std::span<const RuleRequest* const> mine, std::size_t limit) const;
  // Whether `other` (in a shard) is in the way of `mine` (in the same shard), both as seen there.
  static bool in_the_way(const RuleRequest& mine, const RuleRequest& other) noexcept;

  std::array<RuleShard, shard_count> shards_;
  // Read by every operation of every shard, written rarely.
  // Requests refused for lack of memory (put_in_or_refuse), linked like the submitted ones, until
  // the next notify() tells their owners.
  std::atomic<std::uintptr_t> refused_{0};
  std::atomic<Trace*> trace_{nullptr};  // read under the locks, beside what entering writes
  RuleBackend* backend_ = nullptr;      // set before the first request (set_backend)
  std::shared_ptr<RuleBackend> backend_owner_;
  // Written by enter_all, drain() and requests over several shards: on lines of their own, so that
  // the synchronous thread's batches do not take the line above away from the workers.
  // A bit per shard on whose stack enter_all left requests, and deferred_bit: enter() drains them
  // first (they came before), as it drained the one stack of a table without shards.
  static constexpr ShardSet deferred_bit = ShardSet{1} << 63;
  alignas(64) std::atomic<ShardSet> undrained_{0};
  // Blocks of deferred requests, newest first; a drain() entering them holds deferred_mutex_.
  std::atomic<Deferred*> deferred_{nullptr};
  std::atomic<bool> entering_deferred_{false};  // set before the stack looks empty
  oneapi::tbb::mutex deferred_mutex_;
  // Requests over several shards in the table, and of those the granted ones (changed under
  // their shards' locks, read under every shard's lock).
  std::atomic<std::size_t> crosses_live_{0};
  std::atomic<std::size_t> crosses_held_{0};
};

template <class Collect>
std::size_t RuleTable::withdraw_collected(ShardSet shards, Collect&& collect) {
  std::vector<RuleRequest*> withdrawn;
  Grants grants;
  {
    Locked lock(*this, shards, grants);
    collect(withdrawn);
    // In the order they came: the owners hear of it in that order, and withdrawing one may let a
    // later one through first.
    std::sort(withdrawn.begin(), withdrawn.end(),
              [](const RuleRequest* a, const RuleRequest* b) { return a->ticket_ < b->ticket_; });
    auto kept = withdrawn.begin();
    for (RuleRequest* request : withdrawn) {
      // Let through by an earlier withdrawal (it runs after all), unless the backend still has it.
      if (request->held_ && !(backend_ != nullptr && backend_->leave(*request, true))) continue;
      take_out(*request, lock, grants);
      *kept++ = request;
    }
    withdrawn.erase(kept, withdrawn.end());
  }
  notify(grants);
  for (RuleRequest* request : withdrawn) request->canceled();
  return withdrawn.size();
}

template <class Mine, class Predicate>
bool RuleTable::has_conflicting_waiter_if(Mine&& mine, Predicate&& matches) {
  return read_settled([&] {
    // The held request, as seen in each shard it is in.
    for (const RuleShard& shard : shards_) {
      const auto held =
          std::find_if(shard.live_.begin(), shard.live_.end(), [&mine](const RuleRequest* request) {
            const RuleRequest& whole = whole_of(*request);
            return whole.held_ && mine(whole);
          });
      if (held == shard.live_.end()) continue;
      const bool found = std::any_of(shard.live_.begin(), shard.live_.end(), [&](const RuleRequest* waiter) {
        const RuleRequest& whole = whole_of(*waiter);
        return !whole.held_ &&
               (RuleShard::conflicting(**held, *waiter) || RuleShard::conflicts_pairwise(**held, *waiter)) &&
               matches(whole);
      });
      if (found) return true;
    }
    return false;
  });
}

template <class Predicate>
std::size_t RuleTable::withdraw_waiting(const SchedulingRule& rule, Predicate&& matches) {
  const ShardSet shards = shards_of(rule);
  return withdraw_collected(shards, [&](std::vector<RuleRequest*>& withdrawn) {
    const auto consider = [&](RuleRequest& in_shard) {
      if (!seen_here(in_shard)) return;
      RuleRequest& request = whole_of(in_shard);
      if (request.rule_ == &rule && waiting_anywhere(request) &&
          matches(static_cast<const RuleRequest&>(request))) {
        withdrawn.push_back(&request);
      }
    };
    each_shard(shards, [&](std::size_t index) { shards_[index].each_waiting_for(rule, consider); });
  });
}

template <class Predicate>
std::size_t RuleTable::withdraw_waiting_if(Predicate&& matches) {
  return withdraw_collected(all_shards, [&](std::vector<RuleRequest*>& withdrawn) {
    each_live([&](const RuleShard&, RuleRequest& in_shard) {
      if (!seen_here(in_shard)) return;
      RuleRequest& request = whole_of(in_shard);
      if (waiting_anywhere(request) && matches(static_cast<const RuleRequest&>(request)))
        withdrawn.push_back(&request);
    });
  });
}

template <class Consider>
void RuleShard::each_waiting_for(const SchedulingRule& rule, Consider&& consider) const {
  auto identity = identities_.end();
  if (rule.key().kind == RuleKey::Kind::identity) identity = identities_.find(&rule);
  if (identity == identities_.end()) {
    for (RuleRequest* request : live_) consider(*request);
    return;
  }
  // A request for exactly this rule has one entry, queued there unless it is clear, and a clear
  // one waits only when a custom rule holds it back.
  const RuleNode& node = *identity->second;
  for (unsigned left = node.queued; left != 0; left &= left - 1)
    node.waiting(static_cast<std::size_t>(std::countr_zero(left))).for_each(consider);
  for (const Blocked& blocked : blocked_) {
    if (blocked.request->place_.in_table.unclear == 0) consider(*blocked.request);
  }
}

// Inline: on the paths of both entering and leaving, which live in files of their own.

inline void RuleShard::place_live(RuleRequest& request, std::size_t at) noexcept {
  live_[at] = &request;
  request.place_.in_table.live_index = static_cast<std::uint32_t>(at);
}

inline void RuleShard::erase_live(RuleRequest& request) noexcept {
  const std::size_t hole = request.place_.in_table.live_index;
  if (hole < rootless_from_) {
    // The last of the first part fills the hole, and the last request its place.
    const std::size_t last_rooted = --rootless_from_;
    place_live(*live_[last_rooted], hole);
    if (live_.size() - 1 != last_rooted) place_live(*live_.back(), last_rooted);
  } else {
    place_live(*live_.back(), hole);
  }
  live_.pop_back();
}

// Whether an entry of `mode` with `ticket` (not yet granted, not yet counted as clear) is clear at
// `node`. Node-local: a clear waiting entry of an incompatible mode is always older than an entry
// that is not clear yet (see the top of this file), and so is older than every newcomer.
inline bool RuleShard::clear_at(const RuleNode& node, LockMode mode, std::uint64_t ticket) noexcept {
  const std::uint8_t incompatible = incompatible_mask[index_of(mode)];
  if ((node.occupied() & incompatible) == 0) return true;  // nothing in the way
  if ((node.counted & incompatible) != 0) return false;    // granted or clear and older
  // Only queues of incompatible modes are left: in the way when their front came earlier.
  for (unsigned left = node.queued & incompatible; left != 0; left &= left - 1) {
    if (node.waiting(static_cast<std::size_t>(std::countr_zero(left))).front_ticket() < ticket) return false;
  }
  return true;
}

// Inline, as begin_rule's fast path takes them through enter() and leave().
inline bool RuleShard::park(RuleRequest& request) noexcept {
  Park state = Park::active;
  return request.park_.compare_exchange_strong(state, Park::parked, std::memory_order_acq_rel);
}

inline bool RuleShard::resume(RuleRequest& request) noexcept {
  Park state = Park::parked;
  if (request.park_.compare_exchange_strong(state, Park::active, std::memory_order_acq_rel)) return true;
  // A newcomer may be taking it out under the table's lock (revoke_parked notifies when it is out).
  request.park_.wait(Park::revoking, std::memory_order_acquire);
  return false;
}

}  // namespace tasklet::detail
