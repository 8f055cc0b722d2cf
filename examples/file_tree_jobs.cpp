// Background jobs on a file tree with path rules, a console progress bar and a final summary.
//
// An in-memory tree /project/{src,docs,tests,build} is worked on by jobs of one JobManager. No lock
// protects the tree: each job holds path rules for what it touches, so a job on a directory
// excludes jobs on the files below it while siblings run in parallel.
//
//   index /project/src            holds /project/src, so every compile job waits for it (FIFO)
//   compile /project/src/x.cpp    holds the source and its object file (a multi rule); a JobGroup
//                                 lets at most two of them run at once
//   format /project/docs          runs beside the index: /project/docs is a sibling
//   test /project/tests           scheduled with a delay: it sleeps first
//   package /project              delayed, then canceled while it sleeps
//   link /project/build           canceled while it waits for a rule this thread holds
//
// A manager-level JobListener and a ProgressMonitor subclass (through set_progress_provider) draw
// a one-line progress bar. The program checks what it prints and exits 0 only when every job
// ended as expected and no rule is left held, so it doubles as a smoke test.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tasklet.hpp"

using namespace tasklet;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

long long ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

// ---------------------------------------------------------------------------------------------
// The file tree. Every entry exists before the jobs start and only values change, so the map's
// structure is never modified concurrently; the jobs' rules keep writers of one file apart.

using FileTree = std::map<std::string, std::string>;

const std::vector<std::string> sources = {"main", "lexer",   "parser", "ast", "types",  "codegen",
                                          "opt",  "runtime", "io",     "log", "config", "hash"};
const std::vector<std::string> documents = {"guide", "api", "faq", "install", "changelog", "design"};
const std::vector<std::string> test_files = {"lexer", "parser", "types", "codegen", "runtime", "io"};

FileTree make_tree() {
  FileTree tree;
  for (const std::string& name : sources) {
    tree["/project/src/" + name + ".cpp"] =
        "#include \"" + name + ".hpp\"\nint " + name + "() {\n  return 0;\n}\n";
    tree["/project/build/" + name + ".o"] = "";
  }
  tree["/project/src/.index"] = "";
  for (const std::string& name : documents)
    tree["/project/docs/" + name + ".md"] = "# " + name + "   \ntext\t\n";
  for (const std::string& name : test_files) {
    tree["/project/tests/" + name + "_test.cpp"] =
        "TEST(" + name + ", Works) {}\nTEST(" + name + ", Fails) {}\n";
  }
  return tree;
}

