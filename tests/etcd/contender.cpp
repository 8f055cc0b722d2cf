// A process that contends for claims in etcd, for the cross-process tests (etcd_processes_test):
//
//   etcd_contender ENDPOINT PREFIX contend SEED COUNT LOG
//       COUNT requests of random claims (shared or exclusive paths of a small tree, some of two
//       paths at once); each holder writes "token start end mode path [mode path]" to LOG, with
//       start and end read from CLOCK_MONOTONIC (one clock for every process of the host) while
//       it holds the claims.
//   etcd_contender ENDPOINT PREFIX hold PATH
//       holds PATH exclusively, prints "held TOKEN" and waits to be killed.
//
// Exits 0 when everything it asked for was granted.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "session_access.hpp"
#include "tasklet/etcd/etcd.hpp"

using namespace tasklet::etcd;
using detail::Claim;

namespace {

long long monotonic_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec;
}

std::int64_t hold(EtcdSession& session, const std::vector<Claim>& claims,
                  std::shared_ptr<detail::Ticket>& ticket) {
  auto granted = std::make_shared<std::promise<std::int64_t>>();
  std::future<std::int64_t> token = granted->get_future();
  ticket = detail::SessionAccess::locks(session).request(
      claims, {.granted = [granted](std::int64_t revision) { granted->set_value(revision); }});
  if (token.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "contender: a request was never granted\n");
    std::exit(2);
  }
  return token.get();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: etcd_contender ENDPOINT PREFIX (contend SEED COUNT LOG | hold PATH)\n");
    return 1;
  }
  EtcdOptions options;
  options.endpoints = {argv[1]};
  options.prefix = argv[2];
  options.lease_ttl = std::chrono::seconds(2);
  const std::string mode = argv[3];
  auto session = EtcdSession::connect(options);
  std::shared_ptr<detail::Ticket> ticket;

  if (mode == "hold" && argc == 5) {
    const std::int64_t token = hold(*session, {{argv[4], true}}, ticket);
    std::printf("held %lld\n", static_cast<long long>(token));
    std::fflush(stdout);
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // until killed
  }
  if (mode != "contend" || argc != 7) return 1;

  std::mt19937 random(static_cast<unsigned>(std::stoul(argv[4])));
  const int count = std::stoi(argv[5]);
  std::ofstream log(argv[6]);
  // A small tree: the root, /a and /b, and two levels under each.
  std::vector<std::string> paths = {"/"};
  for (const char* top : {"/a", "/b"}) {
    paths.emplace_back(top);
    for (const char* mid : {"/x", "/y"}) {
      paths.push_back(std::string(top) + mid);
      for (const char* leaf : {"/1", "/2"}) paths.push_back(std::string(top) + mid + leaf);
    }
  }
  std::uniform_int_distribution<std::size_t> any_path(1, paths.size() - 1);  // the root rarely
  for (int i = 0; i < count; ++i) {
    std::vector<Claim> claims;
    claims.push_back({random() % 50 == 0 ? "/" : paths[any_path(random)], random() % 2 == 0});
    if (random() % 4 == 0) {
      Claim second{paths[any_path(random)], random() % 2 == 0};
      if (second.path != claims.front().path) claims.push_back(second);
    }
    const std::int64_t token = hold(*session, claims, ticket);
    const long long start = monotonic_ns();
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 2000));  // the holder's work
    const long long end = monotonic_ns();
    log << token << ' ' << start << ' ' << end;
    for (const Claim& claim : claims) log << ' ' << (claim.exclusive ? 'X' : 'S') << ' ' << claim.path;
    log << '\n';
    detail::SessionAccess::locks(*session).release(ticket);
  }
  return log.good() ? 0 : 1;
}
