// The etcd backend of a manager's rule table, the managers made with it, and fencing tokens.
#include "etcd/backend.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "etcd/session_access.hpp"
#include "tasklet/error.hpp"
#include "tasklet/job.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet::etcd {
namespace detail {

namespace {

// Calls fn on each atom of a rule: the children of a multi rule, else the rule itself.
template <class F>
void each_atom(const SchedulingRule& rule, F&& fn) {
  const RuleKey key = rule.key();
  if (key.kind != RuleKey::Kind::multi) {
    fn(key);
    return;
  }
  for (const Rule& child : key.children) {
    if (child) fn(child->key());
  }
}

}  // namespace

std::vector<Claim> claims_of(const SchedulingRule& rule) {
  std::vector<Claim> claims;
  each_atom(rule, [&claims](const RuleKey& key) {
    if (key.kind == RuleKey::Kind::path) {
      claims.push_back({std::string(key.path), !key.shared, false});
    } else if (key.kind == RuleKey::Kind::named) {
      claims.push_back({std::string(key.name), true, true});
    }
  });
  return claims;
}

EtcdBackend::EtcdBackend(std::shared_ptr<EtcdSession> session)
    : session_(std::move(session)),
      locks_(SessionAccess::locks(*session_)),
      link_(std::make_shared<Link>(this)) {}

EtcdBackend::~EtcdBackend() {
  std::lock_guard lock(link_->mutex);
  link_->backend = nullptr;
}

bool EtcdBackend::shares(const SchedulingRule& rule) const noexcept {
  bool shared = false;
  each_atom(rule, [&shared](const RuleKey& key) {
    shared = shared || key.kind == RuleKey::Kind::path || key.kind == RuleKey::Kind::named;
  });
  return shared;
}

void EtcdBackend::acquire(RuleTable& table, RuleRequest& request) noexcept {
  std::shared_ptr<Hold> hold;
  std::vector<Claim> claims;
  try {
    claims = claims_of(*requested_rule(request));
    hold = std::make_shared<Hold>(Hold{&request, &table, nullptr});
    std::lock_guard lock(mutex_);
    holds_[&request] = hold;
  } catch (...) {
    // Out of memory: the request cannot be claimed, and is not granted.
    tasklet::detail::abandon(table, request);
    tell_failed(request, std::current_exception());
    return;
  }
  std::shared_ptr<Ticket> ticket;
  try {
    ticket = locks_.request(std::move(claims), {.entered = {},
                                                .granted =
                                                    [link = link_, hold](std::int64_t revision) {
                                                      std::lock_guard lock(link->mutex);
                                                      if (link->backend != nullptr)
                                                        link->backend->granted(hold, revision);
                                                    },
                                                .failed =
                                                    [link = link_, hold](std::exception_ptr why) {
                                                      std::lock_guard lock(link->mutex);
                                                      if (link->backend != nullptr)
                                                        link->backend->refused(hold, std::move(why));
                                                    }});
  } catch (...) {
    refused(hold, std::current_exception());
    return;
  }
  bool withdrawn = false;
  {
    std::lock_guard lock(mutex_);
    withdrawn = hold->over;  // left (or failed) before its ticket was known
    if (!withdrawn) hold->ticket = ticket;
  }
  if (withdrawn) locks_.release(ticket);
}

void EtcdBackend::granted(const std::shared_ptr<Hold>& hold, std::int64_t revision) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (hold->over) return;
    hold->granted = true;
    hold->token = revision;
  }
  tell_granted(*hold->request);
}

void EtcdBackend::refused(const std::shared_ptr<Hold>& hold, std::exception_ptr why) noexcept {
  {
    std::lock_guard lock(mutex_);
    if (hold->over) return;
    hold->over = true;
    hold->ticket.reset();  // the ticket's callbacks keep the hold: no cycle left behind
    const auto found = holds_.find(hold->request);
    if (found != holds_.end() && found->second == hold) holds_.erase(found);
  }
  // On the claims' courier: no table lock is held here.
  tasklet::detail::abandon(*hold->table, *hold->request);
  tell_failed(*hold->request, std::move(why));
}

void EtcdBackend::take_out(const std::shared_ptr<Hold>& hold) noexcept {
  hold->over = true;
  holds_.erase(hold->request);
  // Sent once the table has told whom this lets through (flush): their requests go with it.
  if (hold->ticket) locks_.release(std::exchange(hold->ticket, nullptr), false);  // else acquire() does
}

bool EtcdBackend::leave(RuleRequest& request, bool withdraw) noexcept {
  std::lock_guard lock(mutex_);
  const auto found = holds_.find(&request);
  if (found == holds_.end()) return false;
  const std::shared_ptr<Hold> hold = found->second;
  if (withdraw && hold->granted) return false;
  take_out(hold);
  return true;
}

bool EtcdBackend::pending(const RuleRequest& request) const noexcept {
  std::lock_guard lock(mutex_);
  const auto found = holds_.find(&request);
  return found != holds_.end() && !found->second->granted;
}

void EtcdBackend::moved(const RuleRequest& from, RuleRequest& to) noexcept {
  std::lock_guard lock(mutex_);
  auto node = holds_.extract(&from);
  if (node.empty()) return;
  node.key() = &to;
  node.mapped()->request = &to;
  holds_.insert(std::move(node));
}

