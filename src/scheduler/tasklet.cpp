#include <cstdio>

#include "scheduler/tasklet_state.hpp"
#include "tasklet/detail/library_tasklet.hpp"
#include "tasklet/error.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet {

Tasklet::~Tasklet() = default;
detail::LibraryTasklet::~LibraryTasklet() = default;

bool Tasklet::is_active() const noexcept {
  return detail::word::phase(state_.load(std::memory_order_acquire)) != detail::word::idle;
}

void Tasklet::set_rule(Rule rule) {
  if (is_active()) {
    throw TaskletActive("cannot change the rule of " + name() + " to " + describe(rule) +
                        " while it is active");
  }
  validate_rule(rule);
  rule_ = std::move(rule);
}

void Tasklet::set_name(std::string name) {
  if (is_active()) throw TaskletActive("cannot rename " + this->name() + " while it is active");
  name_ = name.empty() ? nullptr : std::make_unique<std::string>(std::move(name));
}

std::string Tasklet::name() const {
  if (name_) return *name_;
  char text[48];
  std::snprintf(text, sizeof text, "tasklet@%p", static_cast<const void*>(this));
  return text;
}

}  // namespace tasklet
