// tasklet_bench_rules: the rule engine's rows of the performance contract (DESIGN section 5), each
// measured beside its baseline in the same run and reported as a ratio.
//
//   mutex rule     N trivial jobs on one mutex rule, posted from one thread and awaited, against
//                  a boost::asio strand on a 2-thread pool; two forms of ours: a SerialExecutor
//                  (post + wait) and async tasklets sharing a rules::mutex() (run)
//                                                  (<= 1.5x the strand; 10^6 within 1.5x of 10^3)
//   path rules     N async tasklets, each with a rules::path() on a random node of an 8-ary tree
//                  of depth 1-4, against the same tasklets without rules
//                                                  (<= 3x no-rule; 10^6 within 1.5x of 10^3)
//   begin/end      begin_rule + end_rule on one thread, uncontended (a mutex rule, a path rule),
//                  against std::mutex lock + unlock                                  (<= 3x)
//   memory         bytes per job queued behind a held rule, beyond the user's callable
//                  (growth of resident memory)                                       (<= 256)
//
// Every workload checks itself, so a broken engine cannot post a good number: every job ran, jobs
// on one mutex rule (and on one path) ran in the order they were scheduled, and, in an untimed
// pass, an oracle checks that no two jobs on conflicting paths ever overlapped and that begin_rule
// really excludes a second thread.
//
// Usage: tasklet_bench_rules [--repeats=K] [--max-n=N] [--quick] [--only=WORD]
#include <algorithm>
#include <atomic>
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
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>

#include <oneapi/tbb/version.h>

#include "harness.hpp"
#include "tasklet/tasklet.hpp"

