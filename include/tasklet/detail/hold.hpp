// tasklet/detail/hold.hpp: the engine's side of a coroutine's `co_await tasklet::hold(rule)`.
// Not part of the public API: the names may change.
#pragma once

#include "tasklet/export.hpp"

#include <exception>

#include "tasklet/scheduling_rule.hpp"

namespace tasklet {
class Tasklet;
}

namespace tasklet::detail {

/// How a hold was answered.
enum class HoldAnswer : unsigned char {
  waiting,   // not yet: the tasklet is suspended and its phase must return wait
  nested,    // its tasklet holds a rule containing this one: nothing to take or release
  granted,   // the tasklet holds the rule (its rule from now on) until end_hold or its end
  canceled,  // its job manager shut down or its scheduler went while it waited
  refused,   // out of memory in the rule table: it never waited
  failed,    // a backend of the rule table (etcd) could not grant it: HoldReply::failure says why
};

/// How a waiting hold was answered, set by the engine before it resumes the tasklet.
struct TASKLET_EXPORT HoldReply {
  HoldAnswer answer = HoldAnswer::waiting;
  std::exception_ptr failure{};  // with failed
};

/// In a phase of `tasklet` (on the thread running it): takes `rule` for the tasklet. Answers at once
/// (nested, granted, canceled, refused, failed: `later` says why) when it can, else suspends the
/// tasklet, returns waiting,
/// and sets `later` before the tasklet is resumed (where the phase was: sync or async). Throws
/// IllegalState outside the tasklet's phase, with begin_rule scopes open in the phase, or when its
/// rule was transferred away; RuleNotContained when the tasklet holds a rule that does not contain
/// `rule`; InvalidRule; AlreadyScheduled when the tasklet is suspended already; std::bad_alloc.
TASKLET_EXPORT HoldAnswer begin_hold(Tasklet& tasklet, const Rule& rule, HoldReply& later);

/// Releases the rule a granted begin_hold took, and the tasklet has no rule again (nothing when the
/// tasklet's end released it already).
TASKLET_EXPORT void end_hold(Tasklet& tasklet) noexcept;

}  // namespace tasklet::detail
