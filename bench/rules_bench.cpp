// tasklet_bench_rules: the rule engine's and the Job API's rows of the performance contract (DESIGN
// section 5), each measured beside its baseline in the same run and reported as a ratio. N runs over
// 10^3 ... 10^6 (--max-n); "growth" rows give ns/job at the largest N over ns/job at 10^3.
//
//   memory         bytes per tasklet queued behind a held rule (a mutex rule; random path rules
//                  behind "/"), beyond the user's callable (growth of resident memory)  (<= 256)
//   memory jobs    bytes per job queued, the Job object included, beyond the user's callable:
//                  (a) jobs on a mutex rule, waiting while this thread holds it (begin_rule);
//                  (b) jobs without a rule, waiting on a suspended manager              (<= 512)
//   mutex rule     N trivial jobs on one mutex rule, posted from one thread and awaited, against
//                  a boost::asio strand on a 2-thread pool; two forms of ours: a SerialExecutor
//                  (post + wait) and async tasklets sharing a rules::mutex() (run); and all
//                  queued up front: the n tasklets made before run(), against the strand's n
//                  handlers posted while the pool's threads are held back
//                                                  (<= 1.5x the strand; 10^6 within 1.5x of 10^3)
//   path rules     N async tasklets, each with an exclusive path rule on a random node of an
//                  8-ary tree of depth 1-4, against the same tasklets without rules; two forms:
//                  shared rule objects (the tree's 4,680 rules, made up front)
//                                                  (<= 3x no-rule; 10^6 within 1.5x of 10^3)
//                  and a fresh rules::path(p) per tasklet, made in the timed loop as users write
//                  rules::path(file) per job (the path strings are made up front: user data)
//                                                  (<= 4x no-rule; 10^6 within 1.5x of 10^3)
//                  Both again with all n tasklets (and their fresh rules) made on this thread
//                  before run() starts, the no-rule tasklets likewise ("made up front"). And moves:
//                  each tasklet holds combine(path(p), path(q)), fresh, q a random node of another
//                  top-level subtree (a file moved from one directory tree to another; the
//                  file server's MOVE), against the same no-rule tasklets     (information)
//   jobs           the same workloads through the Job API against the same workloads as async
//                  tasklets (a seed phase schedules N tasklets, run() awaits them): make_job,
//                  set_rule, schedule() from this (plain) thread, then join() every job; on the
//                  tasklets' manager (2 workers). Four rows: no rule, one shared mutex rule, shared
//                  path rules, a fresh path rule per job
//                                                  (<= 2x tasklets; 10^6 within 1.5x of 10^3)
//                  and the jobs of two of them (no rule, shared path rules) with a coroutine as
//                  their run, against the same jobs with a function                  (<= 1.2x)
//   begin/end      begin_rule + end_rule on one thread, uncontended (a mutex rule, a path rule),
//                  against std::mutex lock + unlock                                  (<= 3x)
//
// Every workload checks itself, so a broken engine cannot post a good number: every job ran, jobs
// on one mutex rule (and on one path) ran in the order they were scheduled, and, in an untimed
// pass (with shared and with fresh rules), an oracle checks that no two jobs on conflicting paths
// ever overlapped and that begin_rule really excludes a second thread.
//
// Usage: tasklet_bench_rules [--repeats=K] [--max-n=N] [--quick] [--only=WORD[,WORD...]] [--csv=FILE]
//   --only words: memory (both memory sections), mutex, path, jobs (the Job API rows and the job
//   memory rows), begin.
#include <algorithm>
#include <atomic>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>

#include <oneapi/tbb/version.h>

#include "harness.hpp"
#include "tasklet.hpp"
#include "tasklet/coroutine.hpp"

