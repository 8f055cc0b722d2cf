// Claims granted in revision order (locks.hpp says how): the courier sends requests and
// deletions in batches, the watcher follows every deletion under <prefix>/c and lets through the
// requests waiting for it.
#include "etcd/locks.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <iterator>
#include <string_view>
#include <utility>

#include "tasklet/etcd/etcd.hpp"

namespace tasklet::etcd::detail {

namespace {

// The first key after every key that starts with `prefix` (etcd's range_end for a prefix).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

// The proper ancestors of a normalised path, root first ("/a/b": "/", "/a").
std::vector<std::string> ancestors_of(const std::string& path) {
  std::vector<std::string> ancestors;
  if (path == "/") return ancestors;
  ancestors.emplace_back("/");
  for (std::size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    ancestors.push_back(path.substr(0, slash));
  }
  return ancestors;
}

}  // namespace

Locks::Locks(Gateway& gateway, std::string prefix, std::int64_t lease, std::string session_key,
             std::int64_t session_key_revision, Clock::time_point alive_until,
             std::function<void(const std::string& why)> expired)
    : gateway_(gateway),
      prefix_(std::move(prefix)),
      lease_(lease),
      session_key_(std::move(session_key)),
      alive_until_(alive_until.time_since_epoch().count()),
      expired_(std::move(expired)),
      guard_(session_key_revision) {
  // Deletions from the next revision on: a request's blockers, read later, are all still there then.
  const Json now =
      gateway_.call("/v3/kv/range", Json{{"key", base64(prefix_ + "/c/")}, {"count_only", true}});
  start_revision_ = integer_of(now["header"].value("revision", Json())) + 1;
  watcher_ = std::thread([this] { watch(); });
  courier_ = std::thread([this] { courier(); });
}

Locks::~Locks() {
  stop_.stop();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  retry_.notify_all();
  courier_.join();
  watcher_.join();
}

std::string Locks::node_prefix(const Claim& claim) const {
  if (claim.named) {
    // Hex: a name may hold any byte but NUL, and no name's keys may start with another's.
    static constexpr char digits[] = "0123456789abcdef";
    std::string hex;
    for (const char letter : claim.path) {
      const auto byte = static_cast<unsigned char>(letter);
      hex += digits[byte >> 4];
      hex += digits[byte & 15];
    }
    return prefix_ + "/c/n/" + hex + "/";
  }
  return prefix_ + "/c/p" + (claim.path == "/" ? std::string() : claim.path) + "/";
}

std::string Locks::queue_key(const Claim& claim) const { return node_prefix(claim) + "\x01/"; }

std::vector<std::pair<std::string, std::string>> Locks::ranges_of(const Claim& claim) const {
  // The node and everything below it, then each ancestor's own claims (a name has neither).
  std::vector<std::pair<std::string, std::string>> ranges;
  const std::string below = claim.named ? queue_key(claim) : node_prefix(claim);
  ranges.emplace_back(below, prefix_end(below));
  if (claim.named) return ranges;
  for (const std::string& ancestor : ancestors_of(claim.path)) {
    const std::string own = queue_key(Claim{ancestor, true, false});
    ranges.emplace_back(own, prefix_end(own));
  }
  return ranges;
}

void Locks::add_blockers(const Json& range, const Claim& claim, std::int64_t revision,
                         std::set<std::string>& blockers, std::set<std::string>& exclusive) {
  if (!range.contains("kvs")) return;
  for (const Json& kv : range["kvs"]) {
    if (integer_of(kv.value("create_revision", Json())) >= revision) continue;  // the request's own, or later
    const bool theirs_exclusive = unbase64(kv.value("value", std::string())) == "X";
    if (!claim.exclusive && !theirs_exclusive) continue;
    const std::string key = unbase64(kv.value("key", std::string()));
    blockers.insert(key);
    if (theirs_exclusive) exclusive.insert(key);
  }
}

Locks::Waits Locks::waits_of(const Ticket& ticket) {
  std::lock_guard lock(mutex_);
  Waits waits;
  waits.entered = ticket.stage == Ticket::Stage::entered || ticket.stage == Ticket::Stage::done;
  if (ticket.granted) return waits;
  for (const std::string& key : ticket.blockers)
    waits.keys.emplace_back(key, ticket.exclusive_blockers.count(key) != 0);
  return waits;
}

std::optional<std::pair<Claim, std::int64_t>> Locks::claim_of_key(const std::string& key) const {
  // <prefix>/c/p<path>/\x01/<lease hex>-<n> or <prefix>/c/n/<hex name>/\x01/<lease hex>-<n>
  const std::string claims = prefix_ + "/c/";
  const std::size_t mark = key.rfind("/\x01/");
  if (key.compare(0, claims.size(), claims) != 0 || mark == std::string::npos || mark < claims.size())
    return {};
  Claim claim;
  if (key.compare(claims.size(), 1, "p") == 0) {
    std::string path = key.substr(claims.size() + 1, mark - claims.size() - 1);
    claim.path = path.empty() ? std::string(1, '/') : std::move(path);
  } else if (key.compare(claims.size(), 2, "n/") == 0) {
    const std::string hex = key.substr(claims.size() + 2, mark - claims.size() - 2);
    claim.named = true;
    for (std::size_t at = 0; at + 1 < hex.size(); at += 2)
      claim.path += static_cast<char>(std::stoi(hex.substr(at, 2), nullptr, 16));
  } else {
    return {};
  }
  const std::int64_t lease = static_cast<std::int64_t>(std::stoull(key.substr(mark + 3), nullptr, 16));
  return std::make_pair(claim, lease);
}

std::size_t Locks::operations_of(const Ticket& ticket) const {
  std::size_t operations = 0;
  for (const Claim& claim : ticket.claims) operations += 1 + ranges_of(claim).size();
  return operations;
}

std::shared_ptr<Ticket> Locks::request(std::vector<Claim> claims, TicketCalls calls) {
  auto ticket = std::make_shared<Ticket>();
  ticket->claims = std::move(claims);
  ticket->calls = std::move(calls);
  {
    std::lock_guard lock(mutex_);
    for (const Claim& claim : ticket->claims) {
      char id[48];
      std::snprintf(id, sizeof id, "%016llx-%llu", static_cast<unsigned long long>(lease_),
                    static_cast<unsigned long long>(++sequence_));
      ticket->keys.push_back(queue_key(claim) + id);
    }
    if (lease_lost_) {
      ticket->stage = Ticket::Stage::done;
      ticket->failure = lease_lost_;
      failing_.push_back(ticket);
    } else {
      queued_.push_back(ticket);
    }
  }
  work_.notify_one();
  return ticket;
}

void Locks::flush() {
  {
    std::lock_guard lock(mutex_);
    if (deletions_.empty() && fenced_deletions_.empty()) return;
  }
  work_.notify_one();
}

void Locks::release(const std::shared_ptr<Ticket>& ticket, bool send) {
  {
    std::lock_guard lock(mutex_);
    if (ticket->released) return;
    ticket->released = true;  // a waiting request is withdrawn: never granted
    switch (ticket->stage) {
      case Ticket::Stage::queued:
        std::erase(queued_, ticket);
        ticket->stage = Ticket::Stage::done;
        if (!ticket->unanswered) return;  // nothing of it is in etcd
        delete_keys(*ticket);
        break;
      case Ticket::Stage::sent:
        return;  // the courier deletes its keys once the transaction is back
      case Ticket::Stage::entered:
        for (const std::string& key : ticket->blockers) {
          const auto found = waiting_on_.find(key);
          if (found == waiting_on_.end()) continue;
          found->second.erase(ticket);
          if (found->second.empty()) waiting_on_.erase(found);
        }
        ticket->blockers.clear();
        ticket->stage = Ticket::Stage::done;
        delete_keys(*ticket);
        break;
      case Ticket::Stage::done:
        return;
    }
  }
  if (send) work_.notify_one();
}

void Locks::delete_keys(const Ticket& ticket) {
  if (lease_lost_) return;  // etcd deleted the keys with the lease
  std::vector<std::string>& into = ticket.unanswered ? fenced_deletions_ : deletions_;
  into.insert(into.end(), ticket.keys.begin(), ticket.keys.end());
}

void Locks::lease_lost(const std::exception_ptr& why) {
  {
    std::lock_guard lock(mutex_);
    if (lease_lost_) return;
    fail_all(why);
  }
  work_.notify_one();
}

void Locks::fail_all(const std::exception_ptr& why) {
  lease_lost_ = why;
  const auto fail = [&](const std::shared_ptr<Ticket>& ticket) {
    if (ticket->stage == Ticket::Stage::done || ticket->granted) return;
    ticket->stage = Ticket::Stage::done;
    ticket->failure = why;
    failing_.push_back(ticket);
  };
  for (const std::shared_ptr<Ticket>& ticket : queued_) fail(ticket);
  for (const auto& [key, tickets] : waiting_on_) {
    for (const std::shared_ptr<Ticket>& ticket : tickets) fail(ticket);
  }
  queued_.clear();
  deletions_.clear();
  fenced_deletions_.clear();
  waiting_on_.clear();
  // Tickets under way fail when the transaction is back (register_entered).
}

void Locks::renewed(Clock::time_point sent, std::chrono::seconds ttl) noexcept {
  const Clock::rep until = (sent + ttl).time_since_epoch().count();
  Clock::rep seen = alive_until_.load(std::memory_order_relaxed);
  while (seen < until && !alive_until_.compare_exchange_weak(seen, until, std::memory_order_release)) {
  }
}

bool Locks::may_have_expired() const noexcept {
  return Clock::now().time_since_epoch().count() >= alive_until_.load(std::memory_order_acquire);
}

// The session's key went with its lease (expired or revoked), or someone deleted it: either way the
// fence it was is gone, and the session is lost (retrying would wait forever on a live lease).
void Locks::key_gone(Told& told) {
  told.expired = "the session's key " + session_key_ +
                 " is gone from etcd (its lease expired or was revoked, or it was deleted)";
  fail_all(std::make_exception_ptr(EtcdLeaseLost("etcd: " + told.expired)));
}

void Locks::expire(Told& told) {
  char lease[24];
  std::snprintf(lease, sizeof lease, "%llx", static_cast<unsigned long long>(lease_));
  told.expired = "lease " + std::string(lease) + " may have expired: no renewal was answered within its TTL";
  fail_all(std::make_exception_ptr(EtcdLeaseLost("etcd: " + told.expired)));
}

bool Locks::lose_if_expired() {
  Told told;
  {
    std::lock_guard lock(mutex_);
    if (lease_lost_) return true;
    if (!may_have_expired()) return false;
    expire(told);
  }
  tell(told);
  return true;
}

std::exception_ptr Locks::loss() {
  std::lock_guard lock(mutex_);
  return lease_lost_;
}

void Locks::ready(const std::shared_ptr<Ticket>& ticket, Told& told) {
  if (ticket->granted || ticket->released || lease_lost_) return;
  ticket->granted = true;
  told.granted.push_back(ticket);
}

void Locks::tell(Told& told) noexcept {
  // The session is lost before any request hears of it, as when its renewer finds the loss.
  if (!told.expired.empty()) {
    work_.notify_one();  // the failures for the courier to tell
    if (expired_) expired_(told.expired);
  }
  for (const std::shared_ptr<Ticket>& ticket : told.granted) {
    if (ticket->calls.granted) ticket->calls.granted(ticket->revision);
  }
  for (auto& [ticket, error] : told.failed) {
    if (ticket->calls.failed) ticket->calls.failed(error);
  }
  told = {};
}

// Sends what callers asked for, a batch per transaction: the deletions first (so that a request of
// this process sent with them does not wait for keys of its own that are on their way out), then
// the requests in the order they came, while the transaction stays under etcd's limit of
// operations. etcd out of reach: the same batch again shortly (a retried put keeps its key's first
// revision, which the answer's previous value gives back), until the lease is lost.
void Locks::courier() {
  const auto recheck_every = gateway_.options().lease_ttl / 3;
  std::unique_lock lock(mutex_);
  for (;;) {
    const bool work = work_.wait_for(lock, recheck_every, [this] {
      return stopping_ || !failing_.empty() ||
             (!lease_lost_ && (!queued_.empty() || !deletions_.empty() || !fenced_deletions_.empty()));
    });
    if (stopping_) return;
    if (!work) {
      recheck(lock);
      continue;
    }
    Told told;
    if (!failing_.empty()) {
      for (const std::shared_ptr<Ticket>& ticket : failing_) {
        if (!ticket->released) told.failed.emplace_back(ticket, ticket->failure);
      }
      failing_.clear();
    } else {
      Batch batch = take_batch();
      const std::int64_t guard = guard_;
      sending_ = true;
      lock.unlock();
      Sent sent = send_batch(guard, batch);
      lock.lock();
      sending_ = false;
      if (!settle(batch, sent, told)) {
        if (sent.unreachable) pause_before_retry(lock);
        continue;
      }
    }
    lock.unlock();
    tell(told);
    lock.lock();
  }
}

// etcd out of reach: the courier tries again shortly, or at once when the Locks go.
void Locks::pause_before_retry(std::unique_lock<std::mutex>& lock) {
  work_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping_; });
}

