// A process that contends for rules shared through etcd, for the cross-process tests
// (etcd_processes_test):
//
//   etcd_contender ENDPOINT PREFIX contend SEED COUNT LOG
//       schedules COUNT jobs on a manager made with make_job_manager (two workers), each with a
//       random rule: a shared or exclusive path of a small tree, or two of them combined. Each run
//       writes "token start end mode path [mode path]" to LOG, its fencing token and, read from
//       CLOCK_MONOTONIC (one clock for every process of the host), when it began and ended.
//   etcd_contender ENDPOINT PREFIX hold PATH
//       holds PATH exclusively with begin_rule, prints "held TOKEN" and waits to be killed.
//   etcd_contender ENDPOINT PREFIX wait PATH
//       prints "asking", asks for PATH exclusively with begin_rule, prints "held TOKEN" once granted
//       or "lost WHY" when the lease is lost first, and exits.
//
// Exits 0 when every job ran and every rule was granted.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "child_process.hpp"
#include "tasklet.hpp"
#include "tasklet/etcd/etcd.hpp"

using namespace tasklet;
using namespace tasklet::etcd;
using tasklet::test::monotonic_ns;

namespace {

struct Part {
  std::string path;
  bool exclusive;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: etcd_contender ENDPOINT PREFIX (contend SEED COUNT LOG | hold PATH | wait PATH)\n");
    return 1;
  }
  EtcdOptions options;
  options.endpoints = {argv[1]};
  options.prefix = argv[2];
  options.lease_ttl = std::chrono::seconds(2);
  const std::string mode = argv[3];
  auto session = EtcdSession::connect(options);
  auto manager = make_job_manager(session, JobManager::Options{2, nullptr});

  if (mode == "hold" && argc == 5) {
    const Rule held = rules::path(argv[4]);
    manager->begin_rule(held);
    std::printf("held %lld\n", static_cast<long long>(fencing_token(*manager, held)));
    std::fflush(stdout);
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // until killed
  }
  if (mode == "wait" && argc == 5) {
    const Rule wanted = rules::path(argv[4]);
    std::printf("asking\n");
    std::fflush(stdout);
    try {
      const RuleScope scope(*manager, wanted);
      std::printf("held %lld\n", static_cast<long long>(fencing_token(*manager, wanted)));
    } catch (const EtcdLeaseLost& lost) {
      std::printf("lost %s\n", lost.what());
    }
    std::fflush(stdout);
    return 0;
  }
  if (mode != "contend" || argc != 7) return 1;

  std::mt19937 random(static_cast<unsigned>(std::stoul(argv[4])));
  const int count = std::stoi(argv[5]);
  std::ofstream log(argv[6]);
  std::mutex log_mutex;
  // A small tree: the root, /a and /b, and two levels under each.
  std::vector<std::string> paths = {"/"};
  for (const char* top : {"/a", "/b"}) {
    paths.emplace_back(top);
    for (const char* mid : {"/x", "/y"}) {
      paths.push_back(std::string(top) + mid);
      for (const char* leaf : {"/1", "/2"}) paths.push_back(std::string(top) + mid + leaf);
    }
  }
  std::uniform_int_distribution<std::size_t> any_path(1, paths.size() - 1);  // the root rarely
  std::vector<std::shared_ptr<Job>> jobs;
  for (int i = 0; i < count; ++i) {
    std::vector<Part> parts;
    parts.push_back({random() % 50 == 0 ? "/" : paths[any_path(random)], random() % 2 == 0});
    if (random() % 4 == 0) {
      Part second{paths[any_path(random)], random() % 2 == 0};
      if (second.path != parts.front().path) parts.push_back(second);
    }
    std::vector<Rule> rules_of_job;
    for (const Part& part : parts)
      rules_of_job.push_back(part.exclusive ? rules::path(part.path) : rules::read_path(part.path));
    const Rule rule = rules::combine(rules_of_job);
    const unsigned work = static_cast<unsigned>(random() % 2000);
    auto job = make_job(
        "contender " + std::to_string(i),
        [&, parts, rule, work](ProgressMonitor&) {
          const std::int64_t token = fencing_token(*manager, rule);
          const long long start = monotonic_ns();
          std::this_thread::sleep_for(std::chrono::microseconds(work));  // the holder's work
          const long long end = monotonic_ns();
          std::lock_guard lock(log_mutex);
          log << token << ' ' << start << ' ' << end;
          for (const Part& part : parts) log << ' ' << (part.exclusive ? 'X' : 'S') << ' ' << part.path;
          log << '\n';
          return Status::ok();
        },
        manager);
    job->set_rule(rule);
    job->schedule();
    jobs.push_back(job);
  }
  int failed = 0;
  for (const std::shared_ptr<Job>& job : jobs) {
    job->join();
    if (!job->result().is_ok()) {
      std::fprintf(stderr, "contender: %s ended with %s\n", job->name().c_str(),
                   job->result().message.c_str());
      ++failed;
    }
  }
  std::lock_guard lock(log_mutex);
  return failed == 0 && log.good() ? 0 : 1;
}
