// Private: what the library's other parts reach in a session.
#pragma once

#include "locks.hpp"
#include "tasklet/etcd/etcd.hpp"

namespace tasklet::etcd::detail {

struct SessionAccess {
  /// The session's claims in etcd (bound to its lease).
  static Locks& locks(EtcdSession& session) noexcept;
};

}  // namespace tasklet::etcd::detail