namespace {

using tasklet::Directive;
using tasklet::JobManager;
using tasklet::Rule;
using tasklet::Scheduler;
using tasklet::SchedulerOptions;
using tasklet::bench::Comparison;
using tasklet::bench::comparison_row;
using tasklet::bench::figure_row;
using tasklet::bench::growth_row;
using tasklet::bench::Options;
using tasklet::bench::Report;
using tasklet::bench::size_label;

[[noreturn]] void fail(const std::string& what) {
  std::cerr << "benchmark self-check failed: " << what << "\n";
  std::exit(1);
}

// Each sample runs the workload often enough to do at least this many jobs, so that small N is not
// measured at the resolution of one wake-up.
std::size_t repetitions_for(std::size_t n, const Options& options) {
  const std::size_t min_jobs = options.quick ? 10'000 : 100'000;
  return n >= min_jobs ? 1 : (min_jobs + n - 1) / n;
}

std::vector<std::size_t> sizes(const Options& options) {
  std::vector<std::size_t> result;
  for (std::size_t n = 1'000; n <= options.max_n; n *= 10) result.push_back(n);
  return result;
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
  void check(const char* who, std::size_t n) const {
    if (next.load() != n)
      fail(std::string(who) + " ran " + std::to_string(next.load()) + " of " + std::to_string(n) + " jobs");
    if (out_of_order.load()) fail(std::string(who) + " ran jobs out of posting order (or two at once)");
  }
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

void bench_mutex_rule(Report& report, const Options& options, const std::shared_ptr<JobManager>& manager) {
  // Everything persistent is made outside the timed region: the pool and its strand, the serial
  // executor, the scheduler and the rule.
  boost::asio::thread_pool pool(2);
  auto strand = boost::asio::make_strand(pool);
  tasklet::SerialExecutor executor(manager, "bench strand");
  const auto scheduler = Scheduler::create(SchedulerOptions{manager, nullptr, 0});
  const Rule rule = tasklet::rules::mutex("bench mutex");
  SerialProbe probe;
  Completion completion;

  // The three workloads of one size; each call runs `reps` rounds of n jobs.
  struct Workloads {
    std::size_t ops;
    std::function<void()> asio_strand, serial_executor, tasklets;
  };
  const auto workloads_of = [&](std::size_t n) {
    const std::size_t reps = repetitions_for(n, options);
    Workloads w;
    w.ops = n * reps;
    w.asio_strand = [&, n, reps] {
      for (std::size_t r = 0; r < reps; ++r) {
        probe.reset();
        completion.reset();
        for (std::size_t i = 0; i < n; ++i) {
          boost::asio::post(strand, [&probe, &completion, i, n] {
            if (probe.visit(i) + 1 == n) completion.signal();
          });
        }
        completion.wait();
        probe.check("asio strand", n);
      }
    };
    w.serial_executor = [&, n, reps] {
      for (std::size_t r = 0; r < reps; ++r) {
        probe.reset();
        for (std::size_t i = 0; i < n; ++i) executor.post([&probe, i] { probe.visit(i); });
        executor.wait();
        probe.check("SerialExecutor", n);
      }
    };
    w.tasklets = [&, n, reps] {
      for (std::size_t r = 0; r < reps; ++r) {
        probe.reset();
        run_async_tasklets(*scheduler, n, [&](std::size_t i) {
          return tasklet::make_tasklet(
              [&probe, i] {
                probe.visit(i);
                return Directive::done;
              },
              rule);
        });
        probe.check("tasklets on a mutex rule", n);
      }
    };
    return w;
  };

  for (const std::size_t n : sizes(options)) {
    const Workloads w = workloads_of(n);
    const std::vector<Comparison> results =
        tasklet::bench::compare_each(options.repeats, w.ops, w.asio_strand, {w.serial_executor, w.tasklets});
    report.add(comparison_row("mutex rule: SerialExecutor vs asio strand", size_label(n), results[0], 1.5));
    report.add(comparison_row("mutex rule: async tasklets vs asio strand", size_label(n), results[1], 1.5));
  }
  if (const std::vector<std::size_t> all = sizes(options); all.size() >= 2) {
    // Growth from the smallest size to the largest, each pair of sizes measured interleaved.
    const std::size_t small_n = all.front();
    const std::size_t large_n = all.back();
    const Workloads small = workloads_of(small_n);
    const Workloads large = workloads_of(large_n);
    const auto growth_of = [&](const std::function<void()>& at_small, const std::function<void()>& at_large) {
      return tasklet::bench::growth(options.repeats, small.ops, at_small, large.ops, at_large);
    };
    report.add(growth_row("mutex rule: growth, asio strand (baseline)", small_n, large_n,
                          growth_of(small.asio_strand, large.asio_strand)));
    report.add(growth_row("mutex rule: growth, SerialExecutor", small_n, large_n,
                          growth_of(small.serial_executor, large.serial_executor), 1.5));
    report.add(growth_row("mutex rule: growth, async tasklets", small_n, large_n,
                          growth_of(small.tasklets, large.tasklets), 1.5));
  }
  if (manager->rule_stats().held != 0 || manager->rule_stats().waiting != 0)
    fail("rules still held or waiting after the mutex-rule workload");
}

// ---------------------------------------------------------------------------------------------
// 2. Random path rules vs no rules

// Every node of an 8-ary tree of depth 1 to 4 ("/0" ... "/7/7/7/7"), each with one exclusive path
// rule made up front: making rules is not what we measure.
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
      }
    }
    first_of_depth_[max_depth + 1] = rules_.size();
  }

  std::size_t size() const noexcept { return rules_.size(); }
  const Rule& rule(std::size_t node) const noexcept { return rules_[node]; }
  /// The parent node, or no_parent for depth 1 (the root "/" is never used).
  std::size_t parent(std::size_t node) const noexcept { return parent_[node]; }
  static constexpr std::size_t no_parent = static_cast<std::size_t>(-1);

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
  std::vector<std::size_t> parent_;
  std::size_t first_of_depth_[max_depth + 2] = {};
};

// The jobs of one size: which node each job locks, and its ordinal among the jobs on that node
// (jobs on the same path conflict, so they must run in that order).
struct PathJobs {
  std::vector<std::uint32_t> node;
  std::vector<std::uint32_t> ordinal;
  std::vector<std::uint32_t> per_node;  // how many jobs each node has

