// Rules on jobs: conflicting jobs run one at a time in schedule order, a job's rule changes only
// in state none, rules begun in run() and left open, and yield_rule().
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "support/exclusion_check.hpp"
#include "support/job_support.hpp"
#include "support/test_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

using test::eventually;
using test::Gate;
using test::JobTest;
using test::patience;

TEST_F(JobTest, ConflictingJobsFinishInScheduleOrder) {
  const Rule rule = rules::path("/shared");
  std::vector<int> order;  // guarded by the rule
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 500; ++i) {
    auto j = job("j" + std::to_string(i), [&, i](ProgressMonitor&) {
      order.push_back(i);
      return Status::ok();
    });
    j->set_rule(rule);
    jobs.push_back(j);
  }
  for (auto& j : jobs) j->schedule();
  EXPECT_TRUE(manager_->join(nullptr, 60s));
  ASSERT_EQ(order.size(), 500u);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST_F(JobTest, OneOfTenJobsOnAMutexRuleRunsAndCancelingOneLetsTheNextGo) {
  const Rule rule = rules::mutex("one at a time");
  std::vector<std::unique_ptr<Gate>> releases;
  std::vector<std::unique_ptr<Gate>> entered;
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 10; ++i) {
    releases.push_back(std::make_unique<Gate>());
    entered.push_back(std::make_unique<Gate>());
    Gate& release = *releases.back();
    Gate& in = *entered.back();
    jobs.push_back(job("m" + std::to_string(i), [&release, &in](ProgressMonitor&) {
      in.open();
      release.wait();
      return Status::ok();
    }));
    jobs.back()->set_rule(rule);
    jobs.back()->schedule();
  }
  ASSERT_TRUE(entered[0]->wait());
  EXPECT_EQ(jobs[0]->state(), JobState::running);
  for (int i = 1; i < 10; ++i) EXPECT_EQ(jobs[static_cast<std::size_t>(i)]->state(), JobState::waiting);
  EXPECT_TRUE(jobs[1]->cancel());
  releases[0]->open();
  ASSERT_TRUE(entered[2]->wait()) << "the canceled job's successor runs next";
  EXPECT_FALSE(entered[1]->is_open());
  for (auto& release : releases) release->open();
  EXPECT_TRUE(manager_->join(nullptr, patience));
  EXPECT_TRUE(jobs[1]->result().is_canceled());
}

TEST_F(JobTest, TheRuleCanChangeOnlyInStateNone) {
  const Rule a = rules::mutex("a"), b = rules::mutex("b");
  Gate in_run, release;
  auto j = job("ruled", [&](ProgressMonitor&) {
    in_run.open();
    release.wait();
    return Status::ok();
  });
  j->set_rule(a);
  j->schedule(std::chrono::hours(1));
  EXPECT_THROW(j->set_rule(b), TaskletActive);
  j->wake_up();
  ASSERT_TRUE(in_run.wait());
  EXPECT_THROW(j->set_rule(b), TaskletActive);
  EXPECT_THROW(j->set_group(std::make_shared<JobGroup>("g")), TaskletActive);
  release.open();
  EXPECT_TRUE(j->join(patience));
  j->set_rule(b);
  EXPECT_EQ(j->rule(), b);
  j->set_rule(nullptr);
  EXPECT_EQ(j->rule(), nullptr);
}

TEST_F(JobTest, ARuleTakenAwayIsNotHeldByTheNextRun) {
  const Rule rule = rules::mutex("only the first run");
  std::atomic<int> runs{0};
  auto j = job("rule then none", [&](ProgressMonitor&) {
    runs.fetch_add(1);
    return Status::ok();
  });
  j->set_rule(rule);
  j->schedule();
  j->join();
  j->set_rule(nullptr);
  manager_->begin_rule(rule);  // the second run must not wait for it
  j->schedule();
  const bool ended = j->join(patience);
  manager_->end_rule(rule);
  EXPECT_TRUE(ended);
  EXPECT_EQ(runs.load(), 2);
}

TEST_F(JobTest, TheNameCanChangeOnlyInStateNone) {
  Gate in_run, release;
  auto j = job("first name", [&](ProgressMonitor&) {
    in_run.open();
    release.wait();
    return Status::ok();
  });
  j->set_name("second name");
  EXPECT_EQ(j->name(), "second name");
  j->schedule();
  ASSERT_TRUE(in_run.wait());
  try {
    j->set_name("third name");
    FAIL() << "renamed while running";
  } catch (const TaskletActive& error) {
    EXPECT_NE(std::string(error.what()).find("second name"), std::string::npos) << error.what();
  }
  release.open();
  EXPECT_TRUE(j->join(patience));
  j->set_name("third name");
  EXPECT_EQ(j->name(), "third name");
}