// Under the lock: the next batch, the deletions first, then queued requests while the transaction
// stays under etcd's limit of operations.
Locks::Batch Locks::take_batch() {
  // etcd's default --max-txn-ops is 128; a single request beyond it goes alone, and etcd refuses it.
  constexpr std::size_t most_operations = 120;
  Batch batch;
  batch.fenced.swap(fenced_deletions_);
  batch.deletes.swap(deletions_);
  std::size_t operations = batch.before_tickets();
  std::size_t taken = 0;
  for (; taken < queued_.size(); ++taken) {
    const std::size_t cost = operations_of(*queued_[taken]);
    if (operations != 0 && operations + cost > most_operations) break;
    operations += cost;
    queued_[taken]->stage = Ticket::Stage::sent;
    batch.sent.push_back(queued_[taken]);
  }
  queued_.erase(queued_.begin(), queued_.begin() + static_cast<std::ptrdiff_t>(taken));
  return batch;
}

// Outside the lock: the batch's transaction, and how it went.
Locks::Sent Locks::send_batch(std::int64_t guard, const Batch& batch) const {
  Sent sent;
  try {
    sent.answer = send(guard, batch);
  } catch (const EtcdUnavailable&) {
    sent.unreachable = true;
  } catch (const EtcdError& error) {
    // The lease is gone, and the session will say so within a third of its TTL: until then, as
    // if etcd were out of reach (lease_lost() then fails the batch with the session's reason).
    if (std::string_view(error.what()).find("lease not found") != std::string_view::npos) {
      sent.unreachable = true;
    } else {
      sent.refused = std::current_exception();
    }
  } catch (...) {
    sent.refused = std::current_exception();
  }
  return sent;
}

