// The session: sign in, a lease, a key that proves the session may write under its prefix, and a
// thread that renews the lease every third of its TTL until the session goes or the lease is lost.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "etcd/gateway.hpp"
#include "etcd/locks.hpp"
#include "etcd/session_access.hpp"
#include "tasklet/etcd/etcd.hpp"

namespace tasklet::etcd {

using detail::base64;
using detail::integer_of;
using detail::Json;

class EtcdSession::Impl {
 public:
  explicit Impl(EtcdOptions options) : gateway(std::move(options)) {}
  ~Impl() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    if (renewer.joinable()) renewer.join();
    locks.reset();  // its watch before the revocation below deletes its keys
    if (lease_id != 0 && alive.load()) {
      try {
        gateway.call("/v3/lease/revoke", Json{{"ID", std::to_string(lease_id)}});
      } catch (const std::exception&) {
        // Out of reach: the lease expires by itself after its TTL.
      }
    }
  }

  void start() {
    const EtcdOptions& options = gateway.options();
    gateway.authenticate();
    const auto asked = std::chrono::steady_clock::now();
    const Json granted = gateway.call("/v3/lease/grant", Json{{"TTL", options.lease_ttl.count()}});
    lease_id = integer_of(granted.value("ID", Json()));
    if (lease_id == 0) throw EtcdError("etcd: the lease grant gave no lease ID: " + granted.dump());
    // The session's own key, bound to the lease: writing it proves the session may write under the
    // prefix (EtcdPermissionDenied at connect, rather than at the first rule).
    char id[32];
    std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(lease_id));
    session_key = options.prefix + "/sessions/" + id;
    const Json put = gateway.call(
        "/v3/kv/put",
        Json{{"key", base64(session_key)}, {"value", base64("alive")}, {"lease", std::to_string(lease_id)}});
    const std::int64_t put_at = integer_of(put["header"].value("revision", Json()));
    const std::chrono::seconds ttl(std::max<std::int64_t>(1, integer_of(granted.value("TTL", Json()))));
    locks =
        std::make_unique<detail::Locks>(gateway, options.prefix, lease_id, session_key, put_at, asked + ttl,
                                        [this](const std::string& why) { lose(why, false); });
    renewer = std::thread([this] { renew(); });
  }

  // Renews the lease every third of its TTL. A lease that etcd no longer knows, or that had no
  // renewal answered within its TTL (counted from when that renewal was sent), is lost: the
  // renewing thread wakes, and an attempt gives up, by that moment.
  void renew() {
    using Clock = std::chrono::steady_clock;
    const auto ttl = std::chrono::duration_cast<Clock::duration>(gateway.options().lease_ttl);
    std::unique_lock lock(mutex);
    while (!stopping) {
      wake.wait_until(lock, std::min(Clock::now() + ttl / 3, locks->alive_until()),
                      [this] { return stopping; });
      if (stopping) return;
      lock.unlock();
      if (locks->lose_if_expired()) return;  // told through the Locks
      std::string lost_because;
      try {
        const auto sent = Clock::now();
        const auto until_expiry = std::chrono::ceil<std::chrono::milliseconds>(locks->alive_until() - sent);
        const Json answer = gateway.call("/v3/lease/keepalive", Json{{"ID", std::to_string(lease_id)}},
                                         std::min(until_expiry, gateway.options().request_timeout));
        const Json& result = answer.contains("result") ? answer["result"] : answer;
        if (const std::int64_t left = integer_of(result.value("TTL", Json())); left > 0) {
          locks->renewed(sent, std::chrono::seconds(left));
          renewal_count.fetch_add(1, std::memory_order_release);
        } else {
          lost_because =
              "etcd no longer knows lease " + std::to_string(lease_id) + " (it expired or was revoked)";
        }
      } catch (const std::exception&) {
        // Out of reach: tried again, until the lease may have expired.
      }
      if (!lost_because.empty()) {
        lose(lost_because, true);
        return;
      }
      if (locks->lose_if_expired()) return;
      lock.lock();
    }
  }

  // Once: the lease is gone. `tell_locks`: unless the Locks found it (they failed their requests).
  void lose(const std::string& why, bool tell_locks) {
    std::vector<std::function<void(const std::string&)>> told;
    {
      std::lock_guard lock(mutex);
      if (!alive.load(std::memory_order_relaxed)) return;
      alive.store(false, std::memory_order_release);
      lost_reason = why;
      told.swap(listeners);
    }
    // Nothing waiting in etcd can be granted now; the claims' owners hear why first.
    if (tell_locks) locks->lease_lost(std::make_exception_ptr(EtcdLeaseLost("etcd: " + why)));
    telling = true;
    for (auto& listener : told) {
      try {
        listener(why);
      } catch (...) {
        // A listener's failure does not keep the others from being told.
      }
    }
    telling = false;
    loss_told.store(true, std::memory_order_release);
    loss_told.notify_all();
  }

  void wait_until_loss_told() const noexcept {
    if (!telling) loss_told.wait(false, std::memory_order_acquire);
  }

  detail::Gateway gateway;
  std::int64_t lease_id = 0;
  std::string session_key;
  std::atomic<bool> alive{true};
  std::atomic<std::uint64_t> renewal_count{0};
  // Set once every listener has heard of the loss; `telling` on the thread telling them.
  std::atomic<bool> loss_told{false};
  static inline thread_local bool telling = false;
  std::mutex mutex;  // guards what follows
  std::condition_variable wake;
  bool stopping = false;
  std::string lost_reason;
  std::vector<std::function<void(const std::string&)>> listeners;
  std::thread renewer;
  std::unique_ptr<detail::Locks> locks;
};

detail::Locks& detail::SessionAccess::locks(EtcdSession& session) noexcept { return *session.impl_->locks; }
void detail::SessionAccess::wait_until_loss_told(const EtcdSession& session) noexcept {
  session.impl_->wait_until_loss_told();
}

std::shared_ptr<EtcdSession> EtcdSession::connect(EtcdOptions options) {
  if (options.endpoints.empty()) throw std::invalid_argument("etcd: connect needs at least one endpoint");
  if (options.lease_ttl < std::chrono::seconds(2)) {
    throw std::invalid_argument("etcd: a lease TTL under 2 s cannot be renewed reliably (got " +
                                std::to_string(options.lease_ttl.count()) + " s)");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->start();
  return std::shared_ptr<EtcdSession>(new EtcdSession(std::move(impl)));
}

EtcdSession::EtcdSession(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
EtcdSession::~EtcdSession() = default;

const EtcdOptions& EtcdSession::options() const noexcept { return impl_->gateway.options(); }
std::int64_t EtcdSession::lease_id() const noexcept { return impl_->lease_id; }
std::string EtcdSession::endpoint() const { return impl_->gateway.endpoint(); }
bool EtcdSession::lease_alive() const noexcept { return impl_->alive.load(std::memory_order_acquire); }
std::uint64_t EtcdSession::renewals() const noexcept {
  return impl_->renewal_count.load(std::memory_order_acquire);
}

void EtcdSession::on_lease_lost(std::function<void(const std::string& why)> listener) {
  std::string lost;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->alive.load(std::memory_order_acquire)) {
      impl_->listeners.push_back(std::move(listener));
      return;
    }
    lost = impl_->lost_reason;
  }
  listener(lost);
}

}  // namespace tasklet::etcd
