// Parking: a request its owner leaves granted but idle in the table (leave()) until it takes it
// again (enter()) or gives it up (discard()), each with one compare-and-swap (park() and resume()
// are inline in rule_table.hpp); and the table's side, under the lock: revoking the parked requests
// that a newcomer would wait for, and dropping orphans.
#include <atomic>
#include <cstddef>

#include "table/rule_table.hpp"

namespace tasklet::detail {

// ---------------------------------------------------------------------------------------------
// The owner's side, lock-free

bool RuleTable::discard(RuleRequest& request) noexcept {
  Park state = Park::parked;
  if (request.park_.compare_exchange_strong(state, Park::orphaned, std::memory_order_acq_rel)) return true;
  request.park_.wait(Park::revoking, std::memory_order_acquire);
  request.park_.store(Park::none, std::memory_order_relaxed);
  return false;
}

// ---------------------------------------------------------------------------------------------
// The table's side, under the lock

// Whether two requests without custom parts conflict: incompatible modes on a shared node.
bool RuleShard::conflicting(const RuleRequest& a, const RuleRequest& b) noexcept {
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
bool RuleShard::revoke_parked(const RuleRequest& request, Grants& grants, Orphans& orphans) {
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
void RuleShard::drop_orphans(Grants& grants, Orphans& orphans) noexcept {
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
std::size_t RuleShard::parked_idle() const noexcept {
  std::size_t idle = 0;
  for (const RuleRequest* request : parked_) {
    const Park state = request->park_.load(std::memory_order_acquire);
    if (request->held_ && (state == Park::parked || state == Park::orphaned)) ++idle;
  }
  return idle;
}

}  // namespace tasklet::detail
