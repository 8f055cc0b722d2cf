// The rule table on its own: FIFO grants, hierarchical exclusion, shared reads, multi and custom
// rules, and a randomized comparison against a from-scratch reference model.
#include "table/rule_table.hpp"

#include "scheduler/domain.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <latch>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <oneapi/tbb/scalable_allocator.h>

#include "support/table_probe.hpp"
#include "support/test_support.hpp"
#include "tasklet/rules/rules.hpp"

namespace tasklet::detail {
namespace {

using test::ColourRule;
using test::Probe;

// Enters `probe` in `table`; true when enter() granted it there and then (on this thread, with
// nobody else in the table's lock), a grant its count then leaves out: `grants` counts the grants
// that came later, from releases.
bool acquire_in(RuleTable& table, Probe& probe) {
  const int before = probe.grants;
  table.enter(probe);
  if (probe.grants == before) return false;
  --probe.grants;
  return true;
}

class RuleTableTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_TRUE(table_.is_idle()); }
  bool acquire(Probe& probe) { return acquire_in(table_, probe); }
  // Enters a thread's request; true when it was granted there and then.
  bool enter_and_hold(ThreadHold& hold) {
    table_.enter(hold);  // its granted() wakes nobody: this thread does not wait for it
    return hold.is_held();
  }
  // Takes and releases `rule` with a thread's request, which is then recycled.
  void begin_and_end_once(const Rule& rule) {
    ThreadHold* hold = ThreadHold::take(rule, false);
    EXPECT_EQ(hold->enter(table_), ThreadHold::Answer::granted);
    EXPECT_FALSE(table_.leave(*hold));
    ThreadHold::recycle(hold);
  }
  RuleTable table_;
};

TEST_F(RuleTableTest, MutexRequestsAreGrantedInOrder) {
  const Rule light = rules::mutex("light");
  Probe on(light), off(light), again(light);
  EXPECT_TRUE(acquire(on));
  EXPECT_FALSE(acquire(off));
  EXPECT_FALSE(acquire(again));
  table_.leave(on);
  EXPECT_EQ(off.grants, 1);
  EXPECT_EQ(again.grants, 0);
  table_.leave(off);
  EXPECT_EQ(again.grants, 1);
  table_.leave(again);
}

TEST_F(RuleTableTest, DistinctMutexesDoNotWait) {
  Probe a(rules::mutex("a")), b(rules::mutex("b"));
  EXPECT_TRUE(acquire(a));
  EXPECT_TRUE(acquire(b));
  table_.leave(a);
  table_.leave(b);
}

TEST_F(RuleTableTest, NamedMutexesOfOneNameAreOneLockApartFromPathsAndTheRoot) {
  Probe first(rules::named_mutex("t1")), second(rules::named_mutex("t1")), other(rules::named_mutex("t2"));
  Probe root(rules::path("/")), same_text(rules::path("/t1"));
  EXPECT_TRUE(acquire(first));
  EXPECT_FALSE(acquire(second)) << "another object of the same name";
  EXPECT_TRUE(acquire(other));
  EXPECT_TRUE(acquire(root)) << "a rule on the root claims no name";
  EXPECT_FALSE(acquire(same_text)) << "below the held root";
  table_.leave(first);
  EXPECT_EQ(second.grants, 1);
  table_.leave(root);
  EXPECT_EQ(same_text.grants, 1);
  for (Probe* probe : {&second, &other, &same_text}) table_.leave(*probe);
}

TEST_F(RuleTableTest, DirectoryExcludesItsFilesAndSiblingsRunTogether) {
  Probe project(rules::path("/project")), file(rules::path("/project/src/a.cpp"));
  Probe docs(rules::path("/project/docs")), src(rules::path("/project/src"));
  Probe other(rules::path("/other"));
  EXPECT_TRUE(acquire(project));
  EXPECT_FALSE(acquire(file));
  EXPECT_TRUE(acquire(other));
  table_.leave(project);
  EXPECT_EQ(file.grants, 1);
  EXPECT_TRUE(acquire(docs)) << "a sibling of a held path";
  EXPECT_FALSE(acquire(src)) << "the parent of a held file";
  table_.leave(file);
  EXPECT_EQ(src.grants, 1);
  for (Probe* probe : {&docs, &src, &other}) table_.leave(*probe);
}

TEST_F(RuleTableTest, BroadRuleIsNotOvertakenByLaterNarrowOnes) {
  Probe x(rules::path("/a/x")), all(rules::path("/a")), y(rules::path("/a/y"));
  EXPECT_TRUE(acquire(x));
  EXPECT_FALSE(acquire(all));
  EXPECT_FALSE(acquire(y)) << "/a/y is free, but /a asked first and conflicts with it";
  table_.leave(x);
  EXPECT_EQ(all.grants, 1);
  EXPECT_EQ(y.grants, 0);
  table_.leave(all);
  EXPECT_EQ(y.grants, 1);
  table_.leave(y);
}

// Path requests take their intent on the root only once somebody claims it (a rule on "/"): those
// that entered before, held or waiting, must count there all the same, and later ones wait behind.
TEST_F(RuleTableTest, ARuleOnTheRootCountsThePathsThatEnteredBeforeIt) {
  Probe dir(rules::path("/a")), file(rules::path("/a/f")), reader(rules::read_path("/b/r"));
  EXPECT_TRUE(acquire(dir));
  EXPECT_FALSE(acquire(file));
  EXPECT_TRUE(acquire(reader));
  Probe read_all(rules::read_path("/")), write_all(rules::path("/"));
  EXPECT_FALSE(acquire(read_all)) << "a writer below the root holds";
  Probe later_read(rules::read_path("/e")), later_write(rules::path("/c"));
  EXPECT_TRUE(acquire(later_read)) << "readers share with a waiting reader of the root";
  EXPECT_FALSE(acquire(later_write)) << "a writer comes after the waiting reader of the root";
  EXPECT_FALSE(acquire(write_all));
  table_.leave(dir);
  EXPECT_EQ(file.grants, 1);
  EXPECT_EQ(read_all.grants, 0) << "/a/f, waiting when the root was claimed, is a writer below it";
  table_.leave(file);
  EXPECT_EQ(read_all.grants, 1);
  EXPECT_EQ(later_write.grants, 0);
  table_.leave(read_all);
  EXPECT_EQ(later_write.grants, 1);
  EXPECT_EQ(write_all.grants, 0);
  for (Probe* probe : {&reader, &later_read, &later_write}) table_.leave(*probe);
  EXPECT_EQ(write_all.grants, 1);
  // With the root claimed, a newcomer below it waits; once it is free, paths go without it again.
  Probe below(rules::path("/d/e"));
  EXPECT_FALSE(acquire(below));
  table_.leave(write_all);
  EXPECT_EQ(below.grants, 1);
  Probe sibling(rules::path("/d/g"));
  EXPECT_TRUE(acquire(sibling));
  table_.leave(below);
  table_.leave(sibling);
}

