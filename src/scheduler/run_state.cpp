// The thread's own RunState (run_state.hpp).
#include "scheduler/run_state.hpp"

namespace tasklet::detail {

RunState& install_thread_state() noexcept {
  thread_local RunState own;
  context().state = &own;
  return own;
}

}  // namespace tasklet::detail