bool is_at_or_under(const std::string& path, const std::string& dir) {
  return path == dir ||
         (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

// ---------------------------------------------------------------------------------------------
// Checks the rules' promise from the outside: no two running jobs touch overlapping paths.

class Occupancy {
 public:
  void enter(const std::vector<std::string>& paths, bool compile) {
    std::lock_guard lock(mutex_);
    for (const std::string& mine : paths) {
      for (const std::string& theirs : busy_) {
        if (is_at_or_under(mine, theirs) || is_at_or_under(theirs, mine)) {
          std::fprintf(stderr, "VIOLATION: %s runs beside %s\n", mine.c_str(), theirs.c_str());
          violations_ = true;
        }
      }
    }
    for (const std::string& mine : paths) busy_.insert(mine);
    ++running_;
    max_running_ = std::max(max_running_, running_);
    if (compile) max_compiling_ = std::max(max_compiling_, ++compiling_);
  }
  void leave(const std::vector<std::string>& paths, bool compile) {
    std::lock_guard lock(mutex_);
    for (const std::string& mine : paths) busy_.erase(busy_.find(mine));
    --running_;
    if (compile) --compiling_;
  }
  bool violations() const {
    std::lock_guard lock(mutex_);
    return violations_;
  }
  int max_running() const {
    std::lock_guard lock(mutex_);
    return max_running_;
  }
  int max_compiling() const {
    std::lock_guard lock(mutex_);
    return max_compiling_;
  }

 private:
  mutable std::mutex mutex_;
  std::multiset<std::string> busy_;
  int running_ = 0, max_running_ = 0, compiling_ = 0, max_compiling_ = 0;
  bool violations_ = false;
};

// ---------------------------------------------------------------------------------------------
// The console: one progress line, redrawn in place on a terminal, a line per quarter otherwise.

class Console {
 public:
  explicit Console(int total_jobs) : total_(total_jobs), tty_(isatty(STDOUT_FILENO) != 0) {}

  void progress(const std::string& job, double fraction, const std::string& step) {
    std::lock_guard lock(mutex_);
    fraction_[job] = std::clamp(fraction, 0.0, 1.0);
    if (!step.empty()) step_ = job + ": " + step;
    draw(false);
  }
  void finished(const std::string& job) {
    std::lock_guard lock(mutex_);
    fraction_[job] = 1.0;
    ++finished_;
    draw(true);
  }
  // Ends the progress line so that what follows starts on a line of its own.
  void close() {
    std::lock_guard lock(mutex_);
    step_.clear();
    draw(true);
    if (tty_) std::printf("\n");
    std::fflush(stdout);
  }

 private:
  void draw(bool force) {
    double sum = 0;
    for (const auto& [job, fraction] : fraction_) sum += fraction;
    const int percent = static_cast<int>(100.0 * sum / total_);
    if (!tty_) {
      // A log, not a terminal: a line at each quarter, never the same one twice.
      int quarter = percent / 25;
      if (quarter == 4 && finished_ < total_) quarter = 3;  // 100% when the last one has finished
      if (quarter <= printed_quarter_) return;
      printed_quarter_ = quarter;
      std::printf("[%3d%%] %d of %d jobs finished\n", quarter * 25, finished_, total_);
      return;
    }
    const auto now = Clock::now();
    if (!force && now - last_draw_ < 20ms) return;
    last_draw_ = now;
    constexpr int width = 30;
    const int filled = percent * width / 100;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(width, '.');
    std::string line = "[" + bar + "] " + std::to_string(percent) + "%  " + std::to_string(finished_) + "/" +
                       std::to_string(total_) + " jobs  " + step_;
    line.resize(100, ' ');  // overwrite whatever the previous line left
    std::printf("\r%s", line.c_str());
    std::fflush(stdout);
  }

  std::mutex mutex_;
  const int total_;
  const bool tty_;
  std::map<std::string, double> fraction_;
  std::string step_;
  int finished_ = 0;
  int printed_quarter_ = -1;
  Clock::time_point last_draw_{};
};

// The monitor each job gets from the progress provider: it forwards to the console.
class BarMonitor final : public ProgressMonitor {
 public:
  BarMonitor(Console& console, std::string job) : console_(console), job_(std::move(job)) {}

 protected:
  void on_begin_task(std::string_view name, int /*total_work*/) override {
    console_.progress(job_, 0.0, std::string(name));
  }
  void on_worked(double work_done, int total_work) override {
    if (total_work > 0) console_.progress(job_, work_done / total_work, {});
  }
  void on_subtask(std::string_view name) override {
    console_.progress(job_, total_work() > 0 ? work_done() / total_work() : 0.0, std::string(name));
  }

 private:
  Console& console_;
  const std::string job_;
};

// ---------------------------------------------------------------------------------------------
// A manager-level listener: records each job's events in order and counts finished jobs.

class Tracker final : public JobListener {
 public:
  explicit Tracker(Console& console) : console_(console) {}

  void scheduled(const JobEvent& e) override { note(e, "scheduled"); }
  void about_to_run(const JobEvent& e) override { note(e, "about_to_run"); }
  void running(const JobEvent& e) override { note(e, "running"); }
  void sleeping(const JobEvent& e) override { note(e, "sleeping"); }
  void awake(const JobEvent& e) override { note(e, "awake"); }
  void done(const JobEvent& e) override {
    note(e, "done");
    console_.finished(e.job->name());
    std::lock_guard lock(mutex_);
    ++done_;
    changed_.notify_all();
  }

  // Job::join and JobManager::join return once a run is over; the done event may still be on its
  // way to the listeners. Wait for it before reading what the listener saw.
  bool wait_for_done(int jobs, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return done_ >= jobs; });
  }
  std::vector<std::string> events_of(const std::string& job) {
    std::lock_guard lock(mutex_);
    return events_[job];
  }

 private:
  void note(const JobEvent& e, const char* what) {
    std::lock_guard lock(mutex_);
    events_[e.job->name()].push_back(what);
  }

  Console& console_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<std::string>> events_;
  int done_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The jobs. A TreeJob holds a rule made of its paths, belongs to the tree family and times its run.

int tree_family_tag;
const Family tree_family = &tree_family_tag;

class TreeJob final : public Job {
 public:
  using Body = std::function<Status(ProgressMonitor&)>;

  TreeJob(std::string name, std::vector<std::string> paths, Body body, Occupancy& occupancy,
          std::shared_ptr<JobManager> manager)
      : Job(std::move(name), std::move(manager)),
        paths_(std::move(paths)),
        body_(std::move(body)),
        occupancy_(occupancy) {
    std::vector<Rule> parts;
    for (const std::string& path : paths_) parts.push_back(rules::path(path));
    set_rule(rules::combine(parts));  // one path: that path rule; several: a multi rule
  }

  bool belongs_to(Family family) const override { return family == tree_family; }

  bool ran() const { return ran_; }
  long long wall_ms() const { return ms_between(started_, ended_); }
  Clock::time_point started() const { return started_; }

 protected:
  Status run(ProgressMonitor& monitor) override {
    if (manager()->current_job().get() != this) return Status::error("current_job() is not this job");
    const bool compile = name().starts_with("compile");
    ran_ = true;
    started_ = Clock::now();
    occupancy_.enter(paths_, compile);
    Status result = body_(monitor);
    occupancy_.leave(paths_, compile);
    ended_ = Clock::now();
    return result;
  }

 private:
  const std::vector<std::string> paths_;
  const Body body_;
  Occupancy& occupancy_;
  // Written by the run, read after join() (which orders them before the read).
  bool ran_ = false;
  Clock::time_point started_{}, ended_{};
};

void simulate_work(std::chrono::milliseconds how_long) { std::this_thread::sleep_for(how_long); }

}  // namespace

