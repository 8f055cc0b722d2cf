// bench/harness.hpp: a small harness for benchmarks that report every workload as a ratio against
// a baseline measured in the same run.
//
// The machines we measure on are small and shared, so absolute times wander from run to run.
// compare() therefore interleaves the baseline and our variant (alternating which goes first),
// repeats each pair, and takes the median of each side and the median of the pairs' ratios; that
// ratio is the figure the performance contract (DESIGN section 5) promises; compare_each() does the
// same for several variants against one baseline. Report collects the rows; finish() prints them
// as a fixed-width table for people and a markdown table for docs/performance.md, and writes them
// as CSV when asked (below). Memory rows run each in_child_process(), on a heap of their own.
//
// Command line (parse_options): --repeats=K (median of K, default 7), --quick (small sizes, one
// repeat: a smoke test), --max-n=N (largest size of the sweeps), --only=WORD[,WORD...] (only the
// workloads whose name contains one of the words), --csv=FILE (also write the rows to FILE),
// --max-workers=W (the most workers a sweep over worker counts uses; tasklet_bench_scaling).
//
// The CSV file (finish() writes it; scripts/plot_bench.py draws it) has a header line and then one
// line per row, fields quoted as RFC 4180 says when they hold a comma or a quote:
//   workload,size,ratio,median_ours_ns,median_base_ns,min_ratio,max_ratio,target,unit
// - comparison rows: size is N (an integer); ratio the median of the paired ratios, min_ratio and
//   max_ratio the least and greatest of them; the medians in ns per operation; target the bound on
//   the ratio; unit "ns/op".
// - growth rows: size is "LARGE/SMALL" (e.g. 1000000/1000); ratio the growth (ns/op at the large
//   size over ns/op at the small one, 1.0 = flat) with min_ratio and max_ratio over the pairs;
//   median_ours_ns and median_base_ns are ns/op at the large and at the small size; target the
//   bound on the growth.
// - figure rows (no baseline, e.g. bytes per queued job): ratio, median_base_ns, min_ratio and
//   max_ratio empty; median_ours_ns holds the figure in `unit` (e.g. "bytes"); target its bound.
// Empty fields are values that do not apply; target is empty for information-only rows.
#pragma once

#include <dirent.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tasklet::bench {

using Clock = std::chrono::steady_clock;

/// Settings shared by every workload of one benchmark executable.
struct Options {
  int repeats = 7;
  std::size_t max_n = 1'000'000;
  bool quick = false;
  std::string only;
  /// Where finish() writes the rows as CSV; empty: nowhere.
  std::string csv;
  /// The most workers of a sweep over worker counts; 0: the hardware threads.
  int max_workers = 0;

  /// True when the workload named `name` was selected with --only (or nothing was).
  bool selected(std::string_view name) const {
    if (only.empty()) return true;
    for (std::string_view words = only; !words.empty();) {
      const std::size_t comma = words.find(',');
      const std::string_view word = words.substr(0, comma);
      if (!word.empty() && name.find(word) != std::string_view::npos) return true;
      words = comma == std::string_view::npos ? std::string_view{} : words.substr(comma + 1);
    }
    return false;
  }
};