// A multi rule that reads the root and writes below it takes SIX there: another reader of the root
// conflicts with it, though it shares with a plain reader of the root.
TEST_F(RuleTableTest, AMultiRuleThatReadsTheRootAndWritesBelowItExcludesReadersOfTheRoot) {
  Probe mixed(rules::combine(rules::read_path("/"), rules::path("/a/b")));
  Probe reader(rules::read_path("/")), other_reader(rules::read_path("/x"));
  EXPECT_TRUE(acquire(mixed));
  EXPECT_FALSE(acquire(reader));
  table_.leave(mixed);
  EXPECT_EQ(reader.grants, 1);
  EXPECT_TRUE(acquire(other_reader));
  table_.leave(reader);
  table_.leave(other_reader);
}

// The table reads a shared rule's note for each of its requests while every copy of the rule
// writes the rule's counts: the note's block starts a cache line and fills its lines, so no other
// block (the counts are in the same size class) shares them. 32 rules, as a block may start a line
// by chance.
TEST_F(RuleTableTest, ARulesNoteIsOnCacheLinesOfItsOwn) {
  constexpr std::size_t line = 64;
  std::vector<Rule> shared;
  for (int i = 0; i < 32; ++i) {
    shared.push_back(rules::mutex("m" + std::to_string(i)));
    for (int request = 0; request < 2; ++request) {  // the second request makes the note
      Probe probe(shared.back());
      ASSERT_TRUE(acquire(probe));
      table_.leave(probe);
    }
    void* note = SchedulingRule::TableSlot::note(*shared.back(), std::memory_order_acquire);
    ASSERT_NE(note, nullptr) << "the second request notes " << shared.back()->to_string();
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(note) % line, 0u) << shared.back()->to_string();
    EXPECT_EQ(scalable_msize(note) % line, 0u) << shared.back()->to_string();
  }
}

// A rule's second request reuses the nodes its first one found (the rule's note); found while
// nobody claimed the root, they have none there, and it must take one when the root is claimed now.
TEST_F(RuleTableTest, ANotedRuleTakesTheRootIntentWhenTheRootIsClaimed) {
  const Rule rule = rules::path("/a/b");
  begin_and_end_once(rule);
  Probe read_all(rules::read_path("/"));
  ASSERT_TRUE(acquire(read_all));
  ThreadHold* hold = ThreadHold::take(rule, false);
  EXPECT_FALSE(enter_and_hold(*hold)) << "/a/b writes below the root, which is read";
  table_.leave(read_all);
  EXPECT_TRUE(hold->is_held());
  table_.leave(*hold);
  ThreadHold::recycle(hold);
}

TEST_F(RuleTableTest, ReadersShareAndAWriterExcludesThem) {
  Probe r1(rules::read_path("/data")), r2(rules::read_path("/data/x")), w(rules::path("/data/x/y"));
  Probe r3(rules::read_path("/data"));
  EXPECT_TRUE(acquire(r1));
  EXPECT_TRUE(acquire(r2));
  EXPECT_FALSE(acquire(w));
  EXPECT_FALSE(acquire(r3)) << "a reader behind a waiting writer it conflicts with waits (FIFO)";
  table_.leave(r1);
  EXPECT_EQ(w.grants, 0);
  table_.leave(r2);
  EXPECT_EQ(w.grants, 1);
  EXPECT_EQ(r3.grants, 0);
  table_.leave(w);
  EXPECT_EQ(r3.grants, 1);
  table_.leave(r3);
}

TEST_F(RuleTableTest, MultiRulesAreAllOrNothing) {
  const Rule m = rules::mutex("m");
  Probe holder(rules::path("/b")), both(rules::combine(rules::path("/a"), m)), mutex_only(m);
  Probe unrelated(rules::path("/c"));
  EXPECT_TRUE(acquire(holder));
  EXPECT_TRUE(acquire(both));
  EXPECT_FALSE(acquire(mutex_only));
  EXPECT_TRUE(acquire(unrelated));
  table_.leave(both);
  EXPECT_EQ(mutex_only.grants, 1);
  for (Probe* probe : {&holder, &mutex_only, &unrelated}) table_.leave(*probe);
}

TEST_F(RuleTableTest, MultiRuleWaitsUntilEveryPartIsFree) {
  Probe a(rules::path("/a")), b(rules::path("/b")),
      both(rules::combine(rules::path("/a/1"), rules::path("/b/1")));
  EXPECT_TRUE(acquire(a));
  EXPECT_TRUE(acquire(b));
  EXPECT_FALSE(acquire(both));
  table_.leave(a);
  EXPECT_EQ(both.grants, 0);
  table_.leave(b);
  EXPECT_EQ(both.grants, 1);
  table_.leave(both);
}

