// The main demo: background jobs with path rules doing real work on a copy of this repository's
// tree, with a live progress display, a who-blocks-whom snapshot taken mid-run and a timeline of
// the run (README, quick start 1).
//
// The jobs, scheduled at once in this order, on a manager with two workers:
//
//   scan /src, /tests, /docs, /include   read_path: readers of the subtrees, side by side
//   tidy /docs                           path: a writer of /docs; waits for scan /docs, and
//                                        excludes every reader of /docs while it writes
//   manifest /                           path("/"): the whole tree; waits its FIFO turn behind
//                                        everything scheduled before it
//   scan /docs again, scan /examples     read_path: scheduled after the manifest, so they wait
//                                        behind it (strict FIFO), although /examples is free
//   stamp /tests (a thread)              begin_rule(path("/tests")) on a plain thread
//
// A scan reads every file of its subtree and lints it with regular expressions (long lines,
// trailing blanks, TODOs, identifiers); tidy strips trailing blanks from the Markdown files and
// writes an index; the manifest hashes every file of the tree into MANIFEST.txt.
//
// Every job also waits `pace` per file (default 20 ms, as if the tree were on a slow disk), so that
// the display can be followed: the work itself takes a fraction of a second.
//
// Usage: tree_demo [--pace-ms=N] [source tree] [output directory]
//        (defaults: 20, the repository, a new directory under /tmp).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tasklet.hpp"

using namespace tasklet;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

#ifndef TASKLET_SOURCE_DIR
#define TASKLET_SOURCE_DIR "."
#endif

namespace {

// What the display shows of one job, written by its monitor and its run.
struct Shown {
  std::string name;
  std::string rule;
  std::atomic<int> total{0};
  std::atomic<double> done{0};
  Clock::time_point scheduled{};
  std::shared_ptr<Job> job;  // none for the thread
  std::mutex mutex;          // what follows: written by the job's run and monitor
  std::string subtask;
  std::string blocked;
  Clock::time_point started{}, ended{};
  std::string summary;

  void ran(Clock::time_point from, std::string what) {
    const Clock::time_point now = Clock::now();
    std::lock_guard lock(mutex);
    started = from;
    ended = now;
    summary = std::move(what);
  }
};

// A job's monitor, forwarding to what the display reads.
class ShownMonitor final : public ProgressMonitor {
 public:
  explicit ShownMonitor(Shown& shown) : shown_(shown) {}

 private:
  void on_begin_task(std::string_view, int total_work) override { shown_.total = total_work; }
  void on_worked(double work_done, int) override { shown_.done = work_done; }
  void on_subtask(std::string_view name) override {
    std::lock_guard lock(shown_.mutex);
    shown_.subtask = name;
  }
  void on_blocked(std::string_view reason) override {
    std::lock_guard lock(shown_.mutex);
    shown_.blocked = reason;
  }
  void on_unblocked() override {
    std::lock_guard lock(shown_.mutex);
    shown_.blocked.clear();
  }
  Shown& shown_;
};

std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool is_text(const fs::path& file) {
  static const std::vector<std::string> kinds{".cpp",   ".hpp", ".h",  ".md",   ".txt",
                                              ".cmake", ".sh",  ".py", ".json", ".in"};
  return std::find(kinds.begin(), kinds.end(), file.extension().string()) != kinds.end() ||
         file.filename() == "CMakeLists.txt";
}

// A scan's lint of one file: its lines, and what the expressions find in them.
struct Lint {
  long lines = 0, long_lines = 0, trailing_blanks = 0, todos = 0, identifiers = 0;
  Lint& operator+=(const Lint& other) {
    lines += other.lines;
    long_lines += other.long_lines;
    trailing_blanks += other.trailing_blanks;
    todos += other.todos;
    identifiers += other.identifiers;
    return *this;
  }
};

Lint lint(const std::string& text) {
  static const std::regex trailing(R"([ \t]+$)");
  static const std::regex todo(R"(\b(TODO|FIXME|XXX)\b)");
  static const std::regex identifier(R"([A-Za-z_][A-Za-z0-9_]*)");
  Lint found;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    ++found.lines;
    if (line.size() > 100) ++found.long_lines;
    if (std::regex_search(line, trailing)) ++found.trailing_blanks;
    if (std::regex_search(line, todo)) ++found.todos;
    found.identifiers +=
        std::distance(std::sregex_iterator(line.begin(), line.end(), identifier), std::sregex_iterator());
  }
  return found;
}