  PathJobs(const PathTree& tree, std::size_t n, std::uint64_t seed) : per_node(tree.size(), 0) {
    std::mt19937_64 random(seed);
    node.reserve(n);
    ordinal.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t picked = tree.pick(random);
      node.push_back(static_cast<std::uint32_t>(picked));
      ordinal.push_back(per_node[picked]++);
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
  void check(const char* who, const PathJobs& jobs, bool ordered) const {
    for (std::size_t node = 0; node < visits.size(); ++node) {
      if (visits[node].load() != jobs.per_node[node])
        fail(std::string(who) + ": node " + std::to_string(node) + " saw " +
             std::to_string(visits[node].load()) + " of its " + std::to_string(jobs.per_node[node]) +
             " jobs");
    }
    if (ordered && out_of_order.load()) fail(std::string(who) + ": jobs on one path ran out of order");
  }

  std::vector<std::atomic<std::uint32_t>> visits;
  std::atomic<bool> out_of_order{false};
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

void validate_path_exclusion(const PathTree& tree, const std::shared_ptr<JobManager>& manager,
                             std::size_t n) {
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
        tree.rule(node));
  });
  probe.check("path rules (oracle pass)", jobs, true);
  if (oracle.violations.load() != 0)
    fail("path rules: " + std::to_string(oracle.violations.load()) + " jobs overlapped a conflicting job");
  std::cout << "  path rules: exclusion oracle passed on " << size_label(n) << " jobs\n";
}

void bench_path_rules(Report& report, const Options& options, const std::shared_ptr<JobManager>& manager) {
  const PathTree tree;
  validate_path_exclusion(tree, manager,
                          std::min<std::size_t>(options.max_n, options.quick ? 10'000 : 100'000));

  const auto scheduler = Scheduler::create(SchedulerOptions{manager, nullptr, 0});
  PathProbe probe(tree.size());
  std::map<std::size_t, PathJobs> jobs_of;  // the jobs of each size, made once
  // `reps` rounds of the n jobs, with their rules or without.
  const auto workload = [&](std::size_t n, bool with_rules) {
    const std::size_t reps = repetitions_for(n, options);
    const PathJobs* made = &jobs_of.try_emplace(n, tree, n, 1'000 + n).first->second;
    return [&, made, n, reps, with_rules] {
      const PathJobs& jobs = *made;
      for (std::size_t r = 0; r < reps; ++r) {
        probe.reset();
        run_async_tasklets(*scheduler, n, [&](std::size_t i) {
          const std::uint32_t node = jobs.node[i];
          const std::uint32_t ordinal = jobs.ordinal[i];
          auto body = [&probe, node, ordinal] {
            probe.visit(node, ordinal);
            return Directive::done;
          };
          return with_rules ? tasklet::make_tasklet(body, tree.rule(node)) : tasklet::make_tasklet(body);
        });
        probe.check(with_rules ? "path rules" : "no rules", jobs, with_rules);
      }
    };
  };
  for (const std::size_t n : sizes(options)) {
    const Comparison result = tasklet::bench::compare(options.repeats, n * repetitions_for(n, options),
                                                      workload(n, false), workload(n, true));
    report.add(comparison_row("path rules: random depth 1-4 vs no rule", size_label(n), result, 3.0));
  }
  if (const std::vector<std::size_t> all = sizes(options); all.size() >= 2) {
    // Growth from the smallest size to the largest, each pair of sizes measured interleaved.
    const std::size_t small_n = all.front();
    const std::size_t large_n = all.back();
    const std::size_t small_ops = small_n * repetitions_for(small_n, options);
    const std::size_t large_ops = large_n * repetitions_for(large_n, options);
    const auto growth_of = [&](bool with_rules) {
      return tasklet::bench::growth(options.repeats, small_ops, workload(small_n, with_rules), large_ops,
                                    workload(large_n, with_rules));
    };
    report.add(growth_row("path rules: growth, no rule (baseline)", small_n, large_n, growth_of(false)));
    report.add(growth_row("path rules: growth, with path rules", small_n, large_n, growth_of(true), 1.5));
  }
  if (manager->rule_stats().held != 0 || manager->rule_stats().waiting != 0)
    fail("rules still held or waiting after the path-rule workload");
}

// ---------------------------------------------------------------------------------------------
// 3. Uncontended begin_rule/end_rule vs std::mutex

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
  report.add(
      comparison_row("begin/end_rule mutex rule vs std::mutex", size_label(iterations), results[0], 3.0));
  report.add(
      comparison_row("begin/end_rule path /a/b/c vs std::mutex", size_label(iterations), results[1], 3.0));
  if (manager->rule_stats().held != 0) fail("begin_rule/end_rule left a rule held");
}

