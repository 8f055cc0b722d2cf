// Private: what the library's other parts reach in a session.
#pragma once

#include "etcd/locks.hpp"
#include "tasklet/etcd/etcd.hpp"

namespace tasklet::etcd::detail {

struct SessionAccess {
  /// The session's claims in etcd (bound to its lease).
  static Locks& locks(EtcdSession& session) noexcept;
  /// Once the lease is lost: returns when the on_lease_lost listeners have all been told (at once
  /// on the thread telling them, which may be the caller's).
  static void wait_until_loss_told(const EtcdSession& session) noexcept;
};

}  // namespace tasklet::etcd::detail
