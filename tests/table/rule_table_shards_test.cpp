// The rule table's promises across top-level subtrees, mutex rules and named mutexes: whatever
// the table partitions its index by, a request whose rule spans several parts (a multi rule over
// several subtrees or mutexes, a rule on the root, a custom rule) is one request, asked at one
// moment. Strict FIFO, the counts, the readings (blockers, snapshots, wait chains) and the
// withdrawals must treat it so.
#include "table/rule_table.hpp"

#include "scheduler/domain.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <latch>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/table_probe.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet::detail {
namespace {

using test::ColourRule;
using test::Probe;

bool conflict(const Rule& a, const Rule& b) { return a->is_conflicting(*b) || b->is_conflicting(*a); }

// Blockers as "name holds" / "name waits": holders (in no promised order) sorted, then the earlier
// waiters in the order given (ticket order). Holders must come first.
std::vector<std::string> named(const std::vector<RuleBlocker>& found) {
  EXPECT_TRUE(std::is_partitioned(found.begin(), found.end(), [](const RuleBlocker& b) { return b.holds; }))
      << "holders come before earlier waiters";
  std::vector<std::string> names;
  for (const RuleBlocker& blocker : found)
    names.push_back(blocker.owner + (blocker.holds ? " holds" : " waits"));
  const auto holders =
      std::count_if(found.begin(), found.end(), [](const RuleBlocker& b) { return b.holds; });
  std::sort(names.begin(), names.begin() + holders);
  return names;
}

using Names = std::vector<std::string>;

class RuleTableShardsTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_TRUE(table_.is_idle()); }
  // Enters `probe`; true when enter() granted it there and then, a grant its count then leaves
  // out: `grants` counts the grants that came later, from releases.
  bool acquire(Probe& probe) {
    const int before = probe.grants;
    table_.enter(probe);
    if (probe.grants == before) return false;
    --probe.grants;
    return true;
  }
  RuleTable table_;
};

// ---------------------------------------------------------------------------------------------
// Strict FIFO where a request spans several subtrees

// A multi rule waiting in one subtree holds back a later conflicting request in the other, even
// when that subtree comes free first: it asked earlier.
TEST_F(RuleTableShardsTest, AMultiRuleHoldsBackLaterRequestsInTheSubtreeWhereItIsFree) {
  for (const char* later_path : {"/b/y", "/b"}) {
    SCOPED_TRACE(later_path);
    Probe h1(rules::path("/a"), "h1"), h2(rules::path("/b"), "h2");
    Probe multi(rules::combine(rules::path("/a/x"), rules::path("/b/y")), "multi");
    Probe later(rules::path(later_path), "later"), beside(rules::path("/b/z"), "beside");
    ASSERT_TRUE(acquire(h1));
    ASSERT_TRUE(acquire(h2));
    EXPECT_FALSE(acquire(multi));
    EXPECT_FALSE(acquire(later));
    table_.leave(h2);
    EXPECT_EQ(multi.grants, 0) << "/a is still held";
    EXPECT_EQ(later.grants, 0) << "the multi rule asked first and conflicts with it in /b";
    if (std::string(later_path) == "/b/y") {
      EXPECT_TRUE(acquire(beside)) << "/b/z conflicts with nobody: it does not queue behind the multi rule";
    }
    table_.leave(h1);
    EXPECT_EQ(multi.grants, 1);
    EXPECT_EQ(later.grants, 0);
    table_.leave(multi);
    EXPECT_EQ(later.grants, 1);
    table_.leave(later);
    if (beside.is_held()) table_.leave(beside);
  }
}

// The mirror: the later request conflicts with the multi rule in its first subtree, and the
// holder in the second one leaves last.
TEST_F(RuleTableShardsTest, AMultiRuleHoldsBackLaterRequestsInItsFirstSubtree) {
  for (const char* later_path : {"/a/x", "/a"}) {
    SCOPED_TRACE(later_path);
    Probe h1(rules::path("/a"), "h1"), h2(rules::path("/b"), "h2");
    Probe multi(rules::combine(rules::path("/a/x"), rules::path("/b/y")), "multi");
    Probe later(rules::path(later_path), "later");
    ASSERT_TRUE(acquire(h1));
    ASSERT_TRUE(acquire(h2));
    EXPECT_FALSE(acquire(multi));
    EXPECT_FALSE(acquire(later));
    table_.leave(h1);
    EXPECT_EQ(multi.grants, 0) << "/b is still held";
    EXPECT_EQ(later.grants, 0) << "the multi rule asked first and conflicts with it in /a";
    table_.leave(h2);
    EXPECT_EQ(multi.grants, 1);
    EXPECT_EQ(later.grants, 0);
    table_.leave(multi);
    EXPECT_EQ(later.grants, 1);
    table_.leave(later);
  }
}