// A request keeps a few entries in place and the rest in one heap block; a queue slot finds an
// entry past the 255th by its node. Hundreds of parts wait, become clear one by one, and are
// withdrawn or granted once.
TEST_F(RuleTableTest, AMultiRuleOfHundredsOfPartsWaitsAtEachAndIsGrantedOnce) {
  std::vector<Rule> parts;
  for (int i = 0; i < 300; ++i) parts.push_back(rules::mutex("part " + std::to_string(i)));
  const Rule all_parts = rules::combine(std::span<const Rule>(parts));
  Probe first(parts.front()), last(parts.back()), middle(parts[260]);
  Probe withdrawn(all_parts), granted(all_parts), behind_last(parts.back()), behind_middle(parts[260]);
  EXPECT_TRUE(acquire(first));
  EXPECT_TRUE(acquire(last));
  EXPECT_TRUE(acquire(middle));
  EXPECT_FALSE(acquire(withdrawn));  // queued at parts 0, 260 and 299
  EXPECT_FALSE(acquire(behind_last));
  EXPECT_FALSE(acquire(behind_middle));
  table_.leave(last);    // `withdrawn` is clear at part 299 (its 300th entry)
  table_.leave(middle);  // and at part 260, not yet at part 0
  EXPECT_EQ(behind_last.grants + behind_middle.grants, 0);  // it came first
  EXPECT_TRUE(table_.withdraw(withdrawn));
  EXPECT_EQ(behind_last.grants, 1);
  EXPECT_EQ(behind_middle.grants, 1);

  EXPECT_FALSE(acquire(granted));  // queued at parts 0, 260 and 299 again
  table_.leave(behind_last);
  table_.leave(behind_middle);
  EXPECT_EQ(granted.grants, 0);
  table_.leave(first);
  EXPECT_EQ(granted.grants, 1);
  EXPECT_EQ(withdrawn.grants + withdrawn.cancels, 0);
  table_.leave(granted);
  // Every node's counts came back to nothing: each part is free again.
  std::vector<std::unique_ptr<Probe>> again;
  for (const Rule& part : parts) {
    again.push_back(std::make_unique<Probe>(part));
    EXPECT_TRUE(acquire(*again.back())) << part->to_string();
  }
  for (auto& probe : again) table_.leave(*probe);
}

TEST_F(RuleTableTest, CustomRulesAreCheckedPairwiseInBothDirections) {
  const auto red = std::make_shared<ColourRule>(1);
  Probe custom(red), path(rules::path("/c1/file")), free_path(rules::path("/c2/file")), custom_again(red);
  EXPECT_TRUE(acquire(path));
  EXPECT_FALSE(acquire(custom)) << "the custom rule conflicts with a held path";
  EXPECT_TRUE(acquire(free_path));
  EXPECT_FALSE(acquire(custom_again));
  table_.leave(path);
  EXPECT_EQ(custom.grants, 1);
  Probe later_path(rules::path("/c1/other"));
  EXPECT_FALSE(acquire(later_path)) << "a built-in rule waits for a held custom rule";
  table_.leave(custom);
  EXPECT_EQ(custom_again.grants, 1);
  EXPECT_EQ(later_path.grants, 0) << "and for an earlier waiting one (FIFO)";
  table_.leave(custom_again);
  EXPECT_EQ(later_path.grants, 1);
  table_.leave(later_path);
  table_.leave(free_path);
}

// A release rechecks only the requests that the leaving one held back: one held back by two
// holders waits until the last of them has left, whichever leaves first.
TEST_F(RuleTableTest, ACustomRequestHeldBackByTwoWaitsForBoth) {
  const auto red = std::make_shared<ColourRule>(1);
  for (const bool first_leaves_first : {true, false}) {
    Probe first(rules::path("/c1/a")), second(rules::path("/c1/b")), custom(red);
    EXPECT_TRUE(acquire(first));
    EXPECT_TRUE(acquire(second));
    EXPECT_FALSE(acquire(custom));
    table_.leave(first_leaves_first ? first : second);
    EXPECT_EQ(custom.grants, 0) << "one of the two still holds a path it conflicts with";
    table_.leave(first_leaves_first ? second : first);
    EXPECT_EQ(custom.grants, 1);
    table_.leave(custom);
  }
}

// A held rule handed over (transfer_rule) holds back the custom request it held back, in its
// shard and over every shard, and lets it through when the new holder leaves.
TEST_F(RuleTableTest, AHandedOverRuleLetsTheCustomRequestsItHeldBackThrough) {
  const Rule red = std::make_shared<ColourRule>(1);
  const Rule path = rules::path("/c1/file");
  for (const auto& [held, waiting] : {std::pair{path, red}, std::pair{red, path}}) {
    Probe from(held), to(held), waiter(waiting);
    EXPECT_TRUE(acquire(from));
    EXPECT_FALSE(acquire(waiter));
    table_.hand_over(from, to);
    EXPECT_EQ(waiter.grants, 0) << held->to_string();
    table_.leave(to);
    EXPECT_EQ(waiter.grants, 1) << held->to_string();
    table_.leave(waiter);
  }
}

// A user's rule whose check throws when asked about a path rule: the table counts a throwing check
// as a conflict (waiting is safe, running together might not be), in either direction, and stays
// consistent: what waited is granted in order once the holder leaves.
TEST_F(RuleTableTest, ACustomRuleWhoseCheckThrowsCountsAsAConflict) {
  const auto broken = std::make_shared<test::ThrowsOnPathRule>();
  Probe custom(broken), path(rules::path("/a")), mutex(rules::mutex("m")), later_path(rules::path("/b"));
  EXPECT_TRUE(acquire(path));
  EXPECT_FALSE(acquire(custom)) << "its check against the held path threw";
  EXPECT_TRUE(acquire(mutex)) << "its check against a mutex rule answers";
  EXPECT_FALSE(acquire(later_path)) << "the check against the waiting custom request threw";
  table_.leave(path);
  EXPECT_EQ(custom.grants, 1);
  EXPECT_EQ(later_path.grants, 0);
  table_.leave(custom);
  EXPECT_EQ(later_path.grants, 1);
  table_.leave(later_path);
  table_.leave(mutex);
  EXPECT_TRUE(table_.is_idle());
}

// A custom rule whose first conflict check (made under the table's lock) waits for `go`: while it
// waits, another thread holds the lock.
class LockHoldingRule final : public SchedulingRule {
 public:
  explicit LockHoldingRule(bool armed) : armed_(armed) {}
  bool contains(const SchedulingRule& other) const override { return &other == this; }
  bool is_conflicting(const SchedulingRule&) const override {
    if (armed_.exchange(false)) {
      inside.count_down();
      go.wait();
    }
    return false;
  }
  std::string to_string() const override { return "lock-holding rule"; }
  mutable std::latch inside{1}, go{1};