/// Parses the options described at the top of this header. Exits with a usage message on bad input.
inline Options parse_options(int argc, char** argv) {
  Options options;
  const auto usage = [&](const std::string& bad) {
    std::cerr << "unknown or malformed argument: " << bad << "\n"
              << "usage: " << argv[0]
              << " [--repeats=K] [--max-n=N] [--quick] [--only=WORD[,WORD...]] [--csv=FILE]"
                 " [--max-workers=W]\n";
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value_of = [&](std::string_view prefix) -> std::optional<std::string> {
      if (arg.rfind(prefix, 0) != 0) return std::nullopt;
      return arg.substr(prefix.size());
    };
    try {
      if (arg == "--quick") {
        options.quick = true;
        options.repeats = 1;
        options.max_n = std::min<std::size_t>(options.max_n, 10'000);
      } else if (auto repeats = value_of("--repeats=")) {
        options.repeats = std::max(1, std::stoi(*repeats));
      } else if (auto max_n = value_of("--max-n=")) {
        options.max_n = std::max<std::size_t>(1, std::stoull(*max_n));
      } else if (auto only = value_of("--only=")) {
        options.only = *only;
      } else if (auto max_workers = value_of("--max-workers=")) {
        options.max_workers = std::stoi(*max_workers);
        if (options.max_workers < 1) usage(arg);
      } else if (auto csv = value_of("--csv=")) {
        if (csv->empty()) usage(arg);
        options.csv = *csv;
      } else {
        usage(arg);
      }
    } catch (const std::exception&) {
      usage(arg);
    }
  }
  return options;
}

/// The process's resident memory in bytes (/proc/self/statm), 0 when unknown. Memory rows use it
/// rather than malloc statistics because the engine allocates from oneTBB's scalable allocator,
/// which glibc's statistics do not see; run them first, each in_child_process() (below), so that
/// no memory other workloads freed waits in the allocators' pools (reused memory does not show as
/// growth).
inline std::size_t resident_bytes() {
  std::FILE* file = std::fopen("/proc/self/statm", "r");
  if (file == nullptr) return 0;
  unsigned long size = 0;
  unsigned long resident = 0;
  const int read = std::fscanf(file, "%lu %lu", &size, &resident);
  std::fclose(file);
  if (read != 2) return 0;
  return static_cast<std::size_t>(resident) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

/// The threads of this process (the entries of /proc/self/task), 0 when unknown.
inline int thread_count() {
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return 0;
  int count = 0;
  while (const dirent* entry = readdir(tasks)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(tasks);
  return count;
}

/// Runs `measure` in a child process (fork) and returns what it returned. Memory rows use it so
/// that each starts from a fresh copy of this process: memory that earlier rows freed into the
/// allocators' pools would otherwise be reused and not show as growth (jobs queued right after
/// another row's jobs had run measured -8 B each). Call it only while this process runs no other
/// thread (before making a JobManager, a Scheduler or a pool): the child has only the calling
/// thread. A child that fails (a self-check, a crash) makes this process exit with status 1.
inline double in_child_process(const std::function<double()>& measure) {
  if (const int threads = thread_count(); threads > 1) {
    std::cerr << "in_child_process: this process already runs " << threads
              << " threads; measure memory before starting any\n";
    std::exit(1);
  }
  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  std::cout.flush();  // else the child's exit (on a failed self-check) prints it a second time
  const pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    std::exit(1);
  }
  if (child == 0) {
    close(fds[0]);
    const double value = measure();
    const bool sent = write(fds[1], &value, sizeof value) == static_cast<ssize_t>(sizeof value);
    _exit(sent ? 0 : 1);
  }
  close(fds[1]);
  double value = 0.0;
  const bool received = read(fds[0], &value, sizeof value) == static_cast<ssize_t>(sizeof value);
  close(fds[0]);
  int status = 0;
  const bool reaped = waitpid(child, &status, 0) == child;
  if (!received || !reaped || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::cerr << "a measurement in a child process failed: ";
    if (!reaped) {
      std::cerr << "waitpid failed\n";
    } else if (WIFSIGNALED(status)) {
      std::cerr << "killed by signal " << WTERMSIG(status) << "\n";
    } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
      std::cerr << "exit status " << WEXITSTATUS(status) << "\n";
    } else {
      std::cerr << "no result\n";
    }
    std::exit(1);
  }
  return value;
}

/// The 1-, 5- and 15-minute load averages from /proc/loadavg ("?" where unavailable), to print
/// beside the figures: on a shared machine they say how much to trust a run.
inline std::string load_average() {
  std::FILE* file = std::fopen("/proc/loadavg", "r");
  if (file == nullptr) return "?";
  double one = 0.0;
  double five = 0.0;
  double fifteen = 0.0;
  const int read = std::fscanf(file, "%lf %lf %lf", &one, &five, &fifteen);
  std::fclose(file);
  if (read != 3) return "?";
  char text[64];
  std::snprintf(text, sizeof text, "%.2f %.2f %.2f", one, five, fifteen);
  return text;
}

/// Seconds taken by one call of `fn`.
template <class F>
double time_once(F&& fn) {
  const auto start = Clock::now();
  fn();
  const auto stop = Clock::now();
  return std::chrono::duration<double>(stop - start).count();
}

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2.0;
}