void EtcdBackend::flush() noexcept {
  try {
    locks_.flush();
  } catch (...) {
    // Cannot happen (a lock and a notification); the deletion goes with the next request then.
  }
}

std::exception_ptr EtcdBackend::failure() const noexcept {
  std::lock_guard lock(mutex_);
  return failure_;
}

std::vector<RuleBlocker> EtcdBackend::blockers(const RuleRequest& request) const {
  std::shared_ptr<Ticket> ticket;
  {
    std::lock_guard lock(mutex_);
    const auto found = holds_.find(&request);
    if (found == holds_.end() || found->second->granted) return {};
    ticket = found->second->ticket;
  }
  const Locks::Waits waits = ticket ? locks_.waits_of(*ticket) : Locks::Waits{};
  if (!waits.entered) return {RuleBlocker{"etcd (its request is on its way there)", nullptr, false}};
  std::vector<RuleBlocker> found;
  for (const auto& [key, exclusive] : waits.keys) {
    const auto claim = locks_.claim_of_key(key);
    if (!claim) continue;
    char lease[24];
    std::snprintf(lease, sizeof lease, "%llx", static_cast<unsigned long long>(claim->second));
    std::string owner = claim->second == locks_.lease()
                            ? std::string("this process (a release on its way to etcd)")
                            : "the session of etcd lease " + std::string(lease);
    Rule rule = claim->first.named ? rules::named_mutex(claim->first.path)
                : exclusive        ? rules::path(claim->first.path)
                                   : rules::read_path(claim->first.path);
    // Earlier in etcd's order: it holds the rule, or waits for it ahead of this request.
    found.push_back(RuleBlocker{std::move(owner), std::move(rule), false});
  }
  return found;
}

std::vector<std::shared_ptr<Job>> EtcdBackend::lose(const std::string& why) {
  std::vector<std::shared_ptr<Job>> holding;
  std::lock_guard lock(mutex_);
  if (!failure_) failure_ = std::make_exception_ptr(EtcdLeaseLost("etcd: " + why));
  // Under the lock a held request cannot leave (leave() takes it), so its owner is alive.
  for (const auto& [request, hold] : holds_) {
    if (!hold->granted) continue;
    if (auto job = tasklet::detail::job_holding(*request)) holding.push_back(std::move(job));
  }
  return holding;
}

std::optional<std::int64_t> EtcdBackend::token(const RuleRequest& request) const {
  // Past the lease's TTL without an answered renewal the token may be another holder's already:
  // the loss is declared now (its listeners run here, and set failure_). When another thread
  // declared it, the caller hears of it only once the monitors it cancels are canceled.
  const bool lost = locks_.lose_if_expired();
  if (lost) SessionAccess::wait_until_loss_told(*session_);
  std::lock_guard lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
  if (lost) std::rethrow_exception(locks_.loss());  // a listener told before this backend's asks
  const auto found = holds_.find(&request);
  if (found == holds_.end() || !found->second->granted) return std::nullopt;
  return found->second->token;
}

}  // namespace detail

std::shared_ptr<JobManager> make_job_manager(const std::shared_ptr<EtcdSession>& session,
                                             JobManager::Options options) {
  if (!session) throw std::invalid_argument("etcd: make_job_manager needs a session");
  auto backend = std::make_shared<detail::EtcdBackend>(session);
  std::shared_ptr<JobManager> manager = JobManager::create(std::move(options));
  tasklet::detail::install_rule_backend(*manager, backend);
  // A lost lease voids the tokens, and cancels the monitors of the jobs whose runs held rules
  // through it (they should stop writing). The manager owns the backend: a weak reference to it.
  std::weak_ptr<JobManager> weak_manager = manager;
  detail::EtcdBackend* lost = backend.get();
  session->on_lease_lost([weak_manager, lost](const std::string& why) {
    const std::shared_ptr<JobManager> alive = weak_manager.lock();
    if (!alive) return;  // and with it the backend
    for (const std::shared_ptr<Job>& job : lost->lose(why)) job->cancel();
  });
  return manager;
}

std::int64_t fencing_token(const JobManager& manager, const Rule& rule) {
  auto* backend = dynamic_cast<detail::EtcdBackend*>(tasklet::detail::rule_backend_of(manager));
  if (backend == nullptr) throw IllegalState("fencing_token: the manager was not made with an etcd session");
  if (!rule || !backend->shares(*rule))
    throw IllegalState("fencing_token(" + describe(rule) + "): the rule is not shared through etcd");
  // The calling code's own requests in this manager, outermost first.
  const std::vector<const tasklet::detail::RuleRequest*> mine = tasklet::detail::requests_held_here(manager);
  for (const tasklet::detail::RuleRequest* request : mine) {
    const SchedulingRule* held = requested_rule(*request);
    if (held == nullptr || (held != rule.get() && !held->contains(*rule))) continue;
    if (const std::optional<std::int64_t> token = backend->token(*request)) return *token;
  }
  throw IllegalState("fencing_token(" + describe(rule) +
                     "): the calling code holds no rule of this manager that contains it");
}

}  // namespace tasklet::etcd
