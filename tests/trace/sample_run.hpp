// A small run with every kind of event the trace recorder knows, for the trace tests and the
// timeline's rendering test: a job and a thread that wait for rules a job holds, the release
// that lets both through at once, a job with a rule that runs at once, and a tasklet that parks
// until another thread resumes it.
#pragma once

#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "support/test_support.hpp"
#include "tasklet.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet::test {

/// Counts down when a thread is about to wait in begin_rule.
class WaitLatch final : public LockListener {
 public:
  Waiting about_to_wait(const Rule&, const std::vector<RuleBlocker>&) override {
    waiting.count_down();
    return Waiting::block;
  }
  void got_it(const Rule&) override {}
  std::latch waiting{1};
};

/// Runs the sample on `manager` (recording or not). `reader_name` names the job that waits.
inline void run_sample(const std::shared_ptr<JobManager>& manager,
                       const std::string& reader_name = "reader") {
  auto listener = std::make_shared<WaitLatch>();
  manager->set_lock_listener(listener);
  {
    HoldingJob holder(manager, "holder", rules::path("/a"));
    auto reader = make_job(
        reader_name, [](ProgressMonitor& monitor) { monitor.begin_task("read", 1); }, manager);
    reader->set_rule(rules::path("/a/x"));
    reader->schedule();
    const Rule mine = rules::path("/a/y");
    std::thread writer([&] { RuleScope scope(*manager, mine); });
    listener->waiting.wait();  // the thread waits in begin_rule, the reader for its rule
    holder.release();
    writer.join();
    reader->join();
  }
  manager->set_lock_listener(nullptr);

  auto other = make_job(
      "other", [](ProgressMonitor&) {}, manager);
  other->set_rule(rules::read_path("/b"));
  other->schedule();
  other->join();

  auto scheduler = Scheduler::create(SchedulerOptions{manager, nullptr, 0});
  std::optional<Rescheduler> parked;
  std::latch suspended(1);
  bool resumed = false;
  auto tasklet = make_tasklet([&](Tasklet& self) {
    if (resumed) return Directive::done;
    resumed = true;
    parked = api::current().suspend(self);
    suspended.count_down();
    return Directive::wait;
  });
  tasklet->set_name("parker");
  scheduler->schedule(tasklet, Directive::sync);
  std::thread waker([&] {
    suspended.wait();
    parked->resume(Directive::async);
  });
  scheduler->run();
  waker.join();
}

}  // namespace tasklet::test
