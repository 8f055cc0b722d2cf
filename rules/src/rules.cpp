#include "tasklet/rules/rules.hpp"

#include <array>
#include <memory>
#include <utility>

#include "make_rule.hpp"

namespace tasklet::rules {

Rule mutex(std::string name) { return detail::make_rule<MutexRule>(std::move(name)); }

Rule named_mutex(std::string name) { return detail::make_rule<NamedMutexRule>(std::move(name)); }

Rule path(std::string_view path) { return detail::make_rule<PathRule>(path, PathRule::Mode::exclusive); }

Rule write_path(std::string_view path) { return rules::path(path); }

Rule read_path(std::string_view path) { return detail::make_rule<PathRule>(path, PathRule::Mode::shared); }

Rule combine(Rule a, Rule b) {
  if (!a) return b;
  if (!b || a == b) return a;
  if (a->contains(*b)) return a;
  if (b->contains(*a)) return b;
  const std::array<Rule, 2> both{std::move(a), std::move(b)};
  return MultiRule::combine(both);
}

}  // namespace tasklet::rules
