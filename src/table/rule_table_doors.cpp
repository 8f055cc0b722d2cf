// The rule table's doors: enter(), enter_all() and drain() on the way in, leave() and hand_over()
// on the way out. A request goes through the lock-free stack of submitted requests to whichever
// thread holds the table's lock. A parked request comes back or is given up with one
// compare-and-swap (rule_table_parking.cpp). What the table decides once a request is inside is in
// rule_table.cpp and rule_table_release.cpp.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <span>
#include <utility>

#include "table/rule_table.hpp"

namespace tasklet::detail {

// A run of requests entered together (enter_all), in one block with their rules: the thread
// that enters them starts fetching them before it enters the first, where a linked chain cost one
// cache miss per link, one after the other, under the lock. On the submitted stack it is tagged
// with the low bit; it links to the next older entry.
struct RuleShard::SubmittedRun {
  std::uintptr_t next;
  std::size_t count;
  static std::size_t bytes(std::size_t count) noexcept {
    // A block of pointers follows the header: their size is meant.
    // NOLINTNEXTLINE(bugprone-sizeof-expression)
    return sizeof(SubmittedRun) + count * (sizeof(RuleRequest*) + sizeof(const SchedulingRule*));
  }
  RuleRequest** requests() noexcept { return reinterpret_cast<RuleRequest**>(this + 1); }
  const SchedulingRule** rules() noexcept {
    return reinterpret_cast<const SchedulingRule**>(static_cast<void*>(requests() + count));
  }
};

std::uintptr_t& RuleShard::submitted_link(std::uintptr_t entry) noexcept {
  static_assert(alignof(RuleRequest) > run_tag && alignof(SubmittedRun) > run_tag, "the tag's bit is free");
  if ((entry & run_tag) != 0) return reinterpret_cast<SubmittedRun*>(entry & ~run_tag)->next;
  return reinterpret_cast<RuleRequest*>(entry)->place_.next_submitted;
}

void RuleTable::push_refused(RuleRequest& request) noexcept {
  std::uintptr_t head = refused_.load(std::memory_order_relaxed);
  do {
    request.place_.next_submitted = head;
  } while (!refused_.compare_exchange_weak(head, reinterpret_cast<std::uintptr_t>(&request),
                                           std::memory_order_release, std::memory_order_relaxed));
}

void RuleTable::notify(const Grants& grants) noexcept {
  for (RuleRequest* request : grants) deliver(*request);
  if (backend_ != nullptr) backend_->flush();  // a release goes out with the grants it let through
  if (refused_.load(std::memory_order_relaxed) == 0) return;
  // Oldest first; an owner may delete its request once told.
  std::uintptr_t newest = refused_.exchange(0, std::memory_order_acquire);
  RuleRequest* oldest = nullptr;
  while (newest != 0) {
    auto* request = reinterpret_cast<RuleRequest*>(newest);
    newest = std::exchange(request->place_.next_submitted, reinterpret_cast<std::uintptr_t>(oldest));
    oldest = request;
  }
  while (oldest != nullptr) {
    RuleRequest* request = oldest;
    oldest = reinterpret_cast<RuleRequest*>(request->place_.next_submitted);
    request->place_.next_submitted = 0;
    request->refused();
  }
}

// Puts `newest` on the submitted stack; `oldest_link`, the link of the oldest entry pushed with it,
// then names what was there.
void RuleShard::push_submitted(std::uintptr_t newest, std::uintptr_t& oldest_link) noexcept {
  std::uintptr_t head = submitted_.load(std::memory_order_relaxed);
  do {
    oldest_link = head;
  } while (
      !submitted_.compare_exchange_weak(head, newest, std::memory_order_release, std::memory_order_relaxed));
}

// A request is pushed on the submitted stack and entered by whoever takes the lock next: this
// thread, at once, unless another holds it. Every submission sees to the stack itself (drain): what
// is below it may have been pushed by enter_all, which leaves its requests to a drain() that can
// come much later.
void RuleShard::enter(RuleRequest& request) {
  const Park state = request.park_.load(std::memory_order_acquire);
  if (state == Park::parked || state == Park::revoking) {
    // Its owner's idle request, left here by leave(): taken back without the lock, unless a
    // newcomer revokes it (resume() then waits until it is out of the table) or requests submitted
    // before it wait to be entered (they came first: it goes through the lock, which revocations
    // hold while they take a request out).
    if (!has_submitted()) {
      if (resume(request)) {
        request.granted();
        return;
      }
    } else {
      Grants grants;
      {
        RuleTable::Locked lock(*table_, bit(), grants);
        if (request.park_.load(std::memory_order_acquire) == Park::parked) take_out(request, grants);
      }
      table_->notify(grants);
    }
    request.park_.store(Park::none, std::memory_order_relaxed);
  }
  push_submitted(reinterpret_cast<std::uintptr_t>(&request), request.place_.next_submitted);
  Grants grants;
  Orphans orphans;
  if (!drain_into(grants, orphans)) return;
  table_->notify(grants);
  for (RuleRequest* orphan : orphans) delete orphan;
}

void RuleShard::enter_all(std::span<RuleRequest* const> requests) noexcept {
  if (requests.empty()) return;
  void* block = nullptr;
  if (requests.size() > 1) {
    try {
      block = allocate_bytes(SubmittedRun::bytes(requests.size()));
    } catch (...) {
      block = nullptr;  // linked one by one instead
    }
  }
  if (block == nullptr) {
    // Linked newest first, as if pushed one by one; the oldest then links to what was there.
    for (std::size_t i = requests.size() - 1; i > 0; --i)
      requests[i]->place_.next_submitted = reinterpret_cast<std::uintptr_t>(requests[i - 1]);
    push_submitted(reinterpret_cast<std::uintptr_t>(requests.back()),
                   requests.front()->place_.next_submitted);
    return;
  }
  auto* run = ::new (block) SubmittedRun{0, requests.size()};
  std::copy(requests.begin(), requests.end(), run->requests());
  for (std::size_t i = 0; i < requests.size(); ++i) run->rules()[i] = requests[i]->rule_;
  push_submitted(reinterpret_cast<std::uintptr_t>(run) | run_tag, run->next);
}

// Enters what was submitted here, unless another thread holds the lock; false when nothing was.
bool RuleShard::drain_into(Grants& grants, Orphans& orphans) noexcept {
  // A submission this thread made, or one made before a task that calls this was spawned, is seen
  // here unless it was entered already; one made concurrently is its submitter's to see to.
  if (submitted_.load(std::memory_order_acquire) == 0) return false;
  settle(grants, orphans);
  return true;
}

// Under the lock. Out of memory while entering terminates, as while queueing: the submitter has
// gone on, and a half-entered request would break the table.
void RuleShard::enter_submitted(Grants& grants, Orphans& orphans) noexcept {
  if (submitted_.load(std::memory_order_relaxed) == 0) return;  // mostly: no write to share
  // Until they are in, has_submitted() must not say "nothing": set before the stack looks empty.
  entering_submitted_.store(true, std::memory_order_relaxed);
  std::uintptr_t newest = submitted_.exchange(0, std::memory_order_acq_rel);
  std::uintptr_t oldest = 0;
  while (newest != 0) {
    std::uintptr_t& link = submitted_link(newest);
    const std::uintptr_t next = link;
    link = oldest;
    oldest = newest;
    newest = next;
  }
  while (oldest != 0) {
    const std::uintptr_t entry = oldest;
    oldest = std::exchange(submitted_link(entry), 0);
    if ((entry & run_tag) != 0) {
      auto* run = reinterpret_cast<SubmittedRun*>(entry & ~run_tag);
      enter_together(*run, grants, orphans);
      deallocate_bytes(run);
    } else {
      put_in_or_refuse(*reinterpret_cast<RuleRequest*>(entry), grants, orphans);
    }
  }
  entering_submitted_.store(false, std::memory_order_release);
}

// Enters a run of submitted requests, in order, once their rules, the rules' notes and the requests
// are on their way into this core's cache: with a backlog those misses overlap instead of queueing
// up under the lock. A request is fetched only where its rule differs from the one before it: a
// run of one rule (a mutex's tasklets) costs little to enter (every request waits at the same
// node), and fetching each of its requests costs more than it saves.
void RuleShard::enter_together(SubmittedRun& run, Grants& grants, Orphans& orphans) noexcept {
  RuleRequest* const* requests = run.requests();
  const SchedulingRule* const* rules = run.rules();
  for (std::size_t i = 0; i < run.count; ++i) {
    if (i == 0 || rules[i] != rules[i - 1]) __builtin_prefetch(requests[i]);
    __builtin_prefetch(rules[i]);
  }
  for (std::size_t i = 0; i < run.count; ++i)
    __builtin_prefetch(SchedulingRule::TableSlot::note(*rules[i], std::memory_order_relaxed));
  for (std::size_t i = 0; i < run.count; ++i) put_in_or_refuse(*requests[i], grants, orphans);
}

// Out of memory, put_in changed nothing but the request (and perhaps made empty nodes): the request
// is linked on refused_ for the next notify(), which tells its owner.
void RuleShard::put_in_or_refuse(RuleRequest& request, Grants& grants, Orphans& orphans) noexcept {
  try {
    if (put_in(request, grants, orphans)) grants.push_back(&request);  // put_in made room
  } catch (...) {
    request.clear_entries();
    request.has_custom_ = false;
    table_->push_refused(request);
  }
}

// After letting the lock go (or submitting): enters what was submitted meanwhile, unless another
// thread holds the lock, which does it when it lets go. The fences order our read of submitted_
// after our unlock, and a submitter's try_lock after its push: one of us sees the other.
void RuleShard::settle(Grants& grants, Orphans& orphans) noexcept {
  for (;;) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (submitted_.load(std::memory_order_relaxed) == 0 || !mutex_.try_lock()) return;
    enter_submitted(grants, orphans);
    mutex_.unlock();
  }
}