 private:
  mutable std::atomic<bool> armed_;
};

// Requests entered while another thread holds the table's lock are left for that thread: enter()
// returns at once, and the holder enters them, in the order they were submitted, when it lets go.
TEST_F(RuleTableTest, RequestsSubmittedWhileTheLockIsHeldAreEnteredInOrderByItsHolder) {
  const auto holding = std::make_shared<LockHoldingRule>(true);
  const auto plain = std::make_shared<LockHoldingRule>(false);  // only `holding` waits
  Probe held(plain), checker(holding);
  ASSERT_TRUE(acquire(held));
  std::thread holder([&] { EXPECT_TRUE(acquire(checker)); });  // checks against `held`
  holding->inside.wait();
  const Rule light = rules::mutex("light");
  Probe first(light), second(light), third(light);
  table_.enter(first);
  table_.enter(second);
  table_.enter(third);
  EXPECT_TRUE(table_.has_submitted());
  EXPECT_EQ(first.grants + second.grants + third.grants, 0) << "nobody could enter them yet";
  holding->go.count_down();
  holder.join();
  EXPECT_FALSE(table_.has_submitted()) << "the holder entered them when it let the lock go";
  EXPECT_EQ(first.grants, 1) << "the first submitted is granted first";
  EXPECT_EQ(second.grants + third.grants, 0);
  EXPECT_EQ(table_.waiting_count(), 2u);
  table_.leave(first);
  EXPECT_EQ(second.grants, 1);
  EXPECT_EQ(third.grants, 0);
  table_.leave(second);
  EXPECT_EQ(third.grants, 1);
  table_.leave(third);
  table_.leave(checker);
  table_.leave(held);
}

TEST_F(RuleTableTest, LeaveHandsTheRequestsItLetsThroughToTheCaller) {
  const Rule light = rules::mutex("light");
  Probe on(light), next(light);
  ASSERT_TRUE(acquire(on));
  EXPECT_FALSE(acquire(next));
  Grants grants;
  EXPECT_FALSE(table_.leave(on, grants)) << "a request that is not parkable is never parked";
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_EQ(grants.front(), &next);
  EXPECT_EQ(next.grants, 0) << "the caller notifies";
  table_.notify(grants);
  EXPECT_EQ(next.grants, 1);
  table_.leave(next);
}

// Whoever takes the lock enters what was submitted before, in order: a request a third thread
// enters while the lock is held comes after the requests entered before it, which can be
// withdrawn as usual.
TEST_F(RuleTableTest, ARequestEnteredWhileTheLockIsHeldComesAfterThoseEnteredBefore) {
  const auto holding = std::make_shared<LockHoldingRule>(true);
  const auto plain = std::make_shared<LockHoldingRule>(false);
  const Rule light = rules::mutex("light");
  Probe held(plain), checker(holding), owner(light), submitted(light), dropped(light), later(light);
  ASSERT_TRUE(acquire(held));
  ASSERT_TRUE(acquire(owner));
  std::thread holder([&] { EXPECT_TRUE(acquire(checker)); });
  holding->inside.wait();
  table_.enter(submitted);
  table_.enter(dropped);
  std::thread acquirer([&] { EXPECT_FALSE(acquire(later)); });
  holding->go.count_down();
  holder.join();
  acquirer.join();
  EXPECT_EQ(table_.withdraw_waiting(*light, [&](const RuleRequest& r) { return &r == &dropped; }), 1u);
  EXPECT_EQ(dropped.cancels, 1);
  table_.leave(owner);
  EXPECT_EQ(submitted.grants, 1) << "entered before `later`: granted before it";
  EXPECT_EQ(later.grants, 0);
  table_.leave(submitted);
  EXPECT_EQ(later.grants, 1);
  table_.leave(later);
  table_.leave(checker);
  table_.leave(held);
}

// enter_all enters nothing on the calling thread: the requests wait for drain() (or whoever takes
// the lock next), which enters them in their order.
TEST_F(RuleTableTest, RequestsSubmittedTogetherWaitForADrainAndKeepTheirOrder) {
  const Rule light = rules::mutex("light");
  Probe first(light), second(light), third(light), other(rules::path("/free"));
  std::vector<RuleRequest*> batch{&first, &second, &other, &third};
  table_.enter_all(batch);
  EXPECT_TRUE(table_.has_submitted());
  EXPECT_EQ(first.grants + second.grants + third.grants + other.grants, 0);
  table_.drain();
  EXPECT_FALSE(table_.has_submitted());
  EXPECT_EQ(first.grants, 1);
  EXPECT_EQ(other.grants, 1) << "a request that conflicts with none is granted at once";
  EXPECT_EQ(second.grants + third.grants, 0);
  table_.leave(first);
  EXPECT_EQ(second.grants, 1);
  EXPECT_EQ(third.grants, 0);
  // A second batch comes after the first, and an enter() after both.
  Probe fourth(light), fifth(light), last(light);
  std::vector<RuleRequest*> more{&fourth, &fifth};
  table_.enter_all(more);
  EXPECT_FALSE(acquire(last)) << "entered after the batch it follows";
  table_.leave(second);
  EXPECT_EQ(third.grants, 1);
  table_.leave(third);
  EXPECT_EQ(fourth.grants, 1);
  table_.leave(fourth);
  EXPECT_EQ(fifth.grants, 1);
  table_.leave(fifth);
  EXPECT_EQ(last.grants, 1);
  table_.leave(last);
  table_.leave(other);
}

