// tasklet_bench_etcd: rules shared through etcd (tasklet::etcd) against etcd's own lock service
// (v3lock's Lock + Unlock), on one etcd that the benchmark starts on loopback (Debian's
// etcd-server). Both sides use the same kind of client (libcurl to the JSON gateway) and lease.
//
//   latency     one thread: begin_rule + end_rule of a named mutex on a manager made with
//               make_job_manager, uncontended, against Lock + Unlock of one name (<= 1.5x); the
//               same with an exclusive path rule, and with a job that holds the path
//   threads     one process, four threads, each holding its own path (disjoint) or paths on one
//               branch (overlapping: /b and /b/<i>), against four threads locking four names or
//               one name, each thread with a lease of its own (v3lock excludes leases, not threads)
//   processes   four processes (this program again), the same two ways: each process's holds
//               against each process's Locks, timed from when all are connected until all are done
//   claims      the claims alone (no manager): acquire + release of one path
//
// Throughput rows report time per hold over all threads or processes (lower is better).
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <future>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "etcd/gateway.hpp"
#include "etcd/session_access.hpp"
#include "etcd_server.hpp"
#include "harness.hpp"
#include "tasklet.hpp"
#include "tasklet/etcd/etcd.hpp"

extern char** environ;

namespace {

using tasklet::bench::Comparison;
using tasklet::bench::comparison_row;
using tasklet::bench::Options;
using tasklet::bench::Report;
using namespace tasklet::etcd;

constexpr int workers = 4;  // threads or processes of the throughput rows

EtcdOptions settings_for(const std::string& endpoint) {
  EtcdOptions settings;
  settings.endpoints = {endpoint};
  settings.prefix = "/bench";
  return settings;
}

// etcd's lock service, with a session's lease.
class LockService {
 public:
  explicit LockService(const std::shared_ptr<EtcdSession>& session)
      : gateway_(session->options()), lease_(std::to_string(session->lease_id())) {}
  void lock_and_unlock(const std::string& name) {
    const detail::Json locked =
        gateway_.call("/v3/lock/lock", detail::Json{{"name", detail::base64(name)}, {"lease", lease_}});
    const std::string key = locked.value("key", std::string());
    if (key.empty()) throw std::runtime_error("v3lock gave no key: " + locked.dump());
    gateway_.call("/v3/lock/unlock", detail::Json{{"key", key}});
  }

 private:
  detail::Gateway gateway_;
  std::string lease_;
};

// What worker `index` of `count` holds: its own path, or one on a shared branch.
tasklet::Rule rule_of(bool overlapping, int index) {
  if (!overlapping) return tasklet::rules::path("/w/" + std::to_string(index));
  return tasklet::rules::path(index % 2 == 0 ? "/b" : "/b/" + std::to_string(index));
}
std::string lock_name_of(bool overlapping, int index) {
  return overlapping ? "b" : "w" + std::to_string(index);
}

// `holds` holds of worker `index`, ours (a manager) or the lock service's.
void hold_many(bool ours, bool overlapping, int index, std::size_t holds, tasklet::JobManager* manager,
               LockService* service) {
  for (std::size_t i = 0; i < holds; ++i) {
    if (ours) {
      const tasklet::RuleScope scope(*manager, rule_of(overlapping, index));
    } else {
      service->lock_and_unlock(lock_name_of(overlapping, index));
    }
  }
}

void bench_latency(Report& report, const Options& options, const std::string& endpoint) {
  auto session = EtcdSession::connect(settings_for(endpoint));
  auto manager = make_job_manager(session);
  LockService service(session);
  const std::size_t n = options.quick ? 30 : 300;
  const auto v3lock = [&] {
    for (std::size_t i = 0; i < n; ++i) service.lock_and_unlock("latency");
  };
  const auto named = [&] {
    const tasklet::Rule mutex = tasklet::rules::named_mutex("latency");
    for (std::size_t i = 0; i < n; ++i) const tasklet::RuleScope scope(*manager, mutex);
  };
  const auto path = [&] {
    for (std::size_t i = 0; i < n; ++i)
      const tasklet::RuleScope scope(*manager, tasklet::rules::path("/latency"));
  };
  const auto job = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      auto held = tasklet::make_job(
          "hold", [](tasklet::ProgressMonitor&) {}, manager);
      held->set_rule(tasklet::rules::path("/latency/job"));
      held->schedule();
      held->join();
    }
  };
  const std::vector<Comparison> results =
      tasklet::bench::compare_each(options.repeats, n, v3lock, {named, path, job});
  report.add(
      comparison_row("etcd latency: named mutex begin/end_rule vs v3lock Lock+Unlock", n, results[0], 1.5));
  report.add(
      comparison_row("etcd latency: path rule begin/end_rule vs v3lock Lock+Unlock", n, results[1], 1.5));
  report.add(comparison_row("etcd latency: job with a path rule vs v3lock Lock+Unlock", n, results[2], 1.5));
}