namespace {

using tasklet::Directive;
using tasklet::Job;
using tasklet::JobManager;
using tasklet::Rule;
using tasklet::Scheduler;
using tasklet::SchedulerOptions;
using tasklet::bench::Comparison;
using tasklet::bench::comparison_row;
using tasklet::bench::fail;
using tasklet::bench::figure_row;
using tasklet::bench::growth_row;
using tasklet::bench::Options;
using tasklet::bench::Report;
using tasklet::bench::size_label;

// The engine every workload runs on: two workers, as the strand's pool has two threads.
constexpr int workers = 2;
std::shared_ptr<JobManager> make_manager() {
  return JobManager::create(JobManager::Options{workers, nullptr});
}

// Each sample runs the workload often enough to do at least this many jobs, so that small N is not
// measured at the resolution of one wake-up.
std::size_t repetitions_for(std::size_t n, const Options& options) {
  const std::size_t min_jobs = options.quick ? 10'000 : 100'000;
  return n >= min_jobs ? 1 : (min_jobs + n - 1) / n;
}

// The jobs one sample of size n runs.
std::size_t sample_ops(std::size_t n, const Options& options) { return n * repetitions_for(n, options); }

std::vector<std::size_t> sizes(const Options& options) {
  std::vector<std::size_t> result;
  for (std::size_t n = 1'000; n <= options.max_n; n *= 10) result.push_back(n);
  return result;
}

// A growth row (harness growth()) for the workload whose sample at size n is sample_at(n): the
// smallest size against the largest, measured interleaved. Nothing when there is only one size.
template <class SampleAt>
void add_growth_row(Report& report, const Options& options, std::string workload, SampleAt&& sample_at,
                    std::optional<double> target) {
  const std::vector<std::size_t> all = sizes(options);
  if (all.size() < 2) return;
  const std::size_t small_n = all.front();
  const std::size_t large_n = all.back();
  const Comparison result =
      tasklet::bench::growth(options.repeats, sample_ops(small_n, options), sample_at(small_n),
                             sample_ops(large_n, options), sample_at(large_n));
  report.add(growth_row(std::move(workload), small_n, large_n, result, target));
}

void check_rules_released(const JobManager& manager, const std::string& after) {
  const auto stats = manager.rule_stats();
  if (stats.held != 0 || stats.waiting != 0) fail("rules still held or waiting after " + after);
}

// Schedules `n` async tasklets from the synchronous thread of `scheduler` (async needs an active
// run(), so a seed's sync phase does it) and returns when run() has drained them.
template <class MakeTasklet>
void run_async_tasklets(Scheduler& scheduler, std::size_t n, MakeTasklet&& make) {
  auto seed = tasklet::make_tasklet([&scheduler, &make, n] {
    for (std::size_t i = 0; i < n; ++i) scheduler.schedule(make(i), Directive::async);
    return Directive::done;
  });
  scheduler.schedule(std::move(seed), Directive::sync);
  scheduler.run();
}

// ---------------------------------------------------------------------------------------------
// Workloads, and the two ways of running them: as tasklets or as jobs

// A workload of n trivial jobs, cheap to copy: job i holds rule(i) while it runs (null: no rule;
// it may be a new rule object, made when asked, as users make rules::path(file) per job) and does
// visit(i). reset() comes before every round of the n jobs, check() after it, naming `who` ran them.
template <class W>
concept Workload = requires(const W& workload, std::size_t i, const std::string& who) {
  { workload.rule(i) } -> std::convertible_to<Rule>;
  workload.visit(i);
  workload.reset();
  workload.check(who);
};

// How the user runs the n jobs: async tasklets of a scheduler (a seed's sync phase makes and
// schedules them, run() awaits them); the same tasklets, all made (with their rules) on this
// thread before run() starts, so that all n and their rules are in memory at once; or the Job API
// (make_job, set_rule, schedule() from this plain thread, then join() every job), with a plain
// function or a coroutine as the run. All on the same manager, so on the same workers and table.
enum class Form { tasklets, made_up_front, jobs, coroutine_jobs };

std::string name_of(Form form) {
  switch (form) {
    case Form::tasklets:
      return "tasklets";
    case Form::made_up_front:
      return "tasklets made up front";
    case Form::jobs:
      return "jobs";
    case Form::coroutine_jobs:
      return "coroutine jobs";
  }
  return "?";
}

class Runner {
 public:
  explicit Runner(const std::shared_ptr<JobManager>& manager)
      : manager_(manager), scheduler_(Scheduler::create(SchedulerOptions{manager, nullptr, 0})) {}

  /// One round of the workload's n jobs in `form`; returns when every job has ended.
  template <Workload W>
  void run(Form form, const W& workload, std::size_t n) {
    const auto make = [&workload](std::size_t i) {
      return tasklet::make_tasklet(
          [&workload, i] {
            workload.visit(i);
            return Directive::done;
          },
          workload.rule(i));
    };
    if (form == Form::tasklets) {
      run_async_tasklets(*scheduler_, n, make);
      return;
    }
    if (form == Form::made_up_front) {
      for (std::size_t i = 0; i < n; ++i) made_.push_back(make(i));
      run_async_tasklets(*scheduler_, n, [this](std::size_t i) { return std::move(made_[i]); });
      made_.clear();  // capacity kept: the vector is not what is measured
      return;
    }
    for (std::size_t i = 0; i < n; ++i) {
      std::shared_ptr<Job> job =
          form == Form::jobs
              ? tasklet::make_job(
                    "bench job",
                    [&workload, i](tasklet::ProgressMonitor&) {
                      workload.visit(i);
                      return tasklet::Status::ok();
                    },
                    manager_)
              : tasklet::make_job(
                    "bench job",
                    // The closure lives in the job, so its captures outlive the coroutine.
                    [&workload, i](tasklet::ProgressMonitor&) -> tasklet::Task<tasklet::Status> {
                      workload.visit(i);
                      co_return tasklet::Status::ok();
                    },
                    manager_);
      if (Rule rule = workload.rule(i)) job->set_rule(std::move(rule));
      job->schedule();
      jobs_.push_back(std::move(job));
    }
    for (const std::shared_ptr<Job>& job : jobs_) job->join();
    jobs_.clear();  // the Job objects go here, inside the timed region (tasklets go when done)
  }

  /// A timed sample for compare(): sample_ops(n) jobs, in rounds of n, each round reset and checked.
  /// The Runner must outlive it.
  template <Workload W>
  std::function<void()> sample(Form form, W workload, std::size_t n, const Options& options) {
    return [this, form, workload, n, reps = repetitions_for(n, options)] {
      const std::string who = name_of(form);
      for (std::size_t r = 0; r < reps; ++r) {
        workload.reset();
        run(form, workload, n);
        workload.check(who);
      }
    };
  }

 private:
  std::shared_ptr<JobManager> manager_;
  std::shared_ptr<Scheduler> scheduler_;
  std::vector<std::shared_ptr<Job>> jobs_;               // the handles a user keeps to join; capacity reused
  std::vector<std::shared_ptr<tasklet::Tasklet>> made_;  // Form::made_up_front; capacity reused
};

// ---------------------------------------------------------------------------------------------
// 1. One mutex rule vs a boost::asio strand

// What every job of this workload does: one relaxed increment of a shared sequence counter, which
// also proves that the jobs ran one at a time in posting order (job i must see i).
struct SerialProbe {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> out_of_order{false};

  void reset() {
    next.store(0, std::memory_order_relaxed);
    out_of_order.store(false, std::memory_order_relaxed);
  }
  // Returns the sequence number this job saw.
  std::size_t visit(std::size_t i) noexcept {
    const std::size_t seen = next.fetch_add(1, std::memory_order_relaxed);
    if (seen != i && !out_of_order.load(std::memory_order_relaxed))
      out_of_order.store(true, std::memory_order_relaxed);
    return seen;
  }
  void check(const std::string& who, std::size_t n) const {
    if (next.load() != n)
      fail(who + " ran " + std::to_string(next.load()) + " of " + std::to_string(n) + " jobs");
    if (out_of_order.load()) fail(who + " ran jobs out of posting order (or two at once)");
  }
};

// n jobs sharing one mutex rule; they must run one at a time, in the order they were scheduled.
struct MutexWorkload {
  SerialProbe* probe;
  Rule shared;
  std::size_t n;

  Rule rule(std::size_t) const { return shared; }
  void visit(std::size_t i) const noexcept { probe->visit(i); }
  void reset() const { probe->reset(); }
  void check(const std::string& who) const { probe->check(who + " on a mutex rule", n); }
};

// The baseline's way to learn that the last handler ran: the handler that completes the sequence
// flips a flag under a mutex (once per sample, not once per job).
class Completion {
 public:
  void reset() {
    std::lock_guard lock(mutex_);
    done_ = false;
  }
  void signal() {
    std::lock_guard lock(mutex_);
    done_ = true;
    cv_.notify_one();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
};

// Holds every thread of an asio pool in a handler until open(), so that what is posted meanwhile
// is all queued before any of it runs: the strand's form of "all made before run()".
class PoolGate {
 public:
  explicit PoolGate(boost::asio::thread_pool& pool) : pool_(pool) {}
  PoolGate(const PoolGate&) = delete;
  PoolGate& operator=(const PoolGate&) = delete;
  /// Waits until no pool thread is still on its way out of a gate.
  ~PoolGate() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return inside_ == 0; });
  }

