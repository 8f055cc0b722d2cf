// Private: the multi-granularity lock modes that a request's entries take on the rule table's
// nodes, and how they combine (see the top of rule_table.hpp).
#pragma once

#include <cstdint>

namespace tasklet::detail {

/// Multi-granularity lock modes.
enum class LockMode : std::uint8_t { is, ix, s, six, x };
inline constexpr int lock_mode_count = 5;

constexpr int index_of(LockMode mode) noexcept { return static_cast<int>(mode); }

// Multi-granularity locking's compatibility matrix (Gray et al.).
inline constexpr bool compatible[lock_mode_count][lock_mode_count] = {
    //           is     ix     s      six    x
    /* is  */ {true, true, true, true, false},
    /* ix  */ {true, true, false, false, false},
    /* s   */ {true, false, true, false, false},
    /* six */ {true, false, false, false, false},
    /* x   */ {false, false, false, false, false},
};

// Per mode, the bit mask of the modes it is incompatible with.
constexpr std::uint8_t incompatible_modes(int mode) noexcept {
  std::uint8_t mask = 0;
  for (int other = 0; other < lock_mode_count; ++other) {
    if (!compatible[mode][other]) mask = static_cast<std::uint8_t>(mask | (1u << other));
  }
  return mask;
}
inline constexpr std::uint8_t incompatible_mask[lock_mode_count] = {
    incompatible_modes(0), incompatible_modes(1), incompatible_modes(2), incompatible_modes(3),
    incompatible_modes(4)};

// The weakest mode that is at least as strong as both (for one request's entries on one node).
constexpr LockMode supremum(LockMode a, LockMode b) noexcept {
  if (a == b) return a;
  if (a == LockMode::x || b == LockMode::x) return LockMode::x;
  if (a == LockMode::six || b == LockMode::six) return LockMode::six;
  if (a == LockMode::is) return b;
  if (b == LockMode::is) return a;
  return LockMode::six;  // ix with s
}

}  // namespace tasklet::detail