// Runs (one entry on the stack for several requests) and requests linked one by one (a run of one)
// pile up on the same stack; the drain enters them all in the order they were submitted.
TEST_F(RuleTableTest, RunsAndSingleRequestsOnOneStackGoInInTheirOrder) {
  const Rule light = rules::mutex("light");
  Probe first(light), second(light), alone(light), third(light), fourth(light);
  const std::vector<RuleRequest*> run{&first, &second};
  const std::vector<RuleRequest*> one{&alone};
  const std::vector<RuleRequest*> later{&third, &fourth};
  table_.enter_all(run);
  table_.enter_all(one);
  table_.enter_all(later);
  EXPECT_EQ(table_.waiting_count(), 4u) << "counting enters them first";
  EXPECT_FALSE(table_.has_submitted());
  const std::vector<Probe*> order{&first, &second, &alone, &third, &fourth};
  for (std::size_t i = 0; i < order.size(); ++i) {
    for (std::size_t j = 0; j < order.size(); ++j)
      EXPECT_EQ(order[j]->grants, j <= i ? 1 : 0) << "after " << i << " releases, request " << j;
    table_.leave(*order[i]);
  }
  EXPECT_TRUE(table_.is_idle());
}

// An enter() on top of requests that enter_all left for a later drain() enters them all itself
// when the lock is free: nobody else may come for a long time.
TEST_F(RuleTableTest, ASubmissionOnTopOfAnUndrainedBatchEntersIt) {
  const Rule light = rules::mutex("light");
  Probe batched(light), submitted(rules::path("/elsewhere"));
  std::vector<RuleRequest*> batch{&batched};
  table_.enter_all(batch);
  table_.enter(submitted);
  EXPECT_FALSE(table_.has_submitted());
  EXPECT_EQ(batched.grants, 1);
  EXPECT_EQ(submitted.grants, 1);
  table_.leave(batched);
  table_.leave(submitted);
}

// While a lock holder enters what it took from the stack, has_submitted() still says so: a parked
// begin_rule request must not be resumed past requests that are on their way in.
TEST_F(RuleTableTest, RequestsBeingEnteredStillCountAsSubmitted) {
  const auto holding = std::make_shared<LockHoldingRule>(true);
  const auto plain = std::make_shared<LockHoldingRule>(false);
  Probe held(plain), checker(holding), after(rules::path("/after"));
  ASSERT_TRUE(acquire(held));
  std::vector<RuleRequest*> batch{&checker, &after};  // a run: entered from its block
  table_.enter_all(batch);
  std::thread drainer([&] { table_.drain(); });  // stops inside the check of `checker`
  holding->inside.wait();
  EXPECT_TRUE(table_.has_submitted()) << "taken off the stack, but not entered yet";
  holding->go.count_down();
  drainer.join();
  EXPECT_FALSE(table_.has_submitted());
  EXPECT_EQ(checker.grants, 1);
  EXPECT_EQ(after.grants, 1);
  table_.leave(after);
  table_.leave(checker);
  table_.leave(held);
}

TEST_F(RuleTableTest, WithdrawingAWaiterLetsThoseBehindItThrough) {
  Probe x(rules::path("/a/x")), all(rules::path("/a")), y(rules::path("/a/y"));
  EXPECT_TRUE(acquire(x));
  EXPECT_FALSE(acquire(all));
  EXPECT_FALSE(acquire(y));
  EXPECT_TRUE(table_.withdraw(all));
  EXPECT_EQ(y.grants, 1);
  EXPECT_FALSE(table_.withdraw(y)) << "already granted";
  table_.leave(x);
  table_.leave(y);
}

// A queue finds a withdrawn entry by its ticket (binary search over slots and holes): withdrawals at
// the front, in the middle, in runs and at the end, before and while the queue drains, must take
// out exactly those and leave the rest to be granted one by one in their order.
TEST_F(RuleTableTest, WaitersWithdrawnAnywhereInALongQueueLeaveTheRestInOrder) {
  const Rule m = rules::mutex("long queue");
  const Rule dir = rules::path("/q");
  for (const Rule& waiter_rule : {m, rules::path("/q/x")}) {
    const Rule& holder_rule = waiter_rule == m ? m : dir;
    SCOPED_TRACE(waiter_rule->to_string());
    Probe holder(holder_rule);
    ASSERT_TRUE(acquire(holder));
    constexpr int count = 600;
    std::vector<std::unique_ptr<Probe>> waiters;
    for (int i = 0; i < count; ++i) {
      waiters.push_back(std::make_unique<Probe>(waiter_rule));
      ASSERT_FALSE(acquire(*waiters.back()));
    }
    std::vector<bool> gone(count, false);
    const auto withdraw = [&](int i) {
      ASSERT_TRUE(table_.withdraw(*waiters[static_cast<std::size_t>(i)])) << "waiter " << i;
      gone[static_cast<std::size_t>(i)] = true;
    };
    withdraw(0);
    for (int i = 3; i < count; i += 7) withdraw(i);
    for (int i = 200; i < 260; ++i) {
      if (!gone[static_cast<std::size_t>(i)]) withdraw(i);
    }
    withdraw(count - 1);
    table_.leave(holder);
    int granted = 0;
    for (int i = 0; i < count; ++i) {
      Probe& probe = *waiters[static_cast<std::size_t>(i)];
      if (gone[static_cast<std::size_t>(i)]) {
        EXPECT_EQ(probe.grants, 0) << "withdrawn waiter " << i;
        continue;
      }
      ASSERT_EQ(probe.grants, 1) << "waiter " << i << " is next";
      for (int later = i + 1; later < count; ++later) {
        ASSERT_EQ(waiters[static_cast<std::size_t>(later)]->grants, 0)
            << "waiter " << later << " before " << i;
      }
      // While it drains: withdraw the new front and one a little further on.
      if (i == 400) {
        for (int next : {401, 402, 410}) {
          if (!gone[static_cast<std::size_t>(next)]) withdraw(next);
        }
      }
      table_.leave(probe);
      ++granted;
    }
    EXPECT_EQ(granted, static_cast<int>(std::count(gone.begin(), gone.end(), false)));
    EXPECT_GT(granted, count / 2);
  }
}

TEST_F(RuleTableTest, CancelAllWaitingNotifiesEveryWaiter) {
  const Rule m = rules::mutex();
  Probe held(m), w1(m), w2(rules::combine(m, rules::path("/z")));
  EXPECT_TRUE(acquire(held));
  EXPECT_FALSE(acquire(w1));
  EXPECT_FALSE(acquire(w2));
  table_.cancel_all_waiting();
  EXPECT_EQ(w1.cancels, 1);
  EXPECT_EQ(w2.cancels, 1);
  EXPECT_EQ(table_.waiting_count(), 0u);
  table_.leave(held);
  EXPECT_EQ(w1.grants + w2.grants, 0);
}

