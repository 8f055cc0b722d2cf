// tasklet_bench_scaling: throughput against the number of workers, and how much of the wall time
// the rule table's lock is held: the worker count at which that one lock would be saturated.
//
// For each worker count W of 1, 2, 4, ... up to --max-workers (default: the hardware threads; the
// largest is always measured), a JobManager with W workers runs N jobs of each workload:
//   no rule            jobs without a rule
//   one mutex rule     every job on one shared rules::mutex(): one at a time
//   disjoint subtrees  W subtrees /w<i>; job i on subtree i % W, on one of its 64 leaves
//                      /w<i>/d<j>/f<k> in turn (shared rule objects): the table's work, no waiting
//   overlapping paths  a random node of an 8-ary tree of depth 1-4 (shared rule objects)
// with a body of 0, 1 and 10 µs of spinning, as async tasklets and through the Job API (make_job,
// set_rule, schedule, then join once all ended). W producers, async tasklets on the workers, make and
// schedule the N jobs, N/W each: one posting thread would cap what many workers can run.
//
// Per point: jobs per second (the median of --repeats runs; runs of one worker count alternate
// between the workloads), the speedup over one worker, and, in a build with
// TASKLET_TABLE_OCCUPANCY (the `scaling` preset), the occupancy: the fraction of the wall time for
// which the busiest of the rule table's locks (one per shard) was held, and the ceiling
// W / occupancy: the worker count at which that lock would be held all the time, were the work
// per job the same and the added workers' jobs as much in its shard. Timing every hold adds two
// reads of the time-stamp counter to it, so the occupancy is a little high and the ceiling low.
// Without TASKLET_TABLE_OCCUPANCY both columns are empty.
//
// Usage: tasklet_bench_scaling [--repeats=K] [--max-n=N] [--max-workers=W] [--quick]
//                              [--only=WORD[,WORD...]] [--csv=FILE]
//   --max-n caps N (default 100,000 jobs per point, 20,000 for 10 µs bodies); --only selects
//   workloads by name ("mutex", "disjoint", ...).
// CSV columns: workload,form,body_ns,workers,jobs,jobs_per_s,speedup,occupancy,ceiling
// (scripts/plot_bench.py draws it).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "table/table_mutex.hpp"
#include "tasklet.hpp"

namespace {

using tasklet::Directive;
using tasklet::Job;
using tasklet::JobManager;
using tasklet::Rule;
using tasklet::Scheduler;
using tasklet::SchedulerOptions;
using tasklet::bench::Clock;
using tasklet::bench::fail;
using tasklet::bench::Options;

// A job's body: spins for `ns` nanoseconds (0: returns at once).
void spin(std::int64_t ns) {
  if (ns == 0) return;
  const auto until = Clock::now() + std::chrono::nanoseconds(ns);
  while (Clock::now() < until) {
  }
}

// ---------------------------------------------------------------------------------------------
// Workloads: which rule job i holds, and a check that the jobs ran as their rules say

enum class Kind { no_rule, mutex, disjoint, overlapping };

class Workload {
 public:
  Workload(Kind kind, std::string name) : kind_(kind), name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  bool has_rules() const { return kind_ != Kind::no_rule; }

  // The rules of a run on `workers` workers, made before it (shared rule objects, as users keep
  // one rule per resource).
  void prepare(int workers) {
    rules_.clear();
    if (kind_ == Kind::mutex) {
      rules_.push_back(tasklet::rules::mutex("scaling mutex"));
    } else if (kind_ == Kind::disjoint) {
      for (int w = 0; w < workers; ++w) {
        for (int leaf = 0; leaf < leaves; ++leaf) {
          rules_.push_back(tasklet::rules::path("/w" + std::to_string(w) + "/d" + std::to_string(leaf / 8) +
                                                "/f" + std::to_string(leaf)));
        }
      }
    } else if (kind_ == Kind::overlapping) {
      std::vector<std::string> nodes;
      add_nodes("", 4, nodes);
      for (const std::string& node : nodes) rules_.push_back(tasklet::rules::path(node));
      std::mt19937_64 random(42);
      picks_.resize(picks);
      for (std::size_t& pick : picks_) pick = random() % rules_.size();
    }
    workers_ = static_cast<std::size_t>(workers);
  }