int main() {
  const auto start = Clock::now();
  FileTree tree = make_tree();
  auto manager = JobManager::create({.concurrency = 4});
  Occupancy occupancy;

  const int total_jobs = static_cast<int>(sources.size()) + 5;
  Console console(total_jobs);
  auto tracker = std::make_shared<Tracker>(console);
  manager->add_listener(tracker);
  manager->set_progress_provider(
      [&console](Job& job) { return std::make_unique<BarMonitor>(console, job.name()); });

  std::vector<std::shared_ptr<TreeJob>> jobs;
  const auto add = [&](std::string name, std::vector<std::string> paths, TreeJob::Body body,
                       Priority priority) {
    auto job =
        std::make_shared<TreeJob>(std::move(name), std::move(paths), std::move(body), occupancy, manager);
    job->set_priority(priority);
    jobs.push_back(job);
    return job;
  };

  // index /project/src: reads every source, writes /project/src/.index.
  auto index = add(
      "index /project/src", {"/project/src"},
      [&tree](ProgressMonitor& monitor) {
        monitor.begin_task("index", static_cast<int>(sources.size()));
        std::string index_text;
        for (const std::string& name : sources) {
          if (monitor.is_canceled()) return Status::cancel();
          const std::string path = "/project/src/" + name + ".cpp";
          monitor.subtask("read " + path);
          const std::string& text = tree.at(path);
          index_text += path + " " + std::to_string(std::count(text.begin(), text.end(), '\n')) + " lines\n";
          simulate_work(4ms);
          monitor.worked(1);
        }
        tree.at("/project/src/.index") = index_text;
        return Status::ok();
      },
      Priority::interactive);

  // format /project/docs: a sub-monitor per document (split), trailing blanks trimmed.
  auto format = add(
      "format /project/docs", {"/project/docs"},
      [&tree](ProgressMonitor& monitor) {
        monitor.begin_task("format", 600);
        for (const std::string& name : documents) {
          if (monitor.is_canceled()) return Status::cancel();
          std::unique_ptr<ProgressMonitor> one = monitor.split(100);
          one->begin_task("format " + name, 2);
          monitor.subtask("format /project/docs/" + name + ".md");
          std::string& text = tree.at("/project/docs/" + name + ".md");
          std::string trimmed;
          std::string line;
          for (char c : text) {
            if (c != '\n') {
              line += c;
              continue;
            }
            line.erase(line.find_last_not_of(" \t") + 1);
            trimmed += line + '\n';
            line.clear();
          }
          simulate_work(4ms);
          one->worked(1);
          text = trimmed;
          simulate_work(4ms);
          one->done();
        }
        return Status::ok();
      },
      Priority::short_job);

  // test /project/tests: asked to start 120 ms from now, so it sleeps first.
  std::atomic<int> tests_found{0};
  auto test = add(
      "test /project/tests", {"/project/tests"},
      [&tree, &tests_found](ProgressMonitor& monitor) {
        monitor.begin_task("test", static_cast<int>(test_files.size()));
        for (const std::string& name : test_files) {
          const std::string path = "/project/tests/" + name + "_test.cpp";
          monitor.subtask("run " + path);
          const std::string& text = tree.at(path);
          for (std::size_t at = text.find("TEST("); at != std::string::npos;
               at = text.find("TEST(", at + 1)) {
            tests_found.fetch_add(1);
          }
          simulate_work(5ms);
          monitor.worked(1);
        }
        return Status::ok();
      },
      Priority::long_job);

  // package /project and link /project/build: both canceled before they run.
  auto package = add(
      "package /project", {"/project"}, [](ProgressMonitor&) { return Status::ok(); }, Priority::decorate);
  auto link = add(
      "link /project/build", {"/project/build"}, [](ProgressMonitor&) { return Status::ok(); },
      Priority::build);

  // compile /project/src/x.cpp: the source and its object, at most two at once (the group).
  auto compilers = std::make_shared<JobGroup>("compile", 2, static_cast<int>(sources.size()));
  std::vector<std::shared_ptr<TreeJob>> compiles;
  for (const std::string& name : sources) {
    const std::string source = "/project/src/" + name + ".cpp";
    const std::string object = "/project/build/" + name + ".o";
    auto compile = add(
        "compile " + source, {source, object},
        [&tree, source, object](ProgressMonitor& monitor) {
          monitor.begin_task("compile", 3);
          for (const char* step : {"parse", "generate", "write"}) {
            if (monitor.is_canceled()) return Status::cancel();
            monitor.subtask(step);
            simulate_work(5ms);
            monitor.worked(1);
          }
          tree.at(object) =
              "object code for " + source + " (" + std::to_string(tree.at(source).size()) + " bytes)";
          return Status::ok();
        },
        Priority::build);
    compile->set_group(compilers);
    compiles.push_back(compile);
  }

  // ---- Schedule.
  index->schedule();
  format->schedule();  // a sibling of /project/src: runs beside the index
  const auto test_asked = Clock::now();
  test->schedule(120ms);
  const bool test_slept = test->state() == JobState::sleeping;

  package->schedule(10s);
  const bool package_removed = package->cancel();  // a sleeping job: removed at once, no waiting 10 s

  bool link_was_waiting = false;
  bool link_removed = false;
  {
    // This thread holds /project/build, so link waits for it; canceling a waiting job removes it.
    RuleScope build(*manager, rules::path("/project/build"));
    link->schedule();
    link_was_waiting = link->state() == JobState::waiting;
    link_removed = link->cancel();
  }

  for (auto& compile : compiles) compile->schedule();  // each waits for the index (FIFO)

  // ---- Wait for everything in the family, then for the listeners to hear of every end.
  const bool joined = manager->join(tree_family, 10s);
  const bool group_joined = compilers->join(10s);
  const bool all_done_heard = tracker->wait_for_done(total_jobs, 10s);
  console.close();
  const auto end = Clock::now();

  // ---- Check and summarise.
  bool ok = joined && group_joined && all_done_heard;
  const auto expect = [&ok](bool condition, const char* what) {
    if (!condition) {
      std::printf("UNEXPECTED: %s\n", what);
      ok = false;
    }
  };
  expect(test_slept, "the delayed job was not sleeping right after schedule(120ms)");
  expect(package_removed && link_removed, "cancel() of a sleeping or waiting job returned false");
  expect(link_was_waiting, "link was not waiting behind this thread's rule");
  expect(!occupancy.violations(), "two jobs on overlapping paths ran at once");
  expect(occupancy.max_compiling() <= compilers->max_threads(), "the group ran more jobs than max_threads");
  expect(ms_between(test_asked, test->started()) >= 120, "the delayed job started before its delay");
  expect(compilers->result().is_ok(), "the compile group's result is not ok");
  expect(manager->is_idle(), "the manager is not idle");
  expect(manager->find(tree_family).empty(), "jobs of the family are still scheduled");
  expect(manager->rule_stats().held == 0 && manager->rule_stats().waiting == 0,
         "a rule is still held or waited for");

  const std::vector<std::string> ran_events = {"scheduled", "about_to_run", "running", "done"};
  const std::vector<std::string> canceled_events = {"scheduled", "done"};
  std::printf("\n%-34s %-7s %8s   %s\n", "job", "result", "wall", "listener events");
  int ok_count = 0, cancel_count = 0, error_count = 0;
  for (const auto& job : jobs) {
    const Status result = job->result();
    const bool should_cancel = job == package || job == link;
    const char* verdict = result.is_ok() ? "ok" : result.is_canceled() ? "cancel" : "error";
    ok_count += result.is_ok() ? 1 : 0;
    cancel_count += result.is_canceled() ? 1 : 0;
    error_count += result.is_error() ? 1 : 0;
    const std::vector<std::string> events = tracker->events_of(job->name());
    std::string seen;
    for (const std::string& event : events) seen += (seen.empty() ? "" : " ") + event;
    const std::string wall = job->ran() ? std::to_string(job->wall_ms()) + " ms" : "-";
    std::printf("%-34s %-7s %8s   %s\n", job->name().c_str(), verdict, wall.c_str(), seen.c_str());
    if (should_cancel) {
      expect(result.is_canceled() && !job->ran(), "a canceled job ran or did not end with a cancel result");
      expect(events == canceled_events, "a canceled job's listener events are not scheduled, done");
    } else {
      if (result.is_error()) std::printf("  error: %s\n", result.message.c_str());
      expect(result.is_ok(), "a job did not end ok");
      expect(events == ran_events, "a job's listener events are not scheduled, about_to_run, running, done");
    }
    expect(job->state() == JobState::none, "a job is not in state none");
  }

  int objects = 0;
  for (const std::string& name : sources) objects += tree.at("/project/build/" + name + ".o").empty() ? 0 : 1;
  expect(objects == static_cast<int>(sources.size()), "an object file was not written");
  expect(!tree.at("/project/src/.index").empty(), "the index was not written");
  expect(tree.at("/project/docs/guide.md") == "# guide\ntext\n", "the docs were not formatted");
  expect(tests_found.load() == 2 * static_cast<int>(test_files.size()), "the tests were not all found");

  std::printf(
      "\n%zu jobs: %d ok, %d cancel, %d error; %d objects built, %d tests found; "
      "at most %d jobs at once (%d compiling, group limit %d); %lld ms in all\n",
      jobs.size(), ok_count, cancel_count, error_count, objects, tests_found.load(), occupancy.max_running(),
      occupancy.max_compiling(), compilers->max_threads(), ms_between(start, end));
  std::printf("%s\n", ok ? "all jobs ended as expected" : "FAILED");
  return ok ? 0 : 1;
}
