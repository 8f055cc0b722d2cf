// Coroutine tasklets (tasklet/coroutine.hpp): each segment runs where its co_await put it (the
// synchronous thread or a worker, never the wrong one, over 1, 2 and 4 workers), a rule is held
// across all of them, awaited coroutines run inline with their values and exceptions, and an
// exception nobody awaits is the tasklet's failure.
#include <atomic>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet/coroutine.hpp"
#include "tasklet/tasklet.hpp"

namespace tasklet {
namespace {

using test::WorkerCountTest;

class CoroutineTest : public WorkerCountTest {};

// Where each segment of a coroutine ran.
struct Segments {
  std::thread::id sync_thread = std::this_thread::get_id();
  std::atomic<int> on_sync{0}, on_worker{0}, misplaced{0};
  void sync_segment() { (std::this_thread::get_id() == sync_thread ? on_sync : misplaced).fetch_add(1); }
  void async_segment() { (std::this_thread::get_id() != sync_thread ? on_worker : misplaced).fetch_add(1); }
};

Task<int> hop_back_and_forth(Segments& segments, int hops) {
  segments.sync_segment();  // scheduled with sync
  int total = 0;
  for (int i = 0; i < hops; ++i) {
    co_await async();
    segments.async_segment();
    ++total;
    co_await sync();
    segments.sync_segment();
  }
  co_return total;
}

TEST_P(CoroutineTest, EachSegmentRunsWhereItsAwaitPutIt) {
  Segments segments;
  constexpr int tasks = 20, hops = 10;
  std::vector<std::shared_ptr<CoroutineTasklet<int>>> running;
  for (int i = 0; i < tasks; ++i) {
    running.push_back(make_tasklet(hop_back_and_forth(segments, hops)));
    scheduler().schedule(running.back(), Directive::sync);
  }
  scheduler().run();
  for (const auto& tasklet : running) {
    EXPECT_TRUE(tasklet->finished());
    EXPECT_EQ(tasklet->result(), hops);
  }
  EXPECT_EQ(segments.on_sync.load(), tasks * (hops + 1));
  EXPECT_EQ(segments.on_worker.load(), tasks * hops);
  EXPECT_EQ(segments.misplaced.load(), 0);
}

Task<void> count_inside(const Rule& rule, JobManager& manager, std::atomic<int>& inside,
                        std::atomic<int>& overlaps, std::atomic<int>& without_rule) {
  for (int i = 0; i < 5; ++i) {
    co_await async();
    if (manager.current_rule() != rule) without_rule.fetch_add(1);
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    std::this_thread::yield();
    inside.fetch_sub(1);
    co_await sync();
    if (manager.current_rule() != rule) without_rule.fetch_add(1);
  }
}

TEST_P(CoroutineTest, ItsRuleIsHeldAcrossEveryAwait) {
  const Rule rule = rules::mutex("coroutine rule");
  std::atomic<int> inside{0}, overlaps{0}, without_rule{0};
  for (int i = 0; i < 8; ++i) {
    scheduler().schedule(make_tasklet(count_inside(rule, *manager_, inside, overlaps, without_rule), rule),
                         Directive::sync);
  }
  scheduler().run();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(without_rule.load(), 0);
  EXPECT_EQ(manager_->rule_stats().held, 0u);
}

Task<std::string> child(Segments& segments, std::string word) {
  co_await async();
  segments.async_segment();
  co_return word + "!";
}

Task<int> failing_child(bool fail) {
  co_await async();
  if (fail) throw std::runtime_error("child failed");
  co_return 1;
}

Task<std::string> parent(Segments& segments) {
  std::string text = co_await child(segments, "hello");
  co_await sync();
  segments.sync_segment();
  text += co_await child(segments, " world");  // ends on a worker: the parent goes on there
  segments.async_segment();
  try {
    co_await failing_child(true);
    text += " (no exception)";
  } catch (const std::runtime_error& error) {
    text += std::string(" / ") + error.what();
  }
  text += std::to_string(co_await failing_child(false));
  co_return text;
}

TEST_P(CoroutineTest, AwaitedCoroutinesRunInlineWithTheirValuesAndExceptions) {
  Segments segments;
  auto tasklet = make_tasklet(parent(segments));
  scheduler().schedule(tasklet, Directive::sync);
  scheduler().run();
  EXPECT_EQ(tasklet->result(), "hello! world! / child failed1");
  EXPECT_EQ(segments.misplaced.load(), 0);
  EXPECT_EQ(segments.on_worker.load(), 3);
}

Task<int> throws_after_a_hop() {
  co_await async();
  throw std::logic_error("nobody awaits this");
}

TEST_P(CoroutineTest, AnExceptionNobodyAwaitsIsTheTaskletsFailure) {
  auto tasklet = make_tasklet(throws_after_a_hop());
  tasklet->set_name("thrower");
  scheduler().schedule(tasklet, Directive::sync);
  EXPECT_THROW(scheduler().run(), std::logic_error);
  EXPECT_TRUE(tasklet->finished());
  EXPECT_THROW((void)tasklet->result(), std::logic_error);
}

TEST_P(CoroutineTest, ResultBeforeTheEndIsRefused) {
  Segments segments;
  auto tasklet = make_tasklet(hop_back_and_forth(segments, 1));
  EXPECT_THROW((void)tasklet->result(), IllegalState);
}

TEST_P(CoroutineTest, ATaskThatNeverRanIsDestroyedUnrun) {
  bool ran = false;
  auto never = [](bool& flag) -> Task<void> {
    flag = true;
    co_return;
  };
  { const Task<void> dropped = never(ran); }
  { auto unscheduled = make_tasklet(never(ran)); }
  EXPECT_FALSE(ran);
}

TASKLET_WORKER_COUNTS(CoroutineTest);

}  // namespace
}  // namespace tasklet