// ---------------------------------------------------------------------------------------------
// 4. Memory per job queued behind a held rule

// Queues `n` sync tasklets, each with rule_of(i), while this thread holds `holder` (so they all
// wait in the rule table), and reports the memory they take per job beyond the user's callable. Then
// releases the holder and runs them, checking that every one ran.
template <class RuleOf>
void measure_queued(Report& report, const std::shared_ptr<JobManager>& manager, const std::string& label,
                    std::size_t n, const Rule& holder, RuleOf&& rule_of) {
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

  const double delta = after > before ? static_cast<double>(after - before) : 0.0;
  report.add(figure_row(label, size_label(n),
                        delta / static_cast<double>(n) - static_cast<double>(sizeof(job)), "bytes", 256.0));
}

void bench_memory(Report& report, const Options& options, const std::shared_ptr<JobManager>& manager) {
  const std::size_t n = std::min<std::size_t>(options.max_n, options.quick ? 10'000 : 100'000);
  const Rule rule = tasklet::rules::mutex("bench memory");
  measure_queued(report, manager, "memory: queued on a mutex rule, per job", n, rule,
                 [&](std::size_t) { return rule; });

  const PathTree tree;  // made before measuring: rules are the user's, not per-job cost
  std::mt19937_64 random(11);
  std::vector<std::size_t> nodes(n);
  for (auto& node : nodes) node = tree.pick(random);
  const Rule root = tasklet::rules::path("/");
  measure_queued(report, manager, "memory: queued on a path rule, per job", n, root,
                 [&](std::size_t i) { return tree.rule(nodes[i]); });
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = tasklet::bench::parse_options(argc, argv);
  // Two workers, as the strand's pool has two threads; made once, outside every timed region.
  const auto manager = JobManager::create(JobManager::Options{2, nullptr});

  std::cout << "tasklet rule benchmarks: median of " << options.repeats
            << " interleaved runs; ratio = median of (ours / baseline) over runs of the same round\n"
            << "hardware threads " << std::thread::hardware_concurrency() << ", oneTBB " << TBB_VERSION_STRING
            << ", Boost " << BOOST_VERSION / 100000 << "." << BOOST_VERSION / 100 % 1000
            << ", tasklet workers " << manager->workers()->concurrency() << ", asio pool threads 2\n"
            << "load average at start: " << tasklet::bench::load_average() << "\n\n";
  Report::print_header(std::cout);

  Report report("tasklet rule benchmarks (ns/op: medians; ratio: median of paired ours/baseline)");
  if (options.selected("memory")) bench_memory(report, options, manager);  // first: see resident_bytes()
  if (options.selected("mutex")) bench_mutex_rule(report, options, manager);
  if (options.selected("path")) bench_path_rules(report, options, manager);
  if (options.selected("begin")) bench_begin_end(report, options, manager);

  report.print_table(std::cout);
  std::cout << "load average at end: " << tasklet::bench::load_average() << "\n";
  std::cout << "\nMarkdown (for docs/performance.md):\n";
  report.print_markdown(std::cout);
  return 0;
}
