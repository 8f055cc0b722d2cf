// Families: finding, canceling, joining, putting to sleep and waking the jobs of one family.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

using namespace std::chrono_literals;

using test::Gate;
using test::JobTest;
using test::patience;

struct Tagged final : Job {
  Tagged(std::string name, Family family, std::shared_ptr<JobManager> manager)
      : Job(std::move(name), std::move(manager)), family_(family) {}
  bool belongs_to(Family family) const override { return family == family_; }
  Status run(ProgressMonitor& monitor) override {
    while (!monitor.is_canceled() && blocked && !released->load()) std::this_thread::yield();
    return monitor.is_canceled() ? Status::cancel() : Status::ok();
  }
  Family family_;
  bool blocked = false;
  std::atomic<bool>* released = nullptr;
};

TEST_F(JobTest, FamiliesFindCancelJoinSleepAndWake) {
  static const int builds = 0, docs = 0;
  std::atomic<bool> released{false};
  std::vector<std::shared_ptr<Tagged>> build_jobs;
  for (int i = 0; i < 3; ++i) {
    auto j = std::make_shared<Tagged>("build" + std::to_string(i), &builds, manager_);
    j->blocked = true;
    j->released = &released;
    build_jobs.push_back(j);
  }
  auto doc = std::make_shared<Tagged>("doc", &docs, manager_);
  doc->schedule(std::chrono::hours(1));
  for (auto& j : build_jobs) j->schedule();
  EXPECT_EQ(manager_->find(&builds).size(), 3u);
  EXPECT_EQ(manager_->find(&docs).size(), 1u);
  EXPECT_FALSE(manager_->join(&builds, 20ms));
  manager_->cancel(&builds);
  EXPECT_TRUE(manager_->join(&builds, 30s));
  for (auto& j : build_jobs) EXPECT_TRUE(j->result().is_canceled()) << j->name();
  EXPECT_EQ(doc->state(), JobState::sleeping) << "other families are left alone";
  manager_->wake_up(&docs);
  EXPECT_TRUE(manager_->join(&docs, 30s));
  EXPECT_TRUE(doc->result().is_ok());
}

struct Member final : Job {
  Member(std::string name, Family family, std::shared_ptr<JobManager> manager)
      : Job(std::move(name), std::move(manager)), family_(family) {}
  bool belongs_to(Family family) const override { return family == family_; }
  Status run(ProgressMonitor&) override {
    const int done = runs.fetch_add(1) + 1;
    if (done < repeat) schedule();
    return Status::ok();
  }
  Family family_;
  int repeat = 1;
  std::atomic<int> runs{0};
};

TEST_F(JobTest, JoiningAFamilyWaitsForEveryRunOfARepeatingMember) {
  static const int family = 0;
  auto repeating = std::make_shared<Member>("repeating", &family, manager_);
  repeating->repeat = 25;
  repeating->schedule();
  EXPECT_TRUE(manager_->join(&family, patience));
  EXPECT_EQ(repeating->runs.load(), 25);
}

TEST_F(JobTest, FamilyOperationsSkipEndedJobsAndAnEmptyFamilyJoinsAtOnce) {
  static const int family = 0, nobody = 0;
  const Rule rule = rules::mutex("held");
  manager_->begin_rule(rule);
  std::vector<std::shared_ptr<Member>> members;
  for (int i = 0; i < 5; ++i) {
    members.push_back(std::make_shared<Member>("member" + std::to_string(i), &family, manager_));
    members.back()->set_rule(rule);
    members.back()->schedule();
  }
  EXPECT_TRUE(manager_->join(&nobody, 0ms));
  EXPECT_TRUE(manager_->find(&nobody).empty());
  manager_->cancel(&family);
  EXPECT_TRUE(manager_->find(&family).empty());
  manager_->sleep(&family);
  manager_->wake_up(&family);
  for (auto& member : members) {
    EXPECT_EQ(member->state(), JobState::none) << member->name();
    EXPECT_TRUE(member->result().is_canceled());
  }
  manager_->end_rule(rule);
  EXPECT_TRUE(manager_->join(&family, patience));
  for (auto& member : members) EXPECT_EQ(member->runs.load(), 0);
}

// A job of one family that notes its name in `order` when it runs.
class Noting final : public Job {
 public:
  Noting(std::string name, Family family, std::vector<std::string>& order, std::mutex& mutex,
         std::shared_ptr<JobManager> manager)
      : Job(std::move(name), std::move(manager)), family_(family), order_(order), mutex_(mutex) {}
  bool belongs_to(Family family) const override { return family == family_; }

 protected:
  Status run(ProgressMonitor&) override {
    std::lock_guard lock(mutex_);
    order_.push_back(name());
    return Status::ok();
  }

 private:
  Family family_;
  std::vector<std::string>& order_;
  std::mutex& mutex_;
};

// wake_up(family) puts the family's sleeping jobs back in the order they were first scheduled,
// whatever order they were made, put to sleep or scheduled again in. The one runner is taken by a
// blocker until they are all awake, and then runs them in the order they wait.
TEST_F(JobTest, WakingAFamilyQueuesItsJobsInTheOrderTheyWereFirstScheduled) {
  static const int family = 0;
  Gate blocker_in, release;
  std::vector<std::string> order;
  std::mutex order_mutex;
  auto one = JobManager::create(JobManager::Options{1, nullptr});
  auto blocker = make_job(
      "blocker",
      [&](ProgressMonitor&) {
        blocker_in.open();
        release.wait();
        return Status::ok();
      },
      one);
  blocker->schedule();
  ASSERT_TRUE(blocker_in.wait());

  std::vector<std::shared_ptr<Noting>> jobs;
  for (int i = 0; i < 6; ++i) {
    jobs.push_back(std::make_shared<Noting>("j" + std::to_string(i), &family, order, order_mutex, one));
  }
  const std::vector<std::size_t> schedule_order{3, 0, 5, 1, 4, 2};
  const std::vector<std::size_t> sleep_order{1, 4, 0, 2, 5, 3};
  for (const std::size_t i : schedule_order) jobs[i]->schedule();
  for (const std::size_t i : sleep_order) EXPECT_TRUE(jobs[i]->sleep()) << jobs[i]->name();
  for (const std::size_t i : sleep_order) jobs[i]->schedule();  // sleeping: no effect
  for (const auto& j : jobs) EXPECT_EQ(j->state(), JobState::sleeping) << j->name();
  one->wake_up(&family);
  for (const auto& j : jobs) EXPECT_EQ(j->state(), JobState::waiting) << j->name();
  release.open();
  EXPECT_TRUE(one->join(nullptr, patience));

  std::vector<std::string> expected;
  for (const std::size_t i : schedule_order) expected.push_back(jobs[i]->name());
  std::lock_guard lock(order_mutex);
  EXPECT_EQ(order, expected);
}

}  // namespace
}  // namespace tasklet
