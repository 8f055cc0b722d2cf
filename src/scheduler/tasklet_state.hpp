// Private: the engine's view of a Tasklet.
//
// A tasklet's state word (Tasklet::state_) packs everything that several threads race on, so that
// each transition is one compare-and-swap:
//   bits 0-1  phase: idle (not scheduled), active (queued, running, waiting for its rule), parked
//   bit  2    armed: a Rescheduler is outstanding for the current suspension
//   bit  3    resumed: that Rescheduler was used before the phase returned wait (the sticky resume)
//   bits 4-5  the directive given to resume
//   bits 32+  suspension generation: tells stale Reschedulers from the current one
// Only the thread that owns the tasklet's progress (the one running or dispatching it) moves it
// between idle, active and parked; resume() only sets `resumed` or takes a parked tasklet back.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

#include "tasklet/tasklet.hpp"

namespace tasklet::detail {

namespace word {
inline constexpr std::uint64_t idle = 0;
inline constexpr std::uint64_t active = 1;
inline constexpr std::uint64_t parked = 2;
inline constexpr std::uint64_t phase_mask = 3;
inline constexpr std::uint64_t armed = 1u << 2;
inline constexpr std::uint64_t resumed = 1u << 3;
inline constexpr int resume_shift = 4;
inline constexpr std::uint64_t resume_mask = 3u << resume_shift;
inline constexpr int generation_shift = 32;

constexpr std::uint64_t phase(std::uint64_t word) noexcept { return word & phase_mask; }
constexpr std::uint32_t generation(std::uint64_t word) noexcept {
  return static_cast<std::uint32_t>(word >> generation_shift);
}
constexpr std::uint64_t with_generation(std::uint64_t word, std::uint32_t generation) noexcept {
  return (word & 0xffffffffu) | (std::uint64_t{generation} << generation_shift);
}
constexpr Directive resume_directive(std::uint64_t word) noexcept {
  return static_cast<Directive>((word & resume_mask) >> resume_shift);
}
constexpr std::uint64_t resumed_with(Directive directive) noexcept {
  return resumed | (std::uint64_t{static_cast<std::uint8_t>(directive)} << resume_shift);
}
}  // namespace word

class RuleRequest;

}  // namespace tasklet::detail

/// The engine's access to a tasklet's bookkeeping (a nested class of Tasklet: it may read it).
class tasklet::Tasklet::Engine {
 public:
  static std::atomic<std::uint64_t>& state(Tasklet& tasklet) noexcept { return tasklet.state_; }
  static Scheduler* scheduler(const Tasklet& tasklet) noexcept {
    return tasklet.scheduler_.load(std::memory_order_relaxed);
  }
  static void set_scheduler(Tasklet& tasklet, Scheduler* scheduler) noexcept {
    tasklet.scheduler_.store(scheduler, std::memory_order_relaxed);
  }
  static detail::RuleRequest* hold(const Tasklet& tasklet) noexcept {
    return static_cast<detail::RuleRequest*>(tasklet.hold_);
  }
  static void set_hold(Tasklet& tasklet, detail::RuleRequest* hold) noexcept { tasklet.hold_ = hold; }
  static bool has_name(const Tasklet& tasklet) noexcept { return tasklet.name_ != nullptr; }
  /// Sets the rule without validating it, for a rule the library validated already (an inactive
  /// tasklet).
  static void set_trusted_rule(Tasklet& tasklet, Rule rule) noexcept { tasklet.rule_ = std::move(rule); }
};

namespace tasklet::detail {
using TaskletAccess = Tasklet::Engine;
}  // namespace tasklet::detail