/// Ends the benchmark with status 1: a workload's self-check failed, so its figures mean nothing.
[[noreturn]] inline void fail(const std::string& what) {
  std::cerr << "benchmark self-check failed: " << what << "\n";
  std::exit(1);
}

/// `text` as one CSV field: quoted as RFC 4180 says when it holds a comma, a quote or a newline.
inline std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"') quoted += '"';  // a quote is written twice
    quoted += c;
  }
  return quoted + "\"";
}

/// One baseline/ours comparison: median times in nanoseconds per operation, and the median of
/// the ratios of back-to-back pairs (steadier than the ratio of the medians when the load of the
/// machine changes during the run), with the least and greatest of those ratios.
struct Comparison {
  double baseline_ns = 0.0;
  double ours_ns = 0.0;
  double ratio = 0.0;
  double min_ratio = 0.0;
  double max_ratio = 0.0;
};

/// A Comparison from median times (seconds per call) and the pairs' ratios; `ops` per call.
inline Comparison summarize(std::vector<double> base_times, std::vector<double> our_times,
                            const std::vector<double>& ratios, std::size_t ops) {
  const double scale = 1e9 / static_cast<double>(ops);
  Comparison result;
  result.baseline_ns = median(std::move(base_times)) * scale;
  result.ours_ns = median(std::move(our_times)) * scale;
  result.ratio = median(ratios);
  if (!ratios.empty()) {
    const auto [least, greatest] = std::minmax_element(ratios.begin(), ratios.end());
    result.min_ratio = *least;
    result.max_ratio = *greatest;
  }
  return result;
}

/// Runs `baseline()` and `ours()` once each to warm up, then `repeats` interleaved pairs (the
/// first of each pair alternates), and returns the median time of each divided by `ops` and the
/// median ratio of the pairs. Each callable performs `ops` operations per call.
template <class Baseline, class Ours>
Comparison compare(int repeats, std::size_t ops, Baseline&& baseline, Ours&& ours) {
  baseline();
  ours();
  std::vector<double> base_times;
  std::vector<double> our_times;
  std::vector<double> ratios;
  for (int r = 0; r < repeats; ++r) {
    if (r % 2 == 0) {
      base_times.push_back(time_once(baseline));
      our_times.push_back(time_once(ours));
    } else {
      our_times.push_back(time_once(ours));
      base_times.push_back(time_once(baseline));
    }
    if (base_times.back() > 0.0) ratios.push_back(our_times.back() / base_times.back());
  }
  return summarize(std::move(base_times), std::move(our_times), ratios, ops);
}

/// As compare(), for several variants measured against one baseline (e.g. two ways of doing the
/// same serial work against one asio strand). Each round runs the baseline and every variant once,
/// rotating the order from round to round so that none always runs first (or right after the
/// others' worker threads went idle); each variant's ratio is the median over the rounds of
/// (variant time / baseline time of the same round). Returns one Comparison per variant, in order.
inline std::vector<Comparison> compare_each(int repeats, std::size_t ops,
                                            const std::function<void()>& baseline,
                                            const std::vector<std::function<void()>>& variants) {
  const std::size_t count = variants.size() + 1;  // slot 0 is the baseline
  const auto run = [&](std::size_t slot) { slot == 0 ? baseline() : variants[slot - 1](); };
  for (std::size_t slot = 0; slot < count; ++slot) run(slot);  // warm-up
  std::vector<std::vector<double>> times(count);
  std::vector<std::vector<double>> ratios(variants.size());
  std::vector<double> round(count);
  for (int r = 0; r < repeats; ++r) {
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t slot = (k + static_cast<std::size_t>(r)) % count;
      round[slot] = time_once([&] { run(slot); });
    }
    for (std::size_t slot = 0; slot < count; ++slot) times[slot].push_back(round[slot]);
    if (round[0] > 0.0) {
      for (std::size_t v = 0; v < variants.size(); ++v) ratios[v].push_back(round[v + 1] / round[0]);
    }
  }
  std::vector<Comparison> results;
  for (std::size_t v = 0; v < variants.size(); ++v)
    results.push_back(summarize(times[0], std::move(times[v + 1]), ratios[v], ops));
  return results;
}

