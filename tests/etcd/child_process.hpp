// Child processes for the cross-process tests: started with posix_spawn, waited for by pid, and
// the clock they share.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace tasklet::test {

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the host.
inline long long monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec;
}

/// Starts args[0] (a path) with `args`; its standard output goes to `stdout_to` when given.
inline pid_t spawn(std::vector<std::string> args, int stdout_to = -1) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (stdout_to >= 0) posix_spawn_file_actions_adddup2(&actions, stdout_to, 1);
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int failed = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (failed != 0) throw std::runtime_error("cannot start " + args[0]);
  return pid;
}

/// Waits for `pid`; its exit code, or -1 when a signal ended it.
inline int exit_status(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace tasklet::test
