// The rule table's decisions on the way in: where an entering request stands at each of its
// nodes, the pairwise checks of custom rules and root intents. Which nodes a request takes is in
// rule_table_index.cpp; parking, in rule_table_parking.cpp; taking one out and granting those it
// lets through, in rule_table_release.cpp; what the table tells of itself, in
// rule_table_reading.cpp; the doors, in rule_table_doors.cpp.
#include "table/rule_table.hpp"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <vector>

namespace tasklet::detail {
namespace {

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

// A custom rule's answer to whether it conflicts with `theirs`; one that throws conflicts.
bool custom_answer(const SchedulingRule& mine, const SchedulingRule& theirs) noexcept {
  try {
    return mine.is_conflicting(theirs);
  } catch (...) {
    return true;
  }
}

}  // namespace

bool custom_parts_conflict(const SchedulingRule& custom, const SchedulingRule& other) noexcept {
  return any_atom(custom, [&](const SchedulingRule& mine) {
    if (mine.key().kind != RuleKey::Kind::custom) return false;
    return any_atom(other, [&](const SchedulingRule& theirs) { return custom_answer(mine, theirs); });
  });
}

bool has_custom_part(const SchedulingRule& rule) noexcept {
  return any_atom(rule, [](const SchedulingRule& atom) { return atom.key().kind == RuleKey::Kind::custom; });
}

namespace {
std::atomic<std::uint64_t> shard_ids{0};
}  // namespace

void RuleShard::attach(RuleTable& table, std::uint16_t index) {
  table_ = &table;
  index_ = index;
  id_ = shard_ids.fetch_add(1, std::memory_order_relaxed) + 1;
}

RuleShard::~RuleShard() {
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

void RuleShard::insert_live(RuleRequest& request, bool rootless) {
  live_.push_back(&request);
  request.place_.in_table.live_index = static_cast<std::uint32_t>(live_.size() - 1);
  if (rootless) return;
  if (request.place_.in_table.live_index != rootless_from_) {
    place_live(*live_[rootless_from_], live_.size() - 1);
    place_live(request, rootless_from_);
  }
  ++rootless_from_;
}

// Requests with custom parts are few, and each of them costs pairwise checks anyway: a search
// keeps their index out of every request.
void RuleShard::remove_custom(RuleRequest& request) noexcept {
  *std::find(customs_.begin(), customs_.end(), &request) = customs_.back();
  customs_.pop_back();
}

// ---------------------------------------------------------------------------------------------
// Entering a request

// Whether a custom atom of `custom` says it conflicts with some atom of `other`. The custom rule is
// always the one asked: built-in rules know nothing of it. A throwing check counts as a conflict:
// waiting is safe, running together might not be.
bool RuleShard::customs_say_conflict(const RuleRequest& custom, const RuleRequest& other) noexcept {
  return custom_parts_conflict(*custom.rule_, *other.rule_);
}

bool RuleShard::conflicts_pairwise(const RuleRequest& a, const RuleRequest& b) noexcept {
  return (a.has_custom_ && customs_say_conflict(a, b)) || (b.has_custom_ && customs_say_conflict(b, a));
}

// Which request, if any, a pairwise check against a custom rule holds `request` back for: among
// every held request and every request that came earlier.
const RuleRequest* RuleShard::custom_blocker(const RuleRequest& request) const noexcept {
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
    if (blocks(*other)) return other;
  }
  return nullptr;
}

// Whether some request holds or waits for S, SIX or X at the root (and so can conflict there).
bool RuleShard::root_claimed() const noexcept {
  constexpr auto claims = static_cast<std::uint8_t>(
      1u << index_of(LockMode::s) | 1u << index_of(LockMode::six) | 1u << index_of(LockMode::x));
  return (root_.occupied() & claims) != 0;
}

// Whether a rule's key claims the root: a rule on "/" itself, or a multi rule with one.
static bool claims_root(const RuleKey& key) noexcept {
  switch (key.kind) {
    case RuleKey::Kind::path:
      return PathSegments(key.path).empty();
    case RuleKey::Kind::multi:
      return std::any_of(key.children.begin(), key.children.end(),
                         [](const Rule& child) { return child && claims_root(child->key()); });
    default:
      return false;
  }
}

// Appends the root intent that a request's entries imply: IX when it takes IX, SIX or X on a
// child of the root, else IS. The caller has reserved room for it, or may let it throw.
void RuleShard::add_root_intent(RuleRequest& request) {
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
void RuleShard::give_root_intents() noexcept {
  for (std::size_t at = rootless_from_; at < live_.size(); ++at) {
    RuleRequest& request = *live_[at];
    assert(request.entry_count_ < request.entry_capacity());  // reserved when it entered
    add_root_intent(request);
    RuleEntry& entry = request.entry_data()[request.entry_count_ - 1];
    entry.set_clear(true);
    const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
    root_.count(mode);
    if (!request.held_) ++root_.clear_waiting[mode];
  }
  rootless_from_ = live_.size();
}

void RuleShard::enqueue(RuleRequest& request, std::size_t index) noexcept {
  RuleEntry& entry = request.entry_data()[index];
  const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
  entry.node()->make_queue(mode);
  entry.node()->waiting(mode).push_back(request, request.ticket_, index);
  entry.node()->refresh_queued(mode);
}

void RuleShard::dequeue(const RuleEntry& entry, std::uint64_t ticket) noexcept {
  const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
  entry.node()->waiting(mode).erase(ticket);
  entry.node()->refresh_queued(mode);
}

// Decides where each entry of a request that is entering stands (clear or not); returns how many
// are not clear.
std::uint32_t RuleShard::mark_clear(RuleRequest& request) noexcept {
  std::uint32_t unclear = 0;
  for (RuleEntry& entry : request.entries()) {
    entry.set_clear(clear_at(*entry.node(), entry.mode(), request.ticket_));
    if (!entry.clear()) ++unclear;
  }
  return unclear;
}

// enter() under the lock; revoking parked requests may let others through (`grants`) and leave
// orphans to delete (outside the lock).
bool RuleShard::put_in(RuleRequest& request, Grants& grants, Orphans& orphans) {
  assert(request.rule_ != nullptr && !request.in_table_);
  request.place_.in_table = {0, 0};  // its link in submitted_ was read: the union changes member
  request.ticket_ = ++next_ticket_;
  request.held_ = false;
  request.clear_entries();
  request.has_custom_ = false;
  const RuleKey key = request.rule_->key();
  add_atom(request, *request.rule_, key, false, root_claimed() || claims_root(key));
  const RootStand stand = stand_at_root(request);
  if (stand.rootless)
    request.reserve_entries(request.entry_count_ + std::size_t{1});  // for give_root_intents
  // A parked request would keep the backend's hold while it looks free here.
  const bool parkable = request.parkable() && !table_->shared_out(request);
  // Room for all that entering adds, taken before anything of the table changes: out of memory
  // (here or above) the request is refused with the table as it was, but for empty nodes. Its
  // queues' room waits for mark_clear() when nothing changes before (most nodes never queue).
  make_room(request, stand.claims || request.has_custom_, grants, orphans, parkable);
  if (stand.claims) give_root_intents();

  // A parked request's rule may be gone (its owner's frame kept it alive), so a custom rule cannot
  // be asked about it: a request with custom parts takes every parked request out first.
  if (request.has_custom_ && !parked_.empty()) revoke_parked(request, grants, orphans);
  const auto blocker = [&]() -> const RuleRequest* {
    return request.has_custom_ || !customs_.empty() ? custom_blocker(request) : nullptr;
  };
  const RuleRequest* custom_blocked = blocker();
  std::uint32_t unclear = mark_clear(request);
  if (unclear != 0 && !stand.claims && !request.has_custom_) make_queue_room(request);
  // Whoever would wait for a parked request takes it out of the table first.
  if ((unclear != 0 || custom_blocked) && !request.has_custom_ && !parked_.empty() &&
      revoke_parked(request, grants, orphans)) {
    custom_blocked = blocker();
    unclear = mark_clear(request);
  }
  request.in_table_ = true;
  insert_live(request, stand.rootless);
  if (request.has_custom_) customs_.push_back(&request);
  request.parkable_ = parkable && !request.has_custom_;
  request.park_.store(request.parkable_ ? Park::active : Park::none, std::memory_order_relaxed);
  if (request.parkable_) {
    drop_orphans(grants, orphans);
    parked_.push_back(&request);
  }
  const bool held = unclear == 0 && custom_blocked == nullptr;
  if (held) {
    hold_entered(request);
  } else {
    queue_entered(request, unclear, custom_blocked);
  }
  if (RuleTable::is_part(request)) {
    ++parts_;
  } else if (Trace* trace = table_->trace_.load(std::memory_order_relaxed)) [[unlikely]] {
    trace_entered(*trace, request, held);
  }
  return held;
}

// Where a request stands at the root: it claims it, takes an intent there, or is rootless.
RuleShard::RootStand RuleShard::stand_at_root(const RuleRequest& request) const noexcept {
  bool at_root = false, claims = false, on_path = false;
  for (const RuleEntry& entry : request.entries()) {
    if (entry.node() == &root_) {
      at_root = true;
      claims = entry.mode() != LockMode::is && entry.mode() != LockMode::ix;
    } else {
      on_path = on_path || (entry.node()->identity == nullptr && entry.node()->parent != &names_);
    }
  }
  return {claims, on_path && !at_root};
}

// Room in the queues of the entries that are not clear, for a request that will wait there.
void RuleShard::make_queue_room(const RuleRequest& request) {
  for (const RuleEntry& entry : request.entries()) {
    if (entry.clear()) continue;
    const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
    entry.node()->make_queue(mode);
    entry.node()->waiting(mode).make_room();
  }
}

void RuleShard::hold_entered(RuleRequest& request) noexcept {
  for (RuleEntry& entry : request.entries()) {
    const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
    entry.node()->count(mode);
  }
  request.held_ = true;
  ++held_;
  if (RuleTable::is_part(request)) ++held_parts_;
}

// A request that waits: counted where it is clear (and waiting there), queued where it is not.
void RuleShard::queue_entered(RuleRequest& request, std::uint32_t unclear, const RuleRequest* blocker) {
  request.place_.in_table.unclear = unclear;
  request.custom_blocked_ = blocker != nullptr;
  for (std::size_t index = 0; index < request.entry_count_; ++index) {
    RuleEntry& entry = request.entry_data()[index];
    if (entry.clear()) {
      const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
      entry.node()->count(mode);
      ++entry.node()->clear_waiting[mode];
    } else {
      enqueue(request, index);
    }
  }
  if (blocker != nullptr) blocked_.push_back({&request, blocker});
}

// Room in the table's lists for `request`, in the lists of requests to tell or delete for what
// revoking the parked ones lets go, and (`every_entry`) in the queues of every node it has an entry on.
void RuleShard::make_room(RuleRequest& request, bool every_entry, Grants& grants, Orphans& orphans,
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

}  // namespace tasklet::detail