// FIFO carries from subtree to subtree: a multi rule over /b and /c waits behind an earlier one
// over /a and /b, and a request on /c behind it, though /b and /c are free of holders.
TEST_F(RuleTableShardsTest, FifoCarriesAcrossAChainOfMultiRules) {
  Probe holder(rules::path("/a"), "holder");
  Probe first(rules::combine(rules::path("/a/x"), rules::path("/b/y")), "first");
  Probe second(rules::combine(rules::path("/b/y"), rules::path("/c/z")), "second");
  Probe last(rules::path("/c/z"), "last"), free(rules::path("/c/w"), "free");
  ASSERT_TRUE(acquire(holder));
  EXPECT_FALSE(acquire(first));
  EXPECT_FALSE(acquire(second)) << "behind `first` in /b";
  EXPECT_FALSE(acquire(last)) << "behind `second` in /c";
  EXPECT_TRUE(acquire(free));
  table_.leave(holder);
  EXPECT_EQ(first.grants, 1);
  EXPECT_EQ(second.grants, 0);
  EXPECT_EQ(last.grants, 0);
  table_.leave(first);
  EXPECT_EQ(second.grants, 1);
  EXPECT_EQ(last.grants, 0);
  table_.leave(second);
  EXPECT_EQ(last.grants, 1);
  table_.leave(last);
  table_.leave(free);
}

// Two multi rules over the same subtrees, named in opposite orders: one holds, the other waits for
// it and then holds, whatever order the table visits the subtrees in.
TEST_F(RuleTableShardsTest, MultiRulesOverTheSameSubtreesInOppositeOrdersTakeTurns) {
  Probe ab(rules::combine(rules::path("/a/1"), rules::path("/b/1")), "ab");
  Probe ba(rules::combine(rules::path("/b/1"), rules::path("/a/1")), "ba");
  Probe ab_again(rules::combine(rules::path("/a/1"), rules::path("/b/1")), "ab again");
  EXPECT_TRUE(acquire(ab));
  EXPECT_FALSE(acquire(ba));
  EXPECT_FALSE(acquire(ab_again));
  table_.leave(ab);
  EXPECT_EQ(ba.grants, 1);
  EXPECT_EQ(ab_again.grants, 0);
  table_.leave(ba);
  EXPECT_EQ(ab_again.grants, 1);
  table_.leave(ab_again);
}

// ---------------------------------------------------------------------------------------------
// A rule on the root

// A writer of "/" waits for holders in several subtrees, and meanwhile every newcomer below the
// root waits behind it, in subtrees that are free, held or never seen before; mutexes and named
// mutexes are no part of the root.
TEST_F(RuleTableShardsTest, ARuleOnTheRootWaitsForEverySubtreeAndHoldsBackNewcomersInAll) {
  Probe a(rules::path("/a"), "a"), b(rules::path("/b/x"), "b");
  Probe root(rules::path("/"), "root");
  ASSERT_TRUE(acquire(a));
  ASSERT_TRUE(acquire(b));
  EXPECT_FALSE(acquire(root));
  EXPECT_EQ(named(table_.blockers(root)), (Names{"a holds", "b holds"}));
  Probe in_a(rules::path("/a/y"), "in a"), in_b(rules::path("/b"), "in b"), free(rules::path("/c"), "free");
  Probe fresh(rules::path("/fresh/new"), "fresh"), reader(rules::read_path("/d"), "reader");
  Probe lock(rules::mutex("lock"), "lock"), name(rules::named_mutex("name"), "name");
  EXPECT_FALSE(acquire(in_a));
  EXPECT_FALSE(acquire(in_b));
  EXPECT_FALSE(acquire(free)) << "/c is free of holders, but the root asked first";
  EXPECT_FALSE(acquire(fresh)) << "a subtree nobody used before is below the root too";
  EXPECT_FALSE(acquire(reader)) << "a reader below a waiting writer of the root";
  EXPECT_TRUE(acquire(lock)) << "a mutex rule is no part of the root";
  EXPECT_TRUE(acquire(name)) << "nor is a named mutex";
  EXPECT_EQ(named(table_.blockers(free)), (Names{"root waits"}));
  table_.leave(a);
  EXPECT_EQ(root.grants, 0) << "/b/x is still held";
  EXPECT_EQ(in_a.grants, 0) << "/a is free, but the root asked first";
  table_.leave(b);
  EXPECT_EQ(root.grants, 1);
  for (Probe* probe : {&in_a, &in_b, &free, &fresh, &reader}) EXPECT_EQ(probe->grants, 0) << probe->name;
  Probe during(rules::path("/e"), "during");
  EXPECT_FALSE(acquire(during)) << "the root is held";
  table_.leave(root);
  for (Probe* probe : {&in_a, &in_b, &free, &fresh, &reader, &during}) {
    EXPECT_EQ(probe->grants, 1) << probe->name;
    table_.leave(*probe);
  }
  table_.leave(lock);
  table_.leave(name);
  // With the root free, subtrees go on without each other again.
  Probe left(rules::path("/a"), "left"), right(rules::path("/b"), "right");
  EXPECT_TRUE(acquire(left));
  EXPECT_TRUE(acquire(right));
  table_.leave(left);
  table_.leave(right);
}

