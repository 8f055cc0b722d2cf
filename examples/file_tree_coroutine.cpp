// Coroutine jobs on a file tree: the file_tree_jobs example's ideas, written as C++20 coroutines.
//
// An in-memory tree /project/{src,docs,build} is worked on by jobs of one JobManager whose runs are
// coroutines. No lock protects the tree: each step holds the path rules of what it touches, taken
// with `co_await hold(rule)` between steps, so a job waits for a rule without holding a worker.
//
//   index /project/src        a job with the rule /project/src: reads every source, writes .index
//   compile x.cpp             waits for the index job (co_await job), then holds the source and its
//                             object file (a multi rule) while it "compiles"
//   docs /project/docs        formats each document in its own task, all at once (when_all), each
//                             task holding its document's rule
//   lint /project/src         holds one source at a time and polls its monitor; after two it parks
//                             (co_await wait) until this thread has canceled it
//
// The program checks from the outside that no two steps ever touched overlapping paths at once,
// that every job ended as expected and that no rule is left held; it exits 0 only then, so it
// doubles as a smoke test.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tasklet.hpp"
#include "tasklet/coroutine.hpp"

using namespace tasklet;

namespace {

const std::vector<std::string> sources = {"main", "lexer", "parser", "types", "codegen", "runtime"};
const std::vector<std::string> documents = {"guide", "api", "faq"};

std::string source(const std::string& name) { return "/project/src/" + name + ".cpp"; }
std::string object(const std::string& name) { return "/project/build/" + name + ".o"; }

bool overlaps(const std::string& a, const std::string& b) {
  const auto under = [](const std::string& path, const std::string& dir) {
    return path == dir ||
           (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
  };
  return under(a, b) || under(b, a);
}

// The tree, and a check of the rules' promise: no two steps touch overlapping paths at once.
class Tree {
 public:
  Tree() {
    for (const std::string& name : sources) {
      files_[source(name)] = "int " + name + "();\n";
      files_[object(name)] = "";
    }
    files_["/project/src/.index"] = "";
    for (const std::string& name : documents) files_["/project/docs/" + name + ".md"] = "# " + name + "   \n";
  }
  // Every entry exists from the start: steps only change values, under their rules.
  std::string& at(const std::string& path) { return files_.at(path); }

  void enter(const std::vector<std::string>& paths) {
    std::lock_guard lock(mutex_);
    for (const std::string& mine : paths) {
      for (const std::string& theirs : busy_) {
        if (overlaps(mine, theirs)) {
          std::fprintf(stderr, "VIOLATION: %s beside %s\n", mine.c_str(), theirs.c_str());
          violations_ = true;
        }
      }
    }
    busy_.insert(paths.begin(), paths.end());
  }
  void leave(const std::vector<std::string>& paths) {
    std::lock_guard lock(mutex_);
    for (const std::string& mine : paths) busy_.erase(busy_.find(mine));
  }
  bool violations() const {
    std::lock_guard lock(mutex_);
    return violations_;
  }

 private:
  std::map<std::string, std::string> files_;
  mutable std::mutex mutex_;
  std::multiset<std::string> busy_;
  bool violations_ = false;
};

// Marks a step's paths busy for its scope.
struct Touching {
  Touching(Tree& tree, std::vector<std::string> paths) : tree_(tree), paths_(std::move(paths)) {
    tree_.enter(paths_);
  }
  ~Touching() { tree_.leave(paths_); }
  Touching(const Touching&) = delete;
  Touching& operator=(const Touching&) = delete;
  Tree& tree_;
  std::vector<std::string> paths_;
};

// One document, formatted as a task of its own (when_all runs several at once).
Task<std::size_t> format_document(Tree& tree, std::string path) {
  auto held = co_await hold(rules::path(path));
  const Touching touching(tree, {path});
  std::string& text = tree.at(path);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n')) text.pop_back();
  text += "\n";
  co_return text.size();
}

}  // namespace

int main() {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  Tree tree;
  bool ok = true;
  const auto expect = [&ok](bool condition, const char* what) {
    if (!condition) {
      std::fprintf(stderr, "FAILED: %s\n", what);
      ok = false;
    }
  };

  // index: a job with a rule, like any other; its coroutine holds /project/src throughout.
  auto index = make_job(
      "index /project/src",
      [&tree](ProgressMonitor&) -> Task<void> {
        const Touching touching(tree, {"/project/src"});
        std::string listing;
        for (const std::string& name : sources)
          listing += source(name) + " " + std::to_string(tree.at(source(name)).size()) + "\n";
        tree.at("/project/src/.index") = listing;
        co_return;
      },
      manager);
  index->set_rule(rules::path("/project/src"));

  // compile: no job rule; it waits for the index, then takes the rules of what it touches.
  std::atomic<int> compiled{0};
  std::vector<std::shared_ptr<Job>> compiles;
  for (const std::string& name : sources) {
    compiles.push_back(make_job(
        "compile " + name + ".cpp",
        [&tree, &compiled, index, name](ProgressMonitor&) -> Task<Status> {
          const Status indexed = co_await index;  // frees the worker until the index job ends
          if (!indexed.is_ok()) co_return Status::cancel("no index: " + indexed.message);
          auto held = co_await hold(rules::combine(rules::path(source(name)), rules::path(object(name))));
          const Touching touching(tree, {source(name), object(name)});
          tree.at(object(name)) = "object of " + tree.at(source(name));
          compiled.fetch_add(1);
          co_return Status::ok();
        },
        manager));
  }

  // docs: one job, its documents formatted at once, each in a task of its own.
  std::size_t formatted_bytes = 0;
  auto docs = make_job(
      "docs /project/docs",
      [&tree, &formatted_bytes](ProgressMonitor&) -> Task<void> {
        auto [guide, api, faq] = co_await when_all(format_document(tree, "/project/docs/guide.md"),
                                                   format_document(tree, "/project/docs/api.md"),
                                                   format_document(tree, "/project/docs/faq.md"));
        formatted_bytes = guide + api + faq;
      },
      manager);

  // lint: one source at a time, polling its monitor between them. After two it parks (wait) and
  // hands its Rescheduler to this thread, which cancels the job and resumes it.
  std::latch two_linted(1);
  Rescheduler paused;
  std::atomic<int> linted{0};
  auto lint = make_job(
      "lint /project/src",
      [&tree, &linted, &two_linted, &paused](ProgressMonitor& monitor) -> Task<Status> {
        for (const std::string& name : sources) {
          if (monitor.is_canceled())
            co_return Status::cancel("canceled after " + std::to_string(linted.load()) + " files");
          auto held = co_await hold(rules::read_path(source(name)));
          const Touching touching(tree, {source(name)});
          if (linted.fetch_add(1) + 1 == 2) {
            co_await wait([&](Rescheduler resume) {
              paused = std::move(resume);
              two_linted.count_down();
            });
          }
        }
        co_return Status::ok();
      },
      manager);

  index->schedule();
  for (const auto& compile : compiles) compile->schedule();
  docs->schedule();
  lint->schedule();
  two_linted.wait();
  lint->cancel();                   // a running job: its monitor is canceled
  paused.resume(Directive::async);  // jobs go on on the workers

  for (const auto& compile : compiles) compile->join();
  for (const auto& job : {index, docs, lint}) job->join();

  for (const auto& compile : compiles) expect(compile->result().is_ok(), "every compile job ended ok");
  expect(compiled.load() == static_cast<int>(sources.size()), "every source was compiled");
  expect(tree.at("/project/build/lexer.o") == "object of int lexer();\n", "lexer.o was written");
  expect(tree.at("/project/src/.index").find("/project/src/parser.cpp") != std::string::npos,
         "the index lists parser.cpp");
  expect(docs->result().is_ok() && tree.at("/project/docs/faq.md") == "# faq\n",
         "the documents were formatted");
  expect(lint->result().is_canceled(), "lint was canceled");
  expect(linted.load() == 2, "lint stopped after two files");
  expect(!tree.violations(), "no two steps touched overlapping paths at once");
  expect(manager->rule_stats().held == 0, "no rule is left held");

  std::printf("index: %s\n", index->result().is_ok() ? "ok" : index->result().message.c_str());
  std::printf("compiled %d sources after the index; formatted %zu bytes of documents at once\n",
              compiled.load(), formatted_bytes);
  std::printf("lint: %s\n", lint->result().message.c_str());
  std::printf("%s\n", ok ? "all jobs ended as expected" : "SOMETHING WENT WRONG");
  return ok ? 0 : 1;
}