void bench_threads(Report& report, const Options& options, const std::string& endpoint) {
  auto session = EtcdSession::connect(settings_for(endpoint));
  auto manager = make_job_manager(session);
  // v3lock excludes sessions, not threads: its keys are the name and the lease, so threads that
  // shared a lease would all hold the lock at once. One session (lease) per thread.
  std::vector<std::shared_ptr<EtcdSession>> sessions;
  std::vector<std::unique_ptr<LockService>> services;
  for (int t = 0; t < workers; ++t) {
    sessions.push_back(EtcdSession::connect(settings_for(endpoint)));
    services.push_back(std::make_unique<LockService>(sessions.back()));
  }
  const std::size_t per_thread = options.quick ? 10 : 100;
  for (const bool overlapping : {false, true}) {
    const auto run = [&](bool ours) {
      std::vector<std::thread> threads;
      for (int t = 0; t < workers; ++t) {
        threads.emplace_back([&, t] {
          hold_many(ours, overlapping, t, per_thread, manager.get(),
                    services[static_cast<std::size_t>(t)].get());
        });
      }
      for (std::thread& thread : threads) thread.join();
    };
    const Comparison result = tasklet::bench::compare(
        options.repeats, per_thread * workers, [&] { run(false); }, [&] { run(true); });
    report.add(comparison_row(std::string("etcd 1 process x 4 threads: ") +
                                  (overlapping ? "overlapping" : "disjoint") + " paths vs v3lock",
                              per_thread * workers, result, 1.5));
  }
}

// Four processes of this program ("worker" mode): each connects, says "ready", waits for a line
// on its standard input, holds `holds` times, says "done" and exits. Returns seconds from the go
// to the last "done".
double run_fleet(const std::string& endpoint, bool ours, bool overlapping, std::size_t holds) {
  struct Child {
    pid_t pid;
    int to;    // its standard input
    int from;  // its standard output
  };
  std::vector<Child> children;
  for (int i = 0; i < workers; ++i) {
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    std::vector<std::string> args = {"/proc/self/exe",
                                     "worker",
                                     endpoint,
                                     ours ? "ours" : "v3lock",
                                     overlapping ? "overlapping" : "disjoint",
                                     std::to_string(i),
                                     std::to_string(holds)};
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0)
      throw std::runtime_error("cannot start a worker process");
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    children.push_back({pid, in[1], out[0]});
  }
  const auto expect = [](int fd, const char* word) {
    char line[16] = {};
    std::size_t got = 0;
    while (got < sizeof line - 1) {
      if (read(fd, line + got, 1) != 1) throw std::runtime_error(std::string("a worker did not say ") + word);
      if (line[got++] == '\n') break;
    }
    if (std::string(line) != std::string(word) + "\n")
      throw std::runtime_error("a worker said " + std::string(line));
  };
  for (const Child& child : children) expect(child.from, "ready");
  const auto start = tasklet::bench::Clock::now();
  for (const Child& child : children) {
    if (write(child.to, "go\n", 3) != 3) throw std::runtime_error("cannot start a worker");
  }
  for (const Child& child : children) expect(child.from, "done");
  const double seconds = std::chrono::duration<double>(tasklet::bench::Clock::now() - start).count();
  for (const Child& child : children) {
    close(child.to);
    close(child.from);
    int status = 0;
    waitpid(child.pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("a worker process failed");
  }
  return seconds;
}

