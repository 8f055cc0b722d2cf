// examples/distributed_tree.cpp against a real etcd: its two builder processes share the tree's
// rules, every file is compiled exactly once, and both builders package and publish.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "etcd_server.hpp"

extern char** environ;

namespace {

std::size_t lines_of(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::size_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines;
}

TEST(EtcdExampleTest, TwoBuildersShareTheTreeThroughEtcd) {
  tasklet::test::EtcdServer server;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tasklet-distributed-tree-" + std::to_string(getpid()));
  std::vector<std::string> args = {TASKLET_DISTRIBUTED_TREE, server.endpoint(), dir.string()};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  for (const char* file : {"main.cpp.o", "parse.cpp.o", "print.cpp.o", "util.cpp.o"})
    EXPECT_EQ(lines_of(dir / file), 1U) << file << ": compiled once";
  EXPECT_EQ(lines_of(dir / "package-1"), 1U);
  EXPECT_EQ(lines_of(dir / "package-2"), 1U);
  EXPECT_EQ(lines_of(dir / "published"), 2U) << "both builders published, one at a time";
  std::filesystem::remove_all(dir);
}

}  // namespace