// Under the lock, once a batch was sent: false when it goes again (etcd out of reach, or the
// session's key has another revision and nothing of it applied); else `told` has what to tell.
bool Locks::settle(Batch& batch, Sent& sent, Told& told) {
  bool moved = false;
  if (!sent.unreachable && !sent.refused && !sent.answer.value("succeeded", false)) {
    const Json& kvs =
        sent.answer["responses"].at(0).value("response_range", Json::object()).value("kvs", Json());
    if (kvs.is_array() && !kvs.empty()) {
      // A rewrite whose answer was lost was applied: its revision is the one to hold to now.
      guard_ = integer_of(kvs[0].value("mod_revision", Json()));
      moved = true;
    } else {
      if (!lease_lost_) key_gone(told);
      fail_sent(batch, lease_lost_, told);
      deleted_while_sending_.clear();
      return true;
    }
  }
  if (sent.unreachable || moved) {
    deleted_while_sending_.clear();  // the retry reads anew
    if (!lease_lost_) {
      send_again(batch, sent.unreachable);
      return false;
    }
    fail_sent(batch, lease_lost_, told);
    return true;
  }
  if (sent.refused) {
    fail_sent(batch, sent.refused, told);
    // Refused as a whole: the rewrite and its deletions go again, with the next batch.
    fenced_deletions_.insert(fenced_deletions_.end(), batch.fenced.begin(), batch.fenced.end());
  } else {
    if (!batch.fenced.empty()) guard_ = integer_of(sent.answer["header"].value("revision", Json()));
    register_entered(sent.answer, batch, told);
  }
  deleted_while_sending_.clear();
  return true;
}