int worker_main(int argc, char** argv) {
  if (argc != 7) return 2;
  const std::string endpoint = argv[2];
  const bool ours = std::string(argv[3]) == "ours";
  const bool overlapping = std::string(argv[4]) == "overlapping";
  const int index = std::stoi(argv[5]);
  const std::size_t holds = std::stoul(argv[6]);
  auto session = EtcdSession::connect(settings_for(endpoint));
  std::shared_ptr<tasklet::JobManager> manager = ours ? make_job_manager(session) : nullptr;
  LockService service(session);
  std::printf("ready\n");
  std::fflush(stdout);
  char go[8];
  if (std::fgets(go, sizeof go, stdin) == nullptr) return 3;
  hold_many(ours, overlapping, index, holds, manager.get(), &service);
  std::printf("done\n");
  std::fflush(stdout);
  return 0;
}

void bench_processes(Report& report, const Options& options, const std::string& endpoint) {
  const std::size_t per_process = options.quick ? 10 : 100;
  for (const bool overlapping : {false, true}) {
    std::vector<double> base_times, our_times, ratios;
    run_fleet(endpoint, false, overlapping, per_process);  // warm-up
    run_fleet(endpoint, true, overlapping, per_process);
    for (int r = 0; r < options.repeats; ++r) {
      const bool base_first = r % 2 == 0;
      double base = 0, ours = 0;
      if (base_first) base = run_fleet(endpoint, false, overlapping, per_process);
      ours = run_fleet(endpoint, true, overlapping, per_process);
      if (!base_first) base = run_fleet(endpoint, false, overlapping, per_process);
      base_times.push_back(base);
      our_times.push_back(ours);
      ratios.push_back(ours / base);
    }
    const Comparison result = tasklet::bench::summarize(base_times, our_times, ratios, per_process * workers);
    report.add(comparison_row(
        std::string("etcd 4 processes: ") + (overlapping ? "overlapping" : "disjoint") + " paths vs v3lock",
        per_process * workers, result, 1.5));
  }
}

void bench_claims(Report& report, const Options& options, const std::string& endpoint) {
  auto session = EtcdSession::connect(settings_for(endpoint));
  detail::Locks& locks = detail::SessionAccess::locks(*session);
  LockService service(session);
  const std::size_t n = options.quick ? 50 : 500;
  const auto ours = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      std::promise<std::int64_t> granted;
      auto ticket =
          locks.request({{"/claims/mutex", true}},
                        {.granted = [&granted](std::int64_t revision) { granted.set_value(revision); }});
      granted.get_future().get();
      locks.release(ticket);
    }
  };
  const auto v3lock = [&] {
    for (std::size_t i = 0; i < n; ++i) service.lock_and_unlock("claims-mutex");
  };
  const Comparison result = tasklet::bench::compare(options.repeats, n, v3lock, ours);
  report.add(comparison_row("etcd claims: acquire+release vs v3lock Lock+Unlock", n, result, 1.5));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "worker") return worker_main(argc, argv);
  const Options options = tasklet::bench::parse_options(argc, argv);
  std::cout << "tasklet etcd benchmarks: median of " << options.repeats
            << " interleaved runs; ratio = median of (ours / baseline) over back-to-back pairs\n\n";
  tasklet::test::EtcdServer server;
  Report::print_header(std::cout);
  Report report("tasklet etcd benchmarks (ns/op: medians; ratio: median of paired ours/baseline)");
  if (options.selected("latency")) bench_latency(report, options, server.endpoint());
  if (options.selected("threads")) bench_threads(report, options, server.endpoint());
  if (options.selected("processes")) bench_processes(report, options, server.endpoint());
  if (options.selected("claims")) bench_claims(report, options, server.endpoint());
  tasklet::bench::finish(report, options);
  return 0;
}