  Rule rule(std::size_t i) const {
    switch (kind_) {
      case Kind::no_rule:
        return nullptr;
      case Kind::mutex:
        return rules_.front();
      case Kind::disjoint:
        // Subtree i % W, and within it the leaves in turn.
        return rules_[(i % workers_) * leaves + (i / workers_) % leaves];
      case Kind::overlapping:
        return rules_[picks_[i % picks]];
    }
    return nullptr;
  }

  // Before a run of n jobs.
  void reset(std::size_t n) {
    expected_ = n;
    finished_.store(false, std::memory_order_relaxed);
    ran_.store(0, std::memory_order_relaxed);
    inside_.store(0, std::memory_order_relaxed);
    overlapped_.store(false, std::memory_order_relaxed);
  }

  void visit(std::int64_t body_ns) {
    // One mutex rule: no two jobs at once (the other workloads' rules are checked by the oracles of
    // the rules benchmark and the tests).
    const bool serial = kind_ == Kind::mutex;
    if (serial && inside_.fetch_add(1, std::memory_order_acq_rel) != 0)
      overlapped_.store(true, std::memory_order_relaxed);
    spin(body_ns);
    if (serial) inside_.fetch_sub(1, std::memory_order_acq_rel);
    if (ran_.fetch_add(1, std::memory_order_acq_rel) + 1 == expected_) {
      finished_.store(true, std::memory_order_release);
      finished_.notify_all();
    }
  }

  // Until the run's last job has ended its body: the jobs' joins then hardly wait, so that the
  // joining thread is not woken once per job (rules_bench measures joining job by job).
  void wait_finished() const { finished_.wait(false, std::memory_order_acquire); }

  void check(std::size_t n, const std::string& who) const {
    if (ran_.load() != n)
      fail(who + " ran " + std::to_string(ran_.load()) + " of " + std::to_string(n) + " jobs");
    if (overlapped_.load()) fail(who + ": two jobs on one mutex rule ran at once");
  }

 private:
  static constexpr int leaves = 64;
  static constexpr std::size_t picks = 4096;

  static void add_nodes(const std::string& parent, int depth, std::vector<std::string>& nodes) {
    if (depth == 0) return;
    for (int child = 0; child < 8; ++child) {
      const std::string node = parent + "/n" + std::to_string(child);
      nodes.push_back(node);
      add_nodes(node, depth - 1, nodes);
    }
  }

  Kind kind_;
  std::string name_;
  std::vector<Rule> rules_;
  std::vector<std::size_t> picks_;
  std::size_t workers_ = 1;
  // Each on a line of its own: every job touches ran_.
  alignas(64) std::atomic<std::size_t> ran_{0};
  alignas(64) std::atomic<int> inside_{0};
  std::atomic<bool> overlapped_{false};
  std::size_t expected_ = 0;
  std::atomic<bool> finished_{false};
};

// ---------------------------------------------------------------------------------------------
// One run: W producers schedule the N jobs as tasklets or as jobs, and the run ends when all ended

enum class Form { tasklets, jobs };

const char* name_of(Form form) { return form == Form::tasklets ? "tasklets" : "jobs"; }

class Engine {
 public:
  explicit Engine(int workers)
      : workers_(workers),
        manager_(JobManager::create(JobManager::Options{workers, nullptr})),
        scheduler_(Scheduler::create(SchedulerOptions{manager_, nullptr, 0})),
        jobs_(static_cast<std::size_t>(workers)) {}

  int workers() const { return workers_; }

  struct Sample {
    double seconds;
    std::optional<double> occupancy;  // the share of the run for which the busiest table lock was held
  };