// A reader of "/" waiting for a writer below it lets readers anywhere through and holds back
// writers anywhere, in the subtree it waits in and in others.
TEST_F(RuleTableShardsTest, AReaderOfTheRootHoldsBackWritersInEverySubtreeOnly) {
  Probe writer(rules::path("/a/w"), "writer"), read_all(rules::read_path("/"), "read all");
  ASSERT_TRUE(acquire(writer));
  EXPECT_FALSE(acquire(read_all));
  Probe read_b(rules::read_path("/b"), "read b"), read_fresh(rules::read_path("/fresh"), "read fresh");
  Probe write_c(rules::path("/c"), "write c"), write_a(rules::path("/a/v"), "write a");
  EXPECT_TRUE(acquire(read_b)) << "readers share with a waiting reader of the root";
  EXPECT_TRUE(acquire(read_fresh));
  EXPECT_FALSE(acquire(write_c)) << "behind the waiting reader of the root";
  EXPECT_FALSE(acquire(write_a)) << "behind the waiting reader of the root";
  table_.leave(writer);
  EXPECT_EQ(read_all.grants, 1);
  EXPECT_EQ(write_c.grants + write_a.grants, 0);
  table_.leave(read_all);
  EXPECT_EQ(write_c.grants, 1);
  EXPECT_EQ(write_a.grants, 1);
  for (Probe* probe : {&read_b, &read_fresh, &write_c, &write_a}) table_.leave(*probe);
}

// ---------------------------------------------------------------------------------------------
// Multi rules over several mutexes

TEST_F(RuleTableShardsTest, AMultiRuleOverMutexesExcludesAndQueuesAtEachOfThem) {
  const Rule m1 = rules::mutex("m1"), m2 = rules::mutex("m2"), m3 = rules::mutex("m3");
  const Rule both = rules::combine(m1, m2);
  Probe holder(m1, "holder"), multi(both, "multi"), on_m2(m2, "on m2"), on_m3(m3, "on m3");
  ASSERT_TRUE(acquire(holder));
  EXPECT_FALSE(acquire(multi));
  EXPECT_FALSE(acquire(on_m2)) << "m2 is free, but the multi rule asked for it first";
  EXPECT_TRUE(acquire(on_m3));
  table_.leave(holder);
  EXPECT_EQ(multi.grants, 1);
  EXPECT_EQ(on_m2.grants, 0);
  Probe on_m1(m1, "on m1");
  EXPECT_FALSE(acquire(on_m1)) << "the multi rule holds m1";
  table_.leave(multi);
  EXPECT_EQ(on_m2.grants, 1);
  EXPECT_EQ(on_m1.grants, 1);
  for (Probe* probe : {&on_m1, &on_m2, &on_m3}) table_.leave(*probe);
}

// The mirror, with the holder on the second mutex, and two multi rules over both in opposite
// orders.
TEST_F(RuleTableShardsTest, MultiRulesOverMutexesInEitherOrderKeepFifo) {
  const Rule m1 = rules::mutex("m1"), m2 = rules::mutex("m2");
  Probe holder(m2, "holder"), forward(rules::combine(m1, m2), "forward"), on_m1(m1, "on m1");
  Probe backward(rules::combine(m2, m1), "backward");
  ASSERT_TRUE(acquire(holder));
  EXPECT_FALSE(acquire(forward));
  EXPECT_FALSE(acquire(on_m1)) << "m1 is free, but `forward` asked for it first";
  EXPECT_FALSE(acquire(backward));
  table_.leave(holder);
  EXPECT_EQ(forward.grants, 1);
  EXPECT_EQ(on_m1.grants + backward.grants, 0);
  table_.leave(forward);
  EXPECT_EQ(on_m1.grants, 1);
  EXPECT_EQ(backward.grants, 0) << "behind `on_m1` at m1";
  table_.leave(on_m1);
  EXPECT_EQ(backward.grants, 1);
  table_.leave(backward);
}

// Named mutexes are one lock per name, whichever object asks: a multi rule over two names queues
// at each name, ahead of later objects of those names.
TEST_F(RuleTableShardsTest, AMultiRuleOverNamedMutexesQueuesAtEachName) {
  Probe holder(rules::named_mutex("n1"), "holder");
  Probe multi(rules::combine(rules::named_mutex("n1"), rules::named_mutex("n2")), "multi");
  Probe later_n2(rules::named_mutex("n2"), "later n2"), other(rules::named_mutex("n3"), "other");
  ASSERT_TRUE(acquire(holder));
  EXPECT_FALSE(acquire(multi));
  EXPECT_FALSE(acquire(later_n2)) << "another object of a name the multi rule asked for first";
  EXPECT_TRUE(acquire(other));
  table_.leave(holder);
  EXPECT_EQ(multi.grants, 1);
  EXPECT_EQ(later_n2.grants, 0);
  table_.leave(multi);
  EXPECT_EQ(later_n2.grants, 1);
  table_.leave(later_n2);
  table_.leave(other);
}

