// The public JobManager's methods of this room: making one, rules (begin_rule, end_rule,
// RuleScope, transfer_rule, the lock listener, the rule snapshot) and the trace. Each hands over
// to the manager's Domain; its job methods are the jobs room's (jobs/job_manager_jobs.cpp).
#include <chrono>
#include <cstdlib>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "scheduler/domain.hpp"
#include "tasklet/job_manager.hpp"

namespace tasklet {

JobManager::~JobManager() = default;

std::shared_ptr<JobManager> JobManager::create(Options options) {
  return std::make_shared<detail::ManagerHandle>(std::move(options));
}

const std::shared_ptr<JobManager>& JobManager::global() {
  // Never destroyed: schedulers and jobs may outlive static destruction order.
  static const auto* manager = [] {
    auto* made = new std::shared_ptr<JobManager>(create());
    // Never destroyed, so a trace that TASKLET_TRACE asked for is saved at exit.
    if (const char* file = std::getenv("TASKLET_TRACE"); file != nullptr && *file != '\0') {
      std::atexit([] { detail::domain(*global()).save_trace_file(); });
    }
    return made;
  }();
  return *manager;
}

void JobManager::begin_rule(const Rule& rule) { detail::domain(*this).begin_rule(rule); }
void JobManager::end_rule(const Rule& rule) { detail::domain(*this).end_rule(rule); }
JobManager::RuleStats JobManager::rule_stats() const {
  detail::RuleTable& table = detail::domain(*this).table_;
  return RuleStats{table.held_count(), table.waiting_count()};
}

const std::shared_ptr<Workers>& JobManager::workers() const noexcept {
  return detail::domain(*this).workers_;
}

RuleScope::RuleScope(JobManager& manager, Rule rule) : manager_(manager), rule_(std::move(rule)) {
  try {
    manager_.begin_rule(rule_);
  } catch (const std::bad_alloc&) {
    throw;  // nothing was pushed
  } catch (...) {
    manager_.end_rule(rule_);
    throw;
  }
}

RuleScope::~RuleScope() {
  try {
    manager_.end_rule(rule_);
  } catch (...) {
    // Only a scope ended out of order by hand can get here; destructors never throw.
  }
}

void JobManager::start_trace(std::size_t max_events) { detail::domain(*this).start_trace(max_events); }
void JobManager::stop_trace() { detail::domain(*this).stop_trace(); }
void JobManager::write_trace(std::ostream& out, TraceFormat format) const {
  detail::domain(*this).write_trace(out, format);
}

void JobManager::save_trace(const std::string& path) const { detail::domain(*this).save_trace(path); }

void JobManager::set_lock_listener(std::shared_ptr<LockListener> listener) {
  detail::domain(*this).set_lock_listener(std::move(listener));
}

void JobManager::transfer_rule(const Rule& rule, std::thread::id destination) {
  detail::domain(*this).transfer_rule(rule, destination);
}
Rule JobManager::current_rule() const { return detail::domain(*this).current_rule(); }

RuleSnapshot JobManager::rule_snapshot(std::size_t max_waiters) const {
  RuleSnapshot snapshot;
  snapshot.taken = std::chrono::steady_clock::now();
  const auto seen = detail::domain(*this).table_.snapshot(max_waiters, snapshot.waiters_left_out);
  snapshot.requests.reserve(seen.size());
  for (std::size_t i = 0; i < seen.size(); ++i) {
    RuleSnapshot::Request request{
        seen[i].who.owner, seen[i].who.rule, seen[i].who.holds, seen[i].shared, {}, {}, std::nullopt};
    if (seen[i].since) {
      request.since = std::chrono::steady_clock::time_point(
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::nanoseconds(*seen[i].since)));
    }
    if (!request.held) {
      for (std::size_t other = 0; other < i; ++other) {
        if (!detail::RuleTable::conflict(seen[i], seen[other])) continue;
        (seen[other].who.holds ? request.blocked_by : request.behind).push_back(other);
      }
    }
    snapshot.requests.push_back(std::move(request));
  }
  return snapshot;
}

std::string RuleSnapshot::to_string() const {
  std::size_t held = 0;
  for (const Request& request : requests) held += request.held ? 1 : 0;
  std::string text = "rule table: " + std::to_string(held) + " held, " +
                     std::to_string(requests.size() - held + waiters_left_out) + " waiting\n";
  const auto name = [this](std::size_t at) { return "[" + std::to_string(at) + "] " + requests[at].owner; };
  for (std::size_t at = 0; at < requests.size(); ++at) {
    const Request& request = requests[at];
    text += "  " + name(at) + (request.held ? " holds " : " waits for ") + describe(request.rule) +
            (request.shared ? " (shared" : " (exclusive");
    if (request.since) {
      const auto micros =
          std::chrono::duration_cast<std::chrono::microseconds>(taken - *request.since).count();
      text += ", for " +
              (micros < 10'000 ? std::to_string(micros) + " us" : std::to_string(micros / 1000) + " ms");
    }
    text += ")";
    const auto list = [&](const char* what, const std::vector<std::size_t>& which) {
      if (which.empty()) return;
      text += std::string(text.back() == ')' ? ": " : "; ") + what + " ";
      for (std::size_t i = 0; i < which.size(); ++i) text += (i == 0 ? "" : ", ") + name(which[i]);
    };
    list("blocked by", request.blocked_by);
    list("behind", request.behind);
    text += "\n";
  }
  if (waiters_left_out != 0) text += "  ... and " + std::to_string(waiters_left_out) + " more waiting\n";
  return text;
}

}  // namespace tasklet