  Sample run(Workload& workload, Form form, std::size_t n, std::int64_t body_ns) {
    workload.reset(n);
    const auto producers = static_cast<std::size_t>(workers_);
    for (auto& mine : jobs_) mine.reserve(n / producers + 1);  // capacity kept between runs
    const auto lock_before = tasklet::detail::read_table_lock();
    const auto start = Clock::now();
    auto seed = tasklet::make_tasklet([&] {
      for (std::size_t p = 0; p < producers; ++p) {
        scheduler_->schedule(tasklet::make_tasklet([&, p] {
                               produce(workload, form, p * n / producers, (p + 1) * n / producers, body_ns,
                                       jobs_[p]);
                               return Directive::done;
                             }),
                             Directive::async);
      }
      return Directive::done;
    });
    scheduler_->schedule(std::move(seed), Directive::sync);
    scheduler_->run();
    workload.wait_finished();
    for (auto& mine : jobs_) {
      for (const std::shared_ptr<Job>& job : mine) job->join();
      mine.clear();  // the Job objects go inside the timed region (tasklets go when done)
    }
    const auto stop = Clock::now();
    const auto lock_after = tasklet::detail::read_table_lock();
    workload.check(n, std::string(name_of(form)) + " on " + workload.name());
    Sample sample{std::chrono::duration<double>(stop - start).count(), std::nullopt};
    if (lock_before && lock_after) {
      sample.occupancy = tasklet::detail::busiest_lock_share(*lock_before, *lock_after);
    }
    return sample;
  }

  const std::shared_ptr<JobManager>& manager() const { return manager_; }

 private:
  void produce(Workload& workload, Form form, std::size_t begin, std::size_t end, std::int64_t body_ns,
               std::vector<std::shared_ptr<Job>>& mine) {
    for (std::size_t i = begin; i < end; ++i) {
      if (form == Form::tasklets) {
        scheduler_->schedule(tasklet::make_tasklet(
                                 [&workload, body_ns] {
                                   workload.visit(body_ns);
                                   return Directive::done;
                                 },
                                 workload.rule(i)),
                             Directive::async);
        continue;
      }
      std::shared_ptr<Job> job = tasklet::make_job(
          "scaling job",
          [&workload, body_ns](tasklet::ProgressMonitor&) {
            workload.visit(body_ns);
            return tasklet::Status::ok();
          },
          manager_);
      if (Rule rule = workload.rule(i)) job->set_rule(std::move(rule));
      job->schedule();
      mine.push_back(std::move(job));
    }
  }

