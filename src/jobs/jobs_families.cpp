// Operations on every job of a family, or of the manager: find, cancel, sleep, wake_up and join by
// family, suspend and resume, is_idle, and the cancel of a group.
#include "jobs/jobs.hpp"

#include <algorithm>
#include <utility>

#include "tasklet/error.hpp"

namespace tasklet::detail {

namespace jw = job_word;

namespace {

bool in_family(const Job& job, Family family) {
  if (family == nullptr) return true;
  try {
    return job.belongs_to(family);
  } catch (...) {
    return false;
  }
}

}  // namespace

std::vector<std::shared_ptr<Job>> Jobs::find(Family family) const {
  std::vector<std::pair<std::uint64_t, std::shared_ptr<Job>>> listed;
  for_each_listed([&](JobCore& job) {
    if (job.keep_alive) listed.emplace_back(job.order.load(std::memory_order_relaxed), job.keep_alive);
  });
  // In the order they were first scheduled (wake_up(family) keeps it).
  std::sort(listed.begin(), listed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::shared_ptr<Job>> members;
  members.reserve(listed.size());
  for (auto& [order, job] : listed) {
    if (in_family(*job, family)) members.push_back(std::move(job));  // user code, outside the locks
  }
  return members;
}

void Jobs::cancel(Family family) {
  for (const auto& job : find(family)) job->cancel();
}

void Jobs::sleep(Family family) {
  for (const auto& job : find(family)) job->sleep();
}

void Jobs::wake_up(Family family) {
  for (const auto& job : find(family)) job->wake_up();
}

bool Jobs::join(Family family, std::chrono::milliseconds timeout) {
  if (const JobCore* current = running_job(); current != nullptr && in_family(current->job(), family)) {
    throw IllegalState("join(family) from job '" + current->job().name() +
                       "' of that family would wait for itself");
  }
  const Clock::time_point deadline = deadline_after(timeout);
  const Watching watching(watchers_);
  for (;;) {
    std::uint64_t seen = 0;
    {
      std::lock_guard lock(mutex);
      seen = changes_;
    }
    // Membership is user code (belongs_to): decided outside the locks, then wait for any change.
    const std::vector<std::shared_ptr<Job>> members = find(family);
    const bool suspended = is_suspended();
    const bool busy = std::any_of(members.begin(), members.end(), [&](const auto& job) {
      const JobState now = job->state();
      if (suspended) return now == JobState::running;
      return true;  // listed: waiting, sleeping, running, or about to run again
    });
    if (!busy) return true;
    std::unique_lock lock(mutex);
    if (!changed_.wait_until(
            lock, deadline, [&] { return changes_ != seen; }, timer_.get()))
      return false;
  }
}

void Jobs::suspend() {
  std::lock_guard lock(mutex);
  suspended_.store(true, std::memory_order_release);
}

void Jobs::resume() {
  ToStart to_start;
  {
    std::lock_guard lock(mutex);
    suspended_.store(false, std::memory_order_release);
    std::deque<JobCore*> held = std::move(held_entered_);
    held_entered_.clear();
    for (JobCore* job : held_) held.push_back(job);
    held_.clear();
    for (JobCore* job : held) {
      if (job->state() == JobState::waiting) enter_waiting(*job, to_start);
    }
  }
  start(to_start);
  changed();
}

bool Jobs::is_idle() const {
  bool idle = true;
  for_each_listed([&](JobCore& job) {
    const std::uint32_t word = job.load();
    const JobState now = jw::phase(word);
    if (now == JobState::waiting || now == JobState::running ||
        (word & (jw::rerun_pending | jw::ending)) != 0)
      idle = false;
  });
  return idle;
}

// Out of memory for the list of members, it throws before the group changed. A member's cancel()
// that runs out of memory leaves that member running; the others are still canceled.
void Jobs::group_cancel(GroupCore& group, std::optional<std::uint64_t> generation) {
  std::vector<std::shared_ptr<Job>> members;
  {
    std::lock_guard lock(mutex);
    std::lock_guard group_lock(group.mutex);
    if (group.state == JobGroup::State::none) return;
    if (generation && *generation != group.generation) return;
    members.reserve(group.active.size() + group.throttled.size());
    group.state = JobGroup::State::canceling;
    for (JobCore* job : group.active) members.push_back(job->owned());
    for (JobCore* job : group.throttled) members.push_back(job->owned());
  }
  for (auto& job : members) {
    try {
      job->cancel();
    } catch (...) {
    }
  }
}

}  // namespace tasklet::detail
