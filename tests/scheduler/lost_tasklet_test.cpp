// Parked tasklets that nothing can resume any more end with TaskletLost instead of keeping run()
// waiting forever; those someone could still resume stay parked.
#include <atomic>
#include <future>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

using test::WorkerCountTest;

class LostTaskletTest : public WorkerCountTest {
 protected:
  // run() must end with TaskletLost naming `name`.
  void expect_run_loses(const std::string& name) {
    try {
      scheduler().run();
      FAIL() << "run() returned without TaskletLost";
    } catch (const TaskletLost& error) {
      EXPECT_NE(std::string(error.what()).find(name), std::string::npos) << error.what();
    }
  }
};
TASKLET_WORKER_COUNTS(LostTaskletTest);

TEST_P(LostTaskletTest, WaitWithoutARescheduler) {
  auto tasklet = make_tasklet([] { return Directive::wait; });
  tasklet->set_name("forgotten");
  scheduler().schedule(std::move(tasklet), Directive::sync);
  expect_run_loses("forgotten");
}

TEST_P(LostTaskletTest, ASuspensionWhoseReschedulerWasDropped) {
  auto tasklet = make_tasklet([phase = 0](Tasklet& self) mutable {
    if (phase++ == 0) return Directive::async;
    (void)api::current().suspend(self);  // on a worker; the Rescheduler is destroyed at once
    return Directive::wait;
  });
  tasklet->set_name("dropped");
  scheduler().schedule(std::move(tasklet), Directive::sync);
  expect_run_loses("dropped");
}

TEST_P(LostTaskletTest, TheLastReschedulerGoingWhileRunWaits) {
  std::promise<Rescheduler> handed;
  std::latch parked(1);
  auto tasklet = make_tasklet([&](Tasklet& self) {
    handed.set_value(api::current().suspend(self));
    return Directive::wait;
  });
  tasklet->set_name("abandoned");
  // A thread takes the only Rescheduler and lets it go without resuming.
  std::thread holder([&, future = handed.get_future()]() mutable {
    std::optional<Rescheduler> kept = future.get();
    Rescheduler copy = *kept;
    kept.reset();  // a copy lives on: nothing ends yet
    parked.wait();
  });
  scheduler().schedule(std::move(tasklet), Directive::sync);
  parked.count_down();
  expect_run_loses("abandoned");
  holder.join();
}

TEST_P(LostTaskletTest, TheLastOwnerOutsideLettingGoWhileRunWaits) {
  auto parks = make_tasklet([] { return Directive::wait; });
  parks->set_name("orphan");
  std::latch parked(1);
  // Sync phases run in order on the synchronous thread: this one runs once `parks` has parked.
  auto after = make_tasklet([&] {
    parked.count_down();
    return Directive::done;
  });
  std::shared_ptr<Tasklet> owned = parks;
  scheduler().schedule(std::move(parks), Directive::sync).schedule(std::move(after), Directive::sync);
  std::thread owner([&] {
    parked.wait();
    owned.reset();  // nothing tells the scheduler: run() finds out while it waits
  });
  expect_run_loses("orphan");
  owner.join();
}

TEST_P(LostTaskletTest, TheLastOwnerLettingGoAroundTheMomentItParks) {
  std::latch phase_ran(1);
  auto parks = make_tasklet([&, phase = 0]() mutable {
    if (phase++ == 0) return Directive::async;
    phase_ran.count_down();  // on a worker, while the owner below may let go
    return Directive::wait;
  });
  parks->set_name("orphan");
  std::shared_ptr<Tasklet> owned = parks;
  scheduler().schedule(std::move(parks), Directive::sync);
  std::thread owner([&] {
    phase_ran.wait();
    owned.reset();  // before it parks (lost at once) or after (lost while run() waits)
  });
  expect_run_loses("orphan");
  owner.join();
}

TEST_P(LostTaskletTest, AnOwnerCanStillSuspendAndResumeIt) {
  int phases = 0;
  auto parks = make_tasklet([&] { return ++phases == 1 ? Directive::wait : Directive::done; });
  // Runs after `parks` has parked (sync phases run in order), and owns it while it does.
  auto owner = make_tasklet([&, kept = parks] {
    scheduler().suspend(*kept).resume(Directive::sync);
    return Directive::done;
  });
  scheduler().schedule(std::move(parks), Directive::sync).schedule(std::move(owner), Directive::sync);
  scheduler().run();
  EXPECT_EQ(phases, 2);
}

TEST_P(LostTaskletTest, ALostTaskletsRuleGoesToTheNextHolder) {
  const Rule rule = rules::mutex("lost-and-found");
  auto lost = make_tasklet([] { return Directive::wait; }, rule);
  lost->set_name("holder");
  bool next_ran = false;
  auto next = make_tasklet(
      [&] {
        next_ran = true;
        return Directive::done;
      },
      rule);
  scheduler().schedule(std::move(lost), Directive::sync).schedule(std::move(next), Directive::sync);
  expect_run_loses("holder");
  EXPECT_TRUE(next_ran);
}

TEST_P(LostTaskletTest, AKeptReschedulerKeepsItParked) {
  bool ran = false;
  auto tasklet = make_tasklet([&] {
    ran = true;
    return Directive::done;
  });
  Rescheduler kept = scheduler().suspend(*tasklet);
  {
    const Rescheduler copy = kept;  // copies come and go; the suspension lives while one does
  }
  tasklet.reset();  // owned by the scheduler alone, resumable through `kept`
  EXPECT_EQ(scheduler().active_count(), 1u);
  kept.resume(Directive::sync);
  scheduler().run();
  EXPECT_TRUE(ran);
}

TEST_P(LostTaskletTest, AnIdleSuspensionDroppedWithoutAnOwnerIsLostAtOnce) {
  auto tasklet = make_tasklet([] { return Directive::done; });
  tasklet->set_name("never-resumed");
  std::optional<Rescheduler> kept = scheduler().suspend(*tasklet);
  tasklet.reset();
  EXPECT_EQ(scheduler().active_count(), 1u);
  kept.reset();
  EXPECT_EQ(scheduler().active_count(), 0u) << "ended as the Rescheduler went";
  expect_run_loses("never-resumed");
}

}  // namespace
}  // namespace tasklet
