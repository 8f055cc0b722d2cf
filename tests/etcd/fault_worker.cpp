// A process of the fault lane (etcd_faults_test): it runs jobs on rules shared through etcd, and
// every hold reads and writes a fenced store (fenced_store.hpp) with its fencing token, until a
// stop file appears.
//
//   etcd_fault_worker ENDPOINTS PREFIX STORE_PORT PROCESS SEED STOP_FILE LOG
//
// ENDPOINTS are comma-separated. Jobs go in waves of six on a manager made with make_job_manager
// (two workers); each has one or two parts: an exclusive or shared path of a small tree, or a
// named mutex. When the session's lease is lost (paused or cut off past its TTL), the process
// makes a new session and goes on; when no endpoint answers, it tries again. LOG gets one line per
// event, for the test's checker:
//
//   run JOB                         the job's body began
//   hold JOB TOKEN LEASE BEFORE_FIRST BEFORE_LAST FIRST_OK LAST_OK REFUSED CANCELED PART...
//       BEFORE_FIRST / BEFORE_LAST: CLOCK_MONOTONIC just before the first and the last
//       fencing_token call; FIRST_OK / LAST_OK whether they answered (0: EtcdLeaseLost); REFUSED:
//       how many store operations were refused; CANCELED: whether the job's monitor was
//       canceled at the end; PART: "X path", "S path" or "N name"
//   job JOB ok | job JOB cancel|error MESSAGE   how the job ended
//   session LEASE began T | lost LEASE at T WHY | ended LEASE | connect failed WHY
//   waiting JOB; BLOCKER...         a job still waits once told to stop (every 5 s)
//
// Exits 0 once the stop file exists and the last wave has ended.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fenced_store.hpp"
#include "tasklet.hpp"
#include "tasklet/etcd/etcd.hpp"

using namespace tasklet;
using namespace tasklet::etcd;
using tasklet::test::monotonic_ns;

namespace {

struct Part {
  char mode;  // 'X' exclusive path, 'S' shared path, 'N' named mutex
  std::string name;
  Rule rule() const {
    return mode == 'X' ? rules::path(name) : mode == 'S' ? rules::read_path(name) : rules::named_mutex(name);
  }
  std::string store_key() const { return mode == 'N' ? "#" + name : name; }
};

class Log {
 public:
  explicit Log(const std::string& file) : out_(file) {}
  void line(const std::string& text) {
    std::lock_guard lock(mutex_);
    out_ << text << '\n' << std::flush;
  }

 private:
  std::mutex mutex_;
  std::ofstream out_;
};

class Worker {
 public:
  Worker(EtcdOptions options, int store_port, int process, unsigned seed, std::string stop, Log& log)
      : options_(std::move(options)),
        store_(store_port),
        process_(process),
        random_(seed),
        stop_(std::move(stop)),
        log_(log) {}

  void run() {
    while (!stopping()) {
      std::shared_ptr<EtcdSession> session;
      try {
        session = EtcdSession::connect(options_);
      } catch (const EtcdError& failed) {
        log_.line(std::string("connect failed ") + failed.what());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a cut endpoint refuses at once
        continue;
      }
      lease_ = session->lease_id();
      log_.line("session " + std::to_string(lease_) + " began " + std::to_string(monotonic_ns()));
      session->on_lease_lost([this, lease = lease_](const std::string& why) {
        log_.line("lost " + std::to_string(lease) + " at " + std::to_string(monotonic_ns()) + " " + why);
      });
      const auto manager = make_job_manager(session, JobManager::Options{2, nullptr});
      while (!stopping() && session->lease_alive()) wave(manager);
      if (!session->lease_alive()) log_.line("ended " + std::to_string(lease_));
    }
  }

 private:
  bool stopping() const { return std::filesystem::exists(stop_); }

  std::vector<Part> random_parts() {
    static const std::vector<std::string> paths = {"/a", "/a/x", "/a/x/1", "/a/x/2", "/a/y",  "/a/y/1",
                                                   "/b", "/b/x", "/b/x/1", "/b/y",   "/b/y/1"};
    std::vector<Part> parts;
    const auto one = [&] {
      const auto kind = random_() % 10;
      if (kind < 2) return Part{'N', random_() % 2 == 0 ? "n1" : "n2"};
      return Part{kind < 7 ? 'X' : 'S', paths[random_() % paths.size()]};
    };
    parts.push_back(one());
    if (random_() % 4 == 0) {
      const Part second = one();
      if (second.name != parts.front().name) parts.push_back(second);
    }
    return parts;
  }