// ---------------------------------------------------------------------------------------------
// Custom rules

// A custom rule that conflicts only with paths under /c1 (and its colour): it waits for a holder
// there and holds back later requests there, and nowhere else.
TEST_F(RuleTableShardsTest, ACustomRuleWaitsAndQueuesOnlyWhereItConflicts) {
  Probe holder(rules::path("/c1/x"), "holder"), custom(std::make_shared<ColourRule>(1), "custom");
  Probe later(rules::path("/c1/y"), "later"), elsewhere(rules::path("/d"), "elsewhere");
  Probe other_colour(rules::path("/c2/z"), "other colour"), lock(rules::mutex("lock"), "lock");
  Probe same_colour(std::make_shared<ColourRule>(1), "same colour");
  Probe unrelated_custom(std::make_shared<ColourRule>(3), "unrelated custom");
  ASSERT_TRUE(acquire(holder));
  EXPECT_FALSE(acquire(custom));
  EXPECT_FALSE(acquire(later)) << "/c1/y is free, but the custom rule asked first";
  EXPECT_TRUE(acquire(elsewhere));
  EXPECT_TRUE(acquire(other_colour));
  EXPECT_TRUE(acquire(lock));
  EXPECT_FALSE(acquire(same_colour));
  EXPECT_TRUE(acquire(unrelated_custom));
  table_.leave(holder);
  EXPECT_EQ(custom.grants, 1);
  EXPECT_EQ(later.grants + same_colour.grants, 0);
  Probe under_held(rules::path("/c1"), "under held");
  EXPECT_FALSE(acquire(under_held)) << "a path waits for a held custom rule";
  table_.leave(custom);
  EXPECT_EQ(later.grants, 1);
  EXPECT_EQ(same_colour.grants, 0) << "colour 1 conflicts with /c1/y, which asked earlier";
  EXPECT_EQ(under_held.grants, 0);
  table_.leave(later);
  EXPECT_EQ(same_colour.grants, 1);
  EXPECT_EQ(under_held.grants, 0) << "behind `same colour`";
  table_.leave(same_colour);
  EXPECT_EQ(under_held.grants, 1);
  for (Probe* probe : {&under_held, &elsewhere, &other_colour, &lock, &unrelated_custom})
    table_.leave(*probe);
}

// ---------------------------------------------------------------------------------------------
// Counts and readings

TEST_F(RuleTableShardsTest, ARequestOverSeveralSubtreesCountsOnce) {
  Probe multi(rules::combine(rules::path("/a/x"), rules::path("/b/y")), "multi");
  Probe locks(rules::combine(rules::mutex("m1"), rules::mutex("m2")), "locks");
  ASSERT_TRUE(acquire(multi));
  ASSERT_TRUE(acquire(locks));
  EXPECT_EQ(table_.held_count(), 2u);
  EXPECT_EQ(table_.waiting_count(), 0u);
  Probe behind(rules::combine(rules::path("/a/x"), rules::path("/c")), "behind");
  Probe root(rules::path("/"), "root");
  EXPECT_FALSE(acquire(behind));
  EXPECT_EQ(table_.waiting_count(), 1u);
  EXPECT_FALSE(acquire(root));
  EXPECT_EQ(table_.held_count(), 2u);
  EXPECT_EQ(table_.waiting_count(), 2u);
  EXPECT_FALSE(table_.is_idle());
  table_.leave(multi);
  EXPECT_EQ(behind.grants, 1);
  EXPECT_EQ(table_.held_count(), 2u);
  EXPECT_EQ(table_.waiting_count(), 1u);
  table_.leave(behind);
  EXPECT_EQ(root.grants, 1);
  EXPECT_EQ(table_.held_count(), 2u);
  EXPECT_EQ(table_.waiting_count(), 0u);
  table_.leave(root);
  table_.leave(locks);
  EXPECT_EQ(table_.held_count(), 0u);
  EXPECT_EQ(table_.waiting_count(), 0u);
  EXPECT_TRUE(table_.is_idle());
}

