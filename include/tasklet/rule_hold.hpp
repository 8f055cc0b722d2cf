// tasklet/rule_hold.hpp: the guard of a rule a coroutine took with `co_await tasklet::hold(rule)`
// (see tasklet/coroutine.hpp).
#pragma once

#include "tasklet/export.hpp"

#include <utility>

#include "tasklet/detail/hold.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet {

namespace detail {
struct RuleWait;
}  // namespace detail

/// What `co_await tasklet::hold(rule)` gives: while it lives, the coroutine's tasklet holds the rule
/// (its rule: current_rule() gives it, begin_rule nests in it, and it is held across every later
/// co_await). It releases the rule when it goes, at the end of its scope, or at release(). Destroy
/// or release it in the coroutine that took it (the steps of its tasklet), never after that
/// coroutine ended. Move-only.
class [[nodiscard]] TASKLET_EXPORT RuleHold {
 public:
  RuleHold(RuleHold&& other) noexcept : tasklet_(std::exchange(other.tasklet_, nullptr)) {}
  RuleHold& operator=(RuleHold&&) = delete;
  ~RuleHold() { release(); }
  /// Releases the rule now (later calls do nothing): conflicting holders waiting for it may start.
  void release() noexcept {
    if (tasklet_ != nullptr) detail::end_hold(*std::exchange(tasklet_, nullptr));
  }
  /// Whether this guard has a rule to release: false for a hold nested in the tasklet's own rule
  /// (that one covers it) and after release().
  bool owns_rule() const noexcept { return tasklet_ != nullptr; }

 private:
  friend struct detail::RuleWait;
  explicit RuleHold(Tasklet* tasklet) noexcept : tasklet_(tasklet) {}
  Tasklet* tasklet_;
};

}  // namespace tasklet
