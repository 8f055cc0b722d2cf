// Progress groups: several jobs report into one monitor, each with its share of the work.
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string_view>

#include <gtest/gtest.h>

#include "support/job_support.hpp"

namespace tasklet {
namespace {

using test::Gate;
using test::patience;

class ProgressGroupTest : public test::JobTest {};

// A group monitor that counts the calls of its hook (from several runners at once).
class Bar final : public ProgressMonitor {
 public:
  std::atomic<int> updates{0};

 protected:
  void on_worked(double, int) override { updates.fetch_add(1); }
};

TEST_F(ProgressGroupTest, JobsReportTheirSharesIntoOneMonitor) {
  std::atomic<int> provided{0};
  manager_->set_progress_provider([&](Job&) {
    provided.fetch_add(1);
    return std::make_unique<ProgressMonitor>();
  });
  auto bar = std::make_shared<Bar>();
  bar->begin_task("batch", 60);
  std::vector<std::shared_ptr<Job>> jobs;
  for (int share : {10, 20, 30}) {
    auto j = job("part " + std::to_string(share), [](ProgressMonitor& monitor) {
      monitor.begin_task("files", 4);
      for (int i = 0; i < 4; ++i) monitor.worked(1);
      return Status::ok();
    });
    j->set_progress_group(bar, share);
    EXPECT_EQ(j->progress_group(), bar);
    jobs.push_back(j);
  }
  auto ungrouped = job("alone", [](ProgressMonitor&) { return Status::ok(); });
  for (auto& j : jobs) j->schedule();
  ungrouped->schedule();
  for (auto& j : jobs) ASSERT_TRUE(j->join(patience));
  ASSERT_TRUE(ungrouped->join(patience));
  EXPECT_NEAR(bar->work_done(), 60.0, 1e-9);
  EXPECT_GE(bar->updates.load(), 3);
  EXPECT_FALSE(bar->is_done()) << "the group is the user's to finish";
  EXPECT_EQ(provided.load(), 1) << "only the job outside the group asks the provider";
}

TEST_F(ProgressGroupTest, CancelingTheGroupCancelsItsRuns) {
  auto bar = std::make_shared<ProgressMonitor>();
  bar->begin_task("batch", 1);
  Gate running;
  auto j = job("polls", [&](ProgressMonitor& monitor) {
    running.open();
    while (!monitor.is_canceled()) std::this_thread::yield();  // a long job that polls
    return Status::cancel();
  });
  j->set_progress_group(bar, 1);
  j->schedule();
  ASSERT_TRUE(running.wait());
  bar->set_canceled(true);
  ASSERT_TRUE(j->join(patience));
  EXPECT_TRUE(j->result().is_canceled());
}

TEST_F(ProgressGroupTest, TheGroupIsSetInStateNoneOnly) {
  auto bar = std::make_shared<ProgressMonitor>();
  Gate running, release;
  auto j = job("busy", [&](ProgressMonitor&) {
    running.open();
    release.wait();
    return Status::ok();
  });
  EXPECT_THROW(j->set_progress_group(bar, -1), std::invalid_argument);
  j->schedule();
  ASSERT_TRUE(running.wait());
  EXPECT_THROW(j->set_progress_group(bar, 1), TaskletActive);
  release.open();
  ASSERT_TRUE(j->join(patience));
  j->set_progress_group(bar, 1);
  j->set_progress_group(nullptr, 0);
  EXPECT_EQ(j->progress_group(), nullptr);
}

}  // namespace
}  // namespace tasklet
