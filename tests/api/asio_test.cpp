// tasklet::asio::make_scheduler: sync phases as handlers of a Boost.Asio io_context.
#include <atomic>
#include <chrono>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include "support/test_support.hpp"
#include "tasklet.hpp"
#include "tasklet/asio.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

class AsioTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    manager_ = JobManager::create(JobManager::Options{GetParam(), nullptr});
    scheduler_ = asio::make_scheduler(io_, SchedulerOptions{manager_, nullptr, 0});
  }

  boost::asio::io_context io_;
  std::shared_ptr<JobManager> manager_;
  std::shared_ptr<Scheduler> scheduler_;
};
INSTANTIATE_TEST_SUITE_P(Workers, AsioTest, ::testing::Values(1, 2, 4), test::worker_count_name);

TEST_P(AsioTest, SyncPhasesRunAsHandlersOnTheIoThreadInOrder) {
  constexpr int tasklets = 20;
  std::vector<int> merged;
  std::atomic<int> misplaced{0};
  const auto io_thread = std::this_thread::get_id();
  for (int i = 0; i < tasklets; ++i) {
    scheduler_->schedule(make_tasklet([&, i, phase = 0]() mutable {
                           const bool on_io = std::this_thread::get_id() == io_thread;
                           switch (phase++) {
                             case 0:
                               if (!on_io) ++misplaced;
                               return Directive::async;
                             case 1:
                               if (on_io) ++misplaced;
                               return Directive::sync;
                             default:
                               if (!on_io) ++misplaced;
                               merged.push_back(i);  // the io thread's own state: no lock
                               return Directive::done;
                           }
                         }),
                         Directive::sync);
  }
  bool own_handler_ran = false;
  boost::asio::post(io_, [&] { own_handler_ran = true; });
  io_.run();  // returns once the scheduler has no work left
  EXPECT_TRUE(own_handler_ran);
  EXPECT_EQ(merged.size(), static_cast<std::size_t>(tasklets));
  EXPECT_EQ(misplaced.load(), 0);
  EXPECT_FALSE(scheduler_->has_work());
  EXPECT_TRUE(scheduler_->failures().empty());
}

TEST_P(AsioTest, IoRunWaitsForAsyncWorkItHasNotHeardOfYet) {
  std::latch go(1);
  bool merged_on_io = false;
  const auto io_thread = std::this_thread::get_id();
  scheduler_->schedule(make_tasklet([&, phase = 0]() mutable {
                         if (phase++ == 0) {
                           go.wait();  // until the io_context's only handler has run
                           return Directive::sync;
                         }
                         merged_on_io = std::this_thread::get_id() == io_thread;
                         return Directive::done;
                       }),
                       Directive::async);
  boost::asio::post(io_, [&] { go.count_down(); });
  io_.run();
  EXPECT_TRUE(merged_on_io) << "io.run() must not return while the async phase is still to come back";
}

TEST_P(AsioTest, AKeepAliveGuardKeepsIoRunGoing) {
  Scheduler::KeepAlive guard = scheduler_->keep_alive();
  std::thread producer;
  std::atomic<bool> synced_on_io{false};
  const auto io_thread = std::this_thread::get_id();
  boost::asio::post(io_, [&] {
    producer = std::thread([&] {
      std::latch ran(1);
      scheduler_->schedule(make_tasklet([&] {
                             synced_on_io = std::this_thread::get_id() == io_thread;
                             ran.count_down();
                             return Directive::done;
                           }),
                           Directive::sync);
      ran.wait();
      guard.reset();
    });
  });
  io_.run();
  producer.join();
  EXPECT_TRUE(synced_on_io.load());
}

TEST_P(AsioTest, APhasesExceptionLeavesIoRunAndTheRestGoesOnAfterwards) {
  bool second_ran = false;
  scheduler_->schedule(make_tasklet([]() -> Directive { throw std::runtime_error("broken phase"); }),
                       Directive::sync);
  auto second = make_tasklet([&, phase = 0]() mutable {
    if (phase++ == 0) return Directive::sync;  // the next turn, after the failure left io.run()
    second_ran = true;
    return Directive::done;
  });
  scheduler_->schedule(second, Directive::sync);
  EXPECT_THROW(io_.run(), std::runtime_error);
  ASSERT_EQ(scheduler_->failures().size(), 1u);
  io_.restart();
  io_.run();
  EXPECT_TRUE(second_ran);
}

TEST_P(AsioTest, HoldingWhatATaskletWaitsForAroundIoRunIsAWaitCycle) {
  const Rule held = rules::path("/io");
  manager_->begin_rule(held);
  bool ran = false;
  scheduler_->schedule(make_tasklet(
                           [&] {
                             ran = true;
                             return Directive::done;
                           },
                           rules::path("/io/file")),
                       Directive::sync);
  EXPECT_THROW(io_.run(), WaitCycle);
  EXPECT_FALSE(ran);
  manager_->end_rule(held);
  io_.restart();
  io_.run();
  EXPECT_TRUE(ran);
}

TEST_P(AsioTest, DestroyingTheSchedulerWithWorkPendingLetsIoRunReturn) {
  auto parked = make_tasklet([] { return Directive::done; });
  Rescheduler rescheduler = scheduler_->suspend(*parked);
  EXPECT_TRUE(scheduler_->has_work());
  boost::asio::post(io_, [&] { scheduler_.reset(); });
  io_.run();  // would not return while the scheduler held work on the io_context
  EXPECT_FALSE(parked->is_active());
  EXPECT_THROW(rescheduler.resume(Directive::sync), AlreadyResumed);
}

// Eclipse's UIJob on an io_context: jobs whose runs are handlers on the io thread, in FIFO order
// with worker jobs on the same rule, and io.run() waits for them.
TEST_P(AsioTest, JobsRunOnTheIoThreadInTurnWithWorkerJobs) {
  constexpr int pairs = 10;
  const Rule rule = rules::path("/doc");
  const auto io_thread = std::this_thread::get_id();
  std::mutex order_mutex;
  std::vector<std::string> order;
  std::atomic<int> misplaced{0};
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < pairs; ++i) {
    for (const bool on_io : {false, true}) {
      std::string name = (on_io ? "io " : "worker ") + std::to_string(i);
      auto made = make_job(
          name,
          [&, on_io, name](ProgressMonitor&) {
            if ((std::this_thread::get_id() == io_thread) != on_io) ++misplaced;
            std::lock_guard lock(order_mutex);
            order.push_back(name);
            return Status::ok();
          },
          manager_);
      made->set_rule(rule);
      if (on_io) made->set_sync_scheduler(scheduler_);
      jobs.push_back(std::move(made));
    }
  }
  for (const auto& each : jobs) each->schedule();
  io_.run();  // returns once the jobs that run on it have run
  ASSERT_TRUE(manager_->join(nullptr, std::chrono::seconds{30}));
  EXPECT_EQ(misplaced.load(), 0);
  std::vector<std::string> expected;
  for (const auto& each : jobs) expected.push_back(each->name());
  EXPECT_EQ(order, expected) << "FIFO among the holders of one rule, on either thread";
}

}  // namespace
}  // namespace tasklet
