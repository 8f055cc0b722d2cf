// Private: claims on resources held in etcd, granted in the order etcd saw them.
//
// A request puts one key per claim, all in one transaction, so they share one revision: the
// request's ticket (and the holder's fencing token). The same transaction reads where conflicting
// keys can be. It is granted once every earlier request (lower revision) with a conflicting claim
// is gone, which is etcd's own lock recipe (wait for the deletion of the conflicting keys with
// lower revisions) extended to a tree: a claim on a path conflicts with claims on the same path,
// on its ancestors and on its descendants, unless both are shared; a claim on a name conflicts
// with claims on the same name. Later requests never hold an earlier one back, so conflicting
// requests are granted in revision order (strict FIFO) and non-conflicting ones never wait for
// each other.
//
// A transaction that got no answer may still be applied later (etcd received it and was slow, or
// paused). So that a withdrawn request's keys cannot come back after their deletion, every
// transaction holds only while the session's key (<prefix>/sessions/<lease hex>) has the revision
// the courier last knew: withdrawing a request whose transaction went unanswered rewrites that key
// and deletes the request's keys in one transaction, after which no earlier one can apply.
//
// A grant must not outlive the lease: etcd expires it a TTL after the last renewal it saw, so the
// lease certainly lives only until the last answered renewal's sending plus its TTL. Past that, a
// grant could overlap a process granted after the expiry (this one paused past its TTL reads
// deletions etcd made meanwhile): the lease counts as lost instead.
//
// Nothing here blocks its caller: one thread of the Locks (the courier) sends what callers ask
// for, gathering what came meanwhile into one transaction (deletions first, then the new
// requests' keys and reads), and another (the watcher) follows the deletions. A deletion the
// watcher sees while a transaction is under way is remembered until the courier has registered
// what that transaction read, so no request waits for a key that is gone already.
//
// Keys: <prefix>/c/p<path>/\x01/<lease hex>-<sequence> for a path ("/" is <prefix>/c/p/\x01/...),
// <prefix>/c/n/<name in hex>/\x01/<lease hex>-<sequence> for a name; value "X" or "S". A path's
// own keys and its descendants' are one range (<prefix>/c/p<path>/), each ancestor's own keys one
// small range. Every key is bound to the session's lease.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "etcd/gateway.hpp"

namespace tasklet::etcd::detail {

/// One resource of a request, held shared or exclusive: a normalised absolute path ("/" included),
/// or a name (`named`; always exclusive).
struct Claim {
  std::string path;
  bool exclusive = true;
  bool named = false;
};

/// What a request tells its owner, each at most once, on the courier's or the watcher's thread.
struct TicketCalls {
  /// Its keys are in etcd at `revision`, before it is granted. Called under the Locks' lock:
  /// must not call the Locks.
  std::function<void(std::int64_t revision)> entered{};
  /// It holds its claims; `revision` is its fencing token.
  std::function<void(std::int64_t revision)> granted{};
  /// etcd refused it, or the lease was lost first (not for being unreachable: that is retried);
  /// never granted.
  std::function<void(std::exception_ptr)> failed{};
};

/// A request's state, shared by its owner, the courier and the watcher (under Locks::mutex_).
struct Ticket {
  enum class Stage : std::uint8_t { queued, sent, entered, done };
  std::vector<Claim> claims;
  std::vector<std::string> keys;             // its own keys
  std::int64_t revision = 0;                 // its ticket, once entered; its fencing token once granted
  std::set<std::string> blockers;            // earlier conflicting keys not yet seen deleted
  std::set<std::string> exclusive_blockers;  // those of them held or asked for exclusively
  TicketCalls calls;
  Stage stage = Stage::queued;
  bool granted = false;
  bool released = false;       // by its owner: never granted from then on
  bool unanswered = false;     // a transaction with its keys went unanswered: it may apply later
  std::exception_ptr failure;  // why it failed, for the courier to tell
};

class Locks {
 public:
  using Clock = std::chrono::steady_clock;
  /// Watches <prefix>/c from now on, and sends requests; a thread for each. The lease lives until
  /// `alive_until` (see renewed()). `expired` is called, on one of these threads and outside the
  /// lock, when they find that the lease may have expired (which counts as lost): it must not
  /// destroy the Locks. Throws what the gateway throws (reading the current revision).
  /// `session_key` is the session's key, put at `session_key_revision` and bound to the lease.
  Locks(Gateway& gateway, std::string prefix, std::int64_t lease, std::string session_key,
        std::int64_t session_key_revision, Clock::time_point alive_until,
        std::function<void(const std::string& why)> expired);
  /// Stops both threads. Outstanding tickets are not released: the lease's revocation deletes them.
  ~Locks();
  Locks(const Locks&) = delete;
  Locks& operator=(const Locks&) = delete;

