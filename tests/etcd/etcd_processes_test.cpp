// Rules shared through etcd across processes (tests/etcd/contender.cpp): four processes run jobs
// on random paths, shared and exclusive, and a checker proves from their logs that no two
// conflicting holders overlapped and that conflicting requests were granted in revision order
// (their fencing tokens); a process killed with SIGKILL while it holds a rule frees it once its
// lease's TTL has passed; a process paused past its lease while it waits is not granted on resuming.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "child_process.hpp"
#include "etcd/session_access.hpp"
#include "etcd_server.hpp"
#include "tasklet/etcd/etcd.hpp"

namespace tasklet::etcd {
namespace {

using detail::Claim;
using test::exit_status;
using test::spawn;

struct Hold {
  std::int64_t token = 0;
  long long start = 0, end = 0;
  std::vector<Claim> claims;
  int process = 0;
};

bool under(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path == dir ||
         (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

bool conflict(const Hold& a, const Hold& b) {
  for (const Claim& x : a.claims) {
    for (const Claim& y : b.claims) {
      if ((x.exclusive || y.exclusive) && (under(x.path, y.path) || under(y.path, x.path))) return true;
    }
  }
  return false;
}

std::string describe(const Hold& hold) {
  std::string text = "process " + std::to_string(hold.process) + " token " + std::to_string(hold.token) +
                     " [" + std::to_string(hold.start) + ", " + std::to_string(hold.end) + "]";
  for (const Claim& claim : hold.claims)
    text += std::string(" ") + (claim.exclusive ? "X " : "S ") + claim.path;
  return text;
}

TEST(EtcdProcessesTest, JobsOfFourProcessesNeverOverlapOnConflictingPathsAndGoInRevisionOrder) {
  test::EtcdServer server;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tasklet-contenders-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  constexpr int processes = 4, requests = 100;
  std::vector<pid_t> children;
  for (int p = 0; p < processes; ++p) {
    children.push_back(
        spawn({TASKLET_ETCD_CONTENDER, server.endpoint(), "/oracle", "contend", std::to_string(p + 1),
               std::to_string(requests), (dir / ("log" + std::to_string(p))).string()}));
  }
  for (const pid_t child : children) ASSERT_EQ(exit_status(child), 0);

  std::vector<Hold> holds;
  for (int p = 0; p < processes; ++p) {
    std::ifstream log(dir / ("log" + std::to_string(p)));
    std::string line;
    while (std::getline(log, line)) {
      std::istringstream fields(line);
      Hold hold;
      hold.process = p;
      fields >> hold.token >> hold.start >> hold.end;
      std::string mode, path;
      while (fields >> mode >> path) hold.claims.push_back({path, mode == "X"});
      holds.push_back(hold);
    }
  }
  std::filesystem::remove_all(dir);
  ASSERT_EQ(holds.size(), static_cast<std::size_t>(processes * requests));
  int conflicting_pairs = 0;
  for (std::size_t i = 0; i < holds.size(); ++i) {
    for (std::size_t j = i + 1; j < holds.size(); ++j) {
      const Hold& a = holds[i].token < holds[j].token ? holds[i] : holds[j];
      const Hold& b = holds[i].token < holds[j].token ? holds[j] : holds[i];
      if (!conflict(a, b)) continue;
      // One transaction may enter several requests of a process, which then share a revision:
      // never two that conflict (the process's own table holds the later one back).
      ASSERT_NE(a.token, b.token) << "conflicting requests with one revision: " << describe(a) << " / "
                                  << describe(b);
      ++conflicting_pairs;
      // The earlier request (lower revision) held first, and let go before the later one began.
      ASSERT_LT(a.end, b.start) << "overlap or out of revision order:\n  " << describe(a) << "\n  "
                                << describe(b);
    }
  }
  EXPECT_GT(conflicting_pairs, processes * requests);  // the tree is small: they did contend
}

TEST(EtcdProcessesTest, AProcessKilledWhileHoldingFreesItsClaimOnceItsLeaseExpires) {
  test::EtcdServer server;
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t holder = spawn({TASKLET_ETCD_CONTENDER, server.endpoint(), "/killed", "hold", "/k"}, out[1]);
  close(out[1]);
  std::unique_ptr<FILE, int (*)(FILE*)> said(fdopen(out[0], "r"), &fclose);
  std::array<char, 64> line{};
  ASSERT_NE(std::fgets(line.data(), line.size(), said.get()), nullptr);  // "held TOKEN"
  const long long held_token = std::stoll(std::string(line.data()).substr(5));

  EtcdOptions options;
  options.endpoints = {server.endpoint()};
  options.prefix = "/killed";
  auto session = EtcdSession::connect(options);
  auto granted = std::make_shared<std::promise<std::int64_t>>();
  std::future<std::int64_t> token = granted->get_future();
  auto entry = std::make_shared<std::promise<void>>();
  std::future<void> entered = entry->get_future();
  auto ticket = detail::SessionAccess::locks(*session).request(
      {{"/k", true}}, {.entered = [entry](std::int64_t) { entry->set_value(); },
                       .granted = [granted](std::int64_t revision) { granted->set_value(revision); }});
  ASSERT_EQ(entered.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_NE(token.wait_for(std::chrono::seconds(0)), std::future_status::ready) << "the holder still lives";
  kill(holder, SIGKILL);  // nothing deletes its key now but its lease's expiry (TTL 2 s)
  waitpid(holder, nullptr, 0);
  ASSERT_EQ(token.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_GT(token.get(), held_token);
  detail::SessionAccess::locks(*session).release(ticket);
}

// Whether `done` came true within a minute, asking again and again (each look asks etcd).
bool within_a_minute(const std::function<bool()>& done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
  }
  return true;
}

// A process waiting for a rule is paused (SIGSTOP) until its lease has expired in etcd; meanwhile
// the holder lets go and another session takes the rule. Resumed, the paused process reads the
// deletions etcd made meanwhile (its own key's among them): it must not be granted the rule too,
// and ends with EtcdLeaseLost.
TEST(EtcdProcessesTest, AWaiterPausedPastItsLeaseIsNotGrantedWhenItResumes) {
  test::EtcdServer server;
  EtcdOptions options;
  options.endpoints = {server.endpoint()};
  options.prefix = "/paused";
  const auto keys_of_t = [&server] {
    const std::string keys = server.etcdctl("get --prefix --keys-only /paused/c/p/t/");
    std::size_t count = 0;
    for (std::size_t at = keys.find("/paused/c/"); at != std::string::npos;
         at = keys.find("/paused/c/", at + 1))
      ++count;
    return count;
  };
  // Claims /t for `session` and waits until it holds it.
  const auto hold_t = [](EtcdSession& session) {
    auto granted = std::make_shared<std::promise<std::int64_t>>();
    std::future<std::int64_t> token = granted->get_future();
    auto ticket = detail::SessionAccess::locks(session).request(
        {{"/t", true}}, {.granted = [granted](std::int64_t revision) { granted->set_value(revision); }});
    if (token.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
      throw std::runtime_error("/t was never granted");
    return ticket;
  };
  auto first = EtcdSession::connect(options);
  auto first_ticket = hold_t(*first);

  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t waiter = spawn({TASKLET_ETCD_CONTENDER, server.endpoint(), "/paused", "wait", "/t"}, out[1]);
  close(out[1]);
  std::unique_ptr<FILE, int (*)(FILE*)> said(fdopen(out[0], "r"), &fclose);
  std::array<char, 512> line{};
  ASSERT_NE(std::fgets(line.data(), line.size(), said.get()), nullptr);  // "asking"
  ASSERT_TRUE(within_a_minute([&] { return keys_of_t() == 2; })) << "the waiter's request is in etcd";
  kill(waiter, SIGSTOP);
  // Its lease (TTL 2 s) expires: etcd deletes its key. Then the holder lets go, and another
  // session is granted /t.
  ASSERT_TRUE(within_a_minute([&] { return keys_of_t() == 1; })) << "the waiter's lease expired";
  detail::SessionAccess::locks(*first).release(first_ticket);
  auto second = EtcdSession::connect(options);
  auto second_ticket = hold_t(*second);
  kill(waiter, SIGCONT);
  ASSERT_NE(std::fgets(line.data(), line.size(), said.get()), nullptr);
  const std::string answer = line.data();
  EXPECT_EQ(answer.rfind("lost ", 0), 0u) << "granted while another session holds /t: " << answer;
  EXPECT_NE(answer.find("lease"), std::string::npos) << answer;
  EXPECT_EQ(exit_status(waiter), 0);
  detail::SessionAccess::locks(*second).release(second_ticket);
}

}  // namespace
}  // namespace tasklet::etcd