// blockers(), blockers_of(), snapshot() and wait_chain() see a waiting multi rule once, and name
// each holder it waits for once.
TEST_F(RuleTableShardsTest, ReadingsSeeAMultiRuleOnceAndEachOfItsHolders) {
  Probe h1(rules::path("/a"), "h1"), h2(rules::path("/b"), "h2");
  Probe multi(rules::combine(rules::path("/a/x"), rules::path("/b/y")), "multi");
  Probe later(rules::path("/b/y"), "later");
  ASSERT_TRUE(acquire(h1));
  ASSERT_TRUE(acquire(h2));
  EXPECT_FALSE(acquire(multi));
  EXPECT_FALSE(acquire(later));
  EXPECT_EQ(named(table_.blockers(multi)), (Names{"h1 holds", "h2 holds"}));
  EXPECT_EQ(named(table_.blockers_of(&multi)), (Names{"h1 holds", "h2 holds"}));
  EXPECT_EQ(named(table_.blockers(later)), (Names{"h2 holds", "multi waits"}));
  EXPECT_TRUE(table_.blockers(h1).empty()) << "a holder waits for nobody";

  std::size_t left_out = 99;
  const std::vector<RuleTable::Seen> seen = table_.snapshot(16, left_out);
  EXPECT_EQ(left_out, 0u);
  ASSERT_EQ(seen.size(), 4u) << "two holders and two waiters, each once";
  EXPECT_TRUE(seen[0].who.holds && seen[1].who.holds);
  EXPECT_FALSE(seen[2].who.holds || seen[3].who.holds);
  const auto find = [&seen](const Probe& probe) {
    EXPECT_EQ(
        std::count_if(seen.begin(), seen.end(), [&](const RuleTable::Seen& s) { return s.owner == &probe; }),
        1)
        << probe.name;
    return std::find_if(seen.begin(), seen.end(),
                        [&](const RuleTable::Seen& s) { return s.owner == &probe; });
  };
  const auto seen_h1 = find(h1), seen_h2 = find(h2), seen_multi = find(multi), seen_later = find(later);
  ASSERT_TRUE(seen_h1 != seen.end() && seen_h2 != seen.end() && seen_multi != seen.end() &&
              seen_later != seen.end());
  EXPECT_EQ(seen_multi - seen.begin(), 2) << "the waiters in ticket order";
  EXPECT_EQ(seen_later - seen.begin(), 3);
  EXPECT_TRUE(RuleTable::conflict(*seen_multi, *seen_h1));
  EXPECT_TRUE(RuleTable::conflict(*seen_multi, *seen_h2));
  EXPECT_TRUE(RuleTable::conflict(*seen_later, *seen_multi));
  EXPECT_FALSE(RuleTable::conflict(*seen_h1, *seen_h2));
  EXPECT_FALSE(RuleTable::conflict(*seen_later, *seen_h1));
  const std::vector<RuleTable::Seen> first_waiter = table_.snapshot(1, left_out);
  EXPECT_EQ(left_out, 1u);
  ASSERT_EQ(first_waiter.size(), 3u);
  EXPECT_EQ(first_waiter[2].owner, &multi) << "the earliest waiter";

  // From the later request in /b, through the multi rule, to the holder in /a.
  const RuleRequest* mine[] = {&h1};
  const std::vector<RuleBlocker> chain =
      table_.wait_chain([&](const RuleRequest& request) { return &request == &later; }, mine, 16);
  Names steps;
  for (const RuleBlocker& step : chain) steps.push_back(step.owner + (step.holds ? " holds" : " waits"));
  EXPECT_EQ(steps, (Names{"later waits", "multi waits", "h1 holds"}));

  table_.leave(h1);
  table_.leave(h2);
  EXPECT_EQ(multi.grants, 1);
  EXPECT_TRUE(table_.blockers(multi).empty()) << "granted";
  EXPECT_EQ(named(table_.blockers(later)), (Names{"multi holds"}));
  table_.leave(multi);
  EXPECT_EQ(later.grants, 1);
  table_.leave(later);
}

// A waiting multi rule conflicts with each of its holders: has_conflicting_waiter says so for
// both, and not for a holder beside it in the same subtree.
TEST_F(RuleTableShardsTest, EachHolderAMultiRuleWaitsForHasAConflictingWaiter) {
  Probe h1(rules::path("/a"), "h1"), h2(rules::path("/b"), "h2"), beside(rules::path("/c/z"), "beside");
  Probe multi(rules::combine({rules::path("/a/x"), rules::path("/b/y"), rules::path("/c/y")}), "multi");
  ASSERT_TRUE(acquire(h1));
  ASSERT_TRUE(acquire(h2));
  ASSERT_TRUE(acquire(beside));
  EXPECT_FALSE(table_.has_conflicting_waiter(h2)) << "nobody waits yet";
  EXPECT_FALSE(acquire(multi));
  EXPECT_TRUE(table_.has_conflicting_waiter(h2));
  EXPECT_TRUE(table_.has_conflicting_waiter(h1));
  EXPECT_FALSE(table_.has_conflicting_waiter(beside)) << "/c/z and /c/y do not conflict";
  table_.leave(h1);
  EXPECT_TRUE(table_.has_conflicting_waiter(h2)) << "still waits for /b";
  EXPECT_TRUE(table_.withdraw(multi));
  EXPECT_FALSE(table_.has_conflicting_waiter(h2));
  table_.leave(h2);
  table_.leave(beside);
}

