// The manager's one timer: alarms ring once they are due, in time order; moving, canceling and
// stopping.
#include "base/timer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tasklet::detail {
namespace {

using namespace std::chrono_literals;

// Records when it rang and whether the timer thread rang it; counts down `rung` each time.
class Recorded final : public Timer::Alarm {
 public:
  Recorded(Timer& timer, int id, std::vector<int>& order, std::mutex& mutex, std::latch* rung)
      : timer_(timer), id_(id), order_(order), mutex_(mutex), rung_(rung) {}
  void ring() noexcept override {
    {
      std::lock_guard lock(mutex_);
      order_.push_back(id_);
      rang_at = Clock::now();
      on_timer_thread = timer_.runs_here();
      ++rings;
    }
    if (rung_ != nullptr) rung_->count_down();
  }
  Clock::time_point rang_at{};
  bool on_timer_thread = false;
  int rings = 0;

 private:
  Timer& timer_;
  int id_;
  std::vector<int>& order_;
  std::mutex& mutex_;
  std::latch* rung_;
};

TEST(TimerTest, AlarmsRingOnTheTimerThreadInTheOrderTheyAreDueAndNotBefore) {
  auto timer = std::make_shared<Timer>();
  std::vector<int> order;
  std::mutex mutex;
  std::latch rung(3);
  Recorded late(*timer, 3, order, mutex, &rung), early(*timer, 1, order, mutex, &rung),
      middle(*timer, 2, order, mutex, &rung);
  const Clock::time_point now = Clock::now();
  ASSERT_TRUE(timer->set(late, now + 30ms));
  ASSERT_TRUE(timer->set(early, now + 10ms));
  ASSERT_TRUE(timer->set(middle, now + 20ms));
  rung.wait();
  std::lock_guard lock(mutex);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  EXPECT_GE(early.rang_at, now + 10ms);
  EXPECT_GE(middle.rang_at, now + 20ms);
  EXPECT_GE(late.rang_at, now + 30ms);
  EXPECT_TRUE(early.on_timer_thread && middle.on_timer_thread && late.on_timer_thread);
  EXPECT_FALSE(timer->runs_here());
  timer->stop();
}

TEST(TimerTest, SettingASetAlarmAgainMovesItAndItRingsOnce) {
  auto timer = std::make_shared<Timer>();
  std::vector<int> order;
  std::mutex mutex;
  std::latch rung(2);
  Recorded moved(*timer, 1, order, mutex, &rung), marker(*timer, 2, order, mutex, &rung);
  const Clock::time_point now = Clock::now();
  ASSERT_TRUE(timer->set(moved, now + 1h));
  ASSERT_TRUE(timer->set(marker, now + 20ms));
  ASSERT_TRUE(timer->set(moved, now + 10ms));  // earlier than the marker now
  rung.wait();
  timer->stop();  // nothing is set any more: nothing rings again
  std::lock_guard lock(mutex);
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_EQ(moved.rings, 1);
}

TEST(TimerTest, ACanceledAlarmNeverRingsAndAStoppedTimerRingsWhatIsStillSet) {
  auto timer = std::make_shared<Timer>();
  std::vector<int> order;
  std::mutex mutex;
  Recorded canceled(*timer, 1, order, mutex, nullptr), pending(*timer, 2, order, mutex, nullptr);
  ASSERT_TRUE(timer->set(canceled, Clock::now() + 1h));
  ASSERT_TRUE(timer->set(pending, Clock::now() + 1h));
  EXPECT_TRUE(timer->cancel(canceled));
  EXPECT_FALSE(timer->cancel(canceled));  // not set any more
  timer->stop();                          // rings `pending` one last time, on the way out
  timer->stop();                          // idempotent
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(order, (std::vector<int>{2}));
  }
  EXPECT_FALSE(timer->set(canceled, Clock::now()));  // the timer has stopped
  std::lock_guard lock(mutex);
  EXPECT_EQ(canceled.rings, 0);
}

// An alarm that waits in ring() until let go: cancel() from another thread returns only after
// ring() has returned, so that the alarm's owner may go at once.
class Blocking final : public Timer::Alarm {
 public:
  void ring() noexcept override {
    entered.count_down();
    go.wait();
    returned.store(true);
  }
  std::latch entered{1};
  std::latch go{1};
  std::atomic<bool> returned{false};
};

TEST(TimerTest, CancelWaitsForARingInProgress) {
  auto timer = std::make_shared<Timer>();
  Blocking alarm;
  ASSERT_TRUE(timer->set(alarm, Clock::now()));
  alarm.entered.wait();
  bool was_set = true;
  bool ring_over = false;
  std::thread canceler([&] {
    was_set = timer->cancel(alarm);
    ring_over = alarm.returned.load();  // whichever of the two threads gets here first
  });
  alarm.go.count_down();
  canceler.join();
  EXPECT_TRUE(ring_over) << "cancel() returned while ring() was still running";
  EXPECT_FALSE(was_set) << "a ringing alarm is no longer set";
  timer->stop();
}

}  // namespace
}  // namespace tasklet::detail