  /// Returns once every pool thread waits in the gate. Each close is a generation of its own, so
  /// that a thread still leaving the last gate is not caught by this one.
  void close() {
    std::uint64_t generation = 0;
    {
      std::lock_guard lock(mutex_);
      generation = ++closed_;
      arrived_ = 0;
    }
    for (int t = 0; t < workers; ++t) {
      boost::asio::post(pool_, [this, generation] {
        std::unique_lock lock(mutex_);
        ++arrived_;
        ++inside_;
        cv_.notify_all();
        cv_.wait(lock, [this, generation] { return opened_ >= generation; });
        --inside_;
        cv_.notify_all();
      });
    }
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [this] { return arrived_ == workers; });
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      opened_ = closed_;
    }
    cv_.notify_all();
  }

 private:
  boost::asio::thread_pool& pool_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int inside_ = 0;
  std::uint64_t closed_ = 0;
  std::uint64_t opened_ = 0;
};

void bench_mutex_rule(Report& report, const Options& options, const std::shared_ptr<JobManager>& manager) {
  // Everything persistent is made outside the timed region: the pool and its strand, the serial
  // executor, the scheduler and the rule.
  boost::asio::thread_pool pool(2);
  auto strand = boost::asio::make_strand(pool);
  tasklet::SerialExecutor executor(manager, "bench strand");
  Runner runner(manager);
  const Rule rule = tasklet::rules::mutex("bench mutex");
  SerialProbe probe;
  Completion completion;
  PoolGate gate(pool);

  // The workloads of one size; each call runs `reps` rounds of n jobs.
  struct Workloads {
    std::function<void()> asio_strand, serial_executor, tasklets, asio_queued, tasklets_made_up_front;
  };
  const auto workloads_of = [&](std::size_t n) {
    const std::size_t reps = repetitions_for(n, options);
    const auto strand_rounds = [&, n, reps](bool queued) {
      return [&, n, reps, queued] {
        for (std::size_t r = 0; r < reps; ++r) {
          probe.reset();
          completion.reset();
          if (queued) gate.close();
          for (std::size_t i = 0; i < n; ++i) {
            boost::asio::post(strand, [&probe, &completion, i, n] {
              if (probe.visit(i) + 1 == n) completion.signal();
            });
          }
          if (queued) gate.open();
          completion.wait();
          probe.check(queued ? "asio strand (queued up front)" : "asio strand", n);
        }
      };
    };
    Workloads w;
    w.asio_strand = strand_rounds(false);
    w.asio_queued = strand_rounds(true);
    w.serial_executor = [&, n, reps] {
      for (std::size_t r = 0; r < reps; ++r) {
        probe.reset();
        for (std::size_t i = 0; i < n; ++i) executor.post([&probe, i] { probe.visit(i); });
        executor.wait();
        probe.check("SerialExecutor", n);
      }
    };
    w.tasklets = runner.sample(Form::tasklets, MutexWorkload{&probe, rule, n}, n, options);
    w.tasklets_made_up_front = runner.sample(Form::made_up_front, MutexWorkload{&probe, rule, n}, n, options);
    return w;
  };

  for (const std::size_t n : sizes(options)) {
    const Workloads w = workloads_of(n);
    const std::vector<Comparison> results = tasklet::bench::compare_each(
        options.repeats, sample_ops(n, options), w.asio_strand, {w.serial_executor, w.tasklets});
    report.add(comparison_row("mutex rule: SerialExecutor vs asio strand", n, results[0], 1.5));
    report.add(comparison_row("mutex rule: async tasklets vs asio strand", n, results[1], 1.5));
    const Comparison queued = tasklet::bench::compare(options.repeats, sample_ops(n, options), w.asio_queued,
                                                      w.tasklets_made_up_front);
    report.add(comparison_row("mutex rule, all queued up front: tasklets vs asio strand", n, queued, 1.5));
  }
  add_growth_row(
      report, options, "mutex rule: growth, asio strand (baseline)",
      [&](std::size_t n) { return workloads_of(n).asio_strand; }, std::nullopt);
  add_growth_row(
      report, options, "mutex rule: growth, SerialExecutor",
      [&](std::size_t n) { return workloads_of(n).serial_executor; }, 1.5);
  add_growth_row(
      report, options, "mutex rule: growth, async tasklets",
      [&](std::size_t n) { return workloads_of(n).tasklets; }, 1.5);
  add_growth_row(
      report, options, "mutex rule: growth, tasklets made up front",
      [&](std::size_t n) { return workloads_of(n).tasklets_made_up_front; }, 1.5);
  check_rules_released(*manager, "the mutex-rule workload");
}

// ---------------------------------------------------------------------------------------------
// 2. Random path rules vs no rules

// Every node of an 8-ary tree of depth 1 to 4 ("/0" ... "/7/7/7/7"): its path string and one
// exclusive path rule on it, both made up front (the shared-rule workloads use the rules).
class PathTree {
 public:
  static constexpr int fan_out = 8;
  static constexpr int max_depth = 4;