  void wave(const std::shared_ptr<JobManager>& manager) {
    std::vector<std::shared_ptr<Job>> jobs;
    for (int i = 0; i < 6; ++i) {
      const std::string name = std::to_string(process_) + "." + std::to_string(next_job_++);
      const std::vector<Part> parts = random_parts();
      std::vector<Rule> rules_of_job;
      for (const Part& part : parts) rules_of_job.push_back(part.rule());
      const Rule rule = rules::combine(rules_of_job);
      const auto work = std::chrono::microseconds(1000 + random_() % 9000);
      auto job = make_job(
          name,
          [this, manager = manager.get(), name, parts, rule, work](ProgressMonitor& monitor) {
            return hold(*manager, name, parts, rule, work, monitor);
          },
          manager);
      job->set_rule(rule);
      job->schedule();
      jobs.push_back(std::move(job));
    }
    for (const std::shared_ptr<Job>& job : jobs) {
      // Told to stop and still waiting: say for whom, every few seconds (the test reports a hang).
      while (!job->join(std::chrono::seconds(5))) {
        if (!stopping()) continue;
        std::string waits_for;
        for (const RuleBlocker& blocker : job->blockers()) waits_for += "; " + blocker.to_string();
        log_.line("waiting " + job->name() + waits_for);
      }
      const Status& result = job->result();
      log_.line("job " + job->name() +
                (result.is_ok() ? std::string(" ok")
                                : (result.is_canceled() ? " cancel " : " error ") + result.message));
    }
  }

  // The holder's work: three rounds of store operations under the token asked for first, then the
  // token asked for again.
  Status hold(JobManager& manager, const std::string& name, const std::vector<Part>& parts, const Rule& rule,
              std::chrono::microseconds work, ProgressMonitor& monitor) {
    log_.line("run " + name);
    std::int64_t token = 0;
    int refused = 0;
    const long long before_first = monotonic_ns();
    bool first_ok = true, last_ok = true;
    try {
      token = fencing_token(manager, rule);
    } catch (const EtcdLeaseLost&) {
      first_ok = false;
    }
    for (int round = 0; first_ok && refused == 0 && round < 3; ++round) {
      std::this_thread::sleep_for(work / 3);  // the holder's work
      std::lock_guard lock(store_mutex_);
      for (const Part& part : parts)
        refused += store_.apply(part.mode == 'X' || part.mode == 'N', part.store_key(), token, process_, name)
                       ? 0
                       : 1;
    }
    const long long before_last = monotonic_ns();
    try {
      if (first_ok) fencing_token(manager, rule);
    } catch (const EtcdLeaseLost&) {
      last_ok = false;
    }
    std::ostringstream line;
    line << "hold " << name << ' ' << token << ' ' << lease_ << ' ' << before_first << ' ' << before_last
         << ' ' << first_ok << ' ' << (first_ok && last_ok) << ' ' << refused << ' ' << monitor.is_canceled();
    for (const Part& part : parts) line << ' ' << part.mode << ' ' << part.name;
    log_.line(line.str());
    if (!first_ok || !last_ok)
      throw EtcdLeaseLost("etcd: the lease was lost while " + name + " held its rule");
    if (refused > 0) return Status::error("the store refused " + name + "'s token " + std::to_string(token));
    return Status::ok();
  }

  EtcdOptions options_;
  tasklet::test::FencedStoreClient store_;
  std::mutex store_mutex_;  // the client is one connection
  int process_;
  std::mt19937 random_;
  std::string stop_;
  Log& log_;
  int next_job_ = 0;
  std::int64_t lease_ = 0;  // the session's, written between waves
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: etcd_fault_worker ENDPOINTS PREFIX STORE_PORT PROCESS SEED STOP_FILE LOG\n");
    return 1;
  }
  EtcdOptions options;
  for (std::string endpoints = argv[1]; !endpoints.empty();) {
    const std::size_t comma = endpoints.find(',');
    options.endpoints.push_back(endpoints.substr(0, comma));
    endpoints = comma == std::string::npos ? "" : endpoints.substr(comma + 1);
  }
  options.prefix = argv[2];
  options.lease_ttl = std::chrono::seconds(3);
  options.request_timeout = std::chrono::milliseconds(500);
  Log log(argv[7]);
  Worker(options, std::stoi(argv[3]), std::stoi(argv[4]), static_cast<unsigned>(std::stoul(argv[5])), argv[6],
         log)
      .run();
  return 0;
}
