// The rule table with a backend that shares path and named rules (as tasklet::etcd does): a
// request hears of its grant only after the backend's, waits here first and there second, never
// parks, and is withdrawn, canceled, handed over or abandoned in either place.
#include "table/rule_backend.hpp"

#include <algorithm>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "table/rule_table.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet::detail {
namespace {

struct Probe final : InlineRuleRequest<2> {
  explicit Probe(Rule rule, bool parks = false) : kept(std::move(rule)), may_park(parks) {
    set_rule(kept.get());
  }
  Rule kept;
  bool may_park;
  int grants = 0;
  int cancels = 0;
  void granted() noexcept override { ++grants; }
  void canceled() noexcept override { ++cancels; }
  bool parkable() const noexcept override { return may_park; }
};

// Grants only when the test says so; records what the table tells it.
class FakeBackend final : public RuleBackend {
 public:
  bool shares(const SchedulingRule& rule) const noexcept override {
    const RuleKey::Kind kind = rule.key().kind;
    return kind == RuleKey::Kind::path || kind == RuleKey::Kind::named;
  }
  void acquire(RuleTable& table, RuleRequest& request) noexcept override {
    std::lock_guard lock(mutex_);
    table_ = &table;
    pending_.push_back(&request);
  }
  bool leave(RuleRequest& request, bool withdraw) noexcept override {
    std::lock_guard lock(mutex_);
    if (std::erase(pending_, &request) != 0) {
      withdrawn.push_back(&request);
      return true;
    }
    if (withdraw) return false;
    EXPECT_EQ(std::erase(held_, &request), 1U) << "released without being held";
    released.push_back(&request);
    return true;
  }
  bool pending(const RuleRequest& request) const noexcept override {
    std::lock_guard lock(mutex_);
    return std::find(pending_.begin(), pending_.end(), &request) != pending_.end();
  }
  void moved(const RuleRequest& from, RuleRequest& to) noexcept override {
    std::lock_guard lock(mutex_);
    std::replace(held_.begin(), held_.end(), const_cast<RuleRequest*>(&from), &to);
  }
  std::exception_ptr failure() const noexcept override { return failure_; }
  void flush() noexcept override {}
  std::vector<RuleBlocker> blockers(const RuleRequest&) const override {
    return {RuleBlocker{"another process", nullptr, true}};
  }

  // The backend's side: grants a pending request, or gives up on it.
  void grant(RuleRequest& request) {
    {
      std::lock_guard lock(mutex_);
      ASSERT_EQ(std::erase(pending_, &request), 1U);
      held_.push_back(&request);
    }
    request.granted();
  }
  void fail(RuleRequest& request) {
    {
      std::lock_guard lock(mutex_);
      ASSERT_EQ(std::erase(pending_, &request), 1U);
      failure_ = std::make_exception_ptr(std::runtime_error("lost"));
    }
    table_->abandon(request);
    request.failed(failure_);
  }
  bool is_pending(const RuleRequest& request) const { return pending(request); }
  std::size_t held_count() const {
    std::lock_guard lock(mutex_);
    return held_.size();
  }

  std::vector<RuleRequest*> withdrawn;
  std::vector<RuleRequest*> released;

