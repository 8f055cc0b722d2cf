// Claims in etcd between sessions (each its own lease, as separate processes would have): paths
// exclude their ancestors and descendants unless both are shared, conflicting requests are granted
// in revision order, a multi-claim request is one ticket, a withdrawn request lets the next one
// through, and a session that goes frees what it held.
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "etcd_server.hpp"
#include "session_access.hpp"
#include "tasklet/etcd/etcd.hpp"

namespace tasklet::etcd {
namespace {

using namespace std::chrono_literals;
using detail::Claim;
using detail::Locks;
using detail::SessionAccess;
using detail::Ticket;
using test::EtcdServer;

// A request and when it was granted (its fencing token).
struct Request {
  std::shared_ptr<std::promise<std::int64_t>> promise = std::make_shared<std::promise<std::int64_t>>();
  std::future<std::int64_t> granted = promise->get_future();
  std::shared_ptr<Ticket> ticket;
  bool held() { return granted.wait_for(0s) == std::future_status::ready; }
  std::int64_t wait() {
    if (granted.wait_for(30s) != std::future_status::ready) throw std::runtime_error("never granted");
    return granted.get();
  }
};

class EtcdLocksTest : public ::testing::Test {
 protected:
  std::shared_ptr<EtcdSession> session() {
    EtcdOptions options;
    options.endpoints = {server_.endpoint()};
    options.prefix = "/locks";
    sessions_.push_back(EtcdSession::connect(options));
    return sessions_.back();
  }
  static Request claim(EtcdSession& session, std::vector<Claim> claims) {
    Request request;
    request.ticket = SessionAccess::locks(session).request(
        claims, [promise = request.promise](std::int64_t revision) { promise->set_value(revision); });
    return request;
  }
  static void release(EtcdSession& session, Request& request) {
    SessionAccess::locks(session).release(request.ticket);
  }

  EtcdServer server_;
  std::vector<std::shared_ptr<EtcdSession>> sessions_;
};

TEST_F(EtcdLocksTest, AnExclusiveClaimWaitsForTheHolderAndGetsALaterToken) {
  auto a = session(), b = session();
  Request first = claim(*a, {{"/shared/file", true}});
  ASSERT_TRUE(first.held());  // free: granted before request() returned
  Request second = claim(*b, {{"/shared/file", true}});
  EXPECT_FALSE(second.held());
  const std::int64_t first_token = first.granted.get();
  release(*a, first);
  EXPECT_GT(second.wait(), first_token);
  release(*b, second);
}

TEST_F(EtcdLocksTest, APathExcludesItsDescendantsAndAncestorsButNotItsSiblings) {
  auto a = session(), b = session(), c = session();
  Request parent = claim(*a, {{"/tree", true}});
  ASSERT_TRUE(parent.held());
  Request child = claim(*b, {{"/tree/leaf", false}});  // shared, under an exclusive ancestor
  Request sibling = claim(*c, {{"/other", true}});
  EXPECT_FALSE(child.held());
  EXPECT_TRUE(sibling.held());
  release(*a, parent);
  child.wait();
  Request ancestor = claim(*a, {{"/", true}});  // the root conflicts with everything held
  EXPECT_FALSE(ancestor.held());
  release(*b, child);
  EXPECT_FALSE(ancestor.held());
  release(*c, sibling);
  ancestor.wait();
  release(*a, ancestor);
}

TEST_F(EtcdLocksTest, SharedClaimsShareAndAnExclusiveOneWaitsForAllOfThem) {
  auto a = session(), b = session(), c = session();
  Request reader = claim(*a, {{"/docs", false}});
  Request nested_reader = claim(*b, {{"/docs/guide", false}});
  EXPECT_TRUE(reader.held());
  EXPECT_TRUE(nested_reader.held());
  Request writer = claim(*c, {{"/docs/guide/intro", true}});
  EXPECT_FALSE(writer.held());
  release(*a, reader);
  EXPECT_FALSE(writer.held());  // the nested reader's claim is still there
  release(*b, nested_reader);
  writer.wait();
  release(*c, writer);
}

TEST_F(EtcdLocksTest, ConflictingRequestsAreGrantedInRevisionOrder) {
  auto a = session(), b = session(), c = session(), d = session();
  Request holder = claim(*a, {{"/queue", true}});
  Request writer = claim(*b, {{"/queue", true}});
  Request reader_x = claim(*c, {{"/queue/x", false}});  // later than the writer: behind it
  Request reader_y = claim(*d, {{"/queue/y", false}});
  release(*a, holder);
  const std::int64_t writer_token = writer.wait();
  EXPECT_FALSE(reader_x.held());
  EXPECT_FALSE(reader_y.held());
  release(*b, writer);
  EXPECT_GT(reader_x.wait(), writer_token);
  EXPECT_GT(reader_y.wait(), writer_token);
  release(*c, reader_x);
  release(*d, reader_y);
}

TEST_F(EtcdLocksTest, AMultiClaimIsOneTicketAndLaterRequestsQueueBehindAllOfIt) {
  auto a = session(), b = session(), c = session();
  Request one = claim(*a, {{"/m/1", true}});
  Request both = claim(*b, {{"/m/1", true}, {"/m/2", true}});
  Request two = claim(*c, {{"/m/2", true}});  // /m/2 is free, but an earlier request wants it
  EXPECT_FALSE(both.held());
  EXPECT_FALSE(two.held());
  release(*a, one);
  both.wait();
  EXPECT_FALSE(two.held());
  release(*b, both);
  two.wait();
  release(*c, two);
}

TEST_F(EtcdLocksTest, AWithdrawnRequestIsNeverGrantedAndLetsTheNextThrough) {
  auto a = session(), b = session(), c = session();
  Request holder = claim(*a, {{"/w", true}});
  Request withdrawn = claim(*b, {{"/w", true}});
  Request next = claim(*c, {{"/w", true}});
  release(*b, withdrawn);  // while it waits
  release(*a, holder);
  next.wait();
  EXPECT_FALSE(withdrawn.held());
  release(*c, next);
}

TEST_F(EtcdLocksTest, ASessionThatGoesFreesWhatItHeld) {
  auto a = session(), b = session();
  Request held = claim(*a, {{"/gone", true}});
  Request waiting = claim(*b, {{"/gone", true}});
  EXPECT_FALSE(waiting.held());
  sessions_.erase(sessions_.begin());  // its lease is revoked: its keys go with it
  a.reset();
  waiting.wait();
  release(*b, waiting);
}

}  // namespace
}  // namespace tasklet::etcd
