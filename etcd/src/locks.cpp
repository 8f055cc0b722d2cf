// Claims granted in revision order (locks.hpp says how); the watcher follows every deletion under
// <prefix>/q and lets through the requests waiting for it.
#include "locks.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <utility>

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

Locks::Locks(Gateway& gateway, std::string prefix, std::int64_t lease)
    : gateway_(gateway), prefix_(std::move(prefix)), lease_(lease) {
  // Deletions from the next revision on: a request's blockers, read later, are all still there then.
  const Json now =
      gateway_.call("/v3/kv/range", Json{{"key", base64(prefix_ + "/q/")}, {"count_only", true}});
  start_revision_ = integer_of(now["header"].value("revision", Json())) + 1;
  watcher_ = std::thread([this] { watch(); });
}

Locks::~Locks() {
  stop_.stop();
  { const std::lock_guard lock(mutex_); }  // the watcher is waiting, or will see the stop
  retry_.notify_all();
  watcher_.join();
}

std::string Locks::node_prefix(const std::string& path) const {
  return prefix_ + "/q" + (path == "/" ? std::string() : path) + "/";
}

std::string Locks::queue_key(const std::string& path) const { return node_prefix(path) + "\x01/"; }

std::vector<std::pair<std::string, std::string>> Locks::ranges_of(const Claim& claim) const {
  // The node and everything below it, then each ancestor's own claims.
  std::vector<std::pair<std::string, std::string>> ranges;
  const std::string below = node_prefix(claim.path);
  ranges.emplace_back(below, prefix_end(below));
  for (const std::string& ancestor : ancestors_of(claim.path)) {
    const std::string own = queue_key(ancestor);
    ranges.emplace_back(own, prefix_end(own));
  }
  return ranges;
}

void Locks::add_blockers(const Json& range, const Claim& claim, std::int64_t revision,
                         std::set<std::string>& blockers) {
  if (!range.contains("kvs")) return;
  for (const Json& kv : range["kvs"]) {
    if (integer_of(kv.value("create_revision", Json())) >= revision) continue;  // the request's own, or later
    if (claim.exclusive || unbase64(kv.value("value", std::string())) == "X")
      blockers.insert(unbase64(kv.value("key", std::string())));
  }
}

std::shared_ptr<Ticket> Locks::request(const std::vector<Claim>& claims,
                                       std::function<void(std::int64_t)> granted) {
  auto ticket = std::make_shared<Ticket>();
  {
    std::lock_guard lock(mutex_);
    for (const Claim& claim : claims) {
      char id[48];
      std::snprintf(id, sizeof id, "%016llx-%llu", static_cast<unsigned long long>(lease_),
                    static_cast<unsigned long long>(++sequence_));
      ticket->keys.push_back(queue_key(claim.path) + id);
    }
  }
  // One transaction puts every key of the request (so they share one revision, its ticket) and
  // reads what else is there: everything it reads is earlier.
  Json ops = Json::array();
  for (std::size_t i = 0; i < claims.size(); ++i) {
    ops.push_back(Json{{"request_put",
                        {{"key", base64(ticket->keys[i])},
                         {"value", base64(claims[i].exclusive ? "X" : "S")},
                         {"lease", std::to_string(lease_)}}}});
  }
  // Where each claim's blockers can be, as request_range operations, and whose each one is.
  Json reads = Json::array();
  std::vector<std::size_t> claim_of_range;
  for (std::size_t i = 0; i < claims.size(); ++i) {
    for (const auto& [from, to] : ranges_of(claims[i])) {
      reads.push_back(Json{{"request_range", {{"key", base64(from)}, {"range_end", base64(to)}}}});
      claim_of_range.push_back(i);
    }
  }
  ops.insert(ops.end(), reads.begin(), reads.end());
  const Json done = gateway_.call("/v3/kv/txn", Json{{"success", ops}});
  ticket->revision = integer_of(done["header"].value("revision", Json()));
  std::set<std::string> blockers;
  const Json& responses = done["responses"];
  for (std::size_t r = 0; r < claim_of_range.size(); ++r) {
    add_blockers(responses.at(claims.size() + r).value("response_range", Json::object()),
                 claims[claim_of_range[r]], ticket->revision, blockers);
  }
  {
    std::lock_guard lock(mutex_);
    ticket->blockers = blockers;
    ticket->granted = std::move(granted);
    for (const std::string& key : blockers) waiting_on_[key].insert(ticket);
  }
  if (!blockers.empty()) {
    // A blocker deleted before it was registered above may have gone past the watcher: what is
    // left now is what still exists.
    const Json now = gateway_.call("/v3/kv/txn", Json{{"success", reads}});
    std::set<std::string> still;
    for (std::size_t r = 0; r < claim_of_range.size(); ++r) {
      add_blockers(now["responses"].at(r).value("response_range", Json::object()), claims[claim_of_range[r]],
                   ticket->revision, still);
    }
    for (const std::string& key : blockers) {
      if (still.count(key) == 0) deleted(key);
    }
    return ticket;
  }
  std::function<void(std::int64_t)> tell;
  {
    std::lock_guard lock(mutex_);
    if (!ticket->answered) {
      ticket->answered = true;
      tell = std::move(ticket->granted);
    }
  }
  if (tell) tell(ticket->revision);
  return ticket;
}