  PathTree() {
    std::size_t level_size = 1;
    for (int depth = 1; depth <= max_depth; ++depth) {
      level_size *= fan_out;
      first_of_depth_[static_cast<std::size_t>(depth)] = rules_.size();
      for (std::size_t code = 0; code < level_size; ++code) {
        std::string path;
        std::size_t rest = code;
        std::string digits;
        for (int level = 0; level < depth; ++level) {
          digits.insert(digits.begin(), static_cast<char>('0' + rest % fan_out));
          rest /= fan_out;
        }
        for (const char digit : digits) (path += '/') += digit;
        const std::size_t parent_code = code / fan_out;
        parent_.push_back(depth == 1 ? no_parent
                                     : first_of_depth_[static_cast<std::size_t>(depth - 1)] + parent_code);
        rules_.push_back(tasklet::rules::path(path));
        paths_.push_back(std::move(path));
      }
    }
    first_of_depth_[max_depth + 1] = rules_.size();
  }

  std::size_t size() const noexcept { return rules_.size(); }
  const Rule& rule(std::size_t node) const noexcept { return rules_[node]; }
  const std::string& path(std::size_t node) const noexcept { return paths_[node]; }
  /// The i-th node of the deepest level, cycling through it.
  std::size_t deepest(std::size_t i) const noexcept {
    return first_of_depth_[max_depth] + i % (first_of_depth_[max_depth + 1] - first_of_depth_[max_depth]);
  }
  /// The parent node, or no_parent for depth 1 (the root "/" is never used).
  std::size_t parent(std::size_t node) const noexcept { return parent_[node]; }
  static constexpr std::size_t no_parent = static_cast<std::size_t>(-1);

  /// The top-level subtree (0 ... 7) a node is in.
  std::size_t top(std::size_t node) const noexcept {
    while (parent_[node] != no_parent) node = parent_[node];
    return node;
  }

  /// A random node: depth uniform in 1..4, then a uniform node of that depth.
  template <class Random>
  std::size_t pick(Random& random) const {
    std::uniform_int_distribution<int> depth_of(1, max_depth);
    const auto depth = static_cast<std::size_t>(depth_of(random));
    std::uniform_int_distribution<std::size_t> node_of(first_of_depth_[depth],
                                                       first_of_depth_[depth + 1] - 1);
    return node_of(random);
  }

 private:
  std::vector<Rule> rules_;
  std::vector<std::string> paths_;
  std::vector<std::size_t> parent_;
  std::size_t first_of_depth_[max_depth + 2] = {};
};

// Which rule a path job holds: none, the tree's shared rule for its node, a fresh
// rules::path(its node's path) made when the job is made, or (a move) a fresh multi rule over its
// node and its other node, in another top-level subtree.
enum class PathRules { none, shared, fresh, moves };

Rule path_rule(const PathTree& tree, std::size_t node, PathRules rules, std::size_t other = 0) {
  switch (rules) {
    case PathRules::none:
      return nullptr;
    case PathRules::shared:
      return tree.rule(node);
    case PathRules::fresh:
      return tasklet::rules::path(tree.path(node));
    case PathRules::moves:
      return tasklet::rules::combine(tasklet::rules::path(tree.path(node)),
                                     tasklet::rules::path(tree.path(other)));
  }
  return nullptr;
}

// The jobs of one size: which node each job locks, and its ordinal among the jobs on that node
// (jobs on the same path conflict, so they must run in that order). A move also locks its other
// node; its ordinals count the moves on each of its nodes.
struct PathJobs {
  std::vector<std::uint32_t> node;
  std::vector<std::uint32_t> ordinal;
  std::vector<std::uint32_t> per_node;  // how many jobs each node has
  std::vector<std::uint32_t> other;
  std::vector<std::uint32_t> move_ordinal, other_ordinal;
  std::vector<std::uint32_t> moves_per_node;

  PathJobs(const PathTree& tree, std::size_t n, std::uint64_t seed)
      : per_node(tree.size(), 0), moves_per_node(tree.size(), 0) {
    std::mt19937_64 random(seed);
    std::mt19937_64 other_random(seed + 1);
    node.reserve(n);
    ordinal.reserve(n);
    other.reserve(n);
    move_ordinal.reserve(n);
    other_ordinal.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t picked = tree.pick(random);
      node.push_back(static_cast<std::uint32_t>(picked));
      ordinal.push_back(per_node[picked]++);
      std::size_t second = tree.pick(other_random);
      while (tree.top(second) == tree.top(picked)) second = tree.pick(other_random);
      other.push_back(static_cast<std::uint32_t>(second));
      move_ordinal.push_back(moves_per_node[picked]++);
      other_ordinal.push_back(moves_per_node[second]++);
    }
  }
};

// What every job of the path workload does, with rules or without: one relaxed increment of its
// node's counter, which with rules must equal the job's ordinal. Without rules the order is free
// and the flag is ignored; it is written at most once per sample either way, so both variants do
// the same work.
struct PathProbe {
  explicit PathProbe(std::size_t nodes) : visits(nodes) {}

  void reset() {
    for (auto& count : visits) count.store(0, std::memory_order_relaxed);
    out_of_order.store(false, std::memory_order_relaxed);
  }
  void visit(std::uint32_t node, std::uint32_t ordinal) noexcept {
    if (visits[node].fetch_add(1, std::memory_order_relaxed) != ordinal &&
        !out_of_order.load(std::memory_order_relaxed)) {
      out_of_order.store(true, std::memory_order_relaxed);
    }
  }
  void check(const std::string& who, const PathJobs& jobs, bool ordered, bool moves = false) const {
    const std::vector<std::uint32_t>& expected = moves ? jobs.moves_per_node : jobs.per_node;
    for (std::size_t node = 0; node < visits.size(); ++node) {
      if (visits[node].load() != expected[node])
        fail(who + ": node " + std::to_string(node) + " saw " + std::to_string(visits[node].load()) +
             " of its " + std::to_string(expected[node]) + " jobs");
    }
    if (ordered && out_of_order.load()) fail(who + ": jobs on one path ran out of order");
  }

  std::vector<std::atomic<std::uint32_t>> visits;
  std::atomic<bool> out_of_order{false};
};

