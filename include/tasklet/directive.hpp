// tasklet/directive.hpp: what a tasklet's phase asks of the scheduler next.
#pragma once

#include <cstdint>
#include <string_view>

namespace tasklet {

/// The value a Tasklet's task() returns: how it is to be run next.
enum class Directive : std::uint8_t {
  sync,   ///< next phase on the scheduler's synchronous thread (the thread inside run())
  async,  ///< next phase on a worker thread, never on the synchronous thread
  wait,   ///< parked until a Rescheduler resumes it; run() does not return meanwhile, unless
          ///< nothing can resume it any more (it then ends with TaskletLost)
  done,   ///< finished: the scheduler drops its references and releases the tasklet's rule
};

/// "sync", "async", "wait" or "done".
constexpr std::string_view to_string(Directive d) noexcept {
  switch (d) {
    case Directive::sync:
      return "sync";
    case Directive::async:
      return "async";
    case Directive::wait:
      return "wait";
    case Directive::done:
      return "done";
  }
  return "?";
}

}  // namespace tasklet