void Locks::fail_sent(const Batch& batch, const std::exception_ptr& failure, Told& told) {
  for (const std::shared_ptr<Ticket>& ticket : batch.sent) {
    ticket->stage = Ticket::Stage::done;
    if (!ticket->released) told.failed.emplace_back(ticket, failure);
  }
}

void Locks::send_again(Batch& batch, bool unanswered) {
  for (const std::shared_ptr<Ticket>& ticket : batch.sent) {
    ticket->stage = Ticket::Stage::queued;
    ticket->unanswered = ticket->unanswered || unanswered;
    if (ticket->released) {
      ticket->stage = Ticket::Stage::done;
      if (ticket->unanswered) delete_keys(*ticket);  // else nothing of it is in etcd
    }
  }
  std::erase_if(batch.sent, [](const std::shared_ptr<Ticket>& ticket) { return ticket->released; });
  queued_.insert(queued_.begin(), batch.sent.begin(), batch.sent.end());
  deletions_.insert(deletions_.end(), batch.deletes.begin(), batch.deletes.end());
  fenced_deletions_.insert(fenced_deletions_.end(), batch.fenced.begin(), batch.fenced.end());
}

Json Locks::send(std::int64_t guard, const Batch& batch) const {
  Json ops = Json::array();
  if (!batch.fenced.empty()) {
    ops.push_back(Json{
        {"request_put",
         {{"key", base64(session_key_)}, {"value", base64("alive")}, {"lease", std::to_string(lease_)}}}});
  }
  for (const auto* keys : {&batch.fenced, &batch.deletes}) {
    for (const std::string& key : *keys)
      ops.push_back(Json{{"request_delete_range", {{"key", base64(key)}}}});
  }
  // Per ticket: one put per claim (with the previous value, for a retry), then its reads.
  for (const std::shared_ptr<Ticket>& ticket : batch.sent) {
    for (std::size_t i = 0; i < ticket->claims.size(); ++i) {
      ops.push_back(Json{{"request_put",
                          {{"key", base64(ticket->keys[i])},
                           {"value", base64(ticket->claims[i].exclusive ? "X" : "S")},
                           {"lease", std::to_string(lease_)},
                           {"prev_kv", true}}}});
    }
    for (const Claim& claim : ticket->claims) {
      for (const auto& [from, to] : ranges_of(claim))
        ops.push_back(Json{{"request_range", {{"key", base64(from)}, {"range_end", base64(to)}}}});
    }
  }
  const Json compare = Json::array({Json{{"key", base64(session_key_)},
                                         {"target", "MOD"},
                                         {"result", "EQUAL"},
                                         {"mod_revision", std::to_string(guard)}}});
  const Json failure = Json::array({Json{{"request_range", {{"key", base64(session_key_)}}}}});
  return gateway_.call("/v3/kv/txn", Json{{"compare", compare}, {"success", ops}, {"failure", failure}});
}