TEST_F(RuleTableTest, DeepPathsWork) {
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += "/d" + std::to_string(i % 7);
  Probe a(rules::path(deep)), b(rules::path("/d0")), c(rules::path(deep + "/leaf"));
  EXPECT_TRUE(acquire(a));
  EXPECT_FALSE(acquire(b));
  EXPECT_FALSE(acquire(c));
  table_.leave(a);
  EXPECT_EQ(b.grants, 1);
  EXPECT_EQ(c.grants, 0);
  table_.leave(b);
  EXPECT_EQ(c.grants, 1);
  table_.leave(c);
}

// A rule's nodes are noted in the rule object; a recycled request for another rule (even one made
// where the last one was) must resolve that rule's nodes.
TEST_F(RuleTableTest, RecycledThreadRequestsReResolveADifferentRule) {
  begin_and_end_once(rules::path("/a"));
  Probe blocker(rules::path("/b"));
  ASSERT_TRUE(acquire(blocker));
  for (int round = 0; round < 3; ++round) {
    const Rule other = rules::path("/b/c");
    ThreadHold* hold = ThreadHold::take(other, false);
    EXPECT_FALSE(enter_and_hold(*hold)) << "round " << round << ": /b/c waits for the holder of /b";
    EXPECT_TRUE(table_.withdraw(*hold));
    ThreadHold::recycle(hold);
  }
  table_.leave(blocker);
}

// The same rule object again and again through a recycled request: its noted nodes give the same
// decisions every round.
TEST_F(RuleTableTest, RecycledThreadRequestsDecideAlikeForTheSameRule) {
  const Rule rule = rules::path("/a/b/c");
  for (int round = 0; round < 3; ++round) {
    ThreadHold* hold = ThreadHold::take(rule, false);
    ASSERT_TRUE(enter_and_hold(*hold));
    Probe inside(rules::path("/a/b/c/d")), sibling(rules::path("/a/b/x")), above(rules::path("/a"));
    EXPECT_FALSE(acquire(inside)) << "round " << round;
    EXPECT_TRUE(acquire(sibling)) << "round " << round;
    EXPECT_FALSE(acquire(above)) << "round " << round;
    table_.leave(*hold);
    ThreadHold::recycle(hold);
    EXPECT_EQ(inside.grants, 1);
    table_.leave(inside);
    table_.leave(sibling);
    EXPECT_EQ(above.grants, 1);
    table_.leave(above);
  }
}

// The table notes a rule's nodes in the rule object; the noted nodes must give the same decisions
// as resolving the rule again, in the table that noted them and in another one.
TEST_F(RuleTableTest, NotedNodesGiveTheSameDecisions) {
  const Rule file = rules::path("/src/lib/a.cpp");
  const Rule dir = rules::path("/src/lib");
  const Rule other = rules::path("/src/bin/main.cpp");
  const Rule mutex = rules::mutex("m");
  RuleTable second_table;  // does not own the notes: looks the rules up each time
  for (RuleTable* table : {&table_, &second_table, &table_}) {
    Probe first(file), second(file), parent(dir), sibling(other), lock(mutex), lock_again(mutex);
    EXPECT_TRUE(acquire_in(*table, first));
    EXPECT_FALSE(acquire_in(*table, second));
    EXPECT_FALSE(acquire_in(*table, parent));
    EXPECT_TRUE(acquire_in(*table, sibling));
    EXPECT_TRUE(acquire_in(*table, lock));
    EXPECT_FALSE(acquire_in(*table, lock_again));
    table->leave(first);
    EXPECT_EQ(second.grants, 1);
    EXPECT_EQ(parent.grants, 0);
    table->leave(second);
    EXPECT_EQ(parent.grants, 1);
    table->leave(lock);
    EXPECT_EQ(lock_again.grants, 1);
    for (Probe* probe : {&parent, &sibling, &lock_again}) table->leave(*probe);
    EXPECT_TRUE(table->is_idle());
  }
}

// Past its limits of nodes (16,384 path nodes, 1,024 identity nodes) the table frees nodes as their
// last users leave. A note made before must not lead to a freed node (ASan would see it): the same
// rules still exclude each other afterwards, and leave nothing held.
TEST_F(RuleTableTest, NotesStayRightWhenTheTableFreesNodes) {
  const Rule file = rules::path("/kept/dir/file");
  const Rule dir = rules::path("/kept/dir");
  const Rule mutex = rules::mutex("kept");
  const auto exclusion_holds = [&](const char* when) {
    Probe a(file), b(dir), c(mutex), d(mutex);
    EXPECT_TRUE(acquire(a)) << when;
    EXPECT_FALSE(acquire(b)) << when;
    EXPECT_TRUE(acquire(c)) << when;
    EXPECT_FALSE(acquire(d)) << when;
    table_.leave(a);
    EXPECT_EQ(b.grants, 1) << when;
    table_.leave(c);
    EXPECT_EQ(d.grants, 1) << when;
    table_.leave(b);
    table_.leave(d);
  };
  exclusion_holds("before");  // notes the rules' nodes
  for (int round = 0; round < 2; ++round) {
    // Distinct paths and mutexes held at once take the table past its limits, so that nodes are
    // freed as their last users leave: the kept rules' nodes too, in the second check below.
    std::vector<std::unique_ptr<Probe>> many;
    for (int i = 0; i < 17000; ++i) {
      many.push_back(std::make_unique<Probe>(rules::path("/many/" + std::to_string(i))));
      EXPECT_TRUE(acquire(*many.back()));
    }
    for (int i = 0; i < 1100; ++i) {
      many.push_back(std::make_unique<Probe>(rules::mutex("many " + std::to_string(i))));
      EXPECT_TRUE(acquire(*many.back()));
    }
    exclusion_holds("over the limits, with the nodes noted before");
    exclusion_holds("over the limits, after the noted nodes were freed");
    for (auto& probe : many) table_.leave(*probe);
  }
  exclusion_holds("after");
}

