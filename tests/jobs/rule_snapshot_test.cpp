// Who blocks whom: the manager's snapshot of its rule table, and a waiting job's blockers, with
// hard blocks (holders of conflicting rules) told apart from soft ones (earlier conflicting
// requests that strict FIFO puts a waiter behind).
#include <algorithm>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet {
namespace {

using RuleSnapshotTest = test::ManagerTest;

using test::HoldingJob;
using test::this_thread_name;

TEST_F(RuleSnapshotTest, HoldersAndWaitersWithTheirHardAndSoftBlocks) {
  HoldingJob index(manager_, "index", rules::path("/repo/src"));
  const Rule docs = rules::read_path("/repo/docs");
  manager_->begin_rule(docs);  // this thread reads /repo/docs
  auto format = make_job(
      "format", [](ProgressMonitor&) {}, manager_);
  format->set_rule(rules::path("/repo/src/a.cpp"));
  format->schedule();
  auto whole = make_job(
      "whole tree", [](ProgressMonitor&) {}, manager_);
  whole->set_rule(rules::path("/repo"));
  whole->schedule();
  auto reader = make_job(
      "reader", [](ProgressMonitor&) {}, manager_);
  reader->set_rule(rules::read_path("/elsewhere"));  // conflicts with nobody: runs
  reader->schedule();
  reader->join();

  const RuleSnapshot snapshot = manager_->rule_snapshot();
  ASSERT_EQ(snapshot.requests.size(), 4u) << snapshot.to_string();
  EXPECT_EQ(snapshot.waiters_left_out, 0u);
  const auto find = [&](const std::string& owner) {
    const auto at =
        std::find_if(snapshot.requests.begin(), snapshot.requests.end(),
                     [&](const RuleSnapshot::Request& request) { return request.owner == owner; });
    EXPECT_NE(at, snapshot.requests.end()) << owner << " is missing from\n" << snapshot.to_string();
    return static_cast<std::size_t>(at - snapshot.requests.begin());
  };
  const std::size_t index_at = find("job 'index'");
  const std::size_t thread_at = find(this_thread_name());
  const std::size_t format_at = find("job 'format'");
  const std::size_t whole_at = find("job 'whole tree'");
  const auto& requests = snapshot.requests;
  EXPECT_TRUE(requests[index_at].held);
  EXPECT_FALSE(requests[index_at].shared);
  EXPECT_TRUE(requests[thread_at].held);
  EXPECT_TRUE(requests[thread_at].shared);
  EXPECT_EQ(requests[thread_at].rule, docs);
  EXPECT_LT(index_at, format_at) << "holders come first";
  EXPECT_LT(format_at, whole_at) << "waiters in the order they asked";

  EXPECT_FALSE(requests[format_at].held);
  EXPECT_EQ(requests[format_at].blocked_by, std::vector<std::size_t>{index_at});
  EXPECT_TRUE(requests[format_at].behind.empty());
  EXPECT_FALSE(requests[whole_at].held);
  std::vector<std::size_t> hard = requests[whole_at].blocked_by;
  std::sort(hard.begin(), hard.end());
  std::vector<std::size_t> holders{index_at, thread_at};
  std::sort(holders.begin(), holders.end());
  EXPECT_EQ(hard, holders);
  EXPECT_EQ(requests[whole_at].behind, std::vector<std::size_t>{format_at});

  const std::string text = snapshot.to_string();
  EXPECT_NE(text.find("rule table: 2 held, 2 waiting"), std::string::npos) << text;
  EXPECT_NE(text.find("job 'format' waits for path(/repo/src/a.cpp) (exclusive): blocked by [" +
                      std::to_string(index_at) + "] job 'index'"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("behind [" + std::to_string(format_at) + "] job 'format'"), std::string::npos) << text;

  // The same answer for one job.
  std::vector<std::string> blockers;
  for (const RuleBlocker& blocker : whole->blockers()) blockers.push_back(blocker.to_string());
  ASSERT_EQ(blockers.size(), 3u);
  std::sort(blockers.begin(), blockers.begin() + 2);  // the holders, in no particular order
  EXPECT_EQ(blockers[0], "job 'index' holds path(/repo/src)");
  EXPECT_EQ(blockers[1], this_thread_name() + " holds read_path(/repo/docs)");
  EXPECT_EQ(blockers[2], "job 'format' waits for path(/repo/src/a.cpp) (asked earlier)");
  EXPECT_TRUE(index.job->blockers().empty()) << "a running job waits for nobody";
  EXPECT_TRUE(reader->blockers().empty()) << "nor does a job that is done";

  manager_->end_rule(docs);
  index.release();
  format->join();
  whole->join();
  index.job->join();
  EXPECT_TRUE(manager_->rule_snapshot().requests.empty());
}

TEST_F(RuleSnapshotTest, ListsTheFirstWaitersOnlyWhenToldTo) {
  HoldingJob holder(manager_, "holder", rules::mutex("m"));
  std::vector<std::shared_ptr<Job>> waiting;
  for (int i = 0; i < 5; ++i) {
    waiting.push_back(make_job(
        "waiter " + std::to_string(i), [](ProgressMonitor&) {}, manager_));
    waiting.back()->set_rule(holder.job->rule());
    waiting.back()->schedule();
  }
  const RuleSnapshot snapshot = manager_->rule_snapshot(2);
  ASSERT_EQ(snapshot.requests.size(), 3u);
  EXPECT_EQ(snapshot.waiters_left_out, 3u);
  EXPECT_EQ(snapshot.requests[1].owner, "job 'waiter 0'");
  EXPECT_EQ(snapshot.requests[2].owner, "job 'waiter 1'");
  EXPECT_EQ(snapshot.requests[2].behind, std::vector<std::size_t>{1});
  EXPECT_NE(snapshot.to_string().find("... and 3 more waiting"), std::string::npos);
  holder.release();
  for (auto& job : waiting) job->join();
}

TEST_F(RuleSnapshotTest, ANamedTaskletAndACustomRuleAreShownAsTheyAre) {
  class Custom final : public SchedulingRule {
   public:
    bool contains(const SchedulingRule& other) const override { return &other == this; }
    bool is_conflicting(const SchedulingRule& other) const override { return &other == this; }
    std::string to_string() const override { return "custom printer"; }
  };
  const Rule printer = std::make_shared<Custom>();
  auto scheduler = Scheduler::create(SchedulerOptions{manager_, nullptr, 0});
  std::promise<void> release;
  std::latch holding(1);
  std::string seen;
  bool tasklet_started = false;
  auto tasklet = make_tasklet(
      [&] {
        if (!std::exchange(tasklet_started, true)) return Directive::async;  // on to a worker
        holding.count_down();
        release.get_future().wait();
        return Directive::done;
      },
      printer);
  tasklet->set_name("spooler");
  std::thread waiter;
  bool check_started = false;
  auto check = make_tasklet([&] {
    if (!std::exchange(check_started, true)) return Directive::async;
    holding.wait();
    waiter = std::thread([&] {
      manager_->begin_rule(printer);
      manager_->end_rule(printer);
    });
    while (manager_->rule_stats().waiting == 0) std::this_thread::yield();
    seen = manager_->rule_snapshot().to_string();
    release.set_value();
    return Directive::done;
  });
  scheduler->schedule(tasklet, Directive::sync);
  scheduler->schedule(check, Directive::sync);
  scheduler->run();
  waiter.join();
  EXPECT_NE(seen.find("[0] tasklet 'spooler' holds custom printer (exclusive)"), std::string::npos) << seen;
  EXPECT_NE(seen.find("waits for custom printer (exclusive): blocked by [0] tasklet 'spooler'"),
            std::string::npos)
      << seen;
}

TEST_F(RuleSnapshotTest, AJobIsBlockingWhenAHigherPriorityJobWaitsForItsRule) {
  std::latch running(1);
  std::promise<void> release;
  auto slow = make_job(
      "slow",
      [&](ProgressMonitor&) {
        running.count_down();
        release.get_future().wait();
      },
      manager_);
  slow->set_rule(rules::path("/a"));
  slow->set_priority(Priority::long_job);
  slow->schedule();
  running.wait();
  EXPECT_FALSE(slow->is_blocking()) << "nobody waits";
  auto decoration = make_job(
      "decoration", [](ProgressMonitor&) {}, manager_);
  decoration->set_rule(rules::path("/a/b"));
  decoration->set_priority(Priority::decorate);
  decoration->schedule();
  EXPECT_FALSE(slow->is_blocking()) << "a lower priority waits";
  EXPECT_FALSE(decoration->is_blocking()) << "a waiting job blocks nobody";
  auto urgent = make_job(
      "urgent", [](ProgressMonitor&) {}, manager_);
  urgent->set_rule(rules::read_path("/a/c"));
  urgent->set_priority(Priority::interactive);
  urgent->schedule();
  EXPECT_TRUE(slow->is_blocking()) << manager_->rule_snapshot().to_string();
  release.set_value();
  urgent->join();
  decoration->join();
  slow->join();
  EXPECT_FALSE(slow->is_blocking()) << "not running";
}

TEST_F(RuleSnapshotTest, AJobsMonitorIsToldWhileItsRunWaitsInBeginRule) {
  struct Seen {
    std::latch blocked{1};
    std::mutex mutex;
    std::vector<std::string> events;
  };
  struct Watching final : ProgressMonitor {
    explicit Watching(Seen& into) : seen(into) {}
    void on_blocked(std::string_view reason) override {
      {
        std::lock_guard lock(seen.mutex);
        seen.events.emplace_back(reason);
      }
      seen.blocked.count_down();
    }
    void on_unblocked() override {
      std::lock_guard lock(seen.mutex);
      seen.events.emplace_back("unblocked");
    }
    Seen& seen;
  };
  Seen seen;
  manager_->set_progress_provider([&seen](Job&) { return std::make_unique<Watching>(seen); });
  const Rule rule = rules::path("/b");
  manager_->begin_rule(rule);
  std::string reason_inside;
  auto job = make_job(
      "waits inside",
      [&](ProgressMonitor& monitor) {
        manager_->begin_rule(rule);
        reason_inside = monitor.blocked_reason();  // cleared once it got the rule
        manager_->end_rule(rule);
      },
      manager_);
  job->schedule();
  seen.blocked.wait();
  manager_->end_rule(rule);
  job->join();
  EXPECT_TRUE(job->result().is_ok());
  EXPECT_EQ(reason_inside, "");
  std::lock_guard lock(seen.mutex);
  EXPECT_EQ(seen.events,
            (std::vector<std::string>{"waiting for path(/b): " + this_thread_name() + " holds path(/b)",
                                      "unblocked"}));
}

}  // namespace
}  // namespace tasklet
