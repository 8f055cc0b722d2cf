// Coroutine tasklets (tasklet/coroutine.hpp): each segment runs where its co_await put it (the
// synchronous thread or a worker, never the wrong one, over 1, 2 and 4 workers), a rule is held
// across all of them, awaited coroutines run inline with their values and exceptions, and an
// exception nobody awaits is the tasklet's failure.
#include <atomic>
#include <functional>
#include <future>
#include <latch>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#if __has_include(<stop_token>)  // libc++ 14 has none: the std::stop_token test is left out there
#include <stop_token>
#endif

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "support/test_support.hpp"
#include "tasklet.hpp"
#include "tasklet/coroutine.hpp"
#include "tasklet/job_manager.hpp"

namespace tasklet {
namespace {

using test::WorkerCountTest;

class CoroutineTest : public WorkerCountTest {};

// Where each segment of a coroutine ran.
struct Segments {
  std::thread::id sync_thread = std::this_thread::get_id();
  std::atomic<int> on_sync{0}, on_worker{0}, misplaced{0};
  // Called in coroutines: test::current_thread_id() says why not std::this_thread::get_id().
  void sync_segment() { (test::current_thread_id() == sync_thread ? on_sync : misplaced).fetch_add(1); }
  void async_segment() { (test::current_thread_id() != sync_thread ? on_worker : misplaced).fetch_add(1); }
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

TEST_P(CoroutineTest, ACoroutineTaskletIsNoLargerThanAPlainOne) {
  // The shared state of a coroutine and those it awaits lives in its frame.
  EXPECT_LE(sizeof(CoroutineTasklet<int>), sizeof(FunctionTasklet<Directive (*)()>));
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

// wait(): parked until another thread resumes it, where the resume says; a resume that comes
// before the tasklet has parked is not lost.
Task<int> parks_twice(Segments& segments, std::vector<Rescheduler>& given, std::latch& handed, bool early) {
  segments.sync_segment();
  co_await wait([&](Rescheduler resume) {
    if (early) {
      resume.resume(Directive::async);  // before the phase has returned wait
    } else {
      given.push_back(std::move(resume));
      handed.count_down();
    }
  });
  segments.async_segment();
  co_await wait([&](Rescheduler resume) { resume.resume(Directive::sync); });
  segments.sync_segment();
  co_return 7;
}

TEST_P(CoroutineTest, WaitParksUntilARescheduler) {
  Segments segments;
  std::vector<Rescheduler> given;
  std::latch handed(1);
  auto tasklet = make_tasklet(parks_twice(segments, given, handed, false));
  scheduler().schedule(tasklet, Directive::sync);
  std::thread resumer([&] {
    handed.wait();
    given.front().resume(Directive::async);
  });
  scheduler().run();
  resumer.join();
  EXPECT_EQ(tasklet->result(), 7);
  EXPECT_EQ(segments.misplaced.load(), 0);
  EXPECT_EQ(segments.on_worker.load(), 1);
  EXPECT_EQ(segments.on_sync.load(), 2);
}

TEST_P(CoroutineTest, AResumeBeforeTheTaskletParkedIsNotLost) {
  Segments segments;
  std::vector<Rescheduler> given;
  std::latch handed(1);
  auto tasklet = make_tasklet(parks_twice(segments, given, handed, true));
  scheduler().schedule(tasklet, Directive::sync);
  scheduler().run();
  EXPECT_EQ(tasklet->result(), 7);
  EXPECT_EQ(segments.misplaced.load(), 0);
}

Task<void> give_throws(bool& caught) {
  try {
    co_await wait([](Rescheduler) { throw std::runtime_error("cannot keep it"); });
  } catch (const std::runtime_error&) {
    caught = true;
  }
  co_await async();
}

TEST_P(CoroutineTest, AGiveThatThrowsThrowsFromTheAwait) {
  bool caught = false;
  auto tasklet = make_tasklet(give_throws(caught));
  scheduler().schedule(tasklet, Directive::sync);
  scheduler().run();
  EXPECT_TRUE(caught);
  EXPECT_TRUE(tasklet->finished());
}

// Awaiting a job: the coroutine holds no thread meanwhile and goes on where it was.
Task<std::string> awaits_jobs(Segments& segments, std::shared_ptr<Job> slow, std::shared_ptr<Job> failing,
                              std::latch& started) {
  co_await async();
  segments.async_segment();
  slow->schedule();
  failing->schedule();
  started.count_down();
  const Status first = co_await slow;
  segments.async_segment();
  co_await sync();
  const Status second = co_await join(failing);
  segments.sync_segment();
  const Status never = co_await join(make_job("never scheduled", [](ProgressMonitor&) {}));
  co_return std::string(first.is_ok() ? "ok" : "not ok") + "," + (second.is_error() ? "error" : "no error") +
      "," + (never.is_ok() ? "ok" : "not ok");
}

TEST_P(CoroutineTest, AwaitingAJobGivesItsResultWhereTheCoroutineWas) {
  Segments segments;
  std::latch started(1), release(1);
  auto slow = make_job(
      "slow", [&](ProgressMonitor&) { release.wait(); }, manager_);
  auto failing = make_job(
      "failing", [](ProgressMonitor&) -> Status { throw std::runtime_error("job failed"); }, manager_);
  auto tasklet = make_tasklet(awaits_jobs(segments, slow, failing, started));
  scheduler().schedule(tasklet, Directive::sync);
  std::thread releaser([&] {
    started.wait();
    release.count_down();
  });
  scheduler().run();
  releaser.join();
  EXPECT_EQ(tasklet->result(), "ok,error,ok");
  EXPECT_EQ(segments.misplaced.load(), 0);
}

Task<int> square(Segments& segments, int x) {
  co_await async();
  segments.async_segment();
  co_return x* x;
}

Task<void> nothing() { co_return; }

Task<int> fails_later() {
  co_await async();
  throw std::runtime_error("one of them failed");
}

Task<int> sums_squares(Segments& segments) {
  const auto [a, b, none] = co_await when_all(square(segments, 3), square(segments, 4), nothing());
  segments.sync_segment();  // awaited from a sync phase: it goes on there
  (void)none;
  co_await async();
  const auto [c] = co_await when_all(square(segments, 5));
  segments.async_segment();
  try {
    co_await when_all(square(segments, 1), fails_later());
  } catch (const std::runtime_error&) {
    co_return a + b + c;
  }
  co_return -1;
}

TEST_P(CoroutineTest, WhenAllRunsTasksAtOnceAndGivesTheirValues) {
  Segments segments;
  auto tasklet = make_tasklet(sums_squares(segments));
  scheduler().schedule(tasklet, Directive::sync);
  scheduler().run();
  EXPECT_EQ(tasklet->result(), 9 + 16 + 25);
  EXPECT_EQ(segments.misplaced.load(), 0);
}

Task<int> until_stopped(std::latch& running) {
  const StopToken stop = co_await this_stop_token();
  running.count_down();
  int hops = 0;
  while (!stop.stop_requested()) {
    co_await async();
    co_await sync();
    ++hops;
  }
  const auto [inner] =
      co_await when_all([]() -> Task<bool> { co_return (co_await this_stop_token()).stop_requested(); }());
  co_return inner ? hops : -1;
}

// A stop token of the test's own: make_tasklet takes any StoppableToken.
struct StopFlag {
  std::shared_ptr<std::atomic<bool>> stopped = std::make_shared<std::atomic<bool>>(false);
  bool stop_requested() const noexcept { return stopped->load(); }
  bool stop_possible() const noexcept { return true; }
};

TEST_P(CoroutineTest, AStopRequestReachesTheCoroutineAndTheTasksItRuns) {
  std::latch running(1);
  StopFlag stop;
  auto tasklet = make_tasklet(until_stopped(running), nullptr, stop);
  scheduler().schedule(tasklet, Directive::sync);
  std::thread stopper([&] {
    running.wait();
    *stop.stopped = true;
  });
  scheduler().run();
  stopper.join();
  EXPECT_GE(tasklet->result(), 0);
}

Task<bool> stop_possible() { co_return (co_await this_stop_token()).stop_possible(); }

TEST_P(CoroutineTest, WithoutATokenNoStopIsPossible) {
  auto without = make_tasklet(stop_possible());
  auto with = make_tasklet(stop_possible(), nullptr, StopFlag{});
  scheduler().schedule(without, Directive::sync);
  scheduler().schedule(with, Directive::sync);
  scheduler().run();
  EXPECT_FALSE(without->result());
  EXPECT_TRUE(with->result());
}

#if __has_include(<stop_token>)
TEST_P(CoroutineTest, AStdStopTokenIsTakenAsItIs) {
  std::latch running(1);
  std::stop_source stop;
  auto tasklet = make_tasklet(until_stopped(running), nullptr, stop.get_token());
  scheduler().schedule(tasklet, Directive::sync);
  std::thread stopper([&] {
    running.wait();
    stop.request_stop();
  });
  scheduler().run();
  stopper.join();
  EXPECT_GE(tasklet->result(), 0);
}
#endif

// ---- co_await hold(rule)

// Records, in grant order, who held the rule, and whether two ever held it at once.
struct HoldLog {
  std::mutex mutex;
  std::vector<std::string> order;
  std::atomic<int> inside{0}, overlaps{0}, without_rule{0};
  void enter(const std::string& who) {
    if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
    std::lock_guard lock(mutex);
    order.push_back(who);
  }
  void leave() { inside.fetch_sub(1); }
};

Task<void> holds_across_hops(std::string who, Rule rule, JobManager& manager, HoldLog& log,
                             Segments& segments) {
  segments.sync_segment();
  if (manager.current_rule() != nullptr) log.without_rule.fetch_add(100);  // holds nothing yet
  {
    auto held = co_await hold(rule);
    segments.sync_segment();  // went on where it was: the synchronous thread
    EXPECT_TRUE(held.owns_rule());
    log.enter(who);
    if (manager.current_rule() != rule) log.without_rule.fetch_add(1);
    co_await async();
    segments.async_segment();
    if (manager.current_rule() != rule) log.without_rule.fetch_add(1);
    std::this_thread::yield();
    co_await sync();
    segments.sync_segment();
    if (manager.current_rule() != rule) log.without_rule.fetch_add(1);
    log.leave();
  }
  if (manager.current_rule() != nullptr) log.without_rule.fetch_add(100);  // released
  co_await async();
  segments.async_segment();
  if (manager.current_rule() != nullptr) log.without_rule.fetch_add(100);
}

TEST_P(CoroutineTest, HoldWaitsInFifoWithEveryHolderKindAndGoesOnHoldingTheRule) {
  const Rule rule = rules::path("/shared/tree");
  HoldLog log;
  Segments segments;
  std::latch entered(1), release(1);
  // A plain thread holds the rule until every request below has entered the table.
  std::thread holder([&] {
    manager_->begin_rule(rule);
    entered.count_down();
    release.wait();
    manager_->end_rule(rule);
  });
  entered.wait();
  scheduler().schedule(make_tasklet(holds_across_hops("coroutine A", rule, *manager_, log, segments)),
                       Directive::sync);
  auto job = make_job(
      "job J",
      [&](ProgressMonitor&) {
        log.enter("job J");
        log.leave();
      },
      manager_);
  job->set_rule(rules::path("/shared"));  // contains the coroutines' rule: conflicts with it
  // Coroutine lambdas take what they use as parameters: captures would die with the lambda.
  scheduler().schedule(make_tasklet([](std::shared_ptr<Job> scheduled) -> Task<void> {
                         scheduled->schedule();  // enters after A, before B
                         co_return;
                       }(job)),
                       Directive::sync);
  scheduler().schedule(make_tasklet(holds_across_hops("coroutine B", rule, *manager_, log, segments)),
                       Directive::sync);
  auto plain = make_tasklet([](HoldLog& holders) -> Task<void> {
    holders.enter("tasklet T");
    holders.leave();
    co_return;
  }(log));
  plain->set_rule(rules::path("/shared/tree/leaf"));
  scheduler().schedule(
      make_tasklet([](Scheduler& on, std::shared_ptr<Tasklet> last, std::latch& done) -> Task<void> {
        on.schedule(std::move(last), Directive::async);  // after B
        done.count_down();                               // every sync phase before this one has run
        co_return;
      }(scheduler(), plain, release)),
      Directive::sync);
  scheduler().run();
  holder.join();
  job->join();
  EXPECT_EQ(log.order, (std::vector<std::string>{"coroutine A", "job J", "coroutine B", "tasklet T"}));
  EXPECT_EQ(log.overlaps.load(), 0);
  EXPECT_EQ(log.without_rule.load(), 0);
  EXPECT_EQ(segments.misplaced.load(), 0);
  EXPECT_EQ(manager_->rule_stats().held, 0u);
}

Task<void> many_holders(Rule rule, JobManager& manager, HoldLog& log, int round) {
  for (int i = 0; i < 3; ++i) {
    co_await async();
    auto held = co_await hold(rule);  // taken on a worker
    log.enter("");
    if (manager.current_rule() != rule) log.without_rule.fetch_add(1);
    co_await sync();
    if (manager.current_rule() != rule) log.without_rule.fetch_add(1);
    co_await async();
    log.leave();
    if (round % 2 == 0) held.release();  // early, then held across nothing
    if (manager.current_rule() != (round % 2 == 0 ? nullptr : rule)) log.without_rule.fetch_add(1);
  }
}

TEST_P(CoroutineTest, ConflictingHoldsNeverOverlap) {
  const Rule rule = rules::mutex("hold rule");
  HoldLog log;
  constexpr int coroutines = 16;
  for (int i = 0; i < coroutines; ++i) {
    scheduler().schedule(make_tasklet(many_holders(rule, *manager_, log, i)), Directive::sync);
    // Plain tasklets with the same rule in between.
    auto plain = make_tasklet([](HoldLog& holders) -> Task<void> {
      holders.enter("");
      holders.leave();
      co_return;
    }(log));
    plain->set_rule(rule);
    scheduler().schedule(plain, Directive::sync);
  }
  scheduler().run();
  EXPECT_EQ(log.order.size(), static_cast<std::size_t>(coroutines * 3 + coroutines));
  EXPECT_EQ(log.overlaps.load(), 0);
  EXPECT_EQ(log.without_rule.load(), 0);
  EXPECT_EQ(manager_->rule_stats().held, 0u);
}

Task<std::string> nests(JobManager& manager) {
  std::string seen;
  {
    auto inner = co_await hold(rules::path("/a/b"));  // contained in the tasklet's own rule
    seen += inner.owns_rule() ? "owns" : "nested";
    seen += manager.current_rule() == nullptr ? " none" : " " + manager.current_rule()->to_string();
  }
  try {
    auto outside = co_await hold(rules::path("/c"));
    seen += " (not refused)";
  } catch (const RuleNotContained&) {
    seen += " / not contained";
  }
  auto none = co_await hold(nullptr);
  seen += none.owns_rule() ? " (null owns)" : " / null";
  co_return seen;
}

TEST_P(CoroutineTest, HoldsNestOnlyInsideTheRuleHeld) {
  auto tasklet = make_tasklet(nests(*manager_), rules::path("/a"));
  scheduler().schedule(tasklet, Directive::sync);
  scheduler().run();
  EXPECT_EQ(tasklet->result(), "nested path(/a) / not contained / null");
}

Task<std::string> nests_in_an_outer_hold(JobManager& manager) {
  std::string seen;
  co_await async();
  auto outer = co_await hold(rules::path("/x"));
  const Rule scope = rules::path("/x/y");
  manager.begin_rule(scope);  // begin_rule nests in the held rule
  try {
    auto inside_scope = co_await hold(rules::path("/x/y"));
    seen += "(not refused)";
  } catch (const IllegalState&) {
    seen += "refused inside begin_rule";
  }
  manager.end_rule(scope);
  auto inner = co_await hold(rules::path("/x/z"));
  seen += inner.owns_rule() ? " / owns" : " / nested";
  co_return seen;
}

TEST_P(CoroutineTest, AHoldIsTheOuterRuleOfLaterBeginRulesAndHolds) {
  auto tasklet = make_tasklet(nests_in_an_outer_hold(*manager_));
  scheduler().schedule(tasklet, Directive::sync);
  scheduler().run();
  EXPECT_EQ(tasklet->result(), "refused inside begin_rule / nested");
  EXPECT_EQ(manager_->rule_stats().held, 0u);
}

TEST_P(CoroutineTest, ReleasingAHoldLetsWaitersInBeforeTheCoroutineEnds) {
  const Rule rule = rules::mutex("released early");
  std::string seen;
  std::shared_ptr<Tasklet> waiter;
  // The tasklet that waits: made in the give, so that it resumes the coroutine it waits for.
  auto coroutine = make_tasklet(
      [](Rule held_rule, std::shared_ptr<Tasklet>& next, Scheduler& on, std::string& note) -> Task<void> {
        auto held = co_await hold(held_rule);
        std::shared_ptr<Tasklet> waiting;
        co_await wait([&](Rescheduler resume) {
          waiting = make_tasklet([](Rescheduler go_on, std::string& text) -> Task<void> {
            text += "waiter ran; ";
            go_on.resume(Directive::sync);
            co_return;
          }(std::move(resume), note));
          waiting->set_rule(held_rule);
          on.schedule(waiting, Directive::sync);  // waits for the rule held here
          next = waiting;
          held.release();  // lets it in while this coroutine is parked
        });
        note += "resumed";
      }(rule, waiter, scheduler(), seen));
  scheduler().schedule(coroutine, Directive::sync);
  scheduler().run();
  EXPECT_EQ(seen, "waiter ran; resumed");
  EXPECT_TRUE(coroutine->finished());
}

struct FrameGone {
  std::atomic<int>* gone;
  ~FrameGone() { gone->fetch_add(1); }
};

TEST_P(CoroutineTest, DestroyingTheSchedulerWithdrawsAWaitingHold) {
  const Rule rule = rules::mutex("held by the test thread");
  std::atomic<int> gone{0}, got_rule{0};
  manager_->begin_rule(rule);
  {
    auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
    // The hold waits in a coroutine awaited inline: both frames go.
    const auto inner = [](Rule wanted, std::atomic<int>& frames, std::atomic<int>& got) -> Task<void> {
      FrameGone guard{&frames};
      auto held = co_await hold(wanted);
      got.fetch_add(1);
    };
    scheduler->schedule(make_tasklet([](Task<void> awaited, std::atomic<int>& frames) -> Task<void> {
                          FrameGone guard{&frames};
                          co_await std::move(awaited);
                        }(inner(rule, gone, got_rule), gone)),
                        Directive::sync);
    // It waits for the rule this thread holds: run() cannot return.
    EXPECT_THROW(scheduler->run(), WaitCycle);
    EXPECT_EQ(manager_->rule_snapshot().requests.size(), 2u);  // the holder and the waiter
  }
  EXPECT_EQ(gone.load(), 2);  // the parked coroutines went with their scheduler
  EXPECT_EQ(got_rule.load(), 0);
  EXPECT_EQ(manager_->rule_snapshot().requests.size(), 1u);  // only this thread's hold is left
  manager_->end_rule(rule);
  EXPECT_EQ(manager_->rule_stats().held, 0u);
}

// ---- Coroutine jobs

TEST_P(CoroutineTest, ACoroutineJobEndsWithTheStatusItReturnsOrTheExceptionItThrows) {
  auto returns = make_job(
      "returns",
      [](ProgressMonitor&) -> Task<Status> {
        co_await async();
        co_return Status::cancel("chose to stop");
      },
      manager_);
  auto throws = make_job(
      "throws",
      [](ProgressMonitor&) -> Task<void> {
        co_await async();
        throw std::runtime_error("coroutine job failed");
      },
      manager_);
  auto plain_void = make_job(
      "void", [](ProgressMonitor&) -> Task<void> { co_return; }, manager_);
  for (const auto& job : {returns, throws, plain_void}) job->schedule();
  for (const auto& job : {returns, throws, plain_void}) job->join();
  EXPECT_TRUE(returns->result().is_canceled());
  EXPECT_EQ(returns->result().message, "chose to stop");
  EXPECT_TRUE(throws->result().is_error());
  EXPECT_EQ(throws->result().message, "coroutine job failed");
  EXPECT_TRUE(plain_void->result().is_ok());
}

TEST_P(CoroutineTest, AnAwaitingCoroutineJobFreesItsWorker) {
  // Every worker runs a coroutine job that awaits the last job: only jobs that free their worker
  // while they await let it run.
  const int workers = GetParam();
  auto last = make_job(
      "last", [](ProgressMonitor&) {}, manager_);
  std::vector<std::shared_ptr<Job>> awaiting;
  std::latch all_started(workers);
  for (int i = 0; i < workers; ++i) {
    awaiting.push_back(make_job(
        "awaits " + std::to_string(i),
        [&all_started, last](ProgressMonitor&) -> Task<Status> {
          all_started.count_down();
          all_started.wait();  // every worker is taken by one of these
          const Status status = co_await last;
          co_return status;
        },
        manager_));
    awaiting.back()->schedule();
  }
  all_started.wait();
  last->schedule();
  for (const auto& job : awaiting) {
    ASSERT_TRUE(job->join(test::patience));
    EXPECT_TRUE(job->result().is_ok()) << job->result().message;
  }
}

TEST_P(CoroutineTest, ACoroutineJobHoldsItsRuleAcrossStepsAndTakesMoreWithHold) {
  const Rule own = rules::path("/jobs/own");
  const Rule taken = rules::mutex("taken by hold");
  std::atomic<int> wrong{0};
  std::latch entered(1);
  std::shared_ptr<Job> job = make_job(
      "holder",
      [&](ProgressMonitor&) -> Task<void> {
        JobManager& manager = *manager_;
        if (manager.current_rule() != own) wrong.fetch_add(1);
        co_await async();  // a step of its own: the job's rule is still held
        if (manager.current_rule() != own) wrong.fetch_add(1);
        entered.count_down();
        try {
          auto extra = co_await hold(taken);  // not contained in the job's rule
          wrong.fetch_add(100);
        } catch (const RuleNotContained&) {
        }
        co_return;
      },
      manager_);
  job->set_rule(own);
  job->schedule();
  entered.wait();
  ASSERT_TRUE(job->join(test::patience));
  EXPECT_TRUE(job->result().is_ok()) << job->result().message;
  EXPECT_EQ(wrong.load(), 0);

  // A job without a rule takes one with hold(), waiting behind this thread without a worker.
  std::atomic<int> got{0};
  manager_->begin_rule(taken);
  auto waits = make_job(
      "waits",
      [&](ProgressMonitor&) -> Task<void> {
        auto held = co_await hold(taken);
        if (manager_->current_rule() == taken) got.fetch_add(1);
        co_await async();
        if (manager_->current_rule() == taken) got.fetch_add(1);
      },
      manager_);
  waits->schedule();
  ASSERT_TRUE(test::eventually([&] { return manager_->rule_snapshot().requests.size() == 2; }));
  EXPECT_EQ(waits->state(), JobState::running);
  manager_->end_rule(taken);
  ASSERT_TRUE(waits->join(test::patience));
  EXPECT_EQ(got.load(), 2);
  EXPECT_EQ(manager_->rule_stats().held, 0u);
}

TEST_P(CoroutineTest, ACoroutineJobCannotGoOnInASyncPhase) {
  auto job = make_job(
      "sync hop",
      [](ProgressMonitor&) -> Task<void> {
        co_await sync();
        ADD_FAILURE() << "went on after co_await sync()";
      },
      manager_);
  job->schedule();
  job->join();
  EXPECT_TRUE(job->result().is_error());
  EXPECT_NE(job->result().message.find("sync"), std::string::npos) << job->result().message;
  EXPECT_NE(job->result().message.find("sync hop"), std::string::npos) << job->result().message;
}

TEST_P(CoroutineTest, ACanceledCoroutineJobSeesItsMonitorAndListenersSeeOneRun) {
  struct Events final : JobListener {
    std::atomic<int> runs{0}, ends{0};
    void running(const JobEvent&) override { runs.fetch_add(1); }
    void done(const JobEvent&) override { ends.fetch_add(1); }
  };
  auto events = std::make_shared<Events>();
  Rescheduler parked;
  std::latch handed(1);
  std::string sync_refusal;
  auto job = make_job(
      "cancelable",
      [&](ProgressMonitor& monitor) -> Task<Status> {
        co_await wait([&](Rescheduler resume) {
          parked = std::move(resume);
          handed.count_down();
        });
        co_return monitor.is_canceled() ? Status::cancel("saw the cancel") : Status::ok();
      },
      manager_);
  job->add_listener(events);
  job->schedule();
  handed.wait();
  EXPECT_EQ(job->state(), JobState::running);
  EXPECT_FALSE(job->cancel());  // running: its monitor is canceled
  try {
    parked.resume(Directive::sync);
  } catch (const IllegalState& refused) {
    sync_refusal = refused.what();
  }
  EXPECT_NE(sync_refusal.find("resume(async)"), std::string::npos) << sync_refusal;
  parked.resume(Directive::async);
  job->join();
  EXPECT_TRUE(job->result().is_canceled());
  EXPECT_EQ(job->result().message, "saw the cancel");
  EXPECT_EQ(events->runs.load(), 1);
  EXPECT_TRUE(test::eventually([&] { return events->ends.load() == 1; }));  // told after join() returns
}

Task<int> worth(int value) {
  co_await async();
  co_return value;
}

TEST_P(CoroutineTest, WhenAllInACoroutineJobRunsItsTasksOnTheManagersBackgroundScheduler) {
  std::atomic<int> sum{0};
  auto job = make_job(
      "fans out",
      [&sum](ProgressMonitor&) -> Task<void> {
        auto [a, b, c] = co_await when_all(worth(1), worth(20), worth(300));
        sum.store(a + b + c);
        // A plain tasklet scheduled from a job's run goes there too: it resumes this one.
        bool ran = false;
        co_await wait([&ran](Rescheduler resume) {
          api::current().schedule(make_tasklet([&ran, go_on = std::move(resume)] {
                                    ran = true;
                                    go_on.resume(Directive::async);
                                    return Directive::done;
                                  }),
                                  Directive::async);
        });
        if (!ran) sum.store(-1);
      },
      manager_);
  job->schedule();
  job->join();
  EXPECT_TRUE(job->result().is_ok()) << job->result().message;
  EXPECT_EQ(sum.load(), 321);
}

TEST_P(CoroutineTest, EachRunOfACoroutineJobIsANewCoroutine) {
  std::atomic<int> made{0};
  auto job = make_job(
      "runs twice",
      [&made](ProgressMonitor&) -> Task<Status> {
        const int run = made.fetch_add(1) + 1;
        co_await async();
        co_return run == 1 ? Status::ok() : Status::cancel("run " + std::to_string(run));
      },
      manager_);
  job->schedule();
  job->join();
  EXPECT_TRUE(job->result().is_ok());
  job->schedule();
  job->join();
  EXPECT_EQ(job->result().message, "run 2");
  EXPECT_EQ(made.load(), 2);
}

TEST_P(CoroutineTest, ARunThatEndsBeforeItsCoroutineDestroysItAndTheNextRunStartsANewOne) {
  const Rule left_open = rules::mutex("left open");
  std::atomic<int> made{0}, frames_gone{0}, went_on{0};
  // Run 1 asks for a sync phase (refused), run 2 leaves a begin_rule open across a co_await, run 3
  // ends as it should. Each must be a coroutine of its own.
  auto job = make_job(
      "ends early",
      [&](ProgressMonitor&) -> Task<Status> {
        FrameGone guard{&frames_gone};
        const int run = made.fetch_add(1) + 1;
        if (run == 1) {
          co_await sync();
          went_on.fetch_add(1);
        } else if (run == 2) {
          manager_->begin_rule(left_open);
          co_await async();
          went_on.fetch_add(1);
          manager_->end_rule(left_open);
        }
        co_return Status::ok();
      },
      manager_);
  job->schedule();
  job->join();
  EXPECT_TRUE(job->result().is_error()) << job->result().message;
  EXPECT_EQ(frames_gone.load(), 1) << "the first run's coroutine outlived its run";
  job->schedule();
  job->join();
  EXPECT_EQ(made.load(), 2) << "the second run did not start a new coroutine";
  EXPECT_TRUE(job->result().is_error());
  EXPECT_NE(job->result().message.find("did not end it"), std::string::npos) << job->result().message;
  EXPECT_EQ(frames_gone.load(), 2);
  job->schedule();
  job->join();
  EXPECT_TRUE(job->result().is_ok()) << job->result().message;
  EXPECT_EQ(made.load(), 3);
  EXPECT_EQ(frames_gone.load(), 3);
  EXPECT_EQ(went_on.load(), 0) << "a run went on after it had ended";
  EXPECT_EQ(manager_->rule_stats().held, 0u);
}

// The manager's end, from another thread: its destructor waits for the running jobs.
class DroppedElsewhere {
 public:
  explicit DroppedElsewhere(std::shared_ptr<JobManager>& manager)
      : thread_([dropped = std::move(manager)]() mutable { dropped.reset(); }) {}
  ~DroppedElsewhere() { thread_.join(); }
  DroppedElsewhere(const DroppedElsewhere&) = delete;
  DroppedElsewhere& operator=(const DroppedElsewhere&) = delete;

 private:
  std::thread thread_;
};

TEST_P(CoroutineTest, ShutdownCancelsAWaitingHoldBeforeItWaitsForTheRunningJobs) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  test::Gate blocker_in, release;
  std::promise<std::string> outcome;
  auto blocker = make_job(
      "holds /y",
      [&](ProgressMonitor&) {
        blocker_in.open();
        release.wait();
      },
      manager);
  blocker->set_rule(rules::path("/y"));
  auto waiter = make_job(
      "waits for /y/z",
      [&outcome](ProgressMonitor&) -> Task<void> {
        try {
          auto held = co_await hold(rules::path("/y/z"));
          outcome.set_value("granted");
        } catch (const IllegalState& refused) {
          outcome.set_value(refused.what());
        }
      },
      manager);
  blocker->schedule();
  ASSERT_TRUE(blocker_in.wait());
  waiter->schedule();
  ASSERT_TRUE(test::eventually([&] { return manager->rule_snapshot().requests.size() == 2; }));
  std::future<std::string> told = outcome.get_future();
  bool in_time = false;
  {
    const DroppedElsewhere dropping(manager);
    in_time = told.wait_for(test::patience) == std::future_status::ready;
    release.open();  // the blocker ends; the manager's end completes
  }
  ASSERT_TRUE(in_time) << "the hold was still waiting while the shutdown waited for the running job";
  const std::string message = told.get();
  EXPECT_NE(message.find("shut down"), std::string::npos) << message;
  EXPECT_TRUE(waiter->result().is_ok()) << waiter->result().message;
}

// A job that opens a gate when it is canceled.
class TellsItsCancel final : public Job {
 public:
  TellsItsCancel(std::function<Status()> body, std::shared_ptr<JobManager> manager)
      : Job("canceled at shutdown", std::move(manager)), body_(std::move(body)) {}
  test::Gate canceled;

