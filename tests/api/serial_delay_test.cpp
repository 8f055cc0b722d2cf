// Delayed and fixed-rate tasks of a serial executor, on the manager's timer.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class SerialDelayTest : public ::testing::TestWithParam<int> {
 protected:
  void TearDown() override {
    EXPECT_EQ(manager_->rule_stats().held, 0u);
    EXPECT_EQ(manager_->rule_stats().waiting, 0u);
  }
  std::shared_ptr<JobManager> manager_ = JobManager::create(JobManager::Options{.concurrency = GetParam()});
};
TASKLET_WORKER_COUNTS(SerialDelayTest);

TEST_P(SerialDelayTest, DelayedTasksRunWhenDueAndInTheSerialOrder) {
  // The delays only have to outlast the two calls between the posts, which a sanitizer on a loaded
  // machine can stretch to tens of milliseconds; the test checks only lower bounds on time.
  constexpr auto later = 400ms;
  constexpr auto sooner = 200ms;
  SerialExecutor strand(manager_, "later");
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<char> order;                       // touched only by the strand's tasks
  strand.post([released] { released.wait(); });  // holds the strand while we count
  const auto posted = Clock::now();
  Clock::time_point a_ran, b_ran;
  strand.post_after(later, [&] {
    a_ran = Clock::now();
    order.push_back('a');
  });
  strand.post_after(sooner, [&] {
    b_ran = Clock::now();
    order.push_back('b');
  });
  strand.post([&] { order.push_back('c'); });
  EXPECT_EQ(strand.outstanding(), 4u) << "the holder, c behind it, and the delayed ones";
  release.set_value();
  strand.wait();
  EXPECT_EQ(order, (std::vector<char>{'c', 'b', 'a'}));
  EXPECT_GE(b_ran - posted, sooner);
  EXPECT_GE(a_ran - posted, later);
}

TEST_P(SerialDelayTest, CancelingADelayedTaskDropsItAtOnce) {
  SerialExecutor strand(manager_, "canceled");
  auto payload = std::make_shared<int>(7);
  std::weak_ptr<int> kept = payload;
  bool ran = false;
  auto handle = strand.post_after(1h, [&ran, payload = std::move(payload)] { ran = *payload == 7; });
  EXPECT_TRUE(strand.cancel(handle));
  EXPECT_TRUE(kept.expired()) << "a canceled task is not kept until its time";
  EXPECT_EQ(strand.outstanding(), 0u);
  EXPECT_FALSE(strand.cancel(handle));
  strand.wait();
  EXPECT_FALSE(ran);
}

TEST_P(SerialDelayTest, CancelAllRemovesDelayedAndWaitingTasks) {
  SerialExecutor strand(manager_, "all");
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> ran{0};
  strand.post([released] { released.wait(); });  // holds the strand
  strand.post([&] { ++ran; });                   // waits for its turn
  strand.post_after(1h, [&] { ++ran; });
  strand.post_after(2h, [&] { ++ran; });
  EXPECT_EQ(strand.cancel_all(), 3u);
  EXPECT_EQ(strand.outstanding(), 1u) << "only the running task is left";
  release.set_value();
  strand.wait();
  EXPECT_EQ(ran.load(), 0);
}

TEST_P(SerialDelayTest, FixedRateRunsAreDueAtMultiplesOfThePeriod) {
  SerialExecutor strand(manager_, "ticks");
  std::vector<Clock::time_point> runs;  // touched only by the strand's tasks
  std::promise<void> fifth;
  const auto posted = Clock::now();
  auto handle = strand.post_at_fixed_rate(10ms, 15ms, [&] {
    runs.push_back(Clock::now());
    if (runs.size() == 5) fifth.set_value();
  });
  fifth.get_future().wait();
  EXPECT_TRUE(strand.cancel(handle));
  EXPECT_FALSE(strand.cancel(handle));
  strand.wait();  // returns once it is canceled: nothing is left
  EXPECT_EQ(strand.outstanding(), 0u);
  ASSERT_GE(runs.size(), 5u);
  for (std::size_t n = 0; n < runs.size(); ++n) {
    EXPECT_GE(runs[n] - posted, 10ms + n * 15ms) << "run " << n;
  }
}

TEST_P(SerialDelayTest, LateFixedRateRunsCatchUpWithoutOverlapping) {
  SerialExecutor strand(manager_, "slow");
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  std::atomic<int> count{0};
  std::promise<void> done;
  const auto posted = Clock::now();
  Clock::time_point sixth;
  auto handle = strand.post_at_fixed_rate(0ms, 2ms, [&] {
    if (inside.fetch_add(1) != 0) overlapped = true;
    std::this_thread::sleep_for(5ms);  // the work takes longer than the period
    inside.fetch_sub(1);
    if (++count == 6) {
      sixth = Clock::now();
      done.set_value();
    }
  });
  done.get_future().wait();
  strand.cancel(handle);
  strand.wait();
  EXPECT_FALSE(overlapped.load());
  EXPECT_GE(sixth - posted, 30ms) << "six runs of 5 ms, one after another";
}

TEST_P(SerialDelayTest, AFixedRateTaskThatThrowsStopsAndWaitRethrows) {
  SerialExecutor strand(manager_, "failing");
  int runs = 0;
  auto handle = strand.post_at_fixed_rate(0ms, 1ms, [&] {
    if (++runs == 3) throw std::runtime_error("third tick");
  });
  EXPECT_THROW(strand.wait(), std::runtime_error);
  EXPECT_EQ(runs, 3);
  EXPECT_FALSE(strand.cancel(handle)) << "over already";
}

TEST_P(SerialDelayTest, CancelAllEndsFixedRateTasks) {
  SerialExecutor strand(manager_, "ended");
  std::atomic<int> runs{0};
  std::promise<void> first;
  strand.post_at_fixed_rate(0ms, 1ms, [&] {
    if (runs.fetch_add(1) == 0) first.set_value();
  });
  first.get_future().wait();
  strand.cancel_all();
  strand.wait();  // would never return if a run were still posted
  EXPECT_EQ(strand.outstanding(), 0u);
}

TEST_P(SerialDelayTest, DestroyingTheExecutorCancelsDelayedAndRepeatingTasks) {
  auto payload = std::make_shared<int>(1);
  std::weak_ptr<int> kept = payload;
  std::atomic<int> runs{0};
  {
    SerialExecutor strand(manager_, "dropped");
    strand.post_after(1h, [payload = std::move(payload)] { (void)*payload; });
    strand.post_at_fixed_rate(1h, 1h, [&runs] { ++runs; });
  }
  EXPECT_TRUE(kept.expired());
  EXPECT_EQ(runs.load(), 0);
}

TEST_P(SerialDelayTest, AFixedRateNeedsAPositivePeriod) {
  SerialExecutor strand(manager_, "period");
  EXPECT_THROW(strand.post_at_fixed_rate(0ms, 0ms, [] {}), std::invalid_argument);
  EXPECT_EQ(strand.outstanding(), 0u);
}

}  // namespace
}  // namespace tasklet