/// One line of the report. A row without a baseline (a plain figure, e.g. bytes per tasklet)
/// leaves `baseline` empty and puts its value in `ours`.
struct Row {
  std::string workload;
  /// The size as printed ("10^6", "10^6/10^3" for growth).
  std::string n;
  /// The size as a number: N, or for a growth row the large N (and `from_size` the small one).
  std::size_t size = 0;
  std::size_t from_size = 0;
  std::optional<double> baseline;
  double ours = 0.0;
  /// ours / baseline; comparison_row() sets it from Comparison::ratio.
  std::optional<double> measured_ratio;
  /// The least and greatest of the paired ratios behind measured_ratio.
  std::optional<double> min_ratio;
  std::optional<double> max_ratio;
  std::string unit = "ns/op";
  /// The promised bound: a ratio when there is a baseline, else a bound on `ours`; none: info only.
  std::optional<double> target;

  std::optional<double> ratio() const {
    if (measured_ratio) return measured_ratio;
    if (!baseline || *baseline <= 0.0) return std::nullopt;
    return ours / *baseline;
  }
  /// "ok", "OVER" or "" (no target).
  std::string verdict() const {
    if (!target) return "";
    const double value = baseline ? ratio().value_or(0.0) : ours;
    return value <= *target ? "ok" : "OVER";
  }
};

/// "10^6" for powers of ten, else the number itself.
inline std::string size_label(std::size_t n) {
  int exponent = 0;
  std::size_t rest = n;
  while (rest >= 10 && rest % 10 == 0) {
    rest /= 10;
    ++exponent;
  }
  if (rest == 1 && exponent > 0) return "10^" + std::to_string(exponent);
  return std::to_string(n);
}

/// A row comparing ours with its baseline at size `n`; `target` bounds the ratio (none:
/// information only).
inline Row comparison_row(std::string workload, std::size_t n, const Comparison& result,
                          std::optional<double> target = std::nullopt) {
  Row row;
  row.workload = std::move(workload);
  row.n = size_label(n);
  row.size = n;
  row.baseline = result.baseline_ns;
  row.ours = result.ours_ns;
  row.measured_ratio = result.ratio;
  row.min_ratio = result.min_ratio;
  row.max_ratio = result.max_ratio;
  row.target = target;
  return row;
}

/// A row with a plain figure and no baseline, at size `n`; `target` bounds the figure itself.
inline Row figure_row(std::string workload, std::size_t n, double value, std::string unit,
                      std::optional<double> target = std::nullopt) {
  Row row;
  row.workload = std::move(workload);
  row.n = size_label(n);
  row.size = n;
  row.ours = value;
  row.unit = std::move(unit);
  row.target = target;
  return row;
}

/// How the cost per operation of one workload grows from a small size to a large one: ns/op of
/// `large()` (`large_ops` operations a call) over ns/op of `small()` (`small_ops` a call), 1.0 being
/// flat. Measured as compare() measures a ratio: interleaved pairs, the order alternating, the
/// median of the pairs' ratios; so a machine that changes speed between the sizes' own rows (this
/// one does, by 2-3x, every few minutes) does not pass for growth. The result's baseline_ns and
/// ours_ns are ns/op at the small and the large size; its ratios are growths.
template <class Small, class Large>
Comparison growth(int repeats, std::size_t small_ops, Small&& small, std::size_t large_ops, Large&& large) {
  Comparison per_call = compare(repeats, 1, std::forward<Small>(small), std::forward<Large>(large));
  const double scale = static_cast<double>(small_ops) / static_cast<double>(large_ops);
  per_call.baseline_ns /= static_cast<double>(small_ops);
  per_call.ours_ns /= static_cast<double>(large_ops);
  per_call.ratio *= scale;
  per_call.min_ratio *= scale;
  per_call.max_ratio *= scale;
  return per_call;
}

/// A row for how the cost per operation grows with the size of the workload (growth() above):
/// ns/op at `large_n` (ours) over ns/op at `small_n` (baseline), 1.0 being flat. `target` bounds
/// that growth (none: information only).
inline Row growth_row(std::string workload, std::size_t small_n, std::size_t large_n,
                      const Comparison& growth, std::optional<double> target = std::nullopt) {
  Row row = comparison_row(std::move(workload), large_n, growth, target);
  row.n += '/';
  row.n += size_label(small_n);
  row.from_size = small_n;
  return row;
}

