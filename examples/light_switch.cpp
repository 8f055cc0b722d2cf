// The light-switch problem from Eclipse's scheduling-rules guide: two background jobs, "on" then
// "off", race and may leave the light on. Giving both the same mutex rule serialises them in the
// order they were scheduled, so the light always ends off.
#include <atomic>
#include <cstdio>

#include "tasklet.hpp"

using namespace tasklet;

namespace {

// A tasklet that flips the switch in one async phase (on a worker thread).
std::shared_ptr<Tasklet> flip(std::atomic<bool>& light, bool value, Rule rule) {
  return make_tasklet(
      [&light, value, step = 0]() mutable {
        if (step++ == 0) return Directive::async;
        light = value;
        return Directive::done;
      },
      std::move(rule));
}

int rounds_left_on(bool with_rule, int rounds) {
  int left_on = 0;
  auto scheduler = api::new_scheduler();
  for (int round = 0; round < rounds; ++round) {
    std::atomic<bool> light{false};
    const Rule rule = with_rule ? rules::mutex("light switch") : nullptr;
    scheduler->schedule(make_tasklet([&] {
                          api::current().schedule(flip(light, true, rule), Directive::async);
                          api::current().schedule(flip(light, false, rule), Directive::async);
                          return Directive::done;
                        }),
                        Directive::sync);
    scheduler->run();
    if (light) ++left_on;
  }
  return left_on;
}

}  // namespace

int main() {
  const int rounds = 2000;
  const int without = rounds_left_on(false, rounds);
  const int with = rounds_left_on(true, rounds);
  std::printf("light left on after 'on' then 'off':\n");
  std::printf("  without a rule: %4d of %d rounds (a race)\n", without, rounds);
  std::printf("  with a mutex rule: %d of %d rounds\n", with, rounds);
  return with == 0 ? 0 : 1;
}