TEST_F(JobTest, ARuleBegunInAJobAndNotEndedIsReleasedWhenTheRunEnds) {
  const Rule rule = rules::path("/left/open");
  auto j = job("forgetful", [&](ProgressMonitor&) {
    manager_->begin_rule(rule);
    return Status::ok();
  });
  j->schedule();
  EXPECT_TRUE(j->join(patience));
  EXPECT_EQ(manager_->rule_stats().held, 0u) << "released by the time join() returns";
  const Status result = j->result();
  EXPECT_TRUE(result.is_error());
  EXPECT_NE(result.message.find("/left/open"), std::string::npos) << result.message;
  EXPECT_THROW(std::rethrow_exception(result.exception), RuleMismatch);
  RuleScope scope(*manager_, rule);  // free again: does not wait
  EXPECT_EQ(manager_->current_rule(), rule);
}

TEST_F(JobTest, YieldRuleLetsAConflictingJobGoFirst) {
  const Rule rule = rules::mutex("shared");
  std::vector<std::string> order;
  std::mutex order_mutex;
  const auto note = [&](std::string what) {
    std::lock_guard lock(order_mutex);
    order.push_back(std::move(what));
  };
  Gate b_waiting;
  std::atomic<bool> yielded{false};
  auto a = job("a", [&](ProgressMonitor&) {
    note("a starts");
    if (!eventually([&] { return manager_->rule_stats().waiting != 0; }))
      return Status::error("b never came");
    yielded = manager_->current_job()->yield_rule();
    note("a resumes");
    return Status::ok();
  });
  auto b = job("b", [&](ProgressMonitor&) {
    note("b runs");
    return Status::ok();
  });
  a->set_rule(rule);
  b->set_rule(rule);
  a->schedule();
  b->schedule();
  EXPECT_TRUE(manager_->join(nullptr, 30s));
  EXPECT_TRUE(yielded.load());
  EXPECT_EQ(order, (std::vector<std::string>{"a starts", "b runs", "a resumes"}));
  auto lone = job("lone", [&](ProgressMonitor&) {
    return manager_->current_job()->yield_rule() ? Status::error("nobody waited") : Status::ok();
  });
  lone->set_rule(rule);
  lone->schedule();
  lone->join();
  EXPECT_TRUE(lone->result().is_ok());
}

TEST_F(JobTest, YieldRuleOutsideTheJobsRunThrows) {
  auto j = job("idle", [](ProgressMonitor&) { return Status::ok(); });
  try {
    j->yield_rule();
    ADD_FAILURE() << "yield_rule outside run() did not throw";
  } catch (const IllegalState& error) {
    EXPECT_NE(std::string(error.what()).find("'idle'"), std::string::npos) << error.what();
  }
}

// A user's rule whose check throws when asked about a path rule: jobs holding it and jobs on a path
// rule never run together (a throwing check counts as a conflict), all of them end ok, and the
// table is empty afterwards (the fixture checks).
TEST_F(JobTest, JobsOnACustomRuleWhoseCheckThrowsStillRunAndExcludeEachOther) {
  const Rule broken = std::make_shared<test::ThrowsOnPathRule>();
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < 200; ++i) {
    auto j = job("j" + std::to_string(i), [&](ProgressMonitor&) {
      if (inside.fetch_add(1) != 0) overlapped = true;
      std::this_thread::yield();
      inside.fetch_sub(1);
      return Status::ok();
    });
    j->set_rule(i % 2 == 0 ? broken : rules::path("/p"));  // one path: only the throw separates kinds
    jobs.push_back(j);
  }
  for (auto& j : jobs) j->schedule();
  for (auto& j : jobs) {
    EXPECT_TRUE(j->join(60s)) << j->name();
    EXPECT_TRUE(j->result().is_ok()) << j->name();
  }
  EXPECT_FALSE(overlapped.load()) << "a job on the broken rule ran beside a job on a path rule";
  test::expect_rules_still_exclude(manager_);
}

}  // namespace
}  // namespace tasklet