// hand_over() moves a held multi rule's place in every subtree at once: what waits for it goes on
// waiting, for the new holder, and is let through when that one leaves.
TEST_F(RuleTableShardsTest, HandingOverAMultiRuleKeepsItsPlaceInEverySubtree) {
  const Rule rule = rules::combine(rules::path("/a/x"), rules::path("/b/y"));
  Probe from(rule, "from"), to(rule, "to");
  Probe in_a(rules::path("/a"), "in a"), in_b(rules::path("/b/y"), "in b");
  ASSERT_TRUE(acquire(from));
  EXPECT_FALSE(acquire(in_a));
  EXPECT_FALSE(acquire(in_b));
  table_.hand_over(from, to);
  EXPECT_EQ(table_.held_count(), 1u);
  EXPECT_EQ(table_.waiting_count(), 2u);
  EXPECT_EQ(in_a.grants + in_b.grants, 0) << "the rule was never free";
  EXPECT_EQ(named(table_.blockers(in_b)), (Names{"to holds"}));
  Probe newcomer(rules::path("/b"), "newcomer");
  EXPECT_FALSE(acquire(newcomer)) << "`to` holds /b/y";
  table_.leave(to);
  EXPECT_EQ(in_a.grants, 1);
  EXPECT_EQ(in_b.grants, 1);
  EXPECT_EQ(newcomer.grants, 0) << "behind `in b`";
  table_.leave(in_b);
  EXPECT_EQ(newcomer.grants, 1);
  EXPECT_EQ(from.grants + from.cancels + to.grants + to.cancels, 0) << "hand_over tells nobody";
  table_.leave(in_a);
  table_.leave(newcomer);
}

// ---------------------------------------------------------------------------------------------
// Withdrawals and cancellation

// A multi rule waiting in /a and clear in /b holds back a later request in /b by FIFO alone:
// withdrawing it lets that one through at once.
TEST_F(RuleTableShardsTest, WithdrawingAMultiRuleLetsThroughWhatWaitedOnlyBehindIt) {
  Probe holder(rules::path("/a"), "holder"), beside(rules::path("/b/z"), "beside");
  Probe multi(rules::combine(rules::path("/a/x"), rules::path("/b/y")), "multi");
  Probe later(rules::path("/b/y"), "later"), in_a(rules::path("/a/x"), "in a");
  ASSERT_TRUE(acquire(holder));
  ASSERT_TRUE(acquire(beside));
  EXPECT_FALSE(acquire(multi));
  EXPECT_FALSE(acquire(later));
  EXPECT_FALSE(acquire(in_a));
  EXPECT_TRUE(table_.withdraw(multi));
  EXPECT_EQ(later.grants, 1) << "it waited for nothing but the multi rule";
  EXPECT_EQ(in_a.grants, 0) << "still waits for the holder of /a";
  EXPECT_FALSE(table_.withdraw(later)) << "granted";
  EXPECT_FALSE(table_.withdraw(multi)) << "out of the table";
  EXPECT_EQ(table_.waiting_count(), 1u);
  table_.leave(holder);
  EXPECT_EQ(in_a.grants, 1);
  EXPECT_EQ(multi.grants + multi.cancels, 0) << "withdraw() tells nobody";
  for (Probe* probe : {&beside, &later, &in_a}) table_.leave(*probe);
}

TEST_F(RuleTableShardsTest, WithdrawingWaitingMultiRulesCountsEachRequestOnce) {
  const Rule multi = rules::combine(rules::path("/a/x"), rules::path("/b/y"));
  const Rule same_text = rules::combine(rules::path("/a/x"), rules::path("/b/y"));  // another object
  Probe holder(rules::path("/a"), "holder");
  Probe first(multi, "first"), second(multi, "second"), third(same_text, "third"), held(multi, "held");
  Probe later(rules::path("/b/y"), "later");
  ASSERT_TRUE(acquire(holder));
  EXPECT_FALSE(acquire(first));
  EXPECT_FALSE(acquire(second));
  EXPECT_FALSE(acquire(third));
  EXPECT_FALSE(acquire(later));
  EXPECT_EQ(table_.withdraw_waiting(*multi, [](const RuleRequest&) { return true; }), 2u)
      << "the same object only";
  EXPECT_EQ(first.cancels, 1);
  EXPECT_EQ(second.cancels, 1);
  EXPECT_EQ(third.cancels, 0);
  EXPECT_EQ(later.grants, 0) << "still behind `third`";
  EXPECT_EQ(table_.withdraw_waiting(*same_text, [&](const RuleRequest& r) { return &r == &third; }), 1u);
  EXPECT_EQ(third.cancels, 1);
  EXPECT_EQ(later.grants, 1);
  table_.leave(later);
  table_.leave(holder);
  // A held request for the rule is not waiting: it is not withdrawn.
  ASSERT_TRUE(acquire(held));
  EXPECT_EQ(table_.withdraw_waiting(*multi, [](const RuleRequest&) { return true; }), 0u);
  EXPECT_EQ(held.cancels, 0);
  table_.leave(held);
  for (Probe* probe : {&first, &second, &third}) {
    EXPECT_EQ(probe->grants, 0) << probe->name;
    EXPECT_EQ(probe->cancels, 1) << probe->name;
  }
}