// ---------------------------------------------------------------------------------------------
// Randomized: after every operation the held set must equal what the specification says, computed
// from scratch: in ticket order, a request holds iff it conflicts with no holder and no earlier
// waiting request.

bool conflict(const Rule& a, const Rule& b) { return a->is_conflicting(*b) || b->is_conflicting(*a); }

class RuleFactory {
 public:
  explicit RuleFactory(std::mt19937& random) : random_(random) {
    for (int i = 0; i < 3; ++i) mutexes_.push_back(rules::mutex("m" + std::to_string(i)));
    for (int i = 1; i <= 2; ++i) colours_.push_back(std::make_shared<ColourRule>(i));
  }
  Rule any() {
    switch (pick(0, 10)) {
      case 10:
        return any_root();
      case 0:
        return mutexes_[static_cast<std::size_t>(pick(0, 2))];
      case 1:
        return colours_[static_cast<std::size_t>(pick(0, 1))];
      case 2:
        return rules::combine(any_simple(), any_simple());
      case 3:
      case 4:
        return rules::read_path(random_path());
      case 9:
        return any_named();
      default:
        return rules::path(random_path());
    }
  }

 private:
  // A new object each time: the name makes them one lock.
  Rule any_named() { return rules::named_mutex("n" + std::to_string(pick(0, 1))); }
  int pick(int low, int high) { return std::uniform_int_distribution<int>(low, high)(random_); }
  // A rule on the root itself, which the table indexes lazily (requests that entered while nobody
  // claimed the root get their intent there when one comes).
  Rule any_root() { return pick(0, 1) == 0 ? rules::path("/") : rules::read_path("/"); }
  Rule any_simple() {
    switch (pick(0, 5)) {
      case 5:
        return any_named();
      case 4:
        return any_root();
      case 0:
        return mutexes_[static_cast<std::size_t>(pick(0, 2))];
      case 1:
        return rules::read_path(random_path());
      default:
        return rules::path(random_path());
    }
  }
  std::string random_path() {
    static const char* const first[] = {"a", "b", "c1", "c2"};
    std::string path = std::string("/") + first[pick(0, 3)];
    const int depth = pick(0, 3);
    for (int i = 0; i < depth; ++i) path += "/" + std::to_string(pick(0, 2));
    return path;
  }
  std::mt19937& random_;
  std::vector<Rule> mutexes_;
  std::vector<Rule> colours_;
};

TEST_F(RuleTableTest, MatchesTheReferenceModelOnRandomOperations) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 random(seed);
  RuleFactory factory(random);
  std::vector<std::unique_ptr<Probe>> live;  // ticket order
  std::size_t immediate_grants = 0, waits_seen = 0, releases = 0;
  const int operations = 20'000 * test::stress_scale();
  // The reference costs O(live^2) per operation and `live` is a random walk: capped, so that no
  // seed takes minutes (uncapped, a seed could reach several hundred and time out under TSan).
  constexpr std::size_t max_live = 64;
  for (int op = 0; op < operations; ++op) {
    const int choice = std::uniform_int_distribution<int>(0, 9)(random);
    if ((choice < 5 && live.size() < max_live) || live.empty()) {
      live.push_back(std::make_unique<Probe>(factory.any()));
      if (acquire(*live.back())) {
        ++live.back()->grants;  // count the immediate grant like a notified one
        ++immediate_grants;
      } else {
        ++waits_seen;
      }
    } else {
      const auto victim =
          static_cast<std::size_t>(std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(random));
      Probe& probe = *live[victim];
      if (probe.grants > 0) {
        table_.leave(probe);
        ++releases;
      } else {
        ASSERT_TRUE(table_.withdraw(probe));
      }
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    }
    // The reference: one pass in ticket order.
    std::vector<bool> holds(live.size(), false);
    for (std::size_t i = 0; i < live.size(); ++i) {
      bool blocked = false;
      for (std::size_t j = 0; j < live.size() && !blocked; ++j) {
        if (j == i) continue;
        if ((holds[j] || j < i) && conflict(live[i]->rule(), live[j]->rule())) blocked = true;
      }
      // A holder never loses its rule, whatever came later.
      holds[i] = !blocked || live[i]->grants > 0;
    }
    for (std::size_t i = 0; i < live.size(); ++i) {
      ASSERT_LE(live[i]->grants, 1) << "granted twice: " << live[i]->rule()->to_string();
      ASSERT_EQ(live[i]->grants == 1, holds[i]) << "operation " << op << ": " << live[i]->rule()->to_string()
                                                << " should " << (holds[i] ? "hold" : "wait");
    }
    // No two holders conflict.
    for (std::size_t i = 0; i < live.size(); ++i) {
      for (std::size_t j = i + 1; j < live.size(); ++j) {
        if (live[i]->grants && live[j]->grants) {
          ASSERT_FALSE(conflict(live[i]->rule(), live[j]->rule()));
        }
      }
    }
  }
  RecordProperty("releases", static_cast<int>(releases));
  EXPECT_GT(immediate_grants, 20u);
  EXPECT_GT(releases, 300u) << "holders must come and go";
  EXPECT_GT(waits_seen, 100u) << "the random mix must produce real contention";
  // Release holders until nobody is left: every waiter must be let through in the end.
  for (bool released = true; released;) {
    released = false;
    for (auto& probe : live) {
      if (probe->is_held()) {
        table_.leave(*probe);
        released = true;
      }
    }
  }
  for (auto& probe : live) EXPECT_EQ(probe->grants, 1) << "never granted: " << probe->rule()->to_string();
}