void Locks::register_entered(const Json& answer, const Batch& batch, Told& told) {
  // The answer may have waited past the lease's TTL (this process paused): then nothing is granted.
  if (!lease_lost_ && may_have_expired()) expire(told);
  const std::int64_t revision = integer_of(answer["header"].value("revision", Json()));
  const Json& responses = answer["responses"];
  std::size_t at = batch.before_tickets();
  for (const std::shared_ptr<Ticket>& ticket : batch.sent) {
    // A put retried after an answer that was lost keeps the revision of the first.
    const Json& first_put = responses.at(at).value("response_put", Json::object());
    const std::int64_t earlier =
        first_put.contains("prev_kv") ? integer_of(first_put["prev_kv"].value("create_revision", Json())) : 0;
    const std::int64_t mine = earlier != 0 ? earlier : revision;
    at += ticket->claims.size();
    std::set<std::string> blockers, exclusive;
    for (const Claim& claim : ticket->claims) {
      for (std::size_t r = ranges_of(claim).size(); r > 0; --r, ++at)
        add_blockers(responses.at(at).value("response_range", Json::object()), claim, mine, blockers,
                     exclusive);
    }
    if (ticket->released || lease_lost_) {
      // Withdrawn while it was on its way (its keys go with the next batch), or the lease went.
      ticket->stage = Ticket::Stage::done;
      if (lease_lost_ && !ticket->released) told.failed.emplace_back(ticket, lease_lost_);
      delete_keys(*ticket);
      continue;
    }
    ticket->revision = mine;
    ticket->stage = Ticket::Stage::entered;
    for (const std::string& key : blockers) {
      if (deleted_while_sending_.count(key) != 0) continue;  // gone past the watcher already
      ticket->blockers.insert(key);
      if (exclusive.count(key) != 0) ticket->exclusive_blockers.insert(key);
      waiting_on_[key].insert(ticket);
    }
    if (ticket->calls.entered) ticket->calls.entered(mine);
    if (ticket->blockers.empty()) ready(ticket, told);
  }
  if (!deletions_.empty() || !fenced_deletions_.empty()) work_.notify_one();
}