// The path workload of one size: its jobs on random nodes, with the rules `rules` says (with none
// it is the no-rule workload, every other row's baseline).
struct PathWorkload {
  const PathTree* tree;
  const PathJobs* jobs;
  PathProbe* probe;
  PathRules rules;

  Rule rule(std::size_t i) const { return path_rule(*tree, jobs->node[i], rules, jobs->other[i]); }
  void visit(std::size_t i) const noexcept {
    if (rules != PathRules::moves) {
      probe->visit(jobs->node[i], jobs->ordinal[i]);
      return;
    }
    probe->visit(jobs->node[i], jobs->move_ordinal[i]);
    probe->visit(jobs->other[i], jobs->other_ordinal[i]);
  }
  void reset() const { probe->reset(); }
  void check(const std::string& who) const {
    const char* with = rules == PathRules::none ? " without rules" : " on path rules";
    probe->check(who + with, *jobs, rules != PathRules::none, rules == PathRules::moves);
  }
};

// The tree, the probe and the jobs of every size (drawn once per size, so all forms and rule kinds
// of one size run the same jobs).
class PathWorkloads {
 public:
  PathWorkloads() : probe_(tree_.size()) {}

  const PathTree& tree() const noexcept { return tree_; }
  PathWorkload at(std::size_t n, PathRules rules) {
    const PathJobs& jobs = jobs_of_.try_emplace(n, tree_, n, 1'000 + n).first->second;
    return {&tree_, &jobs, &probe_, rules};
  }

 private:
  PathTree tree_;
  PathProbe probe_;
  std::map<std::size_t, PathJobs> jobs_of_;
};

// An untimed oracle: every job marks its node exclusive and its ancestors occupied while it runs,
// and notices when a conflicting job is inside at the same time (Dekker-style, sequentially
// consistent, so overlapping conflicting jobs cannot both miss each other and jobs that do not
// overlap never report one another).
struct ExclusionOracle {
  explicit ExclusionOracle(const PathTree& paths)
      : tree(paths), exclusive(paths.size()), inside(paths.size()) {}

  void visit(std::size_t node) noexcept {
    bool clash = false;
    for (std::size_t up = tree.parent(node); up != PathTree::no_parent; up = tree.parent(up)) {
      inside[up].fetch_add(1);
      if (exclusive[up].load() != 0) clash = true;
    }
    if (exclusive[node].exchange(1) != 0) clash = true;
    if (inside[node].load() != 0) clash = true;
    exclusive[node].store(0);
    for (std::size_t up = tree.parent(node); up != PathTree::no_parent; up = tree.parent(up))
      inside[up].fetch_sub(1);
    if (clash) violations.fetch_add(1);
  }

