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

void RuleTable::grant(RuleRequest& request, Grants& grants) {
  for (RuleEntry& entry : request.entries()) {
    const auto mode = static_cast<std::size_t>(index_of(entry.mode()));
    RuleNode& node = *entry.node();
    assert(entry.clear() && node.clear_waiting[mode] != 0);
    --node.clear_waiting[mode];  // still counted: held now
  }
  request.held_ = true;
  ++held_;
  if (Trace* trace = trace_.load(std::memory_order_relaxed)) [[unlikely]]
    trace_granted(*trace, request);
  try {
    grants.push_back(&request);
  } catch (...) {
    // Out of memory for the list (a release can let any number through): told at once, under
    // the lock, rather than never. A grant only queues its owner's next step (no user code), and
    // whatever that enters in the table meanwhile waits for the lock holder.
    deliver(request);
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
  const bool was_held = request.held_;
  Trace* const trace = trace_.load(std::memory_order_relaxed);
  if (trace != nullptr) [[unlikely]]
    releasing_ = &request;
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
  // After the grants it caused, whose flows start inside the holder's slice that ends here.
  if (trace != nullptr) [[unlikely]] {
    releasing_ = nullptr;
    trace_left(*trace, request, was_held);
  }
}

bool RuleTable::withdraw(RuleRequest& request) {
  Grants grants;
  bool withdrawn = false;
  {
    Locked lock(*this, grants);
    if (request.in_table_ && (!request.held_ || (backend_ != nullptr && backend_->leave(request, true)))) {
      take_out(request, grants);
      withdrawn = true;
    }
  }
  notify(grants);
  return withdrawn;
}

void RuleTable::abandon(RuleRequest& request) {
  Grants grants;
  {
    Locked lock(*this, grants);
    if (request.in_table_ && request.held_) take_out(request, grants);
  }
  notify(grants);
}

void RuleTable::cancel_all_waiting() {
  std::vector<RuleRequest*> canceled;
  Grants grants;  // submitted requests granted at once
  {
    Locked lock(*this, grants);
    for (RuleRequest* request : live_) {
      if (!request->held_) canceled.push_back(request);
    }
    const std::size_t waiting_here = canceled.size();
    for (RuleRequest* request : live_) {
      if (waits_outside(*request)) canceled.push_back(request);
    }
    // In the order they came, so that their owners hear of it in that order.
    const auto by_ticket = [](const RuleRequest* a, const RuleRequest* b) { return a->ticket_ < b->ticket_; };
    std::sort(canceled.begin(), canceled.begin() + static_cast<std::ptrdiff_t>(waiting_here), by_ticket);
    // Every waiter goes, so nobody is left to be let through: unlink without walking.
    Trace* trace = trace_.load(std::memory_order_relaxed);
    for (std::size_t at = 0; at < waiting_here; ++at) {
      RuleRequest* request = canceled[at];
      if (trace != nullptr) trace_left(*trace, *request, false);
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
    // Then those held here and still waiting in the backend, withdrawn there: nobody waits here to
    // be let through any more.
    auto kept = canceled.begin() + static_cast<std::ptrdiff_t>(waiting_here);
    for (auto outside = kept; outside != canceled.end(); ++outside) {
      if (!backend_->leave(**outside, true)) continue;
      take_out(**outside, grants);
      *kept++ = *outside;
    }
    canceled.erase(kept, canceled.end());
  }
  notify(grants);
  for (RuleRequest* request : canceled) request->closed();
}

}  // namespace tasklet::detail
