// Two processes build one source tree, sharing their rules through etcd (tasklet::etcd).
//
//   distributed_tree ENDPOINT DIR
//
// starts two builder processes (this program again) against the etcd at ENDPOINT (for instance
// `etcd --data-dir /tmp/etcd-demo` and http://127.0.0.1:2379). Each makes a JobManager with
// make_job_manager and schedules the same jobs on the tree /repo:
//   - index     read_path(/repo): both builders index at once (shared);
//   - compile   path(/repo/src/<file>) for each file: whichever builder comes first compiles it,
//               the other finds it done;
//   - package   path(/repo): the whole tree, after every compile of both builders that asked
//               before it;
//   - publish   named_mutex("publish"): one builder at a time, in any process.
// Results go to files in DIR, each written only by a holder whose fencing token is newer than the
// one the file was written with: a holder that lost its lease (and so its rule) cannot overwrite a
// later holder's result. The launcher checks that every file was compiled exactly once (each
// object file has one line).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <tasklet.hpp>
#include <tasklet/etcd/etcd.hpp>

namespace fs = std::filesystem;
using namespace tasklet;

namespace {

const std::vector<std::string> files = {"main.cpp", "parse.cpp", "print.cpp", "util.cpp"};

// A store that accepts a write only with a token at least as new as the last one it accepted: the
// fencing tokens make late writers harmless.
bool fenced_write(const fs::path& file, std::int64_t token, const std::string& text) {
  const fs::path stamp = file.string() + ".token";
  std::int64_t last = 0;
  if (std::ifstream in(stamp); in) in >> last;
  if (token < last) return false;
  std::ofstream(file, std::ios::app) << text << '\n';  // appended: a second writer would show
  std::ofstream(stamp) << token << '\n';
  return true;
}

std::size_t lines_of(const fs::path& file) {
  std::ifstream in(file);
  std::size_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

int builder(const std::string& endpoint, const fs::path& dir, int number) {
  etcd::EtcdOptions options;
  options.endpoints = {endpoint};
  options.prefix = "/distributed-tree";
  auto manager = etcd::make_job_manager(etcd::EtcdSession::connect(options));
  const std::string me = "builder " + std::to_string(number);
  const auto say = [&](const std::string& what, const Rule& rule) {
    std::printf("[%s] %-28s token %lld\n", me.c_str(), what.c_str(),
                static_cast<long long>(etcd::fencing_token(*manager, rule)));
    std::fflush(stdout);
  };
  std::vector<std::shared_ptr<Job>> jobs;
  const auto add = [&](const std::string& name, Rule rule, std::function<void(const Rule&)> run) {
    auto job = make_job(
        name, [rule, run](ProgressMonitor&) { run(rule); }, manager);
    job->set_rule(std::move(rule));
    job->schedule();
    jobs.push_back(job);
  };

  add("index", rules::read_path("/repo"), [&](const Rule& rule) { say("index /repo (shared)", rule); });
  for (const std::string& file : files) {
    add("compile " + file, rules::path("/repo/src/" + file), [&, file](const Rule& rule) {
      const fs::path object = dir / (file + ".o");
      if (fs::exists(object)) return;  // the other builder compiled it first
      say("compile " + file, rule);
      fenced_write(object, etcd::fencing_token(*manager, rule), "compiled by " + me);
    });
  }
  add("package", rules::path("/repo"), [&](const Rule& rule) {
    say("package /repo", rule);
    std::size_t objects = 0;
    for (const std::string& file : files) objects += fs::exists(dir / (file + ".o")) ? 1U : 0U;
    fenced_write(dir / ("package-" + std::to_string(number)), etcd::fencing_token(*manager, rule),
                 std::to_string(objects) + " objects");
  });
  add("publish", rules::named_mutex("publish"), [&](const Rule& rule) {
    say("publish", rule);
    fenced_write(dir / "published", etcd::fencing_token(*manager, rule), me);
  });
  for (const auto& job : jobs) {
    job->join();
    if (!job->result().is_ok()) {
      std::fprintf(stderr, "[%s] %s: %s\n", me.c_str(), job->name().c_str(), job->result().message.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::string(argv[1]) == "builder") return builder(argv[2], argv[3], std::stoi(argv[4]));
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s ENDPOINT DIR   (an etcd v3 endpoint, e.g. http://127.0.0.1:2379)\n",
                 argv[0]);
    return 2;
  }
  const fs::path dir = argv[2];
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::cout.flush();
  std::vector<pid_t> builders;
  for (int number = 1; number <= 2; ++number) {
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/proc/self/exe", argv[0], "builder", argv[1], argv[2], std::to_string(number).c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    builders.push_back(pid);
  }
  bool ok = true;
  for (const pid_t pid : builders) {
    int status = 0;
    waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  for (const std::string& file : files) ok = ok && lines_of(dir / (file + ".o")) == 1;
  std::printf("%s: every file compiled once, by whichever builder came first\n", ok ? "done" : "FAILED");
  return ok ? 0 : 1;
}
