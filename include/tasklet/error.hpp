// tasklet/error.hpp: the typed exceptions the library throws for misuse and bad input.
//
// Every error derives from tasklet::Error, itself a std::logic_error, and its message names the
// rule, tasklet or job concerned. Failures inside user work are not wrapped: the user's own
// exception is captured and rethrown (Scheduler::run, Job results).
#pragma once

#include "tasklet/export.hpp"

#include <stdexcept>
#include <string>

namespace tasklet {

/// Base of every exception the library throws for misuse or bad input.
class TASKLET_EXPORT Error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// `async` was asked of a scheduler whose run() is not active.
class TASKLET_EXPORT SchedulerNotRunning : public Error {
 public:
  using Error::Error;
};

/// A tasklet was scheduled while already scheduled, running, waiting for its rule or parked;
/// suspended by a thread that does not own it, again while its Rescheduler is outstanding, or
/// while it is parked in another scheduler.
class TASKLET_EXPORT AlreadyScheduled : public Error {
 public:
  using Error::Error;
};

/// A Rescheduler was resumed twice, or after its suspension had ended; or (as a tasklet's failure)
/// a tasklet resumed before its phase returned was continued by that phase with something other
/// than wait.
class TASKLET_EXPORT AlreadyResumed : public Error {
 public:
  using Error::Error;
};

/// A parked tasklet that nothing could resume any more (no Rescheduler for it alive, no owner
/// outside its scheduler) was ended; the message names it.
class TASKLET_EXPORT TaskletLost : public Error {
 public:
  using Error::Error;
};

/// A tasklet's rule or name was changed while the tasklet was active, or a job's settings that
/// need it (its name, rule, group, system and user flags) while the job was not in state none.
class TASKLET_EXPORT TaskletActive : public Error {
 public:
  using Error::Error;
};

/// begin_rule was given a rule that the rule already held by the thread does not contain.
class TASKLET_EXPORT RuleNotContained : public Error {
 public:
  using Error::Error;
};

/// end_rule named a rule other than the most recent begin_rule on this thread; or (as the failure
/// of a phase or a job's run) rules it began were still open at its end (they are released).
class TASKLET_EXPORT RuleMismatch : public Error {
 public:
  using Error::Error;
};

/// A rule breaks the laws every rule must keep (see SchedulingRule), or cannot be built from its
/// input.
class TASKLET_EXPORT InvalidRule : public Error {
 public:
  using Error::Error;
};

/// A path rule was given a path that cannot be normalised.
class TASKLET_EXPORT InvalidPath : public InvalidRule {
 public:
  using InvalidRule::InvalidRule;
};

/// A call was made in a context where it cannot work (for example run() re-entered from inside
/// one of its own phases, which would wait for itself).
class TASKLET_EXPORT IllegalState : public Error {
 public:
  using Error::Error;
};

/// A wait that could never end, found at the moment of the wait: the calling code holds a rule
/// that the work it would wait for needs (directly, or behind other requests that wait for it).
/// The message names the cycle: who waits for what, behind whom, and what the caller holds.
class TASKLET_EXPORT WaitCycle : public IllegalState {
 public:
  using IllegalState::IllegalState;
};

}  // namespace tasklet