std::uint64_t fnv1a(const std::string& bytes) {
  std::uint64_t hash = 1469598103934665603ULL;
  for (const char byte : bytes) hash = (hash ^ static_cast<unsigned char>(byte)) * 1099511628211ULL;
  return hash;
}

std::string bar(double done, int total, int width) {
  const int filled = total > 0 ? static_cast<int>(done / total * width + 0.5) : 0;
  return std::string(static_cast<std::size_t>(std::clamp(filled, 0, width)), '#') +
         std::string(static_cast<std::size_t>(width - std::clamp(filled, 0, width)), '.');
}

const char* state_name(JobState state) {
  switch (state) {
    case JobState::none:
      return "done";
    case JobState::waiting:
      return "waiting";
    case JobState::sleeping:
      return "sleeping";
    case JobState::running:
      return "running";
  }
  return "?";
}

long millis(Clock::duration duration) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(duration).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::chrono::milliseconds pace = 20ms;
  if (!args.empty() && args.front().rfind("--pace-ms=", 0) == 0) {
    pace = std::chrono::milliseconds(std::stoi(args.front().substr(10)));
    args.erase(args.begin());
  }
  const fs::path source = !args.empty() ? fs::path(args[0]) : fs::path(TASKLET_SOURCE_DIR);
  fs::path out;
  if (args.size() > 1) {
    out = args[1];
    fs::create_directories(out);
  } else {
    std::string pattern = (fs::temp_directory_path() / "tasklet-demo-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    out = pattern;
  }
  const fs::path tree = out / "tree";
  const std::vector<std::string> subtrees{"src", "tests", "docs", "include", "examples"};
  fs::remove_all(tree);
  fs::create_directories(tree);
  for (const std::string& dir : subtrees) {
    if (!fs::is_directory(source / dir)) {
      std::cerr << "tree_demo: " << (source / dir) << " is not a directory; give the repository's root\n";
      return 1;
    }
    fs::copy(source / dir, tree / dir, fs::copy_options::recursive);
  }
  std::cout << "tasklet demo: jobs with path rules on a copy of "
            << fs::absolute(source).lexically_normal().string() << "\n  in " << tree.string() << "\n\n";

  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  manager->start_trace();
  std::map<const Job*, Shown*> shown_by_job;
  std::vector<std::unique_ptr<Shown>> shown;
  std::mutex totals_mutex;
  Lint totals;
  long files_scanned = 0;

  manager->set_progress_provider([&shown_by_job](Job& job) -> std::unique_ptr<ProgressMonitor> {
    return std::make_unique<ShownMonitor>(*shown_by_job.at(&job));
  });

  const auto add = [&](std::string name, Rule rule, std::function<std::string(ProgressMonitor&)> work) {
    auto entry = std::make_unique<Shown>();
    Shown& mine = *entry;
    mine.name = name;
    mine.rule = rule->to_string();
    mine.job = make_job(
        name,
        [&mine, work = std::move(work)](ProgressMonitor& monitor) {
          const Clock::time_point from = Clock::now();
          mine.ran(from, work(monitor));
        },
        manager);
    mine.job->set_rule(std::move(rule));
    shown_by_job[mine.job.get()] = &mine;
    shown.push_back(std::move(entry));
  };
  const auto scan = [&](const std::string& dir) {
    return [&, dir](ProgressMonitor& monitor) {
      const auto files = files_under(tree / dir);
      monitor.begin_task("scan /" + dir, static_cast<int>(files.size()));
      Lint found;
      long scanned = 0;
      for (const fs::path& file : files) {
        if (monitor.is_canceled()) break;
        monitor.subtask(fs::relative(file, tree).string());
        if (is_text(file)) {
          found += lint(read_file(file));
          ++scanned;
        }
        monitor.worked(1);
        std::this_thread::sleep_for(pace);
      }
      std::lock_guard lock(totals_mutex);
      totals += found;
      files_scanned += scanned;
      return std::to_string(scanned) + " files, " + std::to_string(found.lines) + " lines, " +
             std::to_string(found.todos) + " TODOs, " + std::to_string(found.long_lines) + " long lines";
    };
  };

  for (const std::string dir : {"src", "tests", "docs", "include"})
    add("scan /" + dir, rules::read_path("/" + dir), scan(dir));
  add("tidy /docs", rules::path("/docs"), [&](ProgressMonitor& monitor) {
    const auto files = files_under(tree / "docs");
    monitor.begin_task("tidy /docs", static_cast<int>(files.size()));
    std::ofstream index(tree / "docs" / "INDEX.txt");
    long tidied = 0;
    for (const fs::path& file : files) {
      monitor.subtask(fs::relative(file, tree).string());
      if (file.extension() == ".md") {
        static const std::regex trailing(R"([ \t]+(\n|$))");
        const std::string text = read_file(file);
        const std::string clean = std::regex_replace(text, trailing, "$1");
        if (clean != text) {
          std::ofstream(file, std::ios::binary | std::ios::trunc) << clean;
          ++tidied;
        }
        index << fs::relative(file, tree).string() << ": " << std::count(clean.begin(), clean.end(), '\n')
              << " lines\n";
      }
      monitor.worked(1);
      std::this_thread::sleep_for(pace);
    }
    return std::to_string(files.size()) + " files, " + std::to_string(tidied) +
           " rewritten, INDEX.txt written";
  });
  add("manifest /", rules::path("/"), [&](ProgressMonitor& monitor) {
    const auto files = files_under(tree);
    monitor.begin_task("manifest /", static_cast<int>(files.size()));
    std::ostringstream manifest;
    for (const fs::path& file : files) {
      monitor.subtask(fs::relative(file, tree).string());
      char hash[17];
      std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a(read_file(file))));
      manifest << hash << "  " << fs::relative(file, tree).string() << '\n';
      monitor.worked(1);
      std::this_thread::sleep_for(pace / 4);  // one read per file, no lint
    }
    std::ofstream(tree / "MANIFEST.txt") << manifest.str();
    return std::to_string(files.size()) + " files hashed into MANIFEST.txt";
  });
  add("scan /docs again", rules::read_path("/docs"), scan("docs"));
  add("scan /examples", rules::read_path("/examples"), scan("examples"));

  const Clock::time_point start = Clock::now();
  for (const auto& entry : shown) {
    entry->scheduled = Clock::now();
    entry->job->schedule();
  }
  // A plain thread that stamps /tests under begin_rule: it waits in FIFO order like the jobs.
  Shown stamp;
  stamp.name = "stamp /tests (a thread)";
  stamp.rule = "path(/tests)";
  stamp.scheduled = Clock::now();
  std::thread stamper([&] {
    RuleScope scope(*manager, rules::path("/tests"));
    const Clock::time_point from = Clock::now();
    std::ofstream(tree / "tests" / "STAMP.txt") << "stamped by tree_demo\n";
    stamp.ran(from, "wrote tests/STAMP.txt");
  });

  // The live display: one line per job, redrawn in place on a terminal; on a pipe, a line per
  // change of state.
  const bool terminal = ::isatty(STDOUT_FILENO) != 0;
  std::string snapshot_text;
  std::map<std::string, std::string> last_state;
  std::size_t drawn = 0;
  const auto all_done = [&] {
    return std::all_of(shown.begin(), shown.end(),
                       [](const auto& entry) { return entry->job->state() == JobState::none; });
  };
  for (bool finished = false; !finished;) {
    finished = all_done();
    if (snapshot_text.empty() && Clock::now() - start >= 5 * pace) {
      // The moment the demo is about: readers hold, a writer, the whole tree, later readers and the
      // thread wait.
      const RuleSnapshot snapshot = manager->rule_snapshot();
      std::size_t waiting = 0;
      for (const auto& request : snapshot.requests) waiting += request.held ? 0 : 1;
      if (waiting >= 4) snapshot_text = snapshot.to_string();
    }
    std::vector<std::string> lines;
    for (const auto& entry : shown) {
      const JobState state = entry->job->state();
      std::string status;
      if (state == JobState::running) {
        std::lock_guard lock(entry->mutex);
        status = "[" + bar(entry->done, entry->total, 20) + "] " +
                 (entry->blocked.empty() ? entry->subtask : entry->blocked);
      } else if (state == JobState::waiting) {
        const auto blockers = entry->job->blockers();
        status = blockers.empty() ? "waiting for a worker" : "waiting: " + blockers.front().to_string();
      } else {
        std::lock_guard lock(entry->mutex);
        status = entry->started != Clock::time_point{} ? "done: " + entry->summary : "scheduled";
      }
      std::string line = entry->name;
      line.resize(18, ' ');
      line += status;
      if (line.size() > 110) line = line.substr(0, 107) + "...";
      lines.push_back(line);
      if (!terminal && last_state[entry->name] != state_name(state)) {
        last_state[entry->name] = state_name(state);
        std::cout << "  " << millis(Clock::now() - start) << " ms  " << entry->name << ": "
                  << state_name(state) << "\n";
      }
    }
    if (terminal) {
      if (drawn != 0) std::cout << "\x1b[" << drawn << "F";
      for (const std::string& line : lines) std::cout << "\x1b[2K  " << line << '\n';
      drawn = lines.size();
      std::cout.flush();
    }
    if (!finished) std::this_thread::sleep_for(100ms);  // the display's refresh, not a wait for work
  }
  stamper.join();
  const Clock::time_point end = Clock::now();
  manager->stop_trace();
  const fs::path timeline = out / "timeline.html";
  const fs::path json = out / "trace.json";
  manager->save_trace(timeline.string());
  manager->save_trace(json.string());

  std::cout << "\nSummary (" << millis(end - start) << " ms, 2 workers)\n";
  bool all_ok = true;
  const auto report = [&all_ok](Shown& entry) {
    std::lock_guard lock(entry.mutex);
    const bool ran = entry.started != Clock::time_point{};
    all_ok = all_ok && ran && (!entry.job || entry.job->result().is_ok());
    std::string name = entry.name;
    name.resize(24, ' ');
    std::string rule = entry.rule;
    rule.resize(20, ' ');
    std::cout << "  " << name << rule << " waited " << (ran ? millis(entry.started - entry.scheduled) : -1)
              << " ms, ran " << (ran ? millis(entry.ended - entry.started) : -1) << " ms: " << entry.summary
              << '\n';
  };
  for (const auto& entry : shown) report(*entry);
  report(stamp);
  std::cout << "  total: " << files_scanned << " files scanned, " << totals.lines << " lines, "
            << totals.identifiers << " identifiers, " << totals.trailing_blanks
            << " lines with trailing blanks\n\n"
            << "Who blocked whom, mid-run (JobManager::rule_snapshot):\n"
            << (snapshot_text.empty()
                    ? std::string("  (the run was over before a snapshot showed four waiters)\n")
                    : snapshot_text)
            << "\nTimeline of the run: " << timeline.string() << "  (open it in a browser)\n"
            << "Chrome trace:        " << json.string() << "  (ui.perfetto.dev or chrome://tracing)\n";
  return all_ok ? 0 : 1;
}