void Locks::deleted(const std::string& key) {
  Told told;
  {
    std::lock_guard lock(mutex_);
    if (sending_) deleted_while_sending_.insert(key);
    const auto found = waiting_on_.find(key);
    if (found == waiting_on_.end()) return;
    if (may_have_expired()) {
      expire(told);  // this deletion may have come after the lease's own expiry in etcd
    } else {
      for (const std::shared_ptr<Ticket>& ticket : found->second) {
        ticket->blockers.erase(key);
        if (ticket->blockers.empty()) ready(ticket, told);
      }
      waiting_on_.erase(found);
    }
  }
  tell(told);
}

// A deletion the watch never reported must not keep a request waiting forever: a watch stream can
// stay open and silent (as one on an etcd member that restarted was seen to). While requests
// wait, the courier asks every third of the TTL whether the keys they wait for still exist; those
// gone count as deleted, and the watch starts again from where it was.
void Locks::recheck(std::unique_lock<std::mutex>& lock) {
  constexpr std::size_t most_keys = 120;  // under etcd's limit of operations per transaction
  if (lease_lost_ || waiting_on_.empty()) return;
  std::vector<std::string> keys;
  for (auto it = waiting_on_.begin(); it != waiting_on_.end() && keys.size() < most_keys; ++it)
    keys.push_back(it->first);
  lock.unlock();
  Json ops = Json::array();
  for (const std::string& key : keys)
    ops.push_back(Json{{"request_range", {{"key", base64(key)}, {"count_only", true}}}});
  std::vector<std::string> gone;
  try {
    const Json answer = gateway_.call("/v3/kv/txn", Json{{"success", ops}});
    const Json& responses = answer.value("responses", Json::array());
    for (std::size_t i = 0; i < keys.size() && i < responses.size(); ++i) {
      const Json& range = responses[i].value("response_range", Json());
      if (range.is_object() && integer_of(range.value("count", Json())) == 0) gone.push_back(keys[i]);
    }
  } catch (const std::exception&) {
    // etcd out of reach: next time.
  }
  for (const std::string& key : gone) deleted(key);
  if (!gone.empty()) stop_.restart();
  lock.lock();
}

// One message of the watch: each deletion it reports, and `next`, the revision to resume from.
void Locks::watched(const Json& result, std::int64_t& next) {
  if (!result.contains("events")) return;
  for (const Json& event : result["events"]) {
    if (event.value("type", std::string()) != "DELETE") continue;
    const Json& kv = event["kv"];
    next = std::max(next, integer_of(kv.value("mod_revision", Json())) + 1);
    deleted(unbase64(kv.value("key", std::string())));
  }
}

// Follows the deletions under <prefix>/c from start_revision_ on, resuming after the last revision
// seen when the stream breaks, until the Locks go.
void Locks::watch() {
  std::int64_t next = start_revision_;
  while (!stop_.stopped()) {
    const Json create{{"create_request",
                       {{"key", base64(prefix_ + "/c/")},
                        {"range_end", base64(prefix_end(prefix_ + "/c/"))},
                        {"start_revision", std::to_string(next)},
                        {"filters", Json::array({"NOPUT"})}}}};
    try {
      gateway_.stream(
          "/v3/watch", create,
          [&](const Json& message) {
            watched(message.contains("result") ? message["result"] : message, next);
            return true;
          },
          stop_);
    } catch (const std::exception&) {
      // etcd out of reach: the session's lease decides whether the claims are still held. Try
      // again shortly, from the last revision seen.
    }
    std::unique_lock lock(mutex_);
    retry_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping_; });
  }
}

}  // namespace tasklet::etcd::detail
