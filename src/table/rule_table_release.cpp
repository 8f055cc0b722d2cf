// Taking a request out of the rule table (a release, a withdrawal, a revocation or the owner's
// cancellation) and granting the waiting requests that this lets through.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "table/rule_table.hpp"

namespace tasklet::detail {

// ---------------------------------------------------------------------------------------------
// Granting

void RuleShard::grant(RuleRequest& request, Grants& grants) {
  for (RuleEntry& entry : request.entries()) {
    const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
    RuleNode& node = *entry.node();
    assert(entry.clear() && node.clear_waiting[mode] != 0);
    --node.clear_waiting[mode];  // still counted: held now
  }
  request.held_ = true;
  ++held_;
  RuleRequest* told = &request;
  if (RuleTable::is_part(request)) {
    ++held_parts_;
    told = table_->part_granted(static_cast<RulePart&>(request));  // null while other parts wait
    if (told == nullptr) return;
  }
  if (Trace* trace = table_->trace_.load(std::memory_order_relaxed)) [[unlikely]]
    trace_granted(*trace, *told);
  try {
    grants.push_back(told);
  } catch (...) {
    // Out of memory for the list (a release can let any number through): told at once, under
    // the lock, rather than never. A grant only queues its owner's next step (no user code), and
    // whatever that enters in the table meanwhile waits for the lock holder.
    table_->deliver(*told);
  }
}

// Takes the entries that have become clear off the fronts of the queues at `node`, granting the
// requests that are now clear everywhere. Amortised O(1) per entry: an entry is dequeued once.
void RuleShard::walk(RuleNode& node, Grants& grants) {
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

// Those that `leaving` held back: each waits for another, or no longer (in ticket order).
void RuleShard::recheck_custom_blocked(const RuleRequest& leaving, Grants& grants) {
  auto kept = blocked_.begin();
  for (Blocked& blocked : blocked_) {
    if (blocked.by == &leaving) blocked.by = custom_blocker(*blocked.request);
    if (blocked.by != nullptr) {
      *kept++ = blocked;
      continue;
    }
    blocked.request->custom_blocked_ = false;
    if (blocked.request->place_.in_table.unclear == 0) grant(*blocked.request, grants);
  }
  blocked_.erase(kept, blocked_.end());
}

// ---------------------------------------------------------------------------------------------
// Leaving

void RuleShard::unlink_waiting(RuleRequest& request) noexcept {
  for (RuleEntry& entry : request.entries()) {
    if (entry.clear()) {
      const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
      entry.node()->uncount(mode);
      --entry.node()->clear_waiting[mode];
    } else {
      dequeue(entry, request.ticket_);
    }
  }
  if (request.custom_blocked_)
    std::erase_if(blocked_, [&request](const Blocked& blocked) { return blocked.request == &request; });
}

void RuleShard::take_out(RuleRequest& request, Grants& grants) {
  const bool was_held = request.held_;
  const bool part = RuleTable::is_part(request);
  Trace* const trace = part ? nullptr : table_->trace_.load(std::memory_order_relaxed);
  if (trace != nullptr) [[unlikely]]
    releasing_ = &request;
  if (request.held_) {
    for (RuleEntry& entry : request.entries()) {
      const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
      entry.node()->uncount(mode);
    }
    --held_;
    if (part) --held_parts_;
  } else {
    unlink_waiting(request);
  }
  if (part) --parts_;
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
  if (!blocked_.empty()) recheck_custom_blocked(request, grants);
  // Children come after their parents in the entries (a root intent added late comes last, but the
  // root is never freed), so pruning backwards frees leaves first.
  if (path_nodes_ > kept_path_nodes || identities_.size() > kept_identity_nodes) {
    for (auto entry = request.entries().rbegin(); entry != request.entries().rend(); ++entry)
      prune(*entry->node());
  }
  // After the grants it caused, whose flows start inside the holder's slice that ends here.
  if (trace != nullptr) [[unlikely]] {
    releasing_ = nullptr;
    RuleTable::trace_left(*trace, request, was_held);
  }
}

// Takes a request out without walking its nodes: nobody is left waiting to be let through.
void RuleShard::drop(RuleRequest& request) noexcept {
  if (request.held_) {
    for (RuleEntry& entry : request.entries()) {
      const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
      entry.node()->uncount(mode);
    }
    --held_;
    if (RuleTable::is_part(request)) --held_parts_;
  } else {
    unlink_waiting(request);
  }
  if (RuleTable::is_part(request)) --parts_;
  erase_live(request);
  if (request.has_custom_) remove_custom(request);
  if (request.parkable_) {
    std::erase(parked_, &request);
    request.parkable_ = false;
    request.park_.store(Park::none, std::memory_order_relaxed);
  }
  request.in_table_ = false;
  request.held_ = false;
  request.custom_blocked_ = false;
  for (auto entry = request.entries().rbegin(); entry != request.entries().rend(); ++entry)
    prune(*entry->node());
  request.clear_entries();
}

}  // namespace tasklet::detail