  int workers_;
  std::shared_ptr<JobManager> manager_;
  std::shared_ptr<Scheduler> scheduler_;
  std::vector<std::vector<std::shared_ptr<Job>>> jobs_;  // per producer: the handles to join
};

// ---------------------------------------------------------------------------------------------
// The sweep, the table and the CSV file

struct Point {
  std::string workload;
  Form form;
  std::int64_t body_ns;
  int workers;
  std::size_t jobs;
  double jobs_per_s;
  std::optional<double> speedup;    // over one worker, same workload, form and body (1 at one)
  std::optional<double> occupancy;  // of the table's lock
  std::optional<double> ceiling;    // workers / occupancy
};

std::vector<int> worker_counts(int max_workers) {
  std::vector<int> counts;
  for (int w = 1; w < max_workers; w *= 2) counts.push_back(w);
  counts.push_back(max_workers);
  return counts;
}

std::string field(std::optional<double> value, const char* format) {
  if (!value) return "";
  char text[32];
  std::snprintf(text, sizeof text, format, *value);
  return text;
}

void print_point(std::ostream& out, const Point& point) {
  char line[200];
  std::snprintf(line, sizeof line, "%-18s %-8s %7lld %7d %8zu %12.0f %8s %9s %8s\n", point.workload.c_str(),
                name_of(point.form), static_cast<long long>(point.body_ns), point.workers, point.jobs,
                point.jobs_per_s, field(point.speedup, "%.2fx").c_str(),
                field(point.occupancy, "%.3f").c_str(), field(point.ceiling, "%.1f").c_str());
  out << line;
}

void print_header(std::ostream& out) {
  char line[200];
  std::snprintf(line, sizeof line, "%-18s %-8s %7s %7s %8s %12s %8s %9s %8s\n", "workload", "form", "body_ns",
                "workers", "jobs", "jobs/s", "speedup", "occupancy", "ceiling");
  out << line << std::string(94, '-') << "\n";
}

void write_csv(const std::vector<Point>& points, const std::string& path) {
  std::ofstream file(path);
  file << "workload,form,body_ns,workers,jobs,jobs_per_s,speedup,occupancy,ceiling\n";
  for (const Point& point : points) {
    file << tasklet::bench::csv_field(point.workload) << "," << name_of(point.form) << "," << point.body_ns
         << "," << point.workers << "," << point.jobs << "," << field(point.jobs_per_s, "%.6g") << ","
         << field(point.speedup, "%.6g") << "," << field(point.occupancy, "%.6g") << ","
         << field(point.ceiling, "%.6g") << "\n";
  }
  file.close();
  if (!file) {
    std::cerr << "cannot write " << path << "\n";
    std::exit(1);
  }
  std::cout << "\nCSV written to " << path << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = tasklet::bench::parse_options(argc, argv);
  const int max_workers = options.max_workers > 0
                              ? options.max_workers
                              : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const bool counted = tasklet::detail::read_table_lock().has_value();
  std::cout << "tasklet_bench_scaling: 1.." << max_workers << " workers, " << options.repeats
            << " runs per point; the table's lock is "
            << (counted ? "timed (occupancy, ceiling)"
                        : "not timed (build with the scaling preset for occupancy)")
            << "\n";

  std::vector<std::unique_ptr<Workload>> workloads;
  for (const auto& [kind, name] :
       {std::pair{Kind::no_rule, "no rule"}, std::pair{Kind::mutex, "one mutex rule"},
        std::pair{Kind::disjoint, "disjoint subtrees"}, std::pair{Kind::overlapping, "overlapping paths"}}) {
    if (options.selected(name)) workloads.push_back(std::make_unique<Workload>(kind, name));
  }

  const std::int64_t bodies[] = {0, 1'000, 10'000};
  const auto jobs_for = [&](std::int64_t body_ns) {
    const std::size_t full = body_ns >= 10'000 ? 20'000 : 100'000;
    return std::min(options.max_n, options.quick ? full / 20 : full);
  };

  std::vector<Point> points;
  print_header(std::cout);
  for (const int workers : worker_counts(max_workers)) {
    Engine engine(workers);
    for (const auto& workload : workloads) {
      workload->prepare(workers);
      // Untimed: the first run of a new engine also starts its threads and fills its pools.
      for (const Form form : {Form::tasklets, Form::jobs}) engine.run(*workload, form, jobs_for(0), 0);
    }
    for (const std::int64_t body_ns : bodies) {
      for (const Form form : {Form::tasklets, Form::jobs}) {
        // The runs of this worker count, body and form alternate between the workloads.
        const std::size_t n = jobs_for(body_ns);
        std::vector<std::vector<double>> rates(workloads.size()), shares(workloads.size());
        for (int r = 0; r < options.repeats; ++r) {
          for (std::size_t w = 0; w < workloads.size(); ++w) {
            const Engine::Sample sample = engine.run(*workloads[w], form, n, body_ns);
            rates[w].push_back(static_cast<double>(n) / sample.seconds);
            if (sample.occupancy) shares[w].push_back(*sample.occupancy);
          }
        }
        for (std::size_t w = 0; w < workloads.size(); ++w) {
          Point point{
              workloads[w]->name(), form,         body_ns,     workers, n, tasklet::bench::median(rates[w]),
              std::nullopt,         std::nullopt, std::nullopt};
          if (!shares[w].empty()) {
            point.occupancy = tasklet::bench::median(shares[w]);
            if (*point.occupancy <= 0.0 && workloads[w]->has_rules())
              fail(point.workload + ": the table's lock was timed, yet never held");
            if (*point.occupancy > 0.0) point.ceiling = workers / *point.occupancy;
          }
          if (workers == 1) point.speedup = 1.0;
          for (const Point& one : points) {
            if (one.workers == 1 && one.workload == point.workload && one.form == form &&
                one.body_ns == body_ns)
              point.speedup = point.jobs_per_s / one.jobs_per_s;
          }
          print_point(std::cout, point);
          points.push_back(point);
        }
      }
    }
    const auto stats = engine.manager()->rule_stats();
    if (stats.held != 0 || stats.waiting != 0) fail("rules still held or waiting after the runs");
  }

  std::cout << "\nAll points\n";
  print_header(std::cout);
  for (const Point& point : points) print_point(std::cout, point);
  std::cout << "load average at end: " << tasklet::bench::load_average() << "\n";
  if (!options.csv.empty()) write_csv(points, options.csv);
  return 0;
}