/// Collects rows and prints them.
class Report {
 public:
  explicit Report(std::string title) : title_(std::move(title)) {}

  void add(Row row) {
    print_row(std::cout, row);  // progress while the rest is measured
    std::cout.flush();
    rows_.push_back(std::move(row));
  }

  /// The fixed-width table, for people.
  void print_table(std::ostream& out) const {
    out << "\n" << title_ << "\n";
    print_header(out);
    for (const Row& row : rows_) print_row(out, row);
  }

  /// The rows as CSV, in the format described at the top of this header.
  void print_csv(std::ostream& out) const {
    out << "workload,size,ratio,median_ours_ns,median_base_ns,min_ratio,max_ratio,target,unit\n";
    for (const Row& row : rows_) {
      out << csv_field(row.workload) << ",";
      if (row.size == 0) {
        out << csv_field(row.n);
      } else {
        out << row.size;
        if (row.from_size != 0) out << "/" << row.from_size;
      }
      out << "," << number(row.ratio()) << "," << number(row.ours) << "," << number(row.baseline) << ","
          << number(row.min_ratio) << "," << number(row.max_ratio) << "," << number(row.target) << ","
          << csv_field(row.unit) << "\n";
    }
  }

  /// The same figures as a markdown table, to paste into docs/performance.md.
  void print_markdown(std::ostream& out) const {
    out << "\n| workload | N | baseline | ours | unit | ratio | target | verdict |\n"
        << "|---|---|---|---|---|---|---|---|\n";
    for (const Row& row : rows_) {
      out << "| " << row.workload << " | " << row.n << " | " << fixed(row.baseline) << " | "
          << fixed(row.ours) << " | " << row.unit << " | " << ratio_text(row) << " | " << target_text(row)
          << " | " << row.verdict() << " |\n";
    }
  }

  static void print_header(std::ostream& out) {
    char line[200];
    std::snprintf(line, sizeof line, "%-46s %9s %12s %12s %-7s %8s %8s %s\n", "workload", "N", "baseline",
                  "ours", "unit", "ratio", "target", "verdict");
    out << line << std::string(118, '-') << "\n";
  }

 private:
  // Full precision, so that a script sees what we measured; empty when there is no value.
  static std::string number(std::optional<double> value) {
    if (!value) return "";
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", *value);
    return text;
  }

  static std::string fixed(std::optional<double> value) {
    if (!value) return "-";
    std::ostringstream text;
    text.setf(std::ios::fixed);
    text.precision(*value >= 100.0 ? 0 : 1);
    text << *value;
    return text.str();
  }
  static std::string ratio_text(const Row& row) {
    const auto ratio = row.ratio();
    if (!ratio) return "-";
    std::ostringstream text;
    text.setf(std::ios::fixed);
    text.precision(2);
    text << *ratio << "x";
    return text.str();
  }
  static std::string target_text(const Row& row) {
    if (!row.target) return "-";
    std::ostringstream text;
    text << "<= " << *row.target << (row.baseline ? "x" : "");
    return text.str();
  }
  static void print_row(std::ostream& out, const Row& row) {
    char line[300];
    std::snprintf(line, sizeof line, "%-46s %9s %12s %12s %-7s %8s %8s %s\n", row.workload.c_str(),
                  row.n.c_str(), fixed(row.baseline).c_str(), fixed(row.ours).c_str(), row.unit.c_str(),
                  ratio_text(row).c_str(), target_text(row).c_str(), row.verdict().c_str());
    out << line;
  }

  std::string title_;
  std::vector<Row> rows_;
};

/// The end of every benchmark: the whole table, the load average, the markdown copy, and the CSV
/// file when --csv asked for one (exits with status 1 when it cannot be written).
inline void finish(const Report& report, const Options& options) {
  report.print_table(std::cout);
  std::cout << "load average at end: " << load_average() << "\n";
  std::cout << "\nMarkdown (for docs/performance.md):\n";
  report.print_markdown(std::cout);
  if (options.csv.empty()) return;
  std::ofstream file(options.csv);
  report.print_csv(file);
  file.close();
  if (!file) {
    std::cerr << "cannot write " << options.csv << "\n";
    std::exit(1);
  }
  std::cout << "\nCSV written to " << options.csv << "\n";
}

}  // namespace tasklet::bench
