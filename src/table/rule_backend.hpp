// Private: a second authority behind a rule table, which shares some rules beyond this process
// (tasklet::etcd installs one). The table decides first, as always; a request whose rule the
// backend shares is told of its grant only once the backend has granted it as well.
//
// Why the two orders cannot deadlock: a request enters the backend only once it holds its rule in
// the table, so it never waits in the table while it waits in the backend; and in the backend it
// waits only for requests the backend saw earlier. The earliest request waiting in the backend
// therefore waits for holders only, which run and release.
//
// Lock order: the table's lock, then the backend's. The backend calls into the table (abandon)
// and into requests (granted, failed) without its own lock held.
#pragma once

#include <exception>
#include <vector>

#include "tasklet/scheduling_rule.hpp"

namespace tasklet::detail {

class RuleRequest;
class RuleTable;

class RuleBackend {
 public:
  virtual ~RuleBackend() = default;

  /// Whether requests for `rule` go through the backend. Called under the table's lock: reads the
  /// rule's key only. Must answer the same for a rule every time.
  virtual bool shares(const SchedulingRule& rule) const noexcept = 0;

  /// The table granted `request`, whose rule the backend shares (outside the table's lock, on the
  /// thread that would have told the request). The backend calls request.granted() once it holds
  /// the rule too; when it cannot, table.abandon(request) and then request.failed(why).
  virtual void acquire(RuleTable& table, RuleRequest& request) noexcept = 0;

  /// Under the table's lock: a request acquire() took leaves the table. `withdraw`: only if the
  /// backend has not granted it yet (true then, and it never calls granted()); otherwise it is
  /// released (a holder's leave) and the answer is true.
  virtual bool leave(RuleRequest& request, bool withdraw) noexcept = 0;

  /// After the table has told the requests a change let through (outside its lock): what leave()
  /// started may go out now, together with what those grants acquire(), as one step.
  virtual void flush() noexcept = 0;

  /// Under the table's lock: whether acquire() took `request` and has not answered yet.
  virtual bool pending(const RuleRequest& request) const noexcept = 0;

  /// Under the table's lock: a held request's place moved to `to` (RuleTable::hand_over).
  virtual void moved(const RuleRequest& from, RuleRequest& to) noexcept = 0;

  /// Under the table's lock: whom `request`, which waits in the backend (pending()), waits for
  /// there, as RuleTable::blockers says it for the table.
  virtual std::vector<RuleBlocker> blockers(const RuleRequest& request) const = 0;

  /// Why the backend cancels what it cannot grant any more (a lost lease), else null.
  virtual std::exception_ptr failure() const noexcept = 0;
};

}  // namespace tasklet::detail