 private:
  mutable std::mutex mutex_;
  RuleTable* table_ = nullptr;
  std::vector<RuleRequest*> pending_;
  std::vector<RuleRequest*> held_;
  std::exception_ptr failure_;
};

class RuleBackendTest : public ::testing::Test {
 protected:
  RuleBackendTest() {
    auto made = std::make_shared<FakeBackend>();
    backend_ = made.get();
    table_.set_backend(std::move(made));
  }
  void TearDown() override { EXPECT_TRUE(table_.is_idle()); }
  RuleTable table_;
  FakeBackend* backend_;
};

TEST_F(RuleBackendTest, ASharedRuleIsToldOnlyOnceTheBackendGrantsIt) {
  Probe first(rules::path("/a")), second(rules::path("/a/b")), local(rules::mutex("m"));
  table_.enter(first);
  EXPECT_EQ(first.grants, 0) << "granted here, waiting in the backend";
  EXPECT_TRUE(backend_->is_pending(first));
  EXPECT_TRUE(first.is_held()) << "holds its rule here meanwhile";
  table_.enter(second);
  EXPECT_FALSE(backend_->is_pending(second)) << "waits here first: /a is held here";
  const std::vector<RuleBlocker> outside = table_.blockers(first);
  ASSERT_EQ(outside.size(), 1U) << "the backend says whom it waits for";
  EXPECT_EQ(outside[0].owner, "another process");
  const std::vector<RuleBlocker> here = table_.blockers(second);
  ASSERT_EQ(here.size(), 1U);
  EXPECT_TRUE(here[0].holds) << "first holds /a here";
  table_.enter(local);
  EXPECT_EQ(local.grants, 1) << "a rule the backend does not share is told at once";
  backend_->grant(first);
  EXPECT_EQ(first.grants, 1);
  table_.leave(first);
  ASSERT_EQ(backend_->released.size(), 1U);
  EXPECT_EQ(backend_->released[0], &first);
  EXPECT_TRUE(backend_->is_pending(second)) << "let through here, now in the backend";
  backend_->grant(second);
  EXPECT_EQ(second.grants, 1);
  table_.leave(second);
  table_.leave(local);
  EXPECT_EQ(backend_->held_count(), 0U);
}

TEST_F(RuleBackendTest, NamedMutexesGoThroughTheBackendAndSharedRequestsNeverPark) {
  Probe named(rules::named_mutex("t"), true), path(rules::path("/p"), true), local(rules::mutex("m"), true);
  for (Probe* probe : {&named, &path, &local}) table_.enter(*probe);
  EXPECT_TRUE(backend_->is_pending(named));
  EXPECT_TRUE(backend_->is_pending(path));
  backend_->grant(named);
  backend_->grant(path);
  EXPECT_FALSE(table_.leave(named)) << "released, not parked: the backend would keep holding it";
  EXPECT_FALSE(table_.leave(path));
  EXPECT_EQ(backend_->released.size(), 2U);
  EXPECT_TRUE(table_.leave(local)) << "a local rule still parks";
  Probe conflicting(local.kept);
  table_.enter(conflicting);  // revokes the parked request
  EXPECT_EQ(conflicting.grants, 1);
  table_.leave(conflicting);
}

TEST_F(RuleBackendTest, WithdrawingARequestWaitingInTheBackendFreesItHereAndThere) {
  Probe waiting(rules::path("/a")), behind(rules::read_path("/a/b"));
  table_.enter(waiting);
  table_.enter(behind);
  ASSERT_TRUE(backend_->is_pending(waiting));
  EXPECT_TRUE(table_.withdraw(waiting)) << "not granted yet: it counts as waiting";
  EXPECT_EQ(waiting.grants, 0);
  ASSERT_EQ(backend_->withdrawn.size(), 1U);
  EXPECT_TRUE(backend_->is_pending(behind)) << "the next one is let through here";
  backend_->grant(behind);
  EXPECT_FALSE(table_.withdraw(behind)) << "granted by both: a holder";
  table_.leave(behind);
}

TEST_F(RuleBackendTest, WithdrawingByRuleAndPredicateReachesRequestsInTheBackend) {
  const Rule shared = rules::path("/x");
  Probe mine(shared), theirs(rules::path("/y"));
  table_.enter(mine);
  table_.enter(theirs);
  EXPECT_EQ(table_.withdraw_waiting(*shared, [&](const RuleRequest& request) { return &request == &mine; }),
            1U);
  EXPECT_EQ(mine.cancels, 1);
  EXPECT_EQ(table_.withdraw_waiting_if([&](const RuleRequest& request) { return &request == &theirs; }), 1U);
  EXPECT_EQ(theirs.cancels, 1);
  EXPECT_EQ(backend_->withdrawn.size(), 2U);
}

TEST_F(RuleBackendTest, CancelingEveryWaiterIncludesThoseWaitingInTheBackend) {
  Probe outside(rules::path("/a")), here(rules::path("/a")), held(rules::path("/b"));
  table_.enter(held);
  backend_->grant(held);
  table_.enter(outside);
  table_.enter(here);
  table_.cancel_all_waiting();
  EXPECT_EQ(outside.cancels, 1);
  EXPECT_EQ(here.cancels, 1);
  EXPECT_EQ(held.cancels, 0);
  EXPECT_EQ(outside.grants + here.grants, 0);
  EXPECT_EQ(table_.waiting_count(), 0U);
  EXPECT_EQ(table_.held_count(), 1U);
  table_.leave(held);
}

TEST_F(RuleBackendTest, AnAbandonedRequestLeavesTheTableAndLetsTheNextThrough) {
  Probe first(rules::named_mutex("n")), next(rules::named_mutex("n"));
  table_.enter(first);
  table_.enter(next);
  backend_->fail(first);
  EXPECT_EQ(first.cancels, 1);
  EXPECT_EQ(first.grants, 0);
  EXPECT_FALSE(first.is_held());
  EXPECT_NE(backend_->failure(), nullptr);
  EXPECT_TRUE(backend_->is_pending(next));
  backend_->grant(next);
  table_.leave(next);
}

TEST_F(RuleBackendTest, AHandedOverHoldStaysTheBackendsHold) {
  Probe from(rules::path("/h")), to(rules::path("/h"));
  table_.enter(from);
  backend_->grant(from);
  to.set_rule(from.rule());
  table_.hand_over(from, to);
  EXPECT_EQ(backend_->held_count(), 1U);
  table_.leave(to);
  ASSERT_EQ(backend_->released.size(), 1U);
  EXPECT_EQ(backend_->released[0], &to);
}

}  // namespace
}  // namespace tasklet::detail
