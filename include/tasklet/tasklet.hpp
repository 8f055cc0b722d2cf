// tasklet/tasklet.hpp: the unit of co-operative work.
//
// A Tasklet has one method, task(), called by a Scheduler once per phase; the Directive it returns
// says how it runs next (sync, async, wait, done). Tasklets are owned by std::shared_ptr: the
// scheduler keeps a reference while the tasklet is active and drops it when the tasklet is done.
// A tasklet may carry a scheduling rule, held from before its first phase until it is done.
#pragma once

#include "tasklet/export.hpp"

#include <atomic>
#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "tasklet/detail/allocator.hpp"
#include "tasklet/directive.hpp"
#include "tasklet/scheduling_rule.hpp"

namespace tasklet {

class Scheduler;

/// Subclass it and implement task(), or wrap a callable with make_tasklet().
class TASKLET_EXPORT Tasklet : public std::enable_shared_from_this<Tasklet> {
 public:
  virtual ~Tasklet();
  Tasklet(const Tasklet&) = delete;
  Tasklet& operator=(const Tasklet&) = delete;

  /// One phase of work. Called by the scheduler on the thread the previous directive chose; an
  /// exception ends the tasklet (as if done) and is reported by Scheduler::run().
  virtual Directive task() = 0;

  /// Sets the rule held from before the first phase until done. Validates it (InvalidRule).
  /// Throws TaskletActive while the tasklet is active (scheduled, running, parked or waiting).
  void set_rule(Rule rule);
  /// The tasklet's rule (null when it has none).
  const Rule& rule() const noexcept { return rule_; }

  /// Sets the name used in diagnostics and error messages. Throws TaskletActive while active.
  void set_name(std::string name);
  /// The name given by set_name, or "tasklet@<address>".
  std::string name() const;

  /// True from the moment the tasklet is scheduled until its last phase returns done.
  bool is_active() const noexcept;

  /// The engine's view of a tasklet (defined inside the library, not for users).
  class Engine;

 protected:
  Tasklet() = default;

 private:
  std::atomic<std::uint64_t> state_{0};         // one word the engine decides everything on
  std::atomic<Scheduler*> scheduler_{nullptr};  // the scheduler it is active in
  void* hold_ = nullptr;                        // the engine's: its rule's request while active
  Rule rule_;
  std::unique_ptr<std::string> name_;  // usually unnamed: a pointer keeps the tasklet small
};

/// A Tasklet whose task() calls a stored callable. The callable returns a Directive and takes
/// either no argument or the tasklet itself (`Directive(Tasklet&)`), which lets it suspend itself.
template <class F>
class FunctionTasklet final : public Tasklet {
 public:
  explicit FunctionTasklet(F fn) : fn_(std::move(fn)) {}
  Directive task() override {
    if constexpr (std::is_invocable_r_v<Directive, F&, Tasklet&>) {
      return fn_(static_cast<Tasklet&>(*this));
    } else {
      return fn_();
    }
  }

 private:
  F fn_;
};

/// Wraps a callable (`Directive()` or `Directive(Tasklet&)`) as a tasklet with an optional rule.
/// Throws InvalidRule for an invalid rule.
template <class F>
requires(std::is_invocable_r_v<Directive, std::decay_t<F>&> ||
         std::is_invocable_r_v<Directive, std::decay_t<F>&, Tasklet&>)
    std::shared_ptr<Tasklet> make_tasklet(F&& fn, Rule rule = nullptr) {
  using Made = FunctionTasklet<std::decay_t<F>>;
  auto tasklet = std::allocate_shared<Made>(detail::Allocator<Made>{}, std::forward<F>(fn));
  if (rule) tasklet->set_rule(std::move(rule));
  return tasklet;
}

}  // namespace tasklet