// Parking against a model: a parked request is invisible to the reference (it never makes anyone
// wait), and whether leave() parks, entering again takes a parked request back and discard() gives
// it up is decided by what came since: a parked request is revoked exactly when a conflicting
// request (or any with a custom part) entered after it was parked, and an active one is wanted
// exactly when one entered while it was active.
TEST_F(RuleTableTest, ParkingMatchesTheReferenceModelOnRandomOperations) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 random(seed);
  RuleFactory factory(random);
  struct Entry {
    std::unique_ptr<Probe> probe;
    bool parkable = false;
    bool marked = false;  // active: wanted by now; parked: revoked by now
  };
  const auto has_custom = [](const Rule& rule) { return rule->key().kind == RuleKey::Kind::custom; };
  std::vector<Entry> live;    // ticket order (a resumed request goes to the end: it holds anyway)
  std::vector<Entry> parked;  // idle, in the table or revoked
  std::size_t resumed = 0, revoked = 0, wanted = 0, orphaned = 0;
  const auto pick = [&](std::size_t size) {
    return std::uniform_int_distribution<std::size_t>(0, size - 1)(random);
  };
  const int operations = 50'000 * test::stress_scale();
  for (int op = 0; op < operations; ++op) {
    const int choice = std::uniform_int_distribution<int>(0, 11)(random);
    if (choice < 4 || (live.empty() && parked.empty())) {
      Entry entry{std::make_unique<Probe>(factory.any())};
      const Rule& rule = entry.probe->rule();
      // A request over several shards never parks (see RuleTable::leave).
      entry.parkable =
          !has_custom(rule) && choice % 2 == 0 && std::has_single_bit(RuleTable::shards_of(*rule));
      for (Entry& other : live) {
        if (other.parkable && (has_custom(rule) || conflict(rule, other.probe->rule()))) other.marked = true;
      }
      for (Entry& other : parked) {
        if (has_custom(rule) || conflict(rule, other.probe->rule())) other.marked = true;
      }
      entry.probe->may_park = entry.parkable;
      if (acquire(*entry.probe)) ++entry.probe->grants;
      live.push_back(std::move(entry));
    } else if (choice < 9 && !live.empty()) {
      const std::size_t victim = pick(live.size());
      Entry& entry = live[victim];
      if (entry.probe->grants == 0) {
        ASSERT_TRUE(table_.withdraw(*entry.probe));
      } else if (entry.parkable) {
        const bool parks = table_.leave(*entry.probe);
        ASSERT_EQ(parks, !entry.marked)
            << "operation " << op << ": leave() of " << entry.probe->rule()->to_string();
        if (parks) {
          entry.marked = false;
          parked.push_back(std::move(entry));
        } else {
          ++wanted;  // released for real
        }
      } else {
        table_.leave(*entry.probe);
      }
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(victim));
    } else if (!parked.empty()) {
      const std::size_t at = pick(parked.size());
      Entry entry = std::move(parked[at]);
      parked.erase(parked.begin() + static_cast<std::ptrdiff_t>(at));
      const std::string name = entry.probe->rule()->to_string();
      if (choice == 9) {
        const bool gives_up = RuleTable::discard(*entry.probe);
        ASSERT_EQ(gives_up, !entry.marked) << "operation " << op << ": discard() of " << name;
        if (gives_up) {
          // Keeps the rule alive (the probe's copy dies with it), then lets the table delete it.
          static_cast<void>(entry.probe.release());
          ++orphaned;
        }
      } else {
        // Its owner enters it again: taken back when nobody came for it, else (revoked) entered
        // anew, as a newcomer.
        entry.probe->grants = 0;
        const bool was_revoked = entry.marked;
        if (was_revoked) {
          entry.marked = false;
          const Rule& rule = entry.probe->rule();
          for (Entry& other : live) {
            if (other.parkable && conflict(rule, other.probe->rule())) other.marked = true;
          }
          for (Entry& other : parked) {
            if (conflict(rule, other.probe->rule())) other.marked = true;
          }
        }
        if (acquire(*entry.probe)) ++entry.probe->grants;
        if (was_revoked) {
          ++revoked;
        } else {
          ASSERT_EQ(entry.probe->grants, 1) << "operation " << op << ": not taken back: " << name;
          for (const Entry& other : live) {
            ASSERT_TRUE(other.probe->grants > 0 || !conflict(entry.probe->rule(), other.probe->rule()))
                << "took back " << name << " while " << other.probe->rule()->to_string() << " waits";
          }
          ++resumed;
        }
        live.push_back(std::move(entry));
      }
    }
    // The reference, as above: parked requests take no part.
    std::vector<bool> holds(live.size(), false);
    for (std::size_t i = 0; i < live.size(); ++i) {
      bool blocked = false;
      for (std::size_t j = 0; j < live.size() && !blocked; ++j) {
        if (j == i) continue;
        if ((holds[j] || j < i) && conflict(live[i].probe->rule(), live[j].probe->rule())) blocked = true;
      }
      holds[i] = !blocked || live[i].probe->grants > 0;
    }
    std::size_t holders = 0;
    for (std::size_t i = 0; i < live.size(); ++i) {
      ASSERT_LE(live[i].probe->grants, 1) << "granted twice: " << live[i].probe->rule()->to_string();
      ASSERT_EQ(live[i].probe->grants == 1, holds[i])
          << "operation " << op << ": " << live[i].probe->rule()->to_string() << " should "
          << (holds[i] ? "hold" : "wait");
      if (holds[i]) ++holders;
    }
    ASSERT_EQ(table_.held_count(), holders) << "parked requests are not held";
    ASSERT_EQ(table_.waiting_count(), live.size() - holders);
  }
  RecordProperty("resumed", static_cast<int>(resumed));
  RecordProperty("revoked", static_cast<int>(revoked));
  RecordProperty("wanted", static_cast<int>(wanted));
  RecordProperty("orphaned", static_cast<int>(orphaned));
  EXPECT_GT(resumed, 100u);
  EXPECT_GT(revoked, 100u) << "conflicting newcomers must revoke parked requests";
  EXPECT_GT(wanted, 20u) << "conflicting newcomers must want active parkable requests";
  EXPECT_GT(orphaned, 20u);
  for (Entry& entry : parked) {
    if (RuleTable::discard(*entry.probe)) static_cast<void>(entry.probe.release());  // the table's now
  }
  for (bool released = true; released;) {
    released = false;
    for (Entry& entry : live) {
      if (entry.probe->is_held()) {
        table_.leave(*entry.probe);
        released = true;
      }
    }
  }
  for (Entry& entry : live)
    EXPECT_EQ(entry.probe->grants, 1) << "never granted: " << entry.probe->rule()->to_string();
}

}  // namespace
}  // namespace tasklet::detail
