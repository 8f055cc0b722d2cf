// Rules shared through a three-member etcd cluster, each session given every member's endpoint:
// the leader's SIGKILL, while one manager holds a rule and another's job waits for it in etcd,
// loses no lease, lets no holders overlap, and the waiter is granted once the holder lets go,
// through the members that are left.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "etcd_cluster.hpp"
#include "support/job_support.hpp"
#include "tasklet.hpp"
#include "tasklet/etcd/etcd.hpp"

namespace tasklet::etcd {
namespace {

using namespace std::chrono_literals;

template <class T>
T await(std::future<T>& future) {
  if (future.wait_for(60s) != std::future_status::ready) throw std::runtime_error("never happened");
  return future.get();
}

// A session on `cluster` that tries member `first` before the others.
std::shared_ptr<EtcdSession> session_on(const test::EtcdCluster& cluster, std::size_t first) {
  EtcdOptions options;
  options.endpoints = cluster.endpoints();
  std::rotate(options.endpoints.begin(), options.endpoints.begin() + static_cast<std::ptrdiff_t>(first),
              options.endpoints.end());
  options.prefix = "/cluster";
  return EtcdSession::connect(options);
}

TEST(EtcdClusterTest, TheLeadersDeathLosesNoLeaseAndLetsNoHoldersOverlap) {
  test::EtcdCluster cluster(3);
  const std::size_t leader = cluster.leader();
  // Both speak to the leader first: its death is theirs to get over.
  const auto session_a = session_on(cluster, leader), session_b = session_on(cluster, leader);
  const auto a = make_job_manager(session_a), b = make_job_manager(session_b);
  const Rule rule = rules::path("/shared/x");
  std::atomic<int> inside{0};
  std::atomic<bool> overlapped{false};
  std::promise<std::int64_t> a_token, b_token;
  std::promise<void> a_in, a_go;
  auto holder = make_job(
      "holder",
      [&](ProgressMonitor&) {
        if (inside.fetch_add(1) != 0) overlapped = true;
        a_token.set_value(fencing_token(*a, rule));
        a_in.set_value();
        a_go.get_future().wait();
        inside.fetch_sub(1);
      },
      a);
  holder->set_rule(rule);
  holder->schedule();
  auto a_in_future = a_in.get_future();
  await(a_in_future);
  auto waiter = make_job(
      "waiter",
      [&](ProgressMonitor&) {
        if (inside.fetch_add(1) != 0) overlapped = true;
        b_token.set_value(fencing_token(*b, rule));
        inside.fetch_sub(1);
      },
      b);
  waiter->set_rule(rule);
  waiter->schedule();
  // In etcd behind the holder's key (named by its lease) before the leader goes.
  ASSERT_TRUE(test::eventually([&] {
    const auto blockers = waiter->blockers();
    return blockers.size() == 1 && blockers[0].owner.find("etcd lease") != std::string::npos;
  }));

  cluster.member(leader).stop();  // SIGKILL
  a_go.set_value();
  holder->join();
  waiter->join();
  EXPECT_TRUE(holder->result().is_ok()) << holder->result().message;
  EXPECT_TRUE(waiter->result().is_ok()) << waiter->result().message;
  EXPECT_FALSE(overlapped.load());
  auto a_future = a_token.get_future(), b_future = b_token.get_future();
  EXPECT_LT(await(a_future), await(b_future));
  EXPECT_TRUE(session_a->lease_alive());
  EXPECT_TRUE(session_b->lease_alive());
  EXPECT_NE(session_a->endpoint(), cluster.member(leader).endpoint()) << "a moved to another member";
  EXPECT_NE(session_b->endpoint(), cluster.member(leader).endpoint()) << "b moved to another member";
  EXPECT_NE(cluster.leader(), leader) << "the members left chose another leader";
}

}  // namespace
}  // namespace tasklet::etcd
