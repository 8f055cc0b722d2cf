// Private: room in a container for what is about to be pushed, taken before anything changes, so
// that running out of memory leaves things as they were (the pushes that follow cannot fail).
#pragma once

#include <algorithm>
#include <cstddef>

namespace tasklet::detail {

/// Room for `more` elements in `container` (a vector or a small_vector), growing geometrically
/// as push_back does.
/// Throws std::bad_alloc.
template <class Container>
void room_for(Container& container, std::size_t more = 1) {
  const std::size_t needed = container.size() + more;
  if (needed > container.capacity()) container.reserve(std::max(needed, 2 * container.capacity()));
}

}  // namespace tasklet::detail
