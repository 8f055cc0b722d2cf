// What the rule table tells of itself: who blocks a request, wait chains, snapshots and counts
// (each taken under the lock, as one consistent reading), and the trace recorder's events for
// requests entered, granted and left.
#include "table/rule_table.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

namespace tasklet::detail {
namespace {

// A rule's text for the trace recorder, made under the table's lock, where no user code runs: a
// built-in rule's own to_string(), and for a rule with custom parts a name of the library's.
std::string traced_text(const SchedulingRule* rule) {
  if (rule == nullptr) return "null";
  if (has_custom_part(*rule)) {
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

bool RuleTable::has_conflicting_waiter(const RuleRequest& held) {
  Grants grants;
  bool found = false;
  {
    Locked lock(*this, shards_held(held), grants);
    if (is_cross(held)) {
      for (RulePart& part : cross_of(held).parts())
        found = found || shards_[part_shard(part)].has_conflicting_waiter_locked(part);
    } else {
      found = shards_[held.shard_].has_conflicting_waiter_locked(held);
    }
  }
  notify(grants);
  return found;
}

bool RuleShard::has_conflicting_waiter_locked(const RuleRequest& held) const noexcept {
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
    Locked lock(*this, all_shards, grants);
    const RuleRequest* waiting = nullptr;
    each_live([&](const RuleShard&, const RuleRequest& request) {
      const RuleRequest& whole = whole_of(request);
      if (waiting == nullptr && waiting_anywhere(whole) && which(whole)) waiting = &whole;
    });
    if (waiting != nullptr) {
      if (waiting->held_) {
        found = backend_->blockers(*waiting);  // held here, waiting in the backend
      } else {
        RuleShard::InTheWay in_the_way;
        add_blockers(*waiting, in_the_way);
        found = described(in_the_way);
      }
    }
  } catch (...) {
    failed = std::current_exception();
  }
  notify(grants);
  if (failed) std::rethrow_exception(failed);
  return found;
}

void RuleTable::add_blockers(const RuleRequest& mine, RuleShard::InTheWay& found) const {
  if (is_cross(mine)) {
    for (RulePart& part : cross_of(mine).parts()) shards_[part_shard(part)].add_blockers(part, found);
  } else {
    shards_[mine.shard_].add_blockers(mine, found);
  }
}

// Each request once: the holders in the order found, then the earlier waiting ones in ticket order.
std::vector<RuleBlocker> RuleTable::described(const RuleShard::InTheWay& found) {
  std::vector<RuleBlocker> described;
  std::vector<const RuleRequest*> seen;
  const auto add = [&](const RuleRequest* request, bool holds) {
    if (std::find(seen.begin(), seen.end(), request) != seen.end()) return;
    seen.push_back(request);
    described.push_back(request->describe());
    described.back().holds = holds;
  };
  for (const RuleRequest* request : found.held) add(request, true);
  std::vector<const RuleRequest*> earlier = found.earlier;
  std::stable_sort(earlier.begin(), earlier.end(),
                   [](const RuleRequest* a, const RuleRequest* b) { return a->ticket_ < b->ticket_; });
  for (const RuleRequest* request : earlier) add(request, false);
  return described;
}

// Whether `other` is in the way of `mine`, both seen in one shard: held, or waiting since earlier,
// and conflicting. A parked request is idle (a newcomer revokes it), and its rule may be gone.
bool RuleTable::in_the_way(const RuleRequest& mine, const RuleRequest& other) noexcept {
  if (&other == &mine || RuleShard::idle_parked(other)) return false;
  if (!other.held_ && other.ticket_ > mine.ticket_) return false;
  return RuleShard::conflicting(mine, other) || RuleShard::conflicts_pairwise(mine, other);
}

// Under this shard's lock. A part granted here holds only once its whole request holds (its last
// part granted, in whichever shard: the count says so without that shard's lock); before, its
// request waits, asked earlier.
void RuleShard::add_blockers(const RuleRequest& mine, InTheWay& found) const {
  for (const RuleRequest* other : live_) {
    if (!RuleTable::in_the_way(mine, *other)) continue;
    const bool holds =
        RuleTable::is_part(*other)
            ? static_cast<const RulePart&>(*other).cross().unclear_parts.load(std::memory_order_acquire) == 0
            : other->held_;
    (holds ? found.held : found.earlier).push_back(&RuleTable::whole_of(*other));
  }
}

template <class AddBlockers>
void RuleTable::trace_entry(Trace& trace, const RuleRequest& request, bool granted,
                            AddBlockers&& add_blockers) noexcept {
  try {
    const RuleBlocker who = request.describe();
    std::string blockers;
    if (!granted) {
      RuleShard::InTheWay found;
      add_blockers(found);
      for (const RuleBlocker& blocker : described(found))
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

void RuleShard::trace_entered(Trace& trace, const RuleRequest& request, bool granted) noexcept {
  // Naming the blockers walks every live request: done while there are few, so that a backlog
  // does not make each entry cost O(backlog). The grant names what let the request through.
  constexpr std::size_t named_up_to = 64;
  RuleTable::trace_entry(trace, request, granted, [&](InTheWay& found) {
    if (live_.size() <= named_up_to) add_blockers(request, found);
  });
}

// The same for a request over several shards, under their locks.
void RuleTable::trace_entered(Trace& trace, const RuleRequest& request, bool granted) noexcept {
  trace_entry(trace, request, granted, [&](RuleShard::InTheWay& found) { add_blockers(request, found); });
}

void RuleShard::trace_granted(Trace& trace, const RuleRequest& request) const noexcept {
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
    Locked lock(*this, all_shards, grants);
    std::vector<ChainStep> steps;
    each_live([&](const RuleShard&, const RuleRequest& request) {
      const RuleRequest& whole = whole_of(request);
      if (seen_here(request) && !whole.held_ && !RuleShard::idle_parked(whole) && steps.size() < limit &&
          start(whole)) {
        steps.push_back({&whole, steps.size()});
      }
    });
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

bool RuleShard::idle_parked(const RuleRequest& request) noexcept {
  const Park park = request.park_.load(std::memory_order_acquire);
  return park != Park::none && park != Park::active && park != Park::wanted;
}

// One step of wait_chain(), under every lock: what the request of steps[at] waits for, in each
// shard it is in. A holder in `mine` ends the search (the chain from the start to it, then the
// caller's request); a waiter not seen yet becomes a step.
std::vector<RuleBlocker> RuleTable::step_chain(std::vector<ChainStep>& steps, std::size_t at,
                                               std::span<const RuleRequest* const> mine,
                                               std::size_t limit) const {
  const RuleRequest& waiting = *steps[at].request;
  const auto seen = [&steps](const RuleRequest* request) {
    return std::any_of(steps.begin(), steps.end(),
                       [request](const ChainStep& step) { return step.request == request; });
  };
  const RuleRequest* reached = nullptr;  // a holder in `mine`
  const auto follow = [&](const RuleShard& shard, const RuleRequest& here) {
    for (const RuleRequest* other : shard.live_) {
      if (reached != nullptr) return;
      const RuleRequest& whole = whole_of(*other);
      if (&whole == &waiting || !in_the_way(here, *other)) continue;
      if (!whole.held_) {
        if (steps.size() < limit && !seen(&whole)) steps.push_back({&whole, at});
        continue;
      }
      if (std::find(mine.begin(), mine.end(), &whole) != mine.end()) reached = &whole;
    }
  };
  if (is_cross(waiting)) {
    for (RulePart& part : cross_of(waiting).parts()) follow(shards_[part_shard(part)], part);
  } else {
    follow(shards_[waiting.shard_], waiting);
  }
  if (reached == nullptr) return {};
  std::vector<const RuleRequest*> path{reached};
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

std::vector<RuleTable::Seen> RuleTable::snapshot(std::size_t max_waiters, std::size_t& left_out) {
  std::vector<Seen> seen;
  std::vector<std::pair<std::uint64_t, const RuleRequest*>> waiting;
  Grants grants;
  std::exception_ptr failed;  // out of memory: the grants the lock delivered go out all the same
  try {
    Locked lock(*this, all_shards, grants);
    Trace* trace = trace_.load(std::memory_order_relaxed);
    const auto see = [&seen, trace](const RuleRequest& request) {
      Seen one;
      if (trace != nullptr) one.since = trace->since(&request);
      one.who = request.describe();
      one.who.holds = request.held_;
      one.owner = request.owner();
      if (is_cross(request)) {
        for (RulePart& part : cross_of(request).parts())
          one.entries.insert(one.entries.end(), part.entries().begin(), part.entries().end());
      } else {
        one.entries.assign(request.entries().begin(), request.entries().end());
      }
      one.custom = request.has_custom_;
      one.shared =
          !request.has_custom_ && std::all_of(one.entries.begin(), one.entries.end(), [](const RuleEntry& e) {
            return e.mode() == LockMode::is || e.mode() == LockMode::s;
          });
      seen.push_back(std::move(one));
    };
    each_live([&](const RuleShard&, const RuleRequest& in_shard) {
      if (!seen_here(in_shard) || RuleShard::idle_parked(in_shard)) return;  // idle, parked
      const RuleRequest& request = whole_of(in_shard);
      if (request.held_) {
        see(request);
      } else {
        waiting.emplace_back(request.ticket_, &request);
      }
    });
    std::stable_sort(waiting.begin(), waiting.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
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
  return read_settled([this] {
    return std::all_of(shards_.begin(), shards_.end(),
                       [](const RuleShard& shard) { return shard.live_.size() == shard.parked_idle(); });
  });
}

std::size_t RuleTable::held_count() {
  return read_settled([this] {
    std::size_t held = crosses_held_.load(std::memory_order_relaxed);
    for (const RuleShard& shard : shards_) held += shard.own_held() - shard.parked_idle();
    return held;
  });
}

std::size_t RuleTable::waiting_count() {
  return read_settled([this] {
    std::size_t waiting =
        crosses_live_.load(std::memory_order_relaxed) - crosses_held_.load(std::memory_order_relaxed);
    for (const RuleShard& shard : shards_) waiting += shard.own_live() - shard.own_held();
    return waiting;
  });
}

}  // namespace tasklet::detail