// ---------------------------------------------------------------------------------------------
// Leaving

bool RuleShard::leave(RuleRequest& request, Grants& grants) {
  // parkable_ was set when the request was entered, before its grant reached its owner.
  if (request.parkable_ && park(request)) return true;
  RuleTable::Locked lock(*table_, bit(), grants);
  assert(request.in_table_ && request.held_);
  if (table_->shared_out(request)) table_->backend_->leave(request, false);
  take_out(request, grants);
  return false;
}

void RuleShard::hand_over(RuleRequest& from, RuleRequest& to) {
  to.reserve_entries(from.entry_count_);  // out of memory: nothing changed
  Grants grants;  // none: nothing is released, but the lock may enter what was submitted
  {
    RuleTable::Locked lock(*table_, bit(), grants);
    assert(from.in_table_ && from.held_ && !from.parkable_ && !to.in_table_ && !to.parkable());
    std::copy_n(from.entry_data(), from.entry_count_, to.entry_data());
    to.entry_count_ = from.entry_count_;
    RuleTable::take_place(from, to);
    live_[from.place_.in_table.live_index] = &to;
    if (table_->shared_out(from)) table_->backend_->moved(from, to);
    if (from.has_custom_) *std::find(customs_.begin(), customs_.end(), &from) = &to;
    for (Blocked& blocked : blocked_) {
      if (blocked.by == &from) blocked.by = &to;
    }
    from.held_ = false;
    from.in_table_ = false;
    from.has_custom_ = false;
    from.clear_entries();
    if (Trace* trace = table_->trace_.load(std::memory_order_relaxed)) [[unlikely]] {
      RuleTable::trace_left(*trace, from, true);
      trace_entered(*trace, to, true);
    }
  }
  table_->notify(grants);
}

}  // namespace tasklet::detail
