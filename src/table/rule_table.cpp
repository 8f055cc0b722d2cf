// The rule table's decisions on the way in: where an entering request stands at each of its
// nodes, the pairwise checks of custom rules, root intents, and revoking parked requests. Which
// nodes a request takes is in rule_table_index.cpp; taking one out and granting those it lets
// through, in rule_table_release.cpp; the doors, in rule_table_doors.cpp.
#include "table/rule_table.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <cstdio>
#include <exception>
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

// Whether a custom part of `custom` says it conflicts with a part of `other`.
bool custom_parts_conflict(const SchedulingRule& custom, const SchedulingRule& other) noexcept {
  return any_atom(custom, [&](const SchedulingRule& mine) {
    if (mine.key().kind != RuleKey::Kind::custom) return false;
    return any_atom(other, [&](const SchedulingRule& theirs) { return custom_answer(mine, theirs); });
  });
}

// A rule's text for the trace recorder, made under the table's lock, where no user code runs: a
// built-in rule's own to_string(), and for a rule with custom parts a name of the library's.
std::string traced_text(const SchedulingRule* rule) {
  if (rule == nullptr) return "null";
  if (any_atom(*rule, [](const SchedulingRule& atom) { return atom.key().kind == RuleKey::Kind::custom; })) {
    char text[48];
    std::snprintf(text, sizeof text, "custom rule@%p", static_cast<const void*>(rule));
    return text;
  }
  return rule->to_string();
}

// RuleBlocker::to_string() with traced_text().
std::string traced_text(const RuleBlocker& blocker) {
  return blocker.owner + (blocker.holds ? " holds " : " waits for ") + traced_text(blocker.rule.get()) +
         (blocker.holds ? "" : " (asked earlier)");
}

}  // namespace

namespace {
std::atomic<std::uint64_t> table_ids{0};
}  // namespace

RuleTable::RuleTable() : id_(table_ids.fetch_add(1, std::memory_order_relaxed) + 1) {}

RuleTable::~RuleTable() {
  cancel_all_waiting();
  // The backend goes first: what it tells requests from now on would find the table half gone.
  backend_ = nullptr;
  backend_owner_.reset();
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

// Requests with custom parts are few, and each of them costs pairwise checks anyway: a search
// keeps their index out of every request.
void RuleTable::remove_custom(RuleRequest& request) noexcept {
  *std::find(customs_.begin(), customs_.end(), &request) = customs_.back();
  customs_.pop_back();
}

// ---------------------------------------------------------------------------------------------
// Entering a request

// Whether a custom atom of `custom` says it conflicts with some atom of `other`. The custom rule is
// always the one asked: built-in rules know nothing of it. A throwing check counts as a conflict:
// waiting is safe, running together might not be.
bool RuleTable::customs_say_conflict(const RuleRequest& custom, const RuleRequest& other) noexcept {
  return custom_parts_conflict(*custom.rule_, *other.rule_);
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
    RuleEntry& entry = request.entry_data()[request.entry_count_ - 1];
    entry.set_clear(true);
    const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
    root_.count(mode);
    if (!request.held_) ++root_.clear_waiting[mode];
  }
  rootless_from_ = live_.size();
}