  const PathTree& tree;
  std::vector<std::atomic<int>> exclusive;
  std::vector<std::atomic<int>> inside;
  std::atomic<std::size_t> violations{0};
};

void validate_path_exclusion(const PathTree& tree, const std::shared_ptr<JobManager>& manager, std::size_t n,
                             PathRules rules) {
  const std::string which = rules == PathRules::fresh ? "fresh" : "shared";
  const PathJobs jobs(tree, n, 7);
  ExclusionOracle oracle(tree);
  PathProbe probe(tree.size());
  probe.reset();
  const auto scheduler = Scheduler::create(SchedulerOptions{manager, nullptr, 0});
  run_async_tasklets(*scheduler, n, [&](std::size_t i) {
    const std::uint32_t node = jobs.node[i];
    const std::uint32_t ordinal = jobs.ordinal[i];
    return tasklet::make_tasklet(
        [&oracle, &probe, node, ordinal] {
          oracle.visit(node);
          probe.visit(node, ordinal);
          return Directive::done;
        },
        path_rule(tree, node, rules));
  });
  probe.check("path rules (oracle pass, " + which + " rules)", jobs, true);
  if (oracle.violations.load() != 0)
    fail("path rules (" + which + "): " + std::to_string(oracle.violations.load()) +
         " jobs overlapped a conflicting job");
  std::cout << "  path rules: exclusion oracle passed on " << size_label(n) << " jobs with " << which
            << " rules\n";
}

void bench_path_rules(Report& report, const Options& options, const std::shared_ptr<JobManager>& manager) {
  PathWorkloads paths;
  const std::size_t oracle_n = std::min<std::size_t>(options.max_n, options.quick ? 10'000 : 100'000);
  validate_path_exclusion(paths.tree(), manager, oracle_n, PathRules::shared);
  validate_path_exclusion(paths.tree(), manager, oracle_n, PathRules::fresh);

  Runner runner(manager);
  const auto sample_in = [&](Form form, PathRules rules) {
    return [&, form, rules](std::size_t n) { return runner.sample(form, paths.at(n, rules), n, options); };
  };
  const auto sample_at = [&](PathRules rules) { return sample_in(Form::tasklets, rules); };
  const auto made_at = [&](PathRules rules) { return sample_in(Form::made_up_front, rules); };
  for (const std::size_t n : sizes(options)) {
    const std::vector<Comparison> results =
        tasklet::bench::compare_each(options.repeats, sample_ops(n, options), sample_at(PathRules::none)(n),
                                     {sample_at(PathRules::shared)(n), sample_at(PathRules::fresh)(n)});
    report.add(comparison_row("path rules: shared rule objects vs no rule", n, results[0], 3.0));
    report.add(comparison_row("path rules: fresh rule per tasklet vs no rule", n, results[1], 4.0));
    const std::vector<Comparison> made =
        tasklet::bench::compare_each(options.repeats, sample_ops(n, options), made_at(PathRules::none)(n),
                                     {made_at(PathRules::shared)(n), made_at(PathRules::fresh)(n)});
    report.add(comparison_row("path rules, made up front: shared rule objects vs no rule", n, made[0], 3.0));
    report.add(
        comparison_row("path rules, made up front: fresh rule per tasklet vs no rule", n, made[1], 4.0));
    const Comparison moves =
        tasklet::bench::compare(options.repeats, sample_ops(n, options), sample_at(PathRules::none)(n),
                                sample_at(PathRules::moves)(n));
    report.add(comparison_row("path rules: moves (a fresh multi rule over two subtrees) vs no rule", n, moves,
                              std::nullopt));
  }
  add_growth_row(report, options, "path rules: growth, no rule (baseline)", sample_at(PathRules::none),
                 std::nullopt);
  add_growth_row(report, options, "path rules: growth, shared rule objects", sample_at(PathRules::shared),
                 1.5);
  add_growth_row(report, options, "path rules: growth, fresh rule per tasklet", sample_at(PathRules::fresh),
                 1.5);
  add_growth_row(report, options, "path rules, made up front: growth, no rule (baseline)",
                 made_at(PathRules::none), std::nullopt);
  add_growth_row(report, options, "path rules, made up front: growth, shared rule objects",
                 made_at(PathRules::shared), 1.5);
  add_growth_row(report, options, "path rules, made up front: growth, fresh rule per tasklet",
                 made_at(PathRules::fresh), 1.5);
  check_rules_released(*manager, "the path-rule workload");
}

// ---------------------------------------------------------------------------------------------
// The trace recorder switched on (JobManager::start_trace) against the same manager kind with it
// off: what a recording run costs. Off, it costs nothing measurable (every other row runs with it
// off). One size: a recording keeps every event, so it grows with n.

void bench_trace(Report& report, const Options& options) {
  PathWorkloads paths;
  const auto off = make_manager();
  const auto on = make_manager();
  // Never full here (a full recorder drops events, which is cheaper): one round of n per sample,
  // about ten events per job.
  on->start_trace(20'000'000);
  Runner quiet(off), recording(on);
  const std::size_t n = std::min<std::size_t>(options.max_n, 20'000);
  for (const Form form : {Form::tasklets, Form::jobs}) {
    const auto sample = [&, form](Runner& runner) {
      return [&, form] {
        const PathWorkload workload = paths.at(n, PathRules::shared);
        workload.reset();
        runner.run(form, workload, n);
        workload.check(name_of(form));
      };
    };
    const Comparison result = tasklet::bench::compare(options.repeats, n, sample(quiet), sample(recording));
    report.add(comparison_row(form == Form::jobs ? "trace: recording vs off, jobs with shared path rules"
                                                 : "trace: recording vs off, tasklets with shared path rules",
                              n, result, std::nullopt));
  }
  on->stop_trace();
  check_rules_released(*on, "the trace workload");
}

// ---------------------------------------------------------------------------------------------
// 3. The Job API vs tasklets: the same workloads (no rule, one mutex rule, path rules shared and
// fresh), through make_job/set_rule/schedule/join against async tasklets

void bench_jobs(Report& report, const Options& options, const std::shared_ptr<JobManager>& manager) {
  PathWorkloads paths;
  SerialProbe serial;
  const Rule mutex = tasklet::rules::mutex("bench jobs mutex");
  Runner runner(manager);

  // One workload: its rows' names, and its sample in either form at size n.
  struct JobWorkload {
    std::string versus_tasklets;
    std::string growth;
    std::function<std::function<void()>(Form, std::size_t)> sample;
  };
  const auto path_workload = [&](PathRules rules) {
    return
        [&, rules](Form form, std::size_t n) { return runner.sample(form, paths.at(n, rules), n, options); };
  };
  const std::vector<JobWorkload> workloads = {
      {"jobs: no rule vs tasklets", "jobs: growth, no rule", path_workload(PathRules::none)},
      {"jobs: one mutex rule vs tasklets", "jobs: growth, one mutex rule",
       [&](Form form, std::size_t n) {
         return runner.sample(form, MutexWorkload{&serial, mutex, n}, n, options);
       }},
      {"jobs: shared path rules vs tasklets", "jobs: growth, shared path rules",
       path_workload(PathRules::shared)},
      {"jobs: fresh path rule per job vs tasklets", "jobs: growth, fresh path rule per job",
       path_workload(PathRules::fresh)},
  };

  for (const std::size_t n : sizes(options)) {
    for (const JobWorkload& workload : workloads) {
      const Comparison result =
          tasklet::bench::compare(options.repeats, sample_ops(n, options), workload.sample(Form::tasklets, n),
                                  workload.sample(Form::jobs, n));
      report.add(comparison_row(workload.versus_tasklets, n, result, 2.0));
    }
  }
  // A job whose run is a coroutine against one whose run is a function, on the same workloads.
  const std::vector<std::pair<std::string, const JobWorkload*>> coroutine_rows = {
      {"coroutine jobs: no rule vs jobs", &workloads[0]},
      {"coroutine jobs: shared path rules vs jobs", &workloads[2]},
  };
  for (const std::size_t n : sizes(options)) {
    for (const auto& [row, workload] : coroutine_rows) {
      const Comparison result =
          tasklet::bench::compare(options.repeats, sample_ops(n, options), workload->sample(Form::jobs, n),
                                  workload->sample(Form::coroutine_jobs, n));
      report.add(comparison_row(row, n, result, 1.2));
    }
  }
  add_growth_row(
      report, options, "jobs: growth, tasklets no rule (baseline)",
      [&](std::size_t n) { return workloads.front().sample(Form::tasklets, n); }, std::nullopt);
  for (const JobWorkload& workload : workloads) {
    add_growth_row(
        report, options, workload.growth, [&](std::size_t n) { return workload.sample(Form::jobs, n); }, 1.5);
  }
  check_rules_released(*manager, "the Job API workloads");
}

// ---------------------------------------------------------------------------------------------
// 4. Uncontended begin_rule/end_rule vs std::mutex

// Untimed: while this thread holds `rule`, a second thread's begin_rule on it must wait (the table
// shows it waiting) and get in only after end_rule.
void validate_begin_rule_excludes(JobManager& manager, const Rule& rule) {
  std::atomic<bool> entered{false};
  manager.begin_rule(rule);
  std::thread other([&] {
    tasklet::RuleScope scope(manager, rule);
    entered.store(true);
  });
  // Until the other thread waits for the rule, or (broken exclusion) got in anyway.
  while (manager.rule_stats().waiting == 0 && !entered.load()) std::this_thread::yield();
  const bool early = entered.load();
  manager.end_rule(rule);
  other.join();
  if (early || !entered.load())
    fail("begin_rule(" + tasklet::describe(rule) + ") did not exclude a second thread");
}

void bench_begin_end(Report& report, const Options& options, const std::shared_ptr<JobManager>& manager) {
  const std::size_t iterations = options.quick ? 100'000 : 1'000'000;
  const Rule mutex_rule = tasklet::rules::mutex("bench begin/end");
  const Rule path_rule = tasklet::rules::path("/a/b/c");
  validate_begin_rule_excludes(*manager, mutex_rule);
  validate_begin_rule_excludes(*manager, path_rule);

  std::mutex mutex;
  const auto std_mutex = [&] {
    for (std::size_t i = 0; i < iterations; ++i) {
      mutex.lock();
      mutex.unlock();
    }
  };
  const auto begin_end = [&](const Rule& rule) {
    return [&manager, &rule, iterations] {
      for (std::size_t i = 0; i < iterations; ++i) {
        manager->begin_rule(rule);
        manager->end_rule(rule);
      }
      if (manager->current_rule() != nullptr) fail("begin_rule/end_rule left a rule in force");
    };
  };
  const std::vector<Comparison> results = tasklet::bench::compare_each(
      options.repeats, iterations, std_mutex, {begin_end(mutex_rule), begin_end(path_rule)});
  report.add(comparison_row("begin/end_rule mutex rule vs std::mutex", iterations, results[0], 3.0));
  report.add(comparison_row("begin/end_rule path /a/b/c vs std::mutex", iterations, results[1], 3.0));
  if (manager->rule_stats().held != 0) fail("begin_rule/end_rule left a rule held");
}

// ---------------------------------------------------------------------------------------------
// 5. Memory per queued tasklet and per queued job

// How many jobs the memory rows queue.
std::size_t memory_n(const Options& options) {
  return std::min<std::size_t>(options.max_n, options.quick ? 10'000 : 100'000);
}

// Resident growth per queued item, beyond the user's callable of `user_bytes`.
double bytes_per_item(std::size_t before, std::size_t after, std::size_t n, std::size_t user_bytes) {
  const double delta = after > before ? static_cast<double>(after - before) : 0.0;
  return delta / static_cast<double>(n) - static_cast<double>(user_bytes);
}

// Queues `n` sync tasklets, each with rule_of(i), while this thread holds `holder` (so they all
// wait in the rule table), and returns the memory they take per tasklet beyond the user's callable.
// Then releases the holder and runs them, checking that every one ran. Runs in a child process of
// its own (a manager of its own), as every memory row.
template <class RuleOf>
double queued_tasklet_bytes(const std::string& label, std::size_t n, const Rule& holder, RuleOf&& rule_of) {
  const auto manager = make_manager();
  std::atomic<std::size_t> ran{0};
  auto job = [&ran] {
    ran.fetch_add(1, std::memory_order_relaxed);
    return Directive::done;
  };
  const auto scheduler = Scheduler::create(SchedulerOptions{manager, nullptr, 0});
  manager->begin_rule(holder);
  const std::size_t before = tasklet::bench::resident_bytes();
  for (std::size_t i = 0; i < n; ++i)
    scheduler->schedule(tasklet::make_tasklet(job, rule_of(i)), Directive::sync);
  const std::size_t after = tasklet::bench::resident_bytes();
  const auto stats = manager->rule_stats();
  if (stats.waiting != n)
    fail(label + ": " + std::to_string(stats.waiting) + " of " + std::to_string(n) + " wait");
  manager->end_rule(holder);
  scheduler->run();
  if (ran.load() != n) fail(label + ": " + std::to_string(ran.load()) + " of " + std::to_string(n) + " ran");
  return bytes_per_item(before, after, n, sizeof(job));
}

void bench_tasklet_memory(Report& report, const Options& options) {
  const std::size_t n = memory_n(options);
  const auto add_row = [&](const std::string& label, const Rule& holder, const auto& rule_of) {
    const double bytes =
        tasklet::bench::in_child_process([&] { return queued_tasklet_bytes(label, n, holder, rule_of); });
    report.add(figure_row(label, n, bytes, "bytes", 256.0));
  };
  const Rule rule = tasklet::rules::mutex("bench memory");
  add_row("memory: tasklet queued on a mutex rule", rule, [&](std::size_t) { return rule; });

  const PathTree tree;  // made before measuring: rules are the user's, not per-job cost
  std::mt19937_64 random(11);
  std::vector<std::size_t> nodes(n);
  for (auto& node : nodes) node = tree.pick(random);
  add_row("memory: tasklet queued on a path rule", tasklet::rules::path("/"),
          [&](std::size_t i) { return tree.rule(nodes[i]); });
}

// What a fresh rules::path(p) of depth 4 takes (its one block, and its path's if the string does
// not fit in the rule): n of them kept, the path strings and the handles' vector made first.
double fresh_path_rule_bytes(std::size_t n) {
  const PathTree tree;
  std::vector<std::string> paths;
  paths.reserve(n);
  for (std::size_t i = 0; i < n; ++i) paths.push_back(tree.path(tree.deepest(i)));
  std::vector<Rule> kept(n);
  const std::size_t before = tasklet::bench::resident_bytes();
  for (std::size_t i = 0; i < n; ++i) kept[i] = tasklet::rules::path(paths[i]);
  const std::size_t after = tasklet::bench::resident_bytes();
  for (std::size_t i = 0; i < n; ++i) {
    if (kept[i] == nullptr || kept[i]->to_string() != "path(" + paths[i] + ")")
      fail("memory: fresh path rule " + std::to_string(i) + " is not path(" + paths[i] + ")");
  }
  return bytes_per_item(before, after, n, 0);
}

void bench_rule_memory(Report& report, const Options& options) {
  const std::size_t n = memory_n(options);
  const double bytes = tasklet::bench::in_child_process([&] { return fresh_path_rule_bytes(n); });
  report.add(figure_row("memory: fresh path rule of depth 4", n, bytes, "bytes", 128.0));
}

// How a memory row keeps its jobs from starting (see bench_job_memory).
enum class Queued { behind_held_rule, fresh_path_behind_root, on_suspended_manager };

// Schedules `n` jobs (make_job; set_rule when behind a held rule) that cannot start, so that all are
// waiting, and returns the memory they take per job (the Job object, the std::function around the
// callable, everything the engine keeps for a waiting job) beyond the user's callable. The handles
// (a vector of shared_ptr) are made resident before measuring. Then lets them run, joins every job
// and checks that each ran. Runs in a child process of its own (a manager of its own).
// With `coroutine`, the jobs' runs are coroutines (the callable is the same size).
double queued_job_bytes(const std::string& label, std::size_t n, Queued queued, bool coroutine = false) {
  const auto manager = make_manager();
  const Rule rule = tasklet::rules::mutex("bench job memory");
  std::atomic<std::size_t> ran{0};
  auto body = [&ran](tasklet::ProgressMonitor&) {
    ran.fetch_add(1, std::memory_order_relaxed);
    return tasklet::Status::ok();
  };
  auto coroutine_body = [&ran](tasklet::ProgressMonitor&) -> tasklet::Task<tasklet::Status> {
    ran.fetch_add(1, std::memory_order_relaxed);
    co_return tasklet::Status::ok();
  };
  static_assert(sizeof(coroutine_body) == sizeof(body));
  std::vector<std::shared_ptr<Job>> jobs(n);
  // With fresh path rules: each job gets rules::path(p) of depth 4 (the strings are user data, made
  // first), all waiting behind "/" held here; the rules are made in the measured region.
  const Rule root = tasklet::rules::path("/");
  std::vector<std::string> paths;
  if (queued == Queued::fresh_path_behind_root) {
    const PathTree tree;
    paths.reserve(n);
    for (std::size_t i = 0; i < n; ++i) paths.push_back(tree.path(tree.deepest(i)));
  }
  const Rule& holder = queued == Queued::fresh_path_behind_root ? root : rule;
  if (queued == Queued::on_suspended_manager) {
    manager->suspend();
  } else {
    manager->begin_rule(holder);
  }
  const std::size_t before = tasklet::bench::resident_bytes();
  for (std::size_t i = 0; i < n; ++i) {
    std::shared_ptr<Job>& job = jobs[i];
    job = coroutine ? tasklet::make_job("bench job", coroutine_body, manager)
                    : tasklet::make_job("bench job", body, manager);
    if (queued == Queued::behind_held_rule) job->set_rule(rule);
    if (queued == Queued::fresh_path_behind_root) job->set_rule(tasklet::rules::path(paths[i]));
    job->schedule();
  }
  const std::size_t after = tasklet::bench::resident_bytes();
  const auto waiting = std::count_if(jobs.begin(), jobs.end(), [](const std::shared_ptr<Job>& job) {
    return job->state() == tasklet::JobState::waiting;
  });
  if (static_cast<std::size_t>(waiting) != n)
    fail(label + ": " + std::to_string(waiting) + " of " + std::to_string(n) + " wait");
  if (queued == Queued::on_suspended_manager) {
    manager->resume();
  } else {
    manager->end_rule(holder);
  }
  for (const std::shared_ptr<Job>& job : jobs) job->join();
  if (ran.load() != n) fail(label + ": " + std::to_string(ran.load()) + " of " + std::to_string(n) + " ran");
  check_rules_released(*manager, label);
  return bytes_per_item(before, after, n, sizeof(body));
}

// Two meanings of "queued" (state waiting): (a) jobs on a mutex rule while this thread holds it
// (begin_rule), each with its request in the rule table, as the tasklet rows; (b) jobs without a
// rule on a suspended manager, what any scheduled job costs before it starts. And (c) jobs with a
// fresh path rule of depth 4 each, waiting behind "/" held by this thread: a queued job with its rule.
void bench_job_memory(Report& report, const Options& options) {
  const std::size_t n = memory_n(options);
  const auto add_row = [&](const std::string& label, Queued queued, bool coroutine) {
    const double bytes =
        tasklet::bench::in_child_process([&] { return queued_job_bytes(label, n, queued, coroutine); });
    report.add(figure_row(label, n, bytes, "bytes", 512.0));
  };
  add_row("memory: job queued on a held mutex rule", Queued::behind_held_rule, false);
  add_row("memory: job queued on a suspended manager", Queued::on_suspended_manager, false);
  add_row("memory: coroutine job queued on a held mutex rule", Queued::behind_held_rule, true);
  add_row("memory: job queued with a fresh path rule", Queued::fresh_path_behind_root, false);
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = tasklet::bench::parse_options(argc, argv);

  std::cout << "tasklet rule benchmarks: median of " << options.repeats
            << " interleaved runs; ratio = median of (ours / baseline) over runs of the same round\n"
            << "hardware threads " << std::thread::hardware_concurrency() << ", oneTBB " << TBB_VERSION_STRING
            << ", Boost " << BOOST_VERSION / 100000 << "." << BOOST_VERSION / 100 % 1000
            << ", tasklet workers " << workers << ", asio pool threads 2\n"
            << "load average at start: " << tasklet::bench::load_average() << "\n\n";
  Report::print_header(std::cout);

  Report report("tasklet rule benchmarks (ns/op: medians; ratio: median of paired ours/baseline)");
  // Memory first, each row in a child process, while this process has no threads yet (see
  // in_child_process()).
  if (options.selected("memory")) bench_tasklet_memory(report, options);
  if (options.selected("memory")) bench_rule_memory(report, options);
  if (options.selected("memory jobs")) bench_job_memory(report, options);

  // Made once, outside every timed region.
  const auto manager = make_manager();
  if (manager->workers()->concurrency() != workers)
    std::cout << "note: the manager has " << manager->workers()->concurrency() << " workers, not " << workers
              << "\n";
  if (options.selected("mutex")) bench_mutex_rule(report, options, manager);
  if (options.selected("path")) bench_path_rules(report, options, manager);
  if (options.selected("jobs")) bench_jobs(report, options, manager);
  if (options.selected("begin")) bench_begin_end(report, options, manager);
  if (options.selected("trace")) bench_trace(report, options);

  tasklet::bench::finish(report, options);
  return 0;
}
