// Locking a resource hierarchy with path rules: a job holding /project excludes every job under it,
// while /project/src and /project/docs run side by side. A thread locks part of the tree with
// begin_rule/end_rule (RuleScope), in the same FIFO order as the jobs.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tasklet.hpp"

using namespace tasklet;
using namespace std::chrono_literals;

namespace {

std::mutex log_mutex;
std::vector<std::string> log_lines;
const auto start = std::chrono::steady_clock::now();

void log(const std::string& line) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  std::lock_guard lock(log_mutex);
  log_lines.push_back("[" + std::to_string(ms.count()) + " ms] " + line);
}

// A job that works on `path` for a while on a worker thread, holding the path's rule.
std::shared_ptr<Tasklet> job(const std::string& path, std::chrono::milliseconds work) {
  auto tasklet = make_tasklet(
      [path, work, step = 0]() mutable {
        if (step++ == 0) return Directive::async;
        log("start " + path);
        std::this_thread::sleep_for(work);  // stands in for real work on the files
        log("end   " + path);
        return Directive::done;
      },
      rules::path(path));
  tasklet->set_name(path);
  return tasklet;
}

}  // namespace

int main() {
  auto manager = JobManager::create({.concurrency = 4});
  auto scheduler = Scheduler::create({.manager = manager});

  scheduler->schedule(job("/project/src", 40ms), Directive::sync);
  scheduler->schedule(job("/project/docs", 40ms), Directive::sync);       // a sibling: runs alongside
  scheduler->schedule(job("/project", 20ms), Directive::sync);            // waits for both, then runs
  scheduler->schedule(job("/project/src/a.cpp", 10ms), Directive::sync);  // queued after /project

  // A thread locks /project/docs/guide.md directly; it queues behind /project as well.
  std::thread editor([&] {
    RuleScope scope(*manager, rules::path("/project/docs/guide.md"));
    log("editor holds /project/docs/guide.md");
  });

  scheduler->run();
  editor.join();
  for (const std::string& line : log_lines) std::printf("%s\n", line.c_str());
  return manager->rule_stats().held == 0 ? 0 : 1;
}
