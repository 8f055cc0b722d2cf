#include "rule_table.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <new>
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

// Per mode, the bit mask of the modes it is incompatible with.
constexpr std::uint8_t incompatible_modes(int mode) noexcept {
  std::uint8_t mask = 0;
  for (int other = 0; other < lock_mode_count; ++other) {
    if (!compatible[mode][other]) mask = static_cast<std::uint8_t>(mask | (1u << other));
  }
  return mask;
}
constexpr std::uint8_t incompatible_mask[lock_mode_count] = {incompatible_modes(0), incompatible_modes(1),
                                                             incompatible_modes(2), incompatible_modes(3),
                                                             incompatible_modes(4)};

// The weakest mode that is at least as strong as both (for one request's entries on one node).
constexpr LockMode supremum(LockMode a, LockMode b) noexcept {
  if (a == b) return a;
  if (a == LockMode::x || b == LockMode::x) return LockMode::x;
  if (a == LockMode::six || b == LockMode::six) return LockMode::six;
  if (a == LockMode::is) return b;
  if (b == LockMode::is) return a;
  return LockMode::six;  // ix with s
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

std::size_t entry_count_hint(const SchedulingRule& rule) noexcept {
  const RuleKey key = rule.key();
  switch (key.kind) {
    case RuleKey::Kind::identity:
      return 1;
    case RuleKey::Kind::path:
      return key.segments.size() + 1;
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

namespace {
std::atomic<std::uint64_t> table_ids{0};
}  // namespace

RuleTable::RuleTable() : id_(table_ids.fetch_add(1, std::memory_order_relaxed) + 1) {}

RuleTable::~RuleTable() {
  cancel_all_waiting();
  std::lock_guard lock(mutex_);
  // Parked requests go back to their owners (who acquire them anew elsewhere) or, orphaned, are
  // deleted. An active one belongs to a holder that outlived the table (its owner's error).
  for (RuleRequest* request : parked_) {
    Park state = request->park_.load(std::memory_order_acquire);
    while (state == Park::parked &&
           !request->park_.compare_exchange_weak(state, Park::revoking, std::memory_order_acq_rel)) {
    }
    if (state == Park::parked) {
      request->in_table_ = false;
      request->held_ = false;
      request->parkable_ = false;
      request->park_.store(Park::revoked, std::memory_order_release);
      request->park_.notify_all();
    } else if (state == Park::orphaned) {
      delete request;
    }
  }
  parked_.clear();
  // Held requests belong to their holders, who must have released them; forget what is left.
  live_.clear();
  rootless_from_ = 0;
  customs_.clear();
  blocked_.clear();
}

void RuleTable::place_live(RuleRequest& request, std::size_t at) noexcept {
  live_[at] = &request;
  request.place_.in_table.live_index = static_cast<std::uint32_t>(at);
}

void RuleTable::insert_live(RuleRequest& request, bool rootless) {
  live_.push_back(&request);
  request.place_.in_table.live_index = static_cast<std::uint32_t>(live_.size() - 1);
  if (rootless) return;
  if (request.place_.in_table.live_index != rootless_from_) {
    place_live(*live_[rootless_from_], live_.size() - 1);
    place_live(request, rootless_from_);
  }
  ++rootless_from_;
}

void RuleTable::erase_live(RuleRequest& request) noexcept {
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

// Requests with custom parts are few, and each of them costs pairwise checks anyway: a search
// keeps their index out of every request.
void RuleTable::remove_custom(RuleRequest& request) noexcept {
  *std::find(customs_.begin(), customs_.end(), &request) = customs_.back();
  customs_.pop_back();
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

// The note this table keeps on `rule`, or null when another table made the rule's note or this is
// the rule object's first request: a rule made for one job (rules::path(file) per job) is looked up
// once, and a note would only cost an allocation. The second request makes it, with room for
// `room` nodes.
RuleNote* RuleTable::note_on(const SchedulingRule& rule, std::size_t room) {
  using Slot = SchedulingRule::TableSlot;
  void* held = Slot::slot(rule, std::memory_order_acquire);
  if (held == nullptr) {
    if (Slot::replace(rule, held, Slot::seen_once())) return nullptr;
  }
  if (held == Slot::seen_once()) {
    void* block = ::operator new(sizeof(RuleNote) + room * sizeof(RuleNode*));
    auto* made = ::new (block) RuleNote{id_, 0, 0, static_cast<std::uint32_t>(room)};
    if (Slot::replace(rule, held, made)) return made;
    ::operator delete(block);  // another table was first: `held` is its note
  }
  auto* note = static_cast<RuleNote*>(held);
  return note->table == id_ ? note : nullptr;
}

// A rule's node is in its note while no node was freed since it was noted (nodes move only when
// freed, and freeing one advances node_generation_).
RuleNode& RuleTable::identity_node(const SchedulingRule& rule) {
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
void RuleTable::add_entry(RuleRequest& request, RuleNode& node, LockMode mode, bool merge) {
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

// `with_root`: whether a path atom takes its intent entry at the root (see root intents, in the
// header); its own entry there, for a rule on the root, it always takes.
void RuleTable::add_atom(RuleRequest& request, const SchedulingRule& atom, const RuleKey& key, bool merge,
                         bool with_root) {
  switch (key.kind) {
    case RuleKey::Kind::identity:
      add_entry(request, identity_node(atom), LockMode::x, merge);
      return;
    case RuleKey::Kind::path: {
      const std::size_t count = key.segments.size() + 1;
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
        RuleEntry* entry = request.entries_ + request.entry_count_;
        for (std::size_t i = first; i < count; ++i, ++entry) {
          *entry = RuleEntry{};
          entry->set_node(*note->nodes()[i]);
          entry->set_mode(i + 1 == count ? target : intent);
        }
        request.entry_count_ += static_cast<std::uint32_t>(count - first);
        return;
      }
      RuleNode* node = &root_;
      std::size_t depth = 0;
      for (const std::string& segment : key.segments) {
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
      return;
    }
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
    // A parkable request's rule may die once its owner parks it, so it is asked about only while
    // wanted (its owner then releases it for real, under this lock, before letting the rule go).
    // Skipping the others is sound: a request with custom parts marks every parkable one wanted
    // when it enters, and one that enters later was checked against it then (rules answer the
    // same every time).
    if (other.parkable_ && other.park_.load(std::memory_order_acquire) != Park::wanted) return false;
    return conflicts_pairwise(request, other);
  };
  for (const RuleRequest* other : request.has_custom_ ? live_ : customs_) {
    if (blocks(*other)) return true;
  }
  return false;
}

// Whether some request holds or waits for S, SIX or X at the root (and so can conflict there).
bool RuleTable::root_claimed() const noexcept {
  constexpr auto claims = static_cast<std::uint8_t>(
      1u << index_of(LockMode::s) | 1u << index_of(LockMode::six) | 1u << index_of(LockMode::x));
  return (root_.occupied() & claims) != 0;
}

// Whether a rule's key claims the root: a rule on "/" itself, or a multi rule with one.
static bool claims_root(const RuleKey& key) noexcept {
  switch (key.kind) {
    case RuleKey::Kind::path:
      return key.segments.empty();
    case RuleKey::Kind::multi:
      return std::any_of(key.children.begin(), key.children.end(),
                         [](const Rule& child) { return child && claims_root(child->key()); });
    default:
      return false;
  }
}

// Appends the root intent that a request's entries imply: IX when it takes IX, SIX or X on a
// child of the root, else IS. The caller has reserved room for it, or may let it throw.
void RuleTable::add_root_intent(RuleRequest& request) {
  LockMode intent = LockMode::is;
  for (const RuleEntry& entry : request.entries()) {
    const LockMode mode = entry.mode();
    if (entry.node()->parent == &root_ && mode != LockMode::is && mode != LockMode::s) intent = LockMode::ix;
  }
  RuleEntry& entry = request.push_entry();
  entry.set_node(root_);
  entry.set_mode(intent);
}

// For a newcomer that claims the root: the rootless live requests take their intents there, as if
// they had taken them when they entered. The root holds only intents now (nobody claimed it), so
// each is clear at once: counted as granted for a holder, as clear for a waiting request.
void RuleTable::give_root_intents() noexcept {
  for (std::size_t at = rootless_from_; at < live_.size(); ++at) {
    RuleRequest& request = *live_[at];
    assert(request.entry_count_ < request.entry_capacity());  // reserved when it entered
    add_root_intent(request);
    RuleEntry& entry = request.entries_[request.entry_count_ - 1];
    entry.set_clear(true);
    const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
    root_.count(mode);
    if (!request.held_) ++root_.clear_waiting[mode];
  }
  rootless_from_ = live_.size();
}

// Whether an entry of `mode` with `ticket` (not yet granted, not yet counted as clear) is clear at
// `node`. Node-local: a clear waiting entry of an incompatible mode is always older than an entry
// that is not clear yet (see the header), and so is older than every newcomer.
bool RuleTable::clear_at(const RuleNode& node, LockMode mode, std::uint64_t ticket) noexcept {
  const std::uint8_t incompatible = incompatible_mask[index_of(mode)];
  if ((node.occupied() & incompatible) == 0) return true;  // nothing in the way
  if ((node.counted & incompatible) != 0) return false;    // granted or clear and older
  // Only queues of incompatible modes are left: in the way when their front came earlier.
  for (unsigned left = node.queued & incompatible; left != 0; left &= left - 1) {
    if (node.waiting(static_cast<std::size_t>(std::countr_zero(left))).front_ticket() < ticket) return false;
  }
  return true;
}

void RuleTable::enqueue(RuleRequest& request, std::size_t index) noexcept {
  RuleEntry& entry = request.entries_[index];
  const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
  entry.node()->make_queue(mode);
  entry.node()->waiting(mode).push_back(request, request.ticket_, index);
  entry.node()->refresh_queued(mode);
}

void RuleTable::dequeue(const RuleEntry& entry, std::uint64_t ticket) noexcept {
  const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
  entry.node()->waiting(mode).erase(ticket);
  entry.node()->refresh_queued(mode);
}

// Decides where each entry of a request that is entering stands (clear or not); returns how many
// are not clear.
std::uint32_t RuleTable::mark_clear(RuleRequest& request) noexcept {
  std::uint32_t unclear = 0;
  for (RuleEntry& entry : request.entries()) {
    entry.set_clear(clear_at(*entry.node(), entry.mode(), request.ticket_));
    if (!entry.clear()) ++unclear;
  }
  return unclear;
}

// enter() under the lock; revoking parked requests may let others through (`grants`) and leave
// orphans to delete (outside the lock).
bool RuleTable::put_in(RuleRequest& request, Grants& grants, Orphans& orphans) {
  assert(request.rule_ != nullptr && !request.in_table_);
  {
    request.place_.in_table = {0, 0};  // its link in submitted_ was read: the union changes member
    request.ticket_ = ++next_ticket_;
    request.held_ = false;
    request.clear_entries();
    request.has_custom_ = false;
    const RuleKey key = request.rule_->key();
    add_atom(request, *request.rule_, key, false, root_claimed() || claims_root(key));
    // Where the request stands at the root: it claims it, takes an intent there, or is rootless.
    bool at_root = false, claims = false, on_path = false;
    for (const RuleEntry& entry : request.entries()) {
      if (entry.node() == &root_) {
        at_root = true;
        claims = entry.mode() != LockMode::is && entry.mode() != LockMode::ix;
      } else {
        on_path = on_path || entry.node()->identity == nullptr;
      }
    }
    const bool rootless = on_path && !at_root;
    if (rootless) request.reserve_entries(request.entry_count_ + std::size_t{1});  // for give_root_intents
    const bool parkable = request.parkable();
    // Room for all that entering adds, taken before anything of the table changes: out of memory
    // (here or above) the request is refused with the table as it was, but for empty nodes. Its
    // queues' room waits for mark_clear() when nothing changes before (most nodes never queue).
    make_room(request, claims || request.has_custom_, grants, orphans, parkable);
    if (claims) give_root_intents();

    // A parked request's rule may be gone (its owner's frame kept it alive), so a custom rule cannot
    // be asked about it: a request with custom parts takes every parked request out first.
    if (request.has_custom_ && !parked_.empty()) revoke_parked(request, grants, orphans);
    bool custom_blocked = (request.has_custom_ || !customs_.empty()) && blocked_by_custom(request);
    std::uint32_t unclear = mark_clear(request);
    if (unclear != 0 && !claims && !request.has_custom_) {
      for (const RuleEntry& entry : request.entries()) {
        if (entry.clear()) continue;
        const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
        entry.node()->make_queue(mode);
        entry.node()->waiting(mode).make_room();
      }
    }
    // Whoever would wait for a parked request takes it out of the table first.
    if ((unclear != 0 || custom_blocked) && !request.has_custom_ && !parked_.empty() &&
        revoke_parked(request, grants, orphans)) {
      custom_blocked = (request.has_custom_ || !customs_.empty()) && blocked_by_custom(request);
      unclear = mark_clear(request);
    }
    request.in_table_ = true;
    insert_live(request, rootless);
    if (request.has_custom_) customs_.push_back(&request);
    request.parkable_ = parkable && !request.has_custom_;
    request.park_.store(request.parkable_ ? Park::active : Park::none, std::memory_order_relaxed);
    if (request.parkable_) {
      drop_orphans(grants, orphans);
      parked_.push_back(&request);
    }

    if (unclear == 0 && !custom_blocked) {
      for (RuleEntry& entry : request.entries()) {
        const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
        entry.node()->count(mode);
      }
      request.held_ = true;
      ++held_;
      return true;
    } else {
      request.place_.in_table.unclear = unclear;
      request.custom_blocked_ = custom_blocked;
      for (std::size_t index = 0; index < request.entry_count_; ++index) {
        RuleEntry& entry = request.entries_[index];
        if (entry.clear()) {
          const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
          entry.node()->count(mode);
          ++entry.node()->clear_waiting[mode];
        } else {
          enqueue(request, index);
        }
      }
      if (custom_blocked) blocked_.push_back(&request);
    }
  }
  return false;
}

// Room in the table's lists for `request`, in the lists of requests to tell or delete for what
// revoking the parked ones lets go, and (`every_entry`) in the queues of every node it has an entry on.
void RuleTable::make_room(RuleRequest& request, bool every_entry, Grants& grants, Orphans& orphans,
                          bool parkable) {
  room_for(live_, 1);
  if (request.has_custom_) room_for(customs_, 1);
  if (request.has_custom_ || !customs_.empty()) room_for(blocked_, 1);
  if (parkable) room_for(parked_, 1);
  room_for(grants, 1 + parked_.size());
  room_for(orphans, parked_.size());
  if (!every_entry) return;
  for (const RuleEntry& entry : request.entries()) {
    const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
    entry.node()->make_queue(mode);
    entry.node()->waiting(mode).make_room();
  }
}

// ---------------------------------------------------------------------------------------------
// Parking

// Whether two requests without custom parts conflict: incompatible modes on a shared node.
bool RuleTable::conflicting(const RuleRequest& a, const RuleRequest& b) noexcept {
  for (const RuleEntry& mine : a.entries()) {
    for (const RuleEntry& theirs : b.entries()) {
      if (mine.node() == theirs.node() && !compatible[index_of(mine.mode())][index_of(theirs.mode())])
        return true;
    }
  }
  return false;
}

// Takes the parked requests that conflict with `request` (entering, not counted yet) out of the
// table, and marks the active ones that conflict with it wanted; every one of them when `request`
// has custom parts. True when some were taken out. O(parked requests), and only for a newcomer
// that would wait otherwise (or has custom parts).
bool RuleTable::revoke_parked(const RuleRequest& request, Grants& grants, Orphans& orphans) {
  bool revoked = false;
  for (std::size_t at = 0; at < parked_.size();) {
    RuleRequest& other = *parked_[at];
    if (!request.has_custom_ && !conflicting(other, request)) {
      ++at;
      continue;
    }
    Park state = other.park_.load(std::memory_order_acquire);
    for (;;) {
      const Park next = state == Park::active ? Park::wanted : Park::revoking;
      if (state != Park::active && state != Park::parked && state != Park::orphaned) break;
      if (other.park_.compare_exchange_weak(state, next, std::memory_order_acq_rel)) break;
    }
    if (state != Park::parked && state != Park::orphaned) {
      ++at;  // active (now wanted) or wanted: its owner releases it when done
      continue;
    }
    // Nobody waits for a parked request, so take_out() lets nobody through, but it may as well say.
    take_out(other, grants);  // takes it out of parked_: `at` now holds the next one
    if (state == Park::orphaned) {
      orphans.push_back(&other);
    } else {
      other.park_.store(Park::revoked, std::memory_order_release);
      other.park_.notify_all();  // its owner may wait in resume() or discard(), and keeps it alive
    }
    revoked = true;
  }
  return revoked;
}

// Under the lock, before another request is parked: the orphans go (so that a thread that holds
// one rule after another leaves at most one request parked at a time).
void RuleTable::drop_orphans(Grants& grants, Orphans& orphans) noexcept {
  for (std::size_t at = 0; at < parked_.size();) {
    RuleRequest& other = *parked_[at];
    Park state = Park::orphaned;
    if (!other.park_.compare_exchange_strong(state, Park::revoking, std::memory_order_acq_rel)) {
      ++at;
      continue;
    }
    take_out(other, grants);  // takes it out of parked_: `at` now holds the next one
    orphans.push_back(&other);
  }
}

// Parked requests (and orphans) count as neither held nor waiting.
std::size_t RuleTable::parked_idle() const noexcept {
  std::size_t idle = 0;
  for (const RuleRequest* request : parked_) {
    const Park state = request->park_.load(std::memory_order_acquire);
    if (request->held_ && (state == Park::parked || state == Park::orphaned)) ++idle;
  }
  return idle;
}

// ---------------------------------------------------------------------------------------------
// Granting

void RuleTable::grant(RuleRequest& request, Grants& grants) {
  for (RuleEntry& entry : request.entries()) {
    const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
    RuleNode& node = *entry.node();
    assert(entry.clear() && node.clear_waiting[mode] != 0);
    --node.clear_waiting[mode];  // still counted: held now
  }
  request.held_ = true;
  ++held_;
  try {
    grants.push_back(&request);
  } catch (...) {
    // Out of memory for the list (a release can let any number through): told at once, under
    // the lock, rather than never. A grant only queues its owner's next step (no user code), and
    // whatever that enters in the table meanwhile waits for the lock holder.
    request.granted();
  }
}

// Takes the entries that have become clear off the fronts of the queues at `node`, granting the
// requests that are now clear everywhere. Amortised O(1) per entry: an entry is dequeued once.
void RuleTable::walk(RuleNode& node, Grants& grants) {
  for (unsigned left = node.queued; left != 0; left &= left - 1) {
    const auto mode = static_cast<std::size_t>(std::countr_zero(left));
    WaitQueue& queue = node.waiting(mode);
    while (!queue.empty() && clear_at(node, static_cast<LockMode>(mode), queue.front_ticket())) {
      RuleRequest& request = queue.front_request();
      RuleEntry& entry = request.entry_at(queue.front_hint(), node);
      // Those behind are likely let through too: start fetching their requests (cold, at large
      // queue lengths, and holding their entries) a few places ahead.
      if (const RuleRequest* next = queue.peek(4)) __builtin_prefetch(next);
      queue.pop_front();
      entry.set_clear(true);
      node.count(mode);
      ++node.clear_waiting[mode];
      node.refresh_queued(mode);
      if (--request.place_.in_table.unclear == 0 && !request.custom_blocked_) grant(request, grants);
    }
  }
}

void RuleTable::recheck_custom_blocked(Grants& grants) {
  auto kept = blocked_.begin();
  for (RuleRequest* request : blocked_) {
    if (blocked_by_custom(*request)) {
      *kept++ = request;
      continue;
    }
    request->custom_blocked_ = false;
    if (request->place_.in_table.unclear == 0) grant(*request, grants);
  }
  blocked_.erase(kept, blocked_.end());
}

// ---------------------------------------------------------------------------------------------
// Leaving

// Unused nodes are kept while there are few of them, so that taking and releasing the same rules
// over and over allocates nothing; past the limits, a node is freed when its last user leaves. A
// kept identity node may outlive its rule: it is unused, so a new rule at the same address simply
// takes it over.
void RuleTable::prune(RuleNode& node) {
  if (node.identity != nullptr) {
    if (identities_.size() <= kept_identity_nodes || !node.is_unused()) return;
    identities_.erase(node.identity);
  } else {
    if (path_nodes_ <= kept_path_nodes || &node == &root_ || !node.is_unused()) return;
    RuleNode& parent = *node.parent;
    parent.children.erase(parent.children.find(std::string_view(node.segment)));
    --path_nodes_;
  }
  ++node_generation_;
}

void RuleTable::unlink_waiting(RuleRequest& request) noexcept {
  for (RuleEntry& entry : request.entries()) {
    if (entry.clear()) {
      const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
      entry.node()->uncount(mode);
      --entry.node()->clear_waiting[mode];
    } else {
      dequeue(entry, request.ticket_);
    }
  }
  if (request.custom_blocked_) std::erase(blocked_, &request);
}

void RuleTable::take_out(RuleRequest& request, Grants& grants) {
  if (request.held_) {
    for (RuleEntry& entry : request.entries()) {
      const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
      entry.node()->uncount(mode);
    }
    --held_;
  } else {
    unlink_waiting(request);
  }
  erase_live(request);
  if (request.has_custom_) remove_custom(request);
  if (request.parkable_) {
    *std::find(parked_.begin(), parked_.end(), &request) = parked_.back();
    parked_.pop_back();
    request.parkable_ = false;
    // A revocation sets its own state afterwards; an owner's release leaves the request unparked.
    Park state = request.park_.load(std::memory_order_relaxed);
    if (state == Park::active || state == Park::wanted)
      request.park_.store(Park::none, std::memory_order_relaxed);
  }
  request.in_table_ = false;
  request.held_ = false;
  request.custom_blocked_ = false;

  for (RuleEntry& entry : request.entries()) walk(*entry.node(), grants);
  if (!blocked_.empty()) recheck_custom_blocked(grants);
  // Children come after their parents in the entries (a root intent added late comes last, but the
  // root is never freed), so pruning backwards frees leaves first.
  if (path_nodes_ > kept_path_nodes || identities_.size() > kept_identity_nodes) {
    for (auto entry = request.entries().rbegin(); entry != request.entries().rend(); ++entry)
      prune(*entry->node());
  }
}

bool RuleTable::withdraw(RuleRequest& request) {
  Grants grants;
  bool withdrawn = false;
  {
    Locked lock(*this, grants);
    if (request.in_table_ && !request.held_) {
      take_out(request, grants);
      withdrawn = true;
    }
  }
  notify(grants);
  return withdrawn;
}

void RuleTable::cancel_all_waiting() {
  std::vector<RuleRequest*> cancelled;
  Grants grants;  // submitted requests granted at once
  {
    Locked lock(*this, grants);
    for (RuleRequest* request : live_) {
      if (!request->held_) cancelled.push_back(request);
    }
    // In the order they came, so that their owners hear of it in that order.
    std::sort(cancelled.begin(), cancelled.end(),
              [](const RuleRequest* a, const RuleRequest* b) { return a->ticket_ < b->ticket_; });
    // Every waiter goes, so nobody is left to be let through: unlink without walking.
    for (RuleRequest* request : cancelled) {
      unlink_waiting(*request);
      erase_live(*request);
      if (request->has_custom_) remove_custom(*request);
      if (request->parkable_) {
        std::erase(parked_, request);
        request->parkable_ = false;
        request->park_.store(Park::none, std::memory_order_relaxed);
      }
      request->in_table_ = false;
      request->custom_blocked_ = false;
      for (auto entry = request->entries().rbegin(); entry != request->entries().rend(); ++entry) {
        prune(*entry->node());
      }
      request->clear_entries();
    }
  }
  notify(grants);
  for (RuleRequest* request : cancelled) request->cancelled();
}

bool RuleTable::has_conflicting_waiter(const RuleRequest& held) {
  return read_settled([&] { return has_conflicting_waiter_locked(held); });
}

bool RuleTable::has_conflicting_waiter_locked(const RuleRequest& held) const noexcept {
  for (const RuleEntry& entry : held.entries()) {
    const RuleNode& node = *entry.node();
    for (std::size_t mode = 0; mode < lock_mode_count; ++mode) {
      if (!compatible[index_of(entry.mode())][mode] &&
          ((node.queued & (1u << mode)) != 0 || node.clear_waiting[mode] != 0)) {
        return true;
      }
    }
  }
  // Pairwise only where a custom rule is involved: every waiter when `held` has one, else the
  // requests with custom parts.
  for (const RuleRequest* waiter : held.has_custom_ ? live_ : customs_) {
    if (!waiter->held_ && conflicts_pairwise(held, *waiter)) return true;
  }
  return false;
}

bool RuleTable::is_idle() {
  return read_settled([this] { return live_.size() == parked_idle(); });
}

std::size_t RuleTable::held_count() {
  return read_settled([this] { return held_ - parked_idle(); });
}

std::size_t RuleTable::waiting_count() {
  return read_settled([this] { return live_.size() - held_; });
}

}  // namespace tasklet::detail
