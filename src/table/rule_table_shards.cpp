// The rule table's shards (see the top of rule_table.hpp): which shards a rule's requests enter,
// the locks of several shards taken together, and requests over several shards, which enter a
// part in each. What a shard decides on its own is in rule_table.cpp and the files beside it.
#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "table/rule_table.hpp"

namespace tasklet::detail {
namespace {

ShardSet shard_bit(std::size_t hash) noexcept { return ShardSet{1} << (hash % RuleTable::shard_count); }

ShardSet shard_of_text(std::string_view text) noexcept {
  return shard_bit(std::hash<std::string_view>{}(text));
}

ShardSet shard_of_address(const void* address) noexcept {
  // Rules are allocated blocks: the low bits say little, the multiplication spreads the rest.
  const auto bits = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(address)) >> 4;
  return shard_bit(static_cast<std::size_t>((bits * 0x9e3779b97f4a7c15ull) >> 32));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// A part speaks for its whole request

const void* RulePart::owner() const noexcept { return cross_->whole->owner(); }
bool RulePart::blocks_thread() const noexcept { return cross_->whole->blocks_thread(); }
RuleBlocker RulePart::describe() const { return cross_->whole->describe(); }
std::string RulePart::job_name() const { return cross_->whole->job_name(); }

// ---------------------------------------------------------------------------------------------
// Where a rule's requests go

ShardSet RuleTable::atom_shards(const SchedulingRule& atom, const RuleKey& key) noexcept {
  switch (key.kind) {
    case RuleKey::Kind::identity:
      return shard_of_address(&atom);
    case RuleKey::Kind::named:
      return shard_of_text(key.name);
    case RuleKey::Kind::path: {
      const PathSegments segments(key.path);
      return segments.empty() ? all_shards : shard_of_text(segments.front());
    }
    case RuleKey::Kind::multi: {
      ShardSet shards = 0;
      for (const Rule& child : key.children) {
        if (child) shards |= atom_shards(*child, child->key());
      }
      return shards;
    }
    case RuleKey::Kind::custom:
      break;
  }
  return all_shards;  // asked pairwise of every request
}

ShardSet RuleTable::shards_of(const SchedulingRule& rule) noexcept {
  const ShardSet shards = atom_shards(rule, rule.key());
  return shards != 0 ? shards : 1;  // a multi rule of nothing takes no entry: any shard will do
}

RuleTable::RuleTable() {
  for (std::size_t index = 0; index < shard_count; ++index)
    shards_[index].attach(*this, static_cast<std::uint16_t>(index));
}

RuleTable::~RuleTable() {
  cancel_all_waiting();
  // The backend goes first: what it tells requests from now on would find the table half gone.
  backend_ = nullptr;
  backend_owner_.reset();
  // The shards hand parked requests back to their owners as they go.
}

RuleTable::Locked::Locked(RuleTable& table, ShardSet shards, Grants& grants)
    : table_(table), shards_(shards), grants_(grants) {
  each_shard(shards_, [this](std::size_t index) {
    RuleShard& shard = table_.shards_[index];
    shard.mutex_.lock();
    shard.enter_submitted(grants_, orphans_);
  });
}

RuleTable::Locked::~Locked() {
  each_shard(shards_, [this](std::size_t index) {
    RuleShard& shard = table_.shards_[index];
    shard.mutex_.unlock();
    shard.settle(grants_, orphans_);
  });
  for (RuleRequest* orphan : orphans_) delete orphan;
}

// ---------------------------------------------------------------------------------------------
// The doors

void RuleTable::enter(RuleRequest& request) {
  if (undrained_.load(std::memory_order_acquire) != 0) drain();  // enter_all's requests came first
  if (deferring()) {
    // Behind what waits for drain(), which may be this thread's: it came first.
    RuleRequest* const alone[] = {&request};
    defer(alone);
    enter_deferred();
    return;
  }
  if (request.park_.load(std::memory_order_relaxed) == Park::parked) {
    // begin_rule's parked request (always in one shard) goes back to its shard: the same rule.
    shards_[request.shard_].enter(request);
    return;
  }
  enter_now(request);
}

void RuleTable::enter_now(RuleRequest& request) {
  const ShardSet shards = shards_of(*request.rule_);
  if (!single(shards)) {
    enter_across(request, shards);
    return;
  }
  const std::uint16_t index = first_shard(shards);
  // Written only when it changes: a parked request's table reads it meanwhile.
  if (request.shard_ != index) request.shard_ = index;
  shards_[index].enter(request);
}

void RuleTable::enter_all(std::span<RuleRequest* const> requests) noexcept {
  // The requests before the first one over several shards go to their shards' stacks, each
  // shard's in their order; the rest, from that one on, to drain() in a block of their own, and
  // all of them while such blocks wait (they came first).
  if (deferring()) {
    defer(requests);
    return;
  }
  // Each request's shard, noted before any is submitted: once one is, a worker may enter, grant,
  // run and delete it.
  Shards where;
  ShardSet seen = 0;
  std::size_t to = 0;
  for (; to < requests.size(); ++to) {
    RuleRequest& request = *requests[to];
    const ShardSet shards = shards_of(*request.rule_);
    if (!single(shards)) break;
    const std::uint16_t index = first_shard(shards);
    if (request.shard_ != index) request.shard_ = index;
    seen |= shards;
    try {
      where.push_back(index);
    } catch (...) {
      where.clear();  // out of memory: one by one below
      seen = all_shards;
    }
  }
  const std::span<RuleRequest* const> run = requests.first(to);
  if (single(seen)) {
    if (!run.empty()) shards_[first_shard(seen)].enter_all(run);
  } else if (where.size() != run.size()) {
    for (RuleRequest* const& request : run)
      shards_[request->shard_].enter_all(std::span<RuleRequest* const>(&request, 1));
  } else {
    each_shard(seen, [&](std::size_t index) { submit_to(index, run, where); });
  }
  if (seen != 0 && (undrained_.load(std::memory_order_relaxed) & seen) != seen)
    undrained_.fetch_or(seen & all_shards, std::memory_order_release);
  if (to < requests.size()) defer(requests.subspan(to));
}

void RuleTable::submit_to(std::size_t index, std::span<RuleRequest* const> run,
                          const Shards& where) noexcept {
  boost::container::small_vector<RuleRequest*, 16> mine;
  try {
    for (std::size_t at = 0; at < run.size(); ++at) {
      if (where[at] == index) mine.push_back(run[at]);
    }
  } catch (...) {
    // Out of memory for the list: one by one instead, which allocates nothing.
    for (std::size_t at = 0; at < run.size(); ++at) {
      if (where[at] == index) shards_[index].enter_all(run.subspan(at, 1));
    }
    return;
  }
  shards_[index].enter_all(std::span<RuleRequest* const>(mine.data(), mine.size()));
}

struct RuleTable::Deferred {
  Deferred* next;
  std::size_t count;
  RuleRequest** requests() noexcept { return reinterpret_cast<RuleRequest**>(this + 1); }
};

void RuleTable::defer(std::span<RuleRequest* const> requests) noexcept {
  void* block = nullptr;
  try {
    // The requests' pointers follow the header: their size is meant.
    // NOLINTNEXTLINE(bugprone-sizeof-expression)
    block = allocate_bytes(sizeof(Deferred) + requests.size() * sizeof(RuleRequest*));
  } catch (...) {
    // Out of memory: entered here, in their order, rather than lost.
    for (RuleRequest* request : requests) enter_now(*request);
    return;
  }
  auto* deferred = ::new (block) Deferred{nullptr, requests.size()};
  std::copy(requests.begin(), requests.end(), deferred->requests());
  Deferred* head = deferred_.load(std::memory_order_relaxed);
  do {
    deferred->next = head;
  } while (
      !deferred_.compare_exchange_weak(head, deferred, std::memory_order_release, std::memory_order_relaxed));
  undrained_.fetch_or(deferred_bit, std::memory_order_release);
}

// One thread at a time, so that blocks go in in the order they came; one that finds another at it
// leaves its block to that one, which looks again after it let go (the fences: one of the two
// sees the other, as in RuleShard::settle).
void RuleTable::enter_deferred() noexcept {
  // Whoever pushes a block drains afterwards and sees its own push: nothing here, nothing to do.
  if (!deferring()) return;
  for (;;) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (deferred_.load(std::memory_order_relaxed) == nullptr || !deferred_mutex_.try_lock()) return;
    entering_deferred_.store(true, std::memory_order_relaxed);
    Deferred* newest = deferred_.exchange(nullptr, std::memory_order_acq_rel);
    Deferred* oldest = nullptr;
    while (newest != nullptr) oldest = std::exchange(newest, std::exchange(newest->next, oldest));
    while (oldest != nullptr) {
      Deferred* block = std::exchange(oldest, oldest->next);
      for (std::size_t at = 0; at < block->count; ++at) enter_now(*block->requests()[at]);
      deallocate_bytes(block);
    }
    entering_deferred_.store(false, std::memory_order_release);
    deferred_mutex_.unlock();
  }
}

void RuleTable::drain() noexcept {
  if (undrained_.load(std::memory_order_relaxed) != 0) undrained_.store(0, std::memory_order_relaxed);
  Grants grants;
  Orphans orphans;
  bool any = false;
  for (RuleShard& shard : shards_) any = shard.drain_into(grants, orphans) || any;
  if (any) {
    notify(grants);
    for (RuleRequest* orphan : orphans) delete orphan;
  }
  enter_deferred();  // after the stacks: they hold what enter_all put there before
}

bool RuleTable::leave(RuleRequest& request, Grants& grants) {
  if (!is_cross(request)) return shards_[request.shard_].leave(request, grants);
  Locked lock(*this, cross_of(request).shards, grants);
  assert(request.in_table_ && request.held_);
  if (shared_out(request)) backend_->leave(request, false);
  take_out(request, lock, grants);
  return false;
}

bool RuleTable::leave(RuleRequest& request) {
  Grants grants;
  const bool parked = leave(request, grants);
  notify(grants);
  return parked;
}

void RuleTable::take_place(const RuleRequest& from, RuleRequest& to) noexcept {
  to.rule_ = from.rule_;
  to.ticket_ = from.ticket_;
  to.place_ = from.place_;
  to.held_ = true;
  to.in_table_ = true;
  to.has_custom_ = from.has_custom_;
  to.custom_blocked_ = false;
  to.shard_ = from.shard_;
}

void RuleTable::hand_over(RuleRequest& from, RuleRequest& to) {
  if (!is_cross(from)) {
    shards_[from.shard_].hand_over(from, to);
    return;
  }
  Grants grants;  // none: nothing is released, but the locks may enter what was submitted
  {
    Locked lock(*this, cross_of(from).shards, grants);
    assert(from.in_table_ && from.held_ && !to.in_table_ && !to.parkable());
    to.clear_entries();
    take_place(from, to);
    cross_of(to).whole = &to;
    if (shared_out(from)) backend_->moved(from, to);
    from.held_ = false;
    from.in_table_ = false;
    from.has_custom_ = false;
    if (Trace* trace = trace_.load(std::memory_order_relaxed)) [[unlikely]] {
      trace_left(*trace, from, true);
      trace_entered(*trace, to, true);
    }
  }
  notify(grants);
}

bool RuleTable::withdraw(RuleRequest& request) {
  Grants grants;
  bool withdrawn = false;
  {
    // A request over several shards may be taken out meanwhile (cancel_all_waiting), and its parts
    // with it: every lock, before reading them.
    Locked lock(*this, is_cross(request) ? all_shards : ShardSet{1} << request.shard_, grants);
    if (request.in_table_ && (!request.held_ || (backend_ != nullptr && backend_->leave(request, true)))) {
      take_out(request, lock, grants);
      withdrawn = true;
    }
  }
  notify(grants);
  return withdrawn;
}

void RuleTable::abandon(RuleRequest& request) {
  Grants grants;
  {
    Locked lock(*this, is_cross(request) ? all_shards : ShardSet{1} << request.shard_, grants);
    if (request.in_table_ && request.held_) take_out(request, lock, grants);
  }
  notify(grants);
}

void RuleTable::cancel_all_waiting() {
  enter_deferred();  // what was entered goes too
  std::vector<RuleRequest*> canceled;
  Grants grants;  // submitted requests granted at once
  {
    Locked lock(*this, all_shards, grants);
    each_live([&](const RuleShard&, RuleRequest& request) {
      if (seen_here(request) && !whole_of(request).held_) canceled.push_back(&whole_of(request));
    });
    const std::size_t waiting_here = canceled.size();
    each_live([&](const RuleShard&, RuleRequest& request) {
      if (seen_here(request) && waits_outside(whole_of(request))) canceled.push_back(&whole_of(request));
    });
    // In the order they came, so that their owners hear of it in that order.
    const auto by_ticket = [](const RuleRequest* a, const RuleRequest* b) { return a->ticket_ < b->ticket_; };
    std::stable_sort(canceled.begin(), canceled.begin() + static_cast<std::ptrdiff_t>(waiting_here),
                     by_ticket);
    // Every waiter goes, so nobody is left to be let through: out without walking.
    Trace* trace = trace_.load(std::memory_order_relaxed);
    for (std::size_t at = 0; at < waiting_here; ++at) {
      RuleRequest& request = *canceled[at];
      if (trace != nullptr) trace_left(*trace, request, false);
      if (!is_cross(request)) {
        shards_[request.shard_].drop(request);
        continue;
      }
      CrossRequest& cross = cross_of(request);
      for (RulePart& part : cross.parts()) shards_[part_shard(part)].drop(part);
      crosses_live_.fetch_sub(1, std::memory_order_relaxed);
      request.in_table_ = false;
      lock.gone().emplace_back(&cross);
    }
    // Then those held here and still waiting in the backend, withdrawn there: nobody waits here to
    // be let through any more.
    auto kept = canceled.begin() + static_cast<std::ptrdiff_t>(waiting_here);
    for (auto outside = kept; outside != canceled.end(); ++outside) {
      if (!backend_->leave(**outside, true)) continue;
      take_out(**outside, lock, grants);
      *kept++ = *outside;
    }
    canceled.erase(kept, canceled.end());
  }
  notify(grants);
  for (RuleRequest* request : canceled) request->closed();
}

// ---------------------------------------------------------------------------------------------
// Requests over several shards

CrossRequest* CrossRequest::make(RuleRequest& whole, ShardSet shards) {
  static_assert(
      sizeof(CrossRequest) % alignof(RulePart) == 0 && alignof(RulePart) <= alignof(std::max_align_t),
      "the parts follow the header in its block");
  const auto count = static_cast<std::uint32_t>(std::popcount(shards));
  void* block = allocate_bytes(sizeof(CrossRequest) + count * sizeof(RulePart));
  auto* cross = ::new (block) CrossRequest{&whole, shards, {0}, count};
  for (RulePart& part : cross->parts()) ::new (static_cast<void*>(&part)) RulePart(*cross);
  return cross;
}

void CrossRequest::Free::operator()(CrossRequest* cross) const noexcept {
  for (RulePart& part : cross->parts()) part.~RulePart();
  cross->~CrossRequest();
  deallocate_bytes(cross);
}

void RuleTable::enter_across(RuleRequest& request, ShardSet shards) noexcept {
  Grants grants;
  {
    CrossPtr cross;
    try {
      cross.reset(CrossRequest::make(request, shards));
      RulePart* part = cross->parts().data();
      each_shard(shards, [&](std::size_t index) {
        part->rule_ = request.rule_;
        part->shard_ = static_cast<std::uint16_t>(part_bit | index);
        ++part;
      });
    } catch (...) {
      cross.reset();
    }
    Locked lock(*this, shards, grants);
    bool entered = false;
    if (cross) {
      try {
        put_in_across(request, cross, grants, lock.orphans());
        entered = true;
      } catch (...) {
        entered = false;
      }
    }
    if (!entered) push_refused(request);
  }
  notify(grants);
}

// Under the locks of the request's shards: a part in each, with one ticket that comes after every
// earlier one in each of them. Out of memory, the parts entered go out again and it throws.
bool RuleTable::put_in_across(RuleRequest& request, CrossPtr& cross, Grants& grants, Orphans& orphans) {
  room_for(grants, 1);  // for the whole request, granted at once
  std::uint64_t ticket = 0;
  each_shard(cross->shards,
             [&](std::size_t index) { ticket = std::max(ticket, shards_[index].next_ticket_); });
  std::uint32_t unclear = 0;
  std::size_t entered = 0;
  try {
    for (RulePart& part : cross->parts()) {
      RuleShard& shard = shards_[part_shard(part)];
      shard.next_ticket_ = ticket;
      if (!shard.put_in(part, grants, orphans)) ++unclear;
      ++entered;
    }
  } catch (...) {
    // Nothing entered after them: taking them out lets nobody through that was not free before.
    for (RulePart& part : cross->parts().first(entered)) shards_[part_shard(part)].take_out(part, grants);
    throw;
  }
  cross->unclear_parts.store(unclear, std::memory_order_relaxed);
  request.clear_entries();
  request.ticket_ = ticket + 1;
  request.held_ = unclear == 0;
  request.in_table_ = true;
  request.has_custom_ = cross->first().has_custom_;
  request.custom_blocked_ = false;
  request.shard_ = cross_shard;
  request.place_.next_submitted = reinterpret_cast<std::uintptr_t>(cross.release());
  crosses_live_.fetch_add(1, std::memory_order_relaxed);
  if (request.held_) {
    crosses_held_.fetch_add(1, std::memory_order_relaxed);
    grants.push_back(&request);  // room made above
  }
  if (Trace* trace = trace_.load(std::memory_order_relaxed)) [[unlikely]]
    trace_entered(*trace, request, request.held_);
  return request.held_;
}

RuleRequest* RuleTable::part_granted(RulePart& part) noexcept {
  CrossRequest& cross = part.cross();
  if (cross.unclear_parts.fetch_sub(1, std::memory_order_acq_rel) != 1) return nullptr;
  cross.whole->held_ = true;
  crosses_held_.fetch_add(1, std::memory_order_relaxed);
  return cross.whole;
}

void RuleTable::take_out(RuleRequest& request, Locked& lock, Grants& grants) {
  if (!is_cross(request)) {
    shards_[request.shard_].take_out(request, grants);
    return;
  }
  CrossRequest& cross = cross_of(request);
  Trace* const trace = trace_.load(std::memory_order_relaxed);
  const bool was_held = request.held_;
  for (RulePart& part : cross.parts()) {
    RuleShard& shard = shards_[part_shard(part)];
    if (trace != nullptr) [[unlikely]]
      shard.releasing_ = &request;
    shard.take_out(part, grants);
    shard.releasing_ = nullptr;
  }
  if (was_held) crosses_held_.fetch_sub(1, std::memory_order_relaxed);
  crosses_live_.fetch_sub(1, std::memory_order_relaxed);
  request.in_table_ = false;
  request.held_ = false;
  request.custom_blocked_ = false;
  lock.gone().emplace_back(&cross);
  if (trace != nullptr) [[unlikely]]
    trace_left(*trace, request, was_held);
}

}  // namespace tasklet::detail