TEST_F(RuleTableShardsTest, WithdrawingWaitingRequestsThatSpanSubtreesAndMutexesCountsEachOnce) {
  const Rule m1 = rules::mutex("m1"), m2 = rules::mutex("m2"), m3 = rules::mutex("m3");
  Probe on_a(rules::path("/a"), "on a"), on_m1(m1, "on m1"), on_m3(m3, "on m3");
  Probe paths(rules::combine(rules::path("/a/x"), rules::path("/b/y")), "paths");
  Probe locks(rules::combine(m1, m2), "locks");
  Probe root(rules::path("/"), "root");
  // Each of these waits for a holder, so that withdrawing the others never lets it through.
  Probe mixed(rules::combine({rules::path("/c/x"), m2, m3}), "mixed");
  ASSERT_TRUE(acquire(on_a));
  ASSERT_TRUE(acquire(on_m1));
  ASSERT_TRUE(acquire(on_m3));
  EXPECT_FALSE(acquire(paths));
  EXPECT_FALSE(acquire(locks));
  EXPECT_FALSE(acquire(root));
  EXPECT_FALSE(acquire(mixed)) << "waits for m3, and behind `locks` at m2";
  Probe after_b(rules::path("/b/y"), "after b"), after_m2(m2, "after m2"),
      after_c(rules::path("/c"), "after c");
  EXPECT_FALSE(acquire(after_b));
  EXPECT_FALSE(acquire(after_m2));
  EXPECT_FALSE(acquire(after_c));
  const std::vector<const Probe*> spanning{&paths, &locks, &root, &mixed};
  int asked = 0;
  const std::size_t withdrawn = table_.withdraw_waiting_if([&](const RuleRequest& request) {
    ++asked;
    return std::find(spanning.begin(), spanning.end(), &request) != spanning.end() ||
           &request == &on_a;  // held: never withdrawn, whatever the predicate says
  });
  EXPECT_EQ(withdrawn, 4u);
  EXPECT_GE(asked, 7) << "every waiting request was considered";
  for (const Probe* probe : spanning) {
    EXPECT_EQ(probe->cancels, 1) << probe->name;
    EXPECT_EQ(probe->grants, 0) << probe->name;
  }
  EXPECT_EQ(on_a.cancels, 0);
  EXPECT_EQ(after_b.grants, 1) << "it waited only behind `paths` and `root`";
  EXPECT_EQ(after_m2.grants, 1) << "it waited only behind `locks` and `mixed`";
  EXPECT_EQ(after_c.grants, 1) << "it waited only behind `root` and `mixed`";
  EXPECT_EQ(table_.waiting_count(), 0u);
  for (Probe* probe : {&on_a, &on_m1, &on_m3, &after_b, &after_m2, &after_c}) table_.leave(*probe);
}

// Withdrawals go in ticket order: withdrawing an earlier multi rule lets a later accepted request
// through, which then is granted, not withdrawn, and not counted.
TEST_F(RuleTableShardsTest, ARequestThatAnEarlierWithdrawalLetsThroughIsGrantedInstead) {
  Probe holder(rules::path("/a"), "holder");
  Probe multi(rules::combine(rules::path("/a/x"), rules::path("/b/y")), "multi");
  Probe later(rules::path("/b/y"), "later"), stuck(rules::path("/a/x"), "stuck");
  ASSERT_TRUE(acquire(holder));
  EXPECT_FALSE(acquire(multi));
  EXPECT_FALSE(acquire(later)) << "behind `multi` in /b";
  EXPECT_FALSE(acquire(stuck)) << "waits for the holder of /a";
  EXPECT_EQ(table_.withdraw_waiting_if([](const RuleRequest&) { return true; }), 2u) << "`multi` and `stuck`";
  EXPECT_EQ(multi.cancels, 1);
  EXPECT_EQ(stuck.cancels, 1);
  EXPECT_EQ(later.grants, 1);
  EXPECT_EQ(later.cancels, 0);
  EXPECT_EQ(table_.waiting_count(), 0u);
  table_.leave(later);
  table_.leave(holder);
  EXPECT_EQ(multi.grants + stuck.grants, 0);
}

