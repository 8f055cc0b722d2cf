// The etcd session against a real etcd on loopback: connect, endpoints that are down, sign-in
// failures, a user who may not write the prefix, the lease renewed, lost, and revoked at the end.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "etcd_server.hpp"
#include "support/job_support.hpp"
#include "tasklet/etcd/etcd.hpp"

namespace tasklet::etcd {
namespace {

using namespace std::chrono_literals;
using test::EtcdServer;

EtcdOptions options_for(std::vector<std::string> endpoints) {
  EtcdOptions options;
  options.endpoints = std::move(endpoints);
  options.prefix = "/app";
  return options;
}

// A port where nothing listens: a connection there is refused at once.
std::string dead_endpoint() { return "http://127.0.0.1:" + std::to_string(test::free_port()); }

std::string lease_hex(std::int64_t lease) {
  char text[32];
  std::snprintf(text, sizeof text, "%llx", static_cast<unsigned long long>(lease));
  return text;
}

TEST(EtcdSessionTest, ConnectsWithALeaseItsKeyAndRevokesThemWhenItGoes) {
  EtcdServer server;
  std::int64_t lease = 0;
  {
    auto session = EtcdSession::connect(options_for({server.endpoint()}));
    lease = session->lease_id();
    EXPECT_NE(lease, 0);
    EXPECT_TRUE(session->lease_alive());
    EXPECT_EQ(session->endpoint(), server.endpoint());
    const std::string keys = server.etcdctl("get --prefix --keys-only /app/sessions/");
    EXPECT_NE(keys.find("/app/sessions/"), std::string::npos) << keys;
    EXPECT_NE(server.etcdctl("lease timetolive " + lease_hex(lease)).find("remaining"), std::string::npos);
  }
  EXPECT_EQ(server.etcdctl("get --prefix --keys-only /app/sessions/"), "");
  EXPECT_NE(server.etcdctl("lease timetolive " + lease_hex(lease)).find("already expired"),
            std::string::npos);
}

TEST(EtcdSessionTest, AnEndpointThatIsDownIsPassedOver) {
  EtcdServer server;
  auto session = EtcdSession::connect(options_for({dead_endpoint(), server.endpoint()}));
  EXPECT_EQ(session->endpoint(), server.endpoint());
}

TEST(EtcdSessionTest, NoEndpointAnsweringIsEtcdUnavailableAtConnect) {
  EtcdOptions options = options_for({dead_endpoint(), dead_endpoint()});
  options.request_timeout = 500ms;
  try {
    EtcdSession::connect(options);
    FAIL() << "connected to nothing";
  } catch (const EtcdUnavailable& error) {
    EXPECT_NE(std::string(error.what()).find(options.endpoints[1]), std::string::npos) << error.what();
  }
}

TEST(EtcdSessionTest, OptionsWithoutAnEndpointOrWithATinyTtlAreRefused) {
  EXPECT_THROW(EtcdSession::connect(EtcdOptions{}), std::invalid_argument);
  EtcdOptions options = options_for({"http://127.0.0.1:1"});
  options.lease_ttl = 1s;
  EXPECT_THROW(EtcdSession::connect(options), std::invalid_argument);
}

// Options that sign in as `user` on a server where authentication is on.
EtcdOptions signed_in(const EtcdServer& server, const std::string& user, const std::string& password) {
  EtcdOptions options = options_for({server.endpoint()});
  options.user = user;
  options.password = password;
  return options;
}

TEST(EtcdSessionTest, AWrongPasswordOrNoneIsEtcdAuthFailed) {
  EtcdServer server;
  server.add_user("builder", "right", "/app/", true);
  server.enable_auth("rootpw");
  EtcdOptions options = signed_in(server, "builder", "wrong");
  EXPECT_THROW(EtcdSession::connect(options), EtcdAuthFailed);
  EXPECT_THROW(EtcdSession::connect(options_for({server.endpoint()})), EtcdAuthFailed);
  options.password = "right";
  auto session = EtcdSession::connect(options);
  EXPECT_TRUE(session->lease_alive());
}

TEST(EtcdSessionTest, AUserWhoMayNotWriteThePrefixIsEtcdPermissionDeniedAtConnect) {
  EtcdServer server;
  server.add_user("reader", "pw", "/app/", false);
  server.enable_auth("rootpw");
  EXPECT_THROW(EtcdSession::connect(signed_in(server, "reader", "pw")), EtcdPermissionDenied);
}

TEST(EtcdSessionTest, TheLeaseIsRenewedAndItsLossIsTold) {
  EtcdServer server;
  EtcdOptions options = options_for({server.endpoint()});
  options.lease_ttl = 2s;
  auto session = EtcdSession::connect(options);
  // Renewed every third of its TTL: three renewals outlive the TTL itself.
  ASSERT_TRUE(test::eventually([&] { return session->renewals() >= 3; }));
  EXPECT_TRUE(session->lease_alive());
  EXPECT_NE(server.etcdctl("lease timetolive " + lease_hex(session->lease_id())).find("remaining"),
            std::string::npos);

  std::latch told(1);
  std::string why;
  session->on_lease_lost([&](const std::string& reason) {
    why = reason;
    told.count_down();
  });
  server.etcdctl("lease revoke " + lease_hex(session->lease_id()));  // as if it had expired
  told.wait();
  EXPECT_FALSE(session->lease_alive());
  EXPECT_NE(why.find(std::to_string(session->lease_id())), std::string::npos) << why;
  // A listener that comes later is told at once.
  bool late = false;
  session->on_lease_lost([&](const std::string&) { late = true; });
  EXPECT_TRUE(late);
}

TEST(EtcdSessionTest, EtcdGoingAwayLosesTheLeaseOnceItsTtlHasPassed) {
  auto server = std::make_unique<EtcdServer>();
  EtcdOptions options = options_for({server->endpoint()});
  options.lease_ttl = 2s;
  options.request_timeout = 300ms;
  auto session = EtcdSession::connect(options);
  std::latch told(1);
  session->on_lease_lost([&](const std::string&) { told.count_down(); });
  server.reset();  // etcd is killed: nothing renews the lease any more
  told.wait();
  EXPECT_FALSE(session->lease_alive());
}

}  // namespace
}  // namespace tasklet::etcd
