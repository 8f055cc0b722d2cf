// Claims in etcd between sessions (each its own lease, as separate processes would have): paths
// exclude their ancestors and descendants unless both are shared, conflicting requests are granted
// in revision order, a multi-claim request is one ticket, a withdrawn request lets the next one
// through, a session that goes frees what it held, and one whose key is deleted is lost.
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "etcd/session_access.hpp"
#include "etcd_server.hpp"
#include "tasklet/etcd/etcd.hpp"

namespace tasklet::etcd {
namespace {

using namespace std::chrono_literals;
using detail::Claim;
using detail::Locks;
using detail::SessionAccess;
using detail::Ticket;
using test::EtcdServer;

// A request, when etcd entered it and when it was granted (its fencing token).
struct Request {
  std::shared_ptr<std::promise<std::int64_t>> promise = std::make_shared<std::promise<std::int64_t>>();
  std::future<std::int64_t> granted = promise->get_future();
  std::shared_ptr<std::promise<std::int64_t>> entry = std::make_shared<std::promise<std::int64_t>>();
  std::future<std::int64_t> entered = entry->get_future();
  std::shared_ptr<Ticket> ticket;
  // Whether it holds its claims now (after it was entered, this says whether it waits).
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
  // Enters a request and returns once etcd has it (its place in the order is then fixed).
  static Request claim(EtcdSession& session, std::vector<Claim> claims) {
    Request request;
    request.ticket = SessionAccess::locks(session).request(
        std::move(claims),
        {.entered = [entry = request.entry](std::int64_t revision) { entry->set_value(revision); },
         .granted = [promise = request.promise](std::int64_t revision) { promise->set_value(revision); },
         .failed = [](std::exception_ptr) { ADD_FAILURE() << "a request failed"; }});
    if (request.entered.wait_for(30s) != std::future_status::ready) throw std::runtime_error("never entered");
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
  const std::int64_t first_token = first.wait();  // free: granted without anyone's release
  Request second = claim(*b, {{"/shared/file", true}});
  EXPECT_FALSE(second.held());
  release(*a, first);
  EXPECT_GT(second.wait(), first_token);
  release(*b, second);
}

TEST_F(EtcdLocksTest, APathExcludesItsDescendantsAndAncestorsButNotItsSiblings) {
  auto a = session(), b = session(), c = session();
  Request parent = claim(*a, {{"/tree", true}});
  parent.wait();
  Request child = claim(*b, {{"/tree/leaf", false}});  // shared, under an exclusive ancestor
  Request sibling = claim(*c, {{"/other", true}});
  EXPECT_FALSE(child.held());
  sibling.wait();  // granted while /tree is held
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
  reader.wait();
  nested_reader.wait();
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
  holder.wait();
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
  one.wait();
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
  holder.wait();
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
  held.wait();
  Request waiting = claim(*b, {{"/gone", true}});
  EXPECT_FALSE(waiting.held());
  sessions_.erase(sessions_.begin());  // its lease is revoked: its keys go with it
  a.reset();
  waiting.wait();
  release(*b, waiting);
}

TEST_F(EtcdLocksTest, ASessionWhoseKeyWasDeletedIsLostAndItsRequestFails) {
  auto a = session();
  auto lost = std::make_shared<std::promise<std::string>>();
  a->on_lease_lost([lost](const std::string& why) { lost->set_value(why); });
  char id[32];
  std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(a->lease_id()));
  server_.etcdctl(std::string("del /locks/sessions/") + id);  // the lease itself lives on

  auto failed = std::make_shared<std::promise<std::exception_ptr>>();
  std::future<std::exception_ptr> failure = failed->get_future();
  const std::shared_ptr<Ticket> ticket = SessionAccess::locks(*a).request(
      {{"/fenced", true}}, {.failed = [failed](std::exception_ptr error) { failed->set_value(error); }});
  ASSERT_EQ(failure.wait_for(30s), std::future_status::ready) << "the request was retried without end";
  EXPECT_THROW(std::rethrow_exception(failure.get()), EtcdLeaseLost);
  EXPECT_FALSE(a->lease_alive());
  std::future<std::string> why = lost->get_future();
  ASSERT_EQ(why.wait_for(30s), std::future_status::ready);
  EXPECT_NE(why.get().find("/locks/sessions/"), std::string::npos);
}

TEST_F(EtcdLocksTest, NamesAreClaimsOfTheirOwnApartFromPathsAndFromLongerNames) {
  auto a = session(), b = session(), c = session();
  Request tenant = claim(*a, {{"t/42", true, true}});
  tenant.wait();
  Request root = claim(*b, {{"/", true}});  // a rule on the root claims no name
  root.wait();
  Request longer = claim(*c, {{"t/42/x", true, true}});  // not below "t/42": names have no tree
  longer.wait();
  Request same = claim(*b, {{"t/42", true, true}});
  EXPECT_FALSE(same.held());
  release(*a, tenant);
  same.wait();
  release(*b, root);
  release(*c, longer);
  release(*b, same);
}

// Requests that come while a transaction is under way go together in the next one; each is
// granted once (a second grant would set its promise twice and end the test).
TEST_F(EtcdLocksTest, RequestsFromManyThreadsAreEachGrantedOnce) {
  auto a = session();
  constexpr int count = 64;
  std::vector<Request> requests(count);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < count; i += 4)
        requests[static_cast<std::size_t>(i)] = claim(*a, {{"/batch/" + std::to_string(i), true}});
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (Request& request : requests) request.wait();
  for (Request& request : requests) release(*a, request);
  // Their parent: granted once every one of them is deleted.
  Request again = claim(*a, {{"/batch", true}});
  again.wait();
  release(*a, again);
}

}  // namespace
}  // namespace tasklet::etcd