// cancel_all_waiting() cancels a multi rule once (closed(), by default canceled()), and frees the
// subtree where it was clear already.
TEST_F(RuleTableShardsTest, CancellingAllWaitersCancelsAMultiRuleOnceAndFreesEverySubtree) {
  const Rule m1 = rules::mutex("m1"), m2 = rules::mutex("m2");
  Probe holder(rules::path("/a"), "holder"), lock_holder(m1, "lock holder");
  Probe multi(rules::combine(rules::path("/a/x"), rules::path("/b/y")), "multi");
  Probe locks(rules::combine(m1, m2), "locks");
  Probe in_a(rules::path("/a/q"), "in a");
  ASSERT_TRUE(acquire(holder));
  ASSERT_TRUE(acquire(lock_holder));
  EXPECT_FALSE(acquire(multi));
  EXPECT_FALSE(acquire(locks));
  EXPECT_FALSE(acquire(in_a));
  table_.cancel_all_waiting();
  for (Probe* probe : {&multi, &locks, &in_a}) {
    EXPECT_EQ(probe->cancels, 1) << probe->name;
    EXPECT_EQ(probe->grants, 0) << probe->name;
  }
  EXPECT_EQ(table_.waiting_count(), 0u);
  EXPECT_EQ(table_.held_count(), 2u);
  Probe all_of_b(rules::path("/b"), "all of b"), on_m2(m2, "on m2");
  EXPECT_TRUE(acquire(all_of_b)) << "the canceled multi rule left nothing in /b";
  EXPECT_TRUE(acquire(on_m2)) << "the canceled multi rule left nothing at m2";
  table_.leave(holder);
  table_.leave(lock_holder);
  for (Probe* probe : {&multi, &locks, &in_a}) {
    EXPECT_EQ(probe->cancels, 1) << probe->name;
    EXPECT_EQ(probe->grants, 0) << probe->name;
  }
  table_.leave(all_of_b);
  table_.leave(on_m2);
}

// ---------------------------------------------------------------------------------------------
// Threads

// Four threads hold rules over three subtrees, multi rules across two of them and the root, with
// blocking waits; a checker sees every hold and asserts that no two conflicting rules are held at
// once. Every thread's first request waits behind a rule on the root held by this thread.
TEST_F(RuleTableShardsTest, ThreadsNeverHoldConflictingRulesAtOnce) {
  const std::vector<Rule> pool = {
      rules::path("/a"),
      rules::path("/a/0"),
      rules::path("/a/1"),
      rules::read_path("/a"),
      rules::path("/b"),
      rules::path("/b/0"),
      rules::path("/b/1"),
      rules::read_path("/b/1"),
      rules::path("/c"),
      rules::path("/c/0"),
      rules::path("/c/1"),
      rules::combine(rules::path("/a/0"), rules::path("/b/1")),
      rules::combine(rules::path("/a/1"), rules::path("/b/0")),
      rules::combine(rules::path("/b/0"), rules::path("/a")),
      rules::combine(rules::path("/c/1"), rules::path("/b")),
      rules::combine(rules::read_path("/a"), rules::path("/c/0")),
      rules::path("/"),
      rules::read_path("/"),
  };
  struct Checker {
    std::mutex mutex;
    std::vector<const Rule*> held;
    int violations = 0;
    std::string first;
    void take(const Rule& rule) {
      const std::lock_guard lock(mutex);
      for (const Rule* other : held) {
        if (conflict(rule, *other) && violations++ == 0)
          first = rule->to_string() + " and " + (*other)->to_string();
      }
      held.push_back(&rule);
    }
    void drop(const Rule& rule) {
      const std::lock_guard lock(mutex);
      held.erase(std::find(held.begin(), held.end(), &rule));
    }
  } checker;
  constexpr int threads = 4;
  constexpr int holds = 2000;
  const Rule root_rule = rules::path("/");
  Probe root(root_rule, "root");
  ASSERT_TRUE(acquire(root));
  checker.take(root_rule);
  std::atomic<int> granted{0}, waited{0}, refused{0};
  std::latch go(threads + 1);
  std::latch queued(threads);  // each thread's first request waits behind the root
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 random(static_cast<unsigned>(t) + 1);
      go.arrive_and_wait();
      for (int i = 0; i < holds; ++i) {
        const Rule& rule = pool[std::uniform_int_distribution<std::size_t>(0, pool.size() - 1)(random)];
        ThreadHold* hold = ThreadHold::take(rule, false);
        const bool at_once = hold->try_enter(table_);
        if (!at_once) waited.fetch_add(1, std::memory_order_relaxed);
        if (i == 0) queued.count_down();
        const ThreadHold::Answer answer = at_once ? hold->answer() : hold->wait(nullptr, false);
        if (answer != ThreadHold::Answer::granted) {
          refused.fetch_add(1, std::memory_order_relaxed);
          ThreadHold::recycle(hold);
          continue;
        }
        checker.take(rule);
        std::this_thread::yield();  // room for a wrongly granted rule to overlap
        checker.drop(rule);
        granted.fetch_add(1, std::memory_order_relaxed);
        ThreadHold::finish(hold, table_);
      }
    });
  }
  go.arrive_and_wait();
  // Every pool rule is below the root: each thread's first request waits for it.
  queued.wait();
  EXPECT_EQ(table_.waiting_count(), static_cast<std::size_t>(threads));
  checker.drop(root_rule);
  table_.leave(root);
  for (std::thread& worker : workers) worker.join();
  EXPECT_EQ(checker.violations, 0) << "held at once: " << checker.first;
  EXPECT_EQ(refused.load(), 0);
  EXPECT_EQ(granted.load(), threads * holds);
  EXPECT_GE(waited.load(), threads);
  RecordProperty("waited", waited.load());
  EXPECT_EQ(table_.held_count(), 0u);
  EXPECT_EQ(table_.waiting_count(), 0u);
}

}  // namespace
}  // namespace tasklet::detail