void RuleTable::enqueue(RuleRequest& request, std::size_t index) noexcept {
  RuleEntry& entry = request.entry_data()[index];
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
  const bool parkable = request.parkable() && !shared_out(request);
  // Room for all that entering adds, taken before anything of the table changes: out of memory
  // (here or above) the request is refused with the table as it was, but for empty nodes. Its
  // queues' room waits for mark_clear() when nothing changes before (most nodes never queue).
  make_room(request, stand.claims || request.has_custom_, grants, orphans, parkable);
  if (stand.claims) give_root_intents();

  // A parked request's rule may be gone (its owner's frame kept it alive), so a custom rule cannot
  // be asked about it: a request with custom parts takes every parked request out first.
  if (request.has_custom_ && !parked_.empty()) revoke_parked(request, grants, orphans);
  bool custom_blocked = (request.has_custom_ || !customs_.empty()) && blocked_by_custom(request);
  std::uint32_t unclear = mark_clear(request);
  if (unclear != 0 && !stand.claims && !request.has_custom_) make_queue_room(request);
  // Whoever would wait for a parked request takes it out of the table first.
  if ((unclear != 0 || custom_blocked) && !request.has_custom_ && !parked_.empty() &&
      revoke_parked(request, grants, orphans)) {
    custom_blocked = (request.has_custom_ || !customs_.empty()) && blocked_by_custom(request);
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
  const bool held = unclear == 0 && !custom_blocked;
  if (held) {
    hold_entered(request);
  } else {
    queue_entered(request, unclear, custom_blocked);
  }
  if (Trace* trace = trace_.load(std::memory_order_relaxed)) [[unlikely]]
    trace_entered(*trace, request, held);
  return held;
}

// Where a request stands at the root: it claims it, takes an intent there, or is rootless.
RuleTable::RootStand RuleTable::stand_at_root(const RuleRequest& request) const noexcept {
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
void RuleTable::make_queue_room(const RuleRequest& request) {
  for (const RuleEntry& entry : request.entries()) {
    if (entry.clear()) continue;
    const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
    entry.node()->make_queue(mode);
    entry.node()->waiting(mode).make_room();
  }
}

void RuleTable::hold_entered(RuleRequest& request) noexcept {
  for (RuleEntry& entry : request.entries()) {
    const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
    entry.node()->count(mode);
  }
  request.held_ = true;
  ++held_;
}

// A request that waits: counted where it is clear (and waiting there), queued where it is not.
void RuleTable::queue_entered(RuleRequest& request, std::uint32_t unclear, bool custom_blocked) {
  request.place_.in_table.unclear = unclear;
  request.custom_blocked_ = custom_blocked;
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
  if (custom_blocked) blocked_.push_back(&request);
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
// Reading the table

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

std::vector<RuleBlocker> RuleTable::blockers(const RuleRequest& waiting) {
  return blockers_if([&waiting](const RuleRequest& request) { return &request == &waiting; });
}

std::vector<RuleBlocker> RuleTable::blockers_of(const void* owner) {
  return blockers_if([owner](const RuleRequest& request) { return request.owner() == owner; });
}

template <class Which>
std::vector<RuleBlocker> RuleTable::blockers_if(Which&& which) {
  std::vector<RuleBlocker> found;
  Grants grants;
  std::exception_ptr failed;  // out of memory: the grants the lock delivered go out all the same
  try {
    Locked lock(*this, grants);
    const auto waiting = std::find_if(live_.begin(), live_.end(), [&](const RuleRequest* request) {
      return waiting_anywhere(*request) && which(*request);
    });
    if (waiting != live_.end()) {
      if ((*waiting)->held_) {
        found = backend_->blockers(**waiting);  // held here, waiting in the backend
      } else {
        add_blockers(**waiting, found);
      }
    }
  } catch (...) {
    failed = std::current_exception();
  }
  notify(grants);
  if (failed) std::rethrow_exception(failed);
  return found;
}

void RuleTable::add_blockers(const RuleRequest& mine, std::vector<RuleBlocker>& found) const {
  std::vector<const RuleRequest*> earlier;
  for (const RuleRequest* other : live_) {
    // A parked request is idle (a newcomer revokes it), and its rule may be gone.
    const Park park = other->park_.load(std::memory_order_acquire);
    if (other == &mine || (park != Park::none && park != Park::active && park != Park::wanted)) continue;
    if (!other->held_ && other->ticket_ > mine.ticket_) continue;
    if (!conflicting(mine, *other) && !conflicts_pairwise(mine, *other)) continue;
    if (other->held_) {
      found.push_back(other->describe());
      found.back().holds = true;
    } else {
      earlier.push_back(other);
    }
  }
  std::sort(earlier.begin(), earlier.end(),
            [](const RuleRequest* a, const RuleRequest* b) { return a->ticket_ < b->ticket_; });
  for (const RuleRequest* other : earlier) {
    found.push_back(other->describe());
    found.back().holds = false;
  }
}

void RuleTable::trace_entered(Trace& trace, const RuleRequest& request, bool granted) noexcept {
  // Naming the blockers walks every live request: done while there are few, so that a backlog
  // does not make each entry cost O(backlog). The grant names what let the request through.
  constexpr std::size_t named_up_to = 64;
  try {
    const RuleBlocker who = request.describe();
    std::string blockers;
    if (!granted && live_.size() <= named_up_to) {
      std::vector<RuleBlocker> found;
      add_blockers(request, found);
      for (const RuleBlocker& blocker : found)
        blockers += (blockers.empty() ? "" : "; ") + traced_text(blocker);
    }
    const bool thread = request.blocks_thread();
    trace.entered(&request, thread, !granted, {who.owner, request.job_name()}, traced_text(who.rule.get()),
                  std::move(blockers));
    if (granted) trace.granted(&request, thread, {});
  } catch (...) {
    // Out of memory: the trace misses this request.
  }
}

void RuleTable::trace_granted(Trace& trace, const RuleRequest& request) const noexcept {
  try {
    std::string by;
    if (releasing_ != nullptr) {
      const RuleBlocker releaser = releasing_->describe();
      by = releaser.owner + " releasing " + traced_text(releaser.rule.get());
    }
    trace.granted(&request, request.blocks_thread(), std::move(by));
  } catch (...) {
    // Out of memory: the trace misses this grant.
  }
}

void RuleTable::trace_left(Trace& trace, const RuleRequest& request, bool held) noexcept {
  try {
    trace.left(&request, held);
  } catch (...) {
    // Out of memory: the trace misses the end of this request.
  }
}

std::optional<Trace::Nanos> RuleTable::since(const RuleRequest& request) const {
  Trace* trace = trace_.load(std::memory_order_acquire);
  return trace != nullptr ? trace->since(&request) : std::nullopt;
}

std::vector<RuleBlocker> RuleTable::wait_chain(const std::function<bool(const RuleRequest&)>& start,
                                               std::span<const RuleRequest* const> mine, std::size_t limit) {
  std::vector<RuleBlocker> chain;
  Grants grants;
  std::exception_ptr failed;  // out of memory: the grants the lock delivered go out all the same
  try {
    Locked lock(*this, grants);
    std::vector<ChainStep> steps;
    for (const RuleRequest* request : live_) {
      if (!request->held_ && !idle_parked(*request) && steps.size() < limit && start(*request)) {
        steps.push_back({request, steps.size()});
      }
    }
    for (std::size_t at = 0; at < steps.size() && chain.empty(); ++at) {
      chain = step_chain(steps, at, mine, limit);
    }
  } catch (...) {
    failed = std::current_exception();
  }
  notify(grants);
  if (failed) std::rethrow_exception(failed);
  return chain;
}

bool RuleTable::idle_parked(const RuleRequest& request) noexcept {
  const Park park = request.park_.load(std::memory_order_acquire);
  return park != Park::none && park != Park::active && park != Park::wanted;
}

// One step of wait_chain(), under the lock: what the request of steps[at] waits for. A holder in
// `mine` ends the search (the chain from the start to it, then the caller's request); a waiter not
// seen yet becomes a step.
std::vector<RuleBlocker> RuleTable::step_chain(std::vector<ChainStep>& steps, std::size_t at,
                                               std::span<const RuleRequest* const> mine,
                                               std::size_t limit) const {
  const RuleRequest& waiting = *steps[at].request;
  const auto seen = [&steps](const RuleRequest* request) {
    return std::any_of(steps.begin(), steps.end(),
                       [request](const ChainStep& step) { return step.request == request; });
  };
  for (const RuleRequest* other : live_) {
    if (other == &waiting || idle_parked(*other) || (!other->held_ && other->ticket_ > waiting.ticket_))
      continue;
    if (!conflicting(waiting, *other) && !conflicts_pairwise(waiting, *other)) continue;
    if (!other->held_) {
      if (steps.size() < limit && !seen(other)) steps.push_back({other, at});
      continue;
    }
    if (std::find(mine.begin(), mine.end(), other) == mine.end()) continue;
    std::vector<const RuleRequest*> path{other};
    for (std::size_t step = at;; step = steps[step].from) {
      path.push_back(steps[step].request);
      if (steps[step].from == step) break;
    }
    std::vector<RuleBlocker> chain;
    for (auto request = path.rbegin(); request != path.rend(); ++request) {
      chain.push_back((*request)->describe());
      chain.back().holds = (*request)->held_;
    }
    return chain;
  }
  return {};
}

std::vector<RuleTable::Seen> RuleTable::snapshot(std::size_t max_waiters, std::size_t& left_out) {
  std::vector<Seen> seen;
  std::vector<std::pair<std::uint64_t, const RuleRequest*>> waiting;
  Grants grants;
  std::exception_ptr failed;  // out of memory: the grants the lock delivered go out all the same
  try {
    Locked lock(*this, grants);
    Trace* trace = trace_.load(std::memory_order_relaxed);
    const auto see = [&seen, trace](const RuleRequest& request) {
      Seen one;
      if (trace != nullptr) one.since = trace->since(&request);
      one.who = request.describe();
      one.who.holds = request.held_;
      one.owner = request.owner();
      one.entries.assign(request.entries().begin(), request.entries().end());
      one.custom = request.has_custom_;
      one.shared =
          !request.has_custom_ && std::all_of(one.entries.begin(), one.entries.end(), [](const RuleEntry& e) {
            return e.mode() == LockMode::is || e.mode() == LockMode::s;
          });
      seen.push_back(std::move(one));
    };
    for (const RuleRequest* request : live_) {
      const Park park = request->park_.load(std::memory_order_acquire);
      if (park != Park::none && park != Park::active && park != Park::wanted) continue;  // idle, parked
      if (request->held_) {
        see(*request);
      } else {
        waiting.emplace_back(request->ticket_, request);
      }
    }
    std::sort(waiting.begin(), waiting.end());
    left_out = waiting.size() > max_waiters ? waiting.size() - max_waiters : 0;
    waiting.resize(waiting.size() - left_out);
    for (const auto& [ticket, request] : waiting) see(*request);
  } catch (...) {
    failed = std::current_exception();
  }
  notify(grants);
  if (failed) std::rethrow_exception(failed);
  return seen;
}

bool RuleTable::conflict(const Seen& a, const Seen& b) noexcept {
  for (const RuleEntry& mine : a.entries) {
    for (const RuleEntry& theirs : b.entries) {
      if (mine.node() == theirs.node() && !compatible[index_of(mine.mode())][index_of(theirs.mode())])
        return true;
    }
  }
  if (!a.custom && !b.custom) return false;
  const auto says = [](const Seen& custom, const Seen& other) {
    return custom.custom && custom.who.rule && other.who.rule &&
           custom_parts_conflict(*custom.who.rule, *other.who.rule);
  };
  return says(a, b) || says(b, a);
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
