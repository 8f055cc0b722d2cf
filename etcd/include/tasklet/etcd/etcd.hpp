// tasklet/etcd/etcd.hpp: a session with an etcd v3 cluster, the coordinator that shares rules
// across processes (target tasklet::etcd).
//
// connect() reaches one of the endpoints, signs in when a user is given, takes a lease of
// `lease_ttl` and checks that the session may write under `prefix`; from then on a background
// thread keeps the lease alive. Everything the session puts in etcd is bound to the lease, so a
// process that dies (or pauses past the TTL) frees its keys when the lease expires. Destroying the
// session revokes the lease.
//
// It speaks etcd's v3 JSON gateway (the /v3/... endpoints of etcd 3.4 and later) through libcurl.
#pragma once

#include "tasklet/export.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tasklet/error.hpp"
#include "tasklet/job_manager.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet::etcd {

namespace detail {
struct SessionAccess;
}  // namespace detail

/// Any failure to talk to etcd.
class TASKLET_EXPORT EtcdError : public Error {
 public:
  using Error::Error;
};
/// No endpoint answered (down, unreachable, or too slow for `request_timeout`).
class TASKLET_EXPORT EtcdUnavailable : public EtcdError {
 public:
  using EtcdError::EtcdError;
};
/// etcd refused the user name or password, or asked for them when none were given.
class TASKLET_EXPORT EtcdAuthFailed : public EtcdError {
 public:
  using EtcdError::EtcdError;
};
/// The user's roles do not allow what was asked (writing under the prefix, say).
class TASKLET_EXPORT EtcdPermissionDenied : public EtcdError {
 public:
  using EtcdError::EtcdError;
};

/// The session's lease was lost (it expired while this process was paused or cut off from etcd,
/// or someone revoked it): the rules held through it are no longer held in etcd, and their fencing
/// tokens are void. Thrown to begin_rule and end_rule callers that held such rules, and by
/// fencing_token(); the reason it carries cancels waiting requests.
class TASKLET_EXPORT EtcdLeaseLost : public EtcdError {
 public:
  using EtcdError::EtcdError;
};

struct TASKLET_EXPORT EtcdOptions {
  /// Client URLs, tried in order ("http://127.0.0.1:2379"); https:// ones use the TLS settings.
  std::vector<std::string> endpoints{};
  /// Every key of the session lives under it.
  std::string prefix = "/tasklet";
  /// The lease's time to live; the session renews it every third of that.
  std::chrono::seconds lease_ttl{10};
  /// Signs in when not empty.
  std::string user{};
  std::string password{};
  /// TLS: the CA bundle that verifies the server, and a client certificate and key (PEM files).
  std::string ca_file{};
  std::string cert_file{};
  std::string key_file{};
  /// How long one request (and one attempt to connect to an endpoint) may take.
  std::chrono::milliseconds request_timeout{2000};
};

/// A session with etcd. Thread-safe.
class TASKLET_EXPORT EtcdSession {
 public:
  /// Connects (see the header comment). Throws std::invalid_argument for options without an
  /// endpoint or with a TTL under 2 s; EtcdUnavailable when no endpoint answers, EtcdAuthFailed,
  /// EtcdPermissionDenied when the user may not write under the prefix, EtcdError for anything
  /// else etcd answers. Never waits longer than request_timeout per endpoint and request.
  static std::shared_ptr<EtcdSession> connect(EtcdOptions options);

  /// Revokes the lease (best effort: an etcd out of reach lets it expire) and stops renewing it.
  ~EtcdSession();
  EtcdSession(const EtcdSession&) = delete;
  EtcdSession& operator=(const EtcdSession&) = delete;

  const EtcdOptions& options() const noexcept;
  /// The lease every key of the session is bound to.
  std::int64_t lease_id() const noexcept;
  /// The endpoint that answered last.
  std::string endpoint() const;
  /// False once the lease was lost (it expired, or was revoked by someone else); it never comes
  /// back.
  bool lease_alive() const noexcept;
  /// How many times the lease was renewed so far.
  std::uint64_t renewals() const noexcept;
  /// Called once when the lease is found lost, on the thread that finds it (the renewing one, the
  /// one that follows etcd's deletions, or a fencing_token caller); immediately when it was lost
  /// already. The lease counts as lost once no renewal was answered within its TTL, counted from
  /// when that renewal was sent, before etcd says so. Must not block for long.
  void on_lease_lost(std::function<void(const std::string& why)> listener);

  class Impl;

 private:
  friend struct detail::SessionAccess;  // the library's own parts (the claims in etcd)
  explicit EtcdSession(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

/// A JobManager that shares rules with every manager made on the same etcd cluster and prefix,
/// in this process or another: its path rules (shared and exclusive), named mutexes
/// (rules::named_mutex) and multi rules with such parts are held in etcd as well as in its own
/// table, for tasklets, jobs, begin_rule and serial executors alike. Identity mutexes
/// (rules::mutex) and custom rules stay in this process. A request is granted here first (in FIFO
/// order with this manager's other requests), then in etcd (in revision order with every other
/// process's); a holder's fencing_token is that revision. When the session's lease is lost, the
/// monitors of running jobs whose rules are shared are canceled, requests still waiting are
/// canceled, and begin_rule and end_rule throw EtcdLeaseLost to threads that held shared rules;
/// the session's on_lease_lost listeners are told. A manager cannot share again after that: make
/// a new session and manager. The manager keeps the session alive. Throws std::invalid_argument
/// for a null session, std::bad_alloc. See docs/distributed.md.
TASKLET_EXPORT std::shared_ptr<JobManager> make_job_manager(const std::shared_ptr<EtcdSession>& session,
                                                            JobManager::Options options = {});

/// The fencing token under which the calling code (a begin_rule scope on this thread, or the
/// running tasklet's or job's own rule or hold) holds `rule`, or a rule containing it, in etcd:
/// the revision at which etcd entered its request. Strictly larger than the token of every earlier
/// conflicting holder, so a store that remembers the largest token it saw can refuse a late
/// writer. Throws IllegalState when `manager` was not made by make_job_manager, when the rule is
/// not shared, or when the calling code holds no such rule; EtcdLeaseLost once the lease is lost.
TASKLET_EXPORT std::int64_t fencing_token(const JobManager& manager, const Rule& rule);

}  // namespace tasklet::etcd
