#include "context.hpp"

namespace tasklet::detail {

ThreadContext& context() noexcept {
  thread_local ThreadContext ctx;
  return ctx;
}

}  // namespace tasklet::detail