void Locks::deleted(const std::string& key) {
  std::vector<std::shared_ptr<Ticket>> through;
  {
    std::lock_guard lock(mutex_);
    const auto found = waiting_on_.find(key);
    if (found == waiting_on_.end()) return;
    for (const std::shared_ptr<Ticket>& ticket : found->second) {
      ticket->blockers.erase(key);
      if (ticket->blockers.empty() && !ticket->answered) {
        ticket->answered = true;
        through.push_back(ticket);
      }
    }
    waiting_on_.erase(found);
  }
  for (const std::shared_ptr<Ticket>& ticket : through) ticket->granted(ticket->revision);
}

void Locks::release(const std::shared_ptr<Ticket>& ticket) {
  {
    std::lock_guard lock(mutex_);
    ticket->answered = true;  // a waiting request is withdrawn: never granted
    for (const std::string& key : ticket->blockers) {
      const auto found = waiting_on_.find(key);
      if (found == waiting_on_.end()) continue;
      found->second.erase(ticket);
      if (found->second.empty()) waiting_on_.erase(found);
    }
    ticket->blockers.clear();
  }
  Json deletes = Json::array();
  for (const std::string& key : ticket->keys)
    deletes.push_back(Json{{"request_delete_range", {{"key", base64(key)}}}});
  gateway_.call("/v3/kv/txn", Json{{"success", deletes}});
}

// Follows the deletions under <prefix>/q from start_revision_ on, resuming after the last revision
// seen when the stream breaks, until the Locks go.
void Locks::watch() {
  std::int64_t next = start_revision_;
  while (!stop_.stopped()) {
    const Json create{{"create_request",
                       {{"key", base64(prefix_ + "/q/")},
                        {"range_end", base64(prefix_end(prefix_ + "/q/"))},
                        {"start_revision", std::to_string(next)},
                        {"filters", Json::array({"NOPUT"})}}}};
    try {
      gateway_.stream(
          "/v3/watch", create,
          [&](const Json& message) {
            const Json& result = message.contains("result") ? message["result"] : message;
            if (result.contains("events")) {
              for (const Json& event : result["events"]) {
                if (event.value("type", std::string()) != "DELETE") continue;
                const Json& kv = event["kv"];
                next = std::max(next, integer_of(kv.value("mod_revision", Json())) + 1);
                deleted(unbase64(kv.value("key", std::string())));
              }
            }
            return true;
          },
          stop_);
    } catch (const std::exception&) {
      // etcd out of reach: the session's lease decides whether the claims are still held. Try
      // again shortly, from the last revision seen.
    }
    std::unique_lock lock(mutex_);
    retry_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stop_.stopped(); });
  }
}

}  // namespace tasklet::etcd::detail
