// A short oracle pass for a manager that went through injected faults: jobs on random path rules,
// read and write, over a small tree, each recording when it held its rule as an interval of one
// sequence counter (taken inside the hold); then no two conflicting holds may overlap, and every
// job must have run. It proves the rule table still excludes what it must after the faults.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/job_support.hpp"
#include "tasklet.hpp"

namespace tasklet::test {

/// Runs `count` jobs on `manager` and checks that conflicting ones never held their rules at once.
inline void expect_rules_still_exclude(const std::shared_ptr<JobManager>& manager, std::size_t count = 300,
                                       unsigned seed = 1) {
  static const char* const paths[] = {"/", "/a", "/a/b", "/a/b/c", "/a/d", "/e", "/e/f"};
  std::mt19937 random(seed);
  std::vector<Rule> held(count);
  std::vector<std::uint64_t> from(count), to(count);
  std::atomic<std::uint64_t> clock{0};
  std::vector<std::shared_ptr<Job>> jobs;
  jobs.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::string path = paths[random() % std::size(paths)];
    held[i] = random() % 3 == 0 ? rules::path(path) : rules::read_path(path);
    jobs.push_back(make_job(
        "oracle " + std::to_string(i),
        [&, i](ProgressMonitor&) {
          from[i] = clock.fetch_add(1) + 1;
          std::this_thread::yield();  // room for a wrongly granted job to overlap
          to[i] = clock.fetch_add(1) + 1;
          return Status::ok();
        },
        manager));
    jobs.back()->set_rule(held[i]);
  }
  for (const auto& job : jobs) job->schedule();
  for (const auto& job : jobs) ASSERT_TRUE(job->join(patience)) << job->name() << " never ended";
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_TRUE(jobs[i]->result().is_ok()) << jobs[i]->name() << ": " << jobs[i]->result().message;
    ASSERT_NE(to[i], 0u) << jobs[i]->name() << " did not run";
  }
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t j = i + 1; j < count; ++j) {
      const bool overlap = from[i] < to[j] && from[j] < to[i];
      if (overlap && (held[i]->is_conflicting(*held[j]) || held[j]->is_conflicting(*held[i]))) {
        ADD_FAILURE() << held[i]->to_string() << " and " << held[j]->to_string() << " were held at once by "
                      << jobs[i]->name() << " and " << jobs[j]->name();
        return;
      }
    }
  }
  const auto stats = manager->rule_stats();
  EXPECT_EQ(stats.held, 0u);
  EXPECT_EQ(stats.waiting, 0u);
}

}  // namespace tasklet::test
