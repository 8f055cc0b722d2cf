// Private: claims on resources held in etcd, granted in the order etcd saw them.
//
// A request puts one key per claim, all in one transaction, so they share one revision: the
// request's ticket (and the holder's fencing token). The same transaction reads where conflicting
// keys can be. It is granted once every earlier request
// (lower revision) with a conflicting claim is gone, which is etcd's own lock recipe (wait for the
// deletion of the conflicting keys with lower revisions) extended to a tree: a claim on a path
// conflicts with claims on the same path, on its ancestors and on its descendants, unless both
// are shared. Later requests never hold an earlier one back, so conflicting requests are granted
// in revision order (strict FIFO) and non-conflicting ones never wait for each other.
//
// Keys: <prefix>/q<path>/\x01/<lease hex>-<sequence>, value "X" or "S". A claim's own keys and its
// descendants' are one range (<prefix>/q<path>/), its ancestors' one small range each. Every key is
// bound to the session's lease.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gateway.hpp"

namespace tasklet::etcd::detail {

/// One resource of a request: a normalised absolute path ("/" included), held shared or exclusive.
struct Claim {
  std::string path;
  bool exclusive = true;
};

/// A request's state, shared by its owner and the watcher.
struct Ticket {
  std::int64_t revision = 0;       // the request's; its fencing token once granted
  std::vector<std::string> keys;   // its own keys
  std::set<std::string> blockers;  // earlier conflicting keys not yet seen deleted
  std::function<void(std::int64_t)> granted;
  bool answered = false;  // granted was called (or the ticket was released first)
};

class Locks {
 public:
  /// Watches <prefix>/q from now on (a thread of its own).
  Locks(Gateway& gateway, std::string prefix, std::int64_t lease);
  /// Stops the watch. Outstanding tickets are not released: the lease's revocation deletes them.
  ~Locks();
  Locks(const Locks&) = delete;
  Locks& operator=(const Locks&) = delete;

  /// Enters a request for `claims` and returns its ticket; `granted(revision)` is called once it
  /// holds them, at once on this thread or later on the watcher's. Throws what the gateway throws.
  std::shared_ptr<Ticket> request(const std::vector<Claim>& claims,
                                  std::function<void(std::int64_t)> granted);
  /// Deletes the ticket's keys: a release, or the withdrawal of a request still waiting (its
  /// granted is then never called).
  void release(const std::shared_ptr<Ticket>& ticket);

 private:
  std::string node_prefix(const std::string& path) const;  // <prefix>/q<path>/
  std::string queue_key(const std::string& path) const;    // node_prefix(path) + "\x01/"
  // Where a claim's conflicting keys can be: its node's subtree and each ancestor's own keys.
  std::vector<std::pair<std::string, std::string>> ranges_of(const Claim& claim) const;
  // The keys of a range answer that an earlier request holds in a mode that conflicts with `claim`.
  static void add_blockers(const Json& range, const Claim& claim, std::int64_t revision,
                           std::set<std::string>& blockers);
  void watch();
  void deleted(const std::string& key);

  Gateway& gateway_;
  std::string prefix_;
  std::int64_t lease_;
  std::int64_t start_revision_ = 0;
  std::mutex mutex_;  // guards what follows
  std::uint64_t sequence_ = 0;
  std::map<std::string, std::set<std::shared_ptr<Ticket>>> waiting_on_;  // blocker key -> tickets
  std::condition_variable retry_;  // the watcher waits on it before it watches again
  StreamStop stop_;
  std::thread watcher_;
};

}  // namespace tasklet::etcd::detail