  /// Enters a request for `claims` (not empty) and returns its ticket at once; `calls` tell how it
  /// goes. Never blocks on etcd.
  std::shared_ptr<Ticket> request(std::vector<Claim> claims, TicketCalls calls);
  /// A release, or the withdrawal of a request still waiting (never granted from then on): its keys
  /// are deleted soon. Never blocks on etcd. `send`: at once; else with the next request or flush(),
  /// so that a request this release lets through goes in the same transaction.
  void release(const std::shared_ptr<Ticket>& ticket, bool send = true);
  /// Sends what release() left for later.
  void flush();
  /// The earlier keys a request waits for, with whether each is held or asked for exclusively;
  /// empty once granted. A request not entered yet waits for its transaction: `entered` false.
  struct Waits {
    bool entered = false;
    std::vector<std::pair<std::string, bool>> keys;
  };
  Waits waits_of(const Ticket& ticket);
  /// What a key names: its claim (a path or a name) and the lease of the session that put it.
  std::optional<std::pair<Claim, std::int64_t>> claim_of_key(const std::string& key) const;
  std::int64_t lease() const noexcept { return lease_; }
  /// The session's lease is gone: nothing is sent any more (etcd has deleted the keys already), no
  /// request is granted from now on, and every request not granted yet, or made later, fails with
  /// `why` (told on the courier's thread).
  void lease_lost(const std::exception_ptr& why);
  /// etcd answered a renewal of the lease sent at `sent`, with `ttl`: the lease lives until then.
  void renewed(Clock::time_point sent, std::chrono::seconds ttl) noexcept;
  /// Whether the lease may have expired in etcd by now (no renewal answered within its TTL).
  bool may_have_expired() const noexcept;
  /// Until when the lease certainly lives.
  Clock::time_point alive_until() const noexcept {
    return Clock::time_point(Clock::duration(alive_until_.load(std::memory_order_acquire)));
  }
  /// When the lease may have expired: as lease_lost(), then `expired` is told. Returns whether the
  /// lease is lost (now or before).
  bool lose_if_expired();
  /// Why the lease is lost (EtcdLeaseLost); null while it lives.
  std::exception_ptr loss();