 protected:
  Status run(ProgressMonitor&) override { return body_(); }
  void canceling() override { canceled.open(); }

 private:
  std::function<Status()> body_;
};

TEST_P(CoroutineTest, ARunningJobsBeginRuleThatWouldWaitDuringShutdownIsRefused) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  const Rule contended = rules::path("/q");
  test::Gate blocker_in, release;
  std::promise<std::string> outcome;
  auto blocker = make_job(
      "holds /q",
      [&](ProgressMonitor&) {
        blocker_in.open();
        release.wait();
      },
      manager);
  blocker->set_rule(contended);
  JobManager* const going = manager.get();  // alive until the running jobs are over
  std::shared_ptr<TellsItsCancel> late;
  late = std::make_shared<TellsItsCancel>(
      [&] {
        late->canceled.wait();  // the shutdown has begun
        try {
          const RuleScope scope(*going, contended);
          outcome.set_value("granted");
        } catch (const IllegalState& refused) {
          outcome.set_value(refused.what());
        }
        return Status::ok();
      },
      manager);
  blocker->schedule();
  ASSERT_TRUE(blocker_in.wait());
  late->schedule();
  ASSERT_TRUE(test::eventually([&] { return late->state() == JobState::running; }));
  std::future<std::string> told = outcome.get_future();
  bool in_time = false;
  {
    const DroppedElsewhere dropping(manager);
    in_time = told.wait_for(test::patience) == std::future_status::ready;
    release.open();
  }
  ASSERT_TRUE(in_time) << "a begin_rule made during the shutdown waited for a running job";
  const std::string message = told.get();
  EXPECT_NE(message.find("shut down"), std::string::npos) << message;
}

TASKLET_WORKER_COUNTS(CoroutineTest);

}  // namespace
}  // namespace tasklet
