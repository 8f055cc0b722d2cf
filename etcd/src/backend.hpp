// Private: the rule table's backend for a manager made with an etcd session (make_job_manager).
// Path rules, named mutexes and the multi rules with such parts are claimed in etcd once the table
// has granted them here (rule_backend.hpp says why that order cannot deadlock); every other rule
// stays in this process.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/rule_backend_door.hpp"
#include "etcd/locks.hpp"
#include "tasklet/etcd/etcd.hpp"

namespace tasklet::etcd::detail {

/// What a rule claims in etcd: its path parts and its names (nothing for other rules).
std::vector<Claim> claims_of(const SchedulingRule& rule);

class EtcdBackend final : public tasklet::detail::RuleBackend {
 public:
  using RuleRequest = tasklet::detail::RuleRequest;
  using RuleTable = tasklet::detail::RuleTable;

  explicit EtcdBackend(std::shared_ptr<EtcdSession> session);
  /// Waits for the claims' callbacks under way; later ones find it gone.
  ~EtcdBackend() override;
  EtcdBackend(const EtcdBackend&) = delete;
  EtcdBackend& operator=(const EtcdBackend&) = delete;

  bool shares(const SchedulingRule& rule) const noexcept override;
  void acquire(RuleTable& table, RuleRequest& request) noexcept override;
  bool leave(RuleRequest& request, bool withdraw) noexcept override;
  bool pending(const RuleRequest& request) const noexcept override;
  void moved(const RuleRequest& from, RuleRequest& to) noexcept override;
  std::exception_ptr failure() const noexcept override;
  void flush() noexcept override;
  /// The earlier requests in etcd it waits for, each named by the session (lease) that made it.
  std::vector<RuleBlocker> blockers(const RuleRequest& request) const override;

  /// The session's lease is gone: tokens are void, holders are told at their next begin_rule or
  /// end_rule. Requests waiting in etcd fail through the claims (lease_lost there). Returns the
  /// jobs whose runs hold shared rules (their own, or taken with begin_rule or hold), to cancel.
  std::vector<std::shared_ptr<Job>> lose(const std::string& why);
  /// The fencing token of a request held here and in etcd; nothing when the request is not a
  /// granted one of this backend. Throws EtcdLeaseLost once the lease is lost.
  std::optional<std::int64_t> token(const RuleRequest& request) const;
  const std::shared_ptr<EtcdSession>& session() const noexcept { return session_; }

 private:
  // One request's way through etcd, shared with the claims' callbacks (which may outlive it).
  struct Hold {
    RuleRequest* request;
    RuleTable* table;
    std::shared_ptr<Ticket> ticket;  // set once the claims have it
    std::int64_t token = 0;
    bool granted = false;
    bool over = false;  // left the backend: the callbacks do nothing
  };
  void granted(const std::shared_ptr<Hold>& hold, std::int64_t revision) noexcept;
  void refused(const std::shared_ptr<Hold>& hold, std::exception_ptr why) noexcept;
  // Under mutex_: takes `hold` out, and gives its ticket to `released` when it has one.
  void take_out(const std::shared_ptr<Hold>& hold) noexcept;

  // The claims' callbacks reach the backend through this, never keeping it alive: the backend goes
  // with its table, and its session (whose threads run the callbacks) must not go on them.
  struct Link {
    explicit Link(EtcdBackend* to) noexcept : backend(to) {}
    std::mutex mutex;
    EtcdBackend* backend;
  };

  std::shared_ptr<EtcdSession> session_;
  Locks& locks_;
  std::shared_ptr<Link> link_;
  mutable std::mutex mutex_;  // guards what follows
  std::unordered_map<const RuleRequest*, std::shared_ptr<Hold>> holds_;
  std::exception_ptr failure_;
};

}  // namespace tasklet::etcd::detail