 private:
  std::string node_prefix(const Claim& claim) const;  // a path's subtree, or a name's keys
  std::string queue_key(const Claim& claim) const;    // node_prefix + "\x01/"
  // Where a claim's conflicting keys can be: its node's subtree and each ancestor's own keys.
  std::vector<std::pair<std::string, std::string>> ranges_of(const Claim& claim) const;
  // The keys of a range answer that an earlier request holds in a mode that conflicts with `claim`.
  static void add_blockers(const Json& range, const Claim& claim, std::int64_t revision,
                           std::set<std::string>& blockers, std::set<std::string>& exclusive);
  // Operations a request's transaction takes: a put per claim, and its reads.
  std::size_t operations_of(const Ticket& ticket) const;
  // What the courier owes the tickets' owners, told outside the lock.
  struct Told {
    std::vector<std::shared_ptr<Ticket>> granted;
    std::vector<std::pair<std::shared_ptr<Ticket>, std::exception_ptr>> failed;
    std::string expired;  // why the lease counts as lost now, for `expired_`
  };
  void courier();
  // What one transaction carries: `fenced` deletions go with a rewrite of the session's key.
  struct Batch {
    std::vector<std::string> fenced;
    std::vector<std::string> deletes;
    std::vector<std::shared_ptr<Ticket>> sent;
    std::size_t before_tickets() const noexcept {
      return (fenced.empty() ? 0 : 1 + fenced.size()) + deletes.size();
    }
  };
  // One transaction, if the session's key still has revision `guard`: the rewrite and `fenced`
  // deletions, then `deletes`, then each ticket's puts and reads. Throws what the gateway throws.
  Json send(std::int64_t guard, const Batch& batch) const;
  Batch take_batch();
  void pause_before_retry(std::unique_lock<std::mutex>& lock);
  // How a transaction went: its answer, or etcd out of reach, or refused with an error.
  struct Sent {
    Json answer;
    bool unreachable = false;
    std::exception_ptr refused;
  };
  Sent send_batch(std::int64_t guard, const Batch& batch) const;
  bool settle(Batch& batch, Sent& sent, Told& told);
  // Under the lock: the batch's requests fail with `failure`.
  static void fail_sent(const Batch& batch, const std::exception_ptr& failure, Told& told);
  // Under the lock: nothing of `batch` was applied, or nobody knows (`unanswered`): it goes again.
  void send_again(Batch& batch, bool unanswered);
  // Under the lock: the keys of a withdrawn `ticket` go, with the next transaction, or with a
  // rewrite of the session's key when an unanswered transaction may still put them.
  void delete_keys(const Ticket& ticket);
  // Under the lock: what the transaction answered for the tickets it entered.
  void register_entered(const Json& answer, const Batch& batch, Told& told);
  void watch();
  void watched(const Json& result, std::int64_t& next);
  void deleted(const std::string& key);
  // On the courier's thread, with `lock` held: asks etcd whether keys still waited for exist,
  // letting go of the lock while it asks.
  void recheck(std::unique_lock<std::mutex>& lock);
  void tell(Told& told) noexcept;
  // Under the lock: fails what waits, and everything asked for later, with `why`.
  void fail_all(const std::exception_ptr& why);
  // Under the lock: the lease may have expired, or the session's key is gone; it is lost from now
  // on (told.expired says why).
  void expire(Told& told);
  void key_gone(Told& told);
  // Under the lock: `ticket` is free of blockers.
  void ready(const std::shared_ptr<Ticket>& ticket, Told& told);

  Gateway& gateway_;
  std::string prefix_;
  std::int64_t lease_;
  std::int64_t start_revision_ = 0;
  std::string session_key_;
  std::atomic<Clock::rep> alive_until_;  // Clock's ticks
  std::function<void(const std::string&)> expired_;

  std::mutex mutex_;  // guards what follows
  std::uint64_t sequence_ = 0;
  std::vector<std::shared_ptr<Ticket>> queued_;  // for the courier, in request order
  std::vector<std::string> deletions_;           // keys for the courier to delete
  std::vector<std::string> fenced_deletions_;    // to delete with a rewrite of the session's key
  std::int64_t guard_;                           // the session key's revision the courier knows
  std::map<std::string, std::set<std::shared_ptr<Ticket>>> waiting_on_;  // blocker key -> tickets
  bool sending_ = false;                                                 // a transaction is under way
  std::set<std::string> deleted_while_sending_;                          // the watcher's, meanwhile
  bool stopping_ = false;
  std::exception_ptr lease_lost_;                 // why, once the lease is gone
  std::vector<std::shared_ptr<Ticket>> failing_;  // for the courier to tell
  std::condition_variable work_;                  // the courier waits on it, for work or before a retry
  std::condition_variable retry_;                 // the watcher waits on it before it watches again

  StreamStop stop_;
  std::thread courier_;
  std::thread watcher_;
};

}  // namespace tasklet::etcd::detail
