// Managers made with make_job_manager against a real etcd: two managers with sessions of their own
// stand for two processes (tests/etcd/etcd_processes_test.cpp runs real ones). Shared rules exclude
// across them for jobs, begin_rule and strands; identity mutexes stay local; fencing tokens grow;
// a job canceled while it waits in etcd is withdrawn there, even when etcd applies its request
// late; a lost lease and a dead etcd tell every holder and leave nothing hanging.
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "etcd_server.hpp"
#include "support/job_support.hpp"
#include "tasklet.hpp"
#include "tasklet/coroutine.hpp"
#include "tasklet/etcd/etcd.hpp"
#include "tcp_proxy.hpp"

namespace tasklet::etcd {
namespace {

using namespace std::chrono_literals;
using test::EtcdServer;

// Waits for a future without hanging the test when it never comes.
template <class T>
T await(std::future<T>& future) {
  if (future.wait_for(60s) != std::future_status::ready) throw std::runtime_error("never happened");
  return future.get();
}

// A job on `manager` with `rule` whose run calls `body`.
std::shared_ptr<Job> job_on(const std::shared_ptr<JobManager>& manager, const std::string& name, Rule rule,
                            std::function<void(ProgressMonitor&)> body) {
  auto job = make_job(name, std::move(body), manager);
  job->set_rule(std::move(rule));
  return job;
}

// A job that holds `rule` from when the constructor returns (its run has begun) until let_go().
class HeldJob {
 public:
  HeldJob(const std::shared_ptr<JobManager>& manager, const std::string& name, Rule rule)
      : job_(job_on(manager, name, std::move(rule), [this](ProgressMonitor&) {
          entered_.set_value();
          go_on_.get_future().wait();
        })) {
    job_->schedule();
    entered_.get_future().wait();
  }
  HeldJob(const HeldJob&) = delete;
  HeldJob& operator=(const HeldJob&) = delete;
  ~HeldJob() {
    if (!let_go_) let_go();
  }
  void let_go() {
    let_go_ = true;
    go_on_.set_value();
    job_->join();
  }

 private:
  std::promise<void> entered_, go_on_;
  bool let_go_ = false;
  std::shared_ptr<Job> job_;
};

// Whether a job ended unrun because its rule's lease was lost.
bool ended_for_lost_lease(const Job& job) {
  const Status result = job.result();
  if (result.severity != Status::Severity::error || !result.exception) return false;
  try {
    std::rethrow_exception(result.exception);
  } catch (const EtcdLeaseLost&) {
    return true;
  } catch (...) {
    return false;
  }
}

class EtcdManagerTest : public ::testing::Test {
 protected:
  std::shared_ptr<EtcdSession> session(std::chrono::seconds ttl = 10s) {
    EtcdOptions options;
    options.endpoints = {server_->endpoint()};
    options.prefix = "/managers";
    options.lease_ttl = ttl;
    return EtcdSession::connect(options);
  }
  // Four workers: the tests' holders block in their runs, up to three at a time.
  std::shared_ptr<JobManager> manager(std::shared_ptr<EtcdSession> with = nullptr) {
    return make_job_manager(with ? std::move(with) : session(), JobManager::Options{4, nullptr});
  }
  // Keys of claims under the prefix (each held or waiting request has one per part).
  std::size_t claim_keys(const std::string& under = "") const {
    const std::string keys = server_->etcdctl("get --prefix --keys-only /managers/c/" + under);
    std::size_t count = 0;
    for (std::size_t at = keys.find("/managers/c/"); at != std::string::npos;
         at = keys.find("/managers/c/", at + 1))
      ++count;
    return count;
  }

  std::unique_ptr<EtcdServer> server_ = std::make_unique<EtcdServer>();
};

TEST_F(EtcdManagerTest, ConflictingJobsOfTwoManagersNeverOverlapAndOthersRunMeanwhile) {
  auto one = manager(), two = manager();
  std::promise<void> entered, go_on;
  std::atomic<bool> first_done{false}, overlapped{false};
  std::promise<std::int64_t> first_token, second_token;
  auto first = job_on(one, "first", rules::path("/tree"), [&](ProgressMonitor&) {
    first_token.set_value(fencing_token(*one, rules::path("/tree/leaf")));  // contained: the same hold
    entered.set_value();
    go_on.get_future().wait();
    first_done = true;
  });
  first->schedule();
  entered.get_future().wait();
  auto second = job_on(two, "second", rules::read_path("/tree/leaf"), [&](ProgressMonitor&) {
    if (!first_done) overlapped = true;
    second_token.set_value(fencing_token(*two, rules::read_path("/tree/leaf")));
  });
  second->schedule();
  std::promise<void> other_ran;
  auto other =
      job_on(two, "other", rules::path("/elsewhere"), [&](ProgressMonitor&) { other_ran.set_value(); });
  other->schedule();
  auto other_ran_future = other_ran.get_future();
  await(other_ran_future);  // while /tree is held in the other manager
  EXPECT_EQ(second->state(), JobState::waiting) << "second waits in etcd for first";
  ASSERT_TRUE(test::eventually([&] { return second->blockers().size() == 1 && second->blockers()[0].rule; }));
  const RuleBlocker blocker = second->blockers()[0];
  EXPECT_EQ(blocker.rule->to_string(), "path(/tree)") << blocker.to_string();
  EXPECT_NE(blocker.owner.find("etcd lease"), std::string::npos) << blocker.to_string();
  go_on.set_value();
  second->join();
  first->join();
  EXPECT_FALSE(overlapped.load());
  auto first_future = first_token.get_future(), second_future = second_token.get_future();
  EXPECT_LT(await(first_future), await(second_future));
  other->join();
}

TEST_F(EtcdManagerTest, NamedMutexesExcludeAcrossManagersAndIdentityMutexesStayLocal) {
  auto one = manager(), two = manager();
  const Rule local = rules::mutex("local");  // one object, yet each manager's own lock
  std::promise<void> held, go_on;
  std::thread holder([&] {
    const RuleScope scope(*one, rules::combine(rules::named_mutex("tenant-7"), rules::path("/t7")));
    held.set_value();
    go_on.get_future().wait();
  });
  held.get_future().wait();
  std::atomic<bool> released{false}, overlapped{false};
  std::thread waiter([&] {
    const RuleScope named(*two, rules::named_mutex("tenant-7"));
    if (!released) overlapped = true;
  });
  {
    const RuleScope mine(*one, local);  // nobody else holds it in `one`
    std::promise<void> took;
    std::thread other_manager([&] {
      const RuleScope theirs(*two, local);  // taken in `two` while `one` holds it
      took.set_value();
    });
    auto took_future = took.get_future();
    await(took_future);
    other_manager.join();
  }
  released = true;
  go_on.set_value();
  holder.join();
  waiter.join();
  EXPECT_FALSE(overlapped.load());
}

TEST_F(EtcdManagerTest, StrandsOnOneNamedMutexInTwoManagersAreOneOrder) {
  auto one = manager(), two = manager();
  SerialExecutor first(one, rules::named_mutex("strand"));
  SerialExecutor second(two, rules::named_mutex("strand"));
  std::atomic<int> inside{0}, ran{0};
  std::atomic<bool> overlapped{false};
  const auto task = [&] {
    if (inside.fetch_add(1) != 0) overlapped = true;
    std::this_thread::yield();
    inside.fetch_sub(1);
    ran.fetch_add(1);
  };
  for (int i = 0; i < 20; ++i) {
    first.post(task);
    second.post(task);
  }
  first.wait();
  second.wait();
  EXPECT_EQ(ran.load(), 40);
  EXPECT_FALSE(overlapped.load());
}

TEST_F(EtcdManagerTest, FencingTokensGrowAndNeedASharedRuleTheCallerHolds) {
  auto one = manager();
  const Rule dir = rules::path("/fence");
  std::int64_t last = 0;
  for (int round = 0; round < 3; ++round) {
    const RuleScope scope(*one, dir);
    const std::int64_t token = fencing_token(*one, dir);
    EXPECT_GT(token, last);
    last = token;
    EXPECT_EQ(fencing_token(*one, rules::path("/fence/file")), token) << "a rule the held one contains";
    EXPECT_THROW((void)fencing_token(*one, rules::path("/elsewhere")), IllegalState);
  }
  EXPECT_THROW((void)fencing_token(*one, dir), IllegalState) << "nothing held";
  EXPECT_THROW((void)fencing_token(*one, rules::mutex("local")), IllegalState) << "not shared";
  auto plain = JobManager::create();
  EXPECT_THROW((void)fencing_token(*plain, dir), IllegalState) << "not made with a session";
  std::promise<std::int64_t> in_job;
  auto job =
      job_on(one, "fenced", dir, [&](ProgressMonitor&) { in_job.set_value(fencing_token(*one, dir)); });
  job->schedule();
  auto token = in_job.get_future();
  EXPECT_GT(await(token), last);
  job->join();
}

TEST_F(EtcdManagerTest, AJobCanceledWhileItWaitsInEtcdIsWithdrawnThere) {
  auto one = manager(), two = manager();
  HeldJob holder(one, "holder", rules::path("/w"));
  std::atomic<bool> canceled_ran{false};
  auto canceled = job_on(two, "canceled", rules::path("/w"), [&](ProgressMonitor&) { canceled_ran = true; });
  canceled->schedule();
  ASSERT_TRUE(test::eventually([&] { return claim_keys("p/w/") == 2; }))
      << "its key is in etcd, behind the holder's";
  EXPECT_TRUE(canceled->cancel());
  canceled->join();
  EXPECT_EQ(canceled->result().severity, Status::Severity::cancel);
  ASSERT_TRUE(test::eventually([&] { return claim_keys("p/w/") == 1; })) << "its key is deleted";
  std::promise<void> next_ran;
  auto next = job_on(two, "next", rules::path("/w"), [&](ProgressMonitor&) { next_ran.set_value(); });
  next->schedule();
  holder.let_go();
  auto next_future = next_ran.get_future();
  await(next_future);
  next->join();
  EXPECT_FALSE(canceled_ran.load());
}

TEST_F(EtcdManagerTest, DestroyingAManagerWithdrawsWhatWaitsInEtcd) {
  auto one = manager(), two = manager();
  HeldJob holder(one, "holder", rules::named_mutex("d"));
  auto waiting = job_on(two, "waiting", rules::named_mutex("d"), [](ProgressMonitor&) {});
  waiting->schedule();
  ASSERT_TRUE(test::eventually([&] { return claim_keys("n/") == 2; }));
  two.reset();  // with its session: what the withdrawal left, the lease's revocation deletes
  EXPECT_EQ(waiting->result().severity, Status::Severity::cancel);
  EXPECT_TRUE(test::eventually([&] { return claim_keys("n/") == 1; }));
}

TEST_F(EtcdManagerTest, ALostLeaseCancelsRunningAndWaitingWorkAndHoldersHearOfIt) {
  auto lost_session = session(2s);
  auto lost = manager(lost_session);
  auto other = manager();
  std::promise<std::string> told;
  // The holder job's run waits for the listener (registered after the manager's own).
  std::promise<bool> saw_cancel;
  std::promise<void> running;
  std::shared_future<std::string> told_future = told.get_future().share();
  auto holder = job_on(lost, "holder", rules::path("/l"), [&](ProgressMonitor& monitor) {
    running.set_value();
    told_future.wait();
    saw_cancel.set_value(monitor.is_canceled());
    EXPECT_THROW((void)fencing_token(*lost, rules::path("/l")), EtcdLeaseLost);
  });
  holder->schedule();
  running.get_future().wait();
  // A job without a rule of its own that takes one with begin_rule in its run.
  std::promise<void> begun_in;
  std::promise<bool> begun_saw_cancel;
  auto begun = job_on(lost, "begun", nullptr, [&](ProgressMonitor& monitor) {
    const Rule held = rules::path("/begun");
    lost->begin_rule(held);
    begun_in.set_value();
    told_future.wait();
    begun_saw_cancel.set_value(monitor.is_canceled());
    EXPECT_THROW(lost->end_rule(held), EtcdLeaseLost);
  });
  begun->schedule();
  begun_in.get_future().wait();
  // A thread holding a shared rule, and a job waiting in etcd behind another manager's holder.
  HeldJob blocker(other, "blocker", rules::path("/q"));
  auto waiting = job_on(lost, "waiting", rules::path("/q"), [](ProgressMonitor&) {});
  waiting->schedule();
  // A coroutine job that takes /q with co_await hold(): behind `waiting` here, then in etcd.
  std::promise<std::string> hold_ended;
  auto coroutine = make_job(
      "coroutine",
      [&hold_ended](ProgressMonitor&) -> Task<void> {
        try {
          auto held = co_await hold(rules::path("/q"));
          hold_ended.set_value("granted");
        } catch (const EtcdLeaseLost&) {
          hold_ended.set_value("EtcdLeaseLost");
        }
      },
      lost);
  coroutine->schedule();
  std::promise<void> thread_holds;
  std::promise<void> thread_saw;
  std::thread thread([&] {
    const Rule held = rules::read_path("/r");
    lost->begin_rule(held);
    thread_holds.set_value();
    told_future.wait();
    EXPECT_THROW(lost->end_rule(held), EtcdLeaseLost) << "released, and told";
    // A new shared rule cannot be held any more; a local one still can.
    EXPECT_THROW(lost->begin_rule(held), EtcdLeaseLost);
    lost->end_rule(held);
    const RuleScope local(*lost, rules::mutex("still local"));
    thread_saw.set_value();
  });
  thread_holds.get_future().wait();
  ASSERT_TRUE(test::eventually([&] { return claim_keys("p/q/") == 2; }));
  lost_session->on_lease_lost([&](const std::string& why) { told.set_value(why); });
  server_->etcdctl("lease revoke " + [&] {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%llx", static_cast<unsigned long long>(lost_session->lease_id()));
    return std::string(hex);
  }());
  EXPECT_NE(told_future.get().find("lease"), std::string::npos);
  auto saw = saw_cancel.get_future();
  EXPECT_TRUE(await(saw)) << "the running holder's monitor was canceled";
  holder->join();
  auto begun_saw = begun_saw_cancel.get_future();
  EXPECT_TRUE(await(begun_saw)) << "so was the monitor of a job that took its rule with begin_rule";
  begun->join();
  waiting->join();
  EXPECT_TRUE(ended_for_lost_lease(*waiting)) << waiting->result().message;
  auto hold_future = hold_ended.get_future();
  EXPECT_EQ(await(hold_future), "EtcdLeaseLost") << "co_await hold() throws the backend's reason";
  coroutine->join();
  auto thread_done = thread_saw.get_future();
  await(thread_done);
  thread.join();
}

// A job etcd granted its rule but that has not started (the only worker is busy) when the lease is
// lost ends as the waiting ones do: unrun, with an error carrying EtcdLeaseLost.
TEST_F(EtcdManagerTest, AJobGrantedButNotStartedWhenTheLeaseIsLostEndsWithTheLoss) {
  auto lost_session = session(2s);
  auto lost = make_job_manager(lost_session, JobManager::Options{1, nullptr});
  std::promise<void> busy, go_on;
  auto worker_busy = make_job(
      "busy",
      [&](ProgressMonitor&) {
        busy.set_value();
        go_on.get_future().wait();
      },
      lost);
  worker_busy->schedule();
  busy.get_future().wait();
  std::atomic<int> ran{0};
  auto granted = job_on(lost, "granted", rules::path("/g"), [&](ProgressMonitor&) { ++ran; });
  granted->schedule();
  ASSERT_TRUE(test::eventually([&] {
    const JobManager::RuleStats stats = lost->rule_stats();
    return stats.held == 1 && stats.waiting == 0;
  })) << "etcd grants /g while the worker is busy";
  std::promise<void> told;
  lost_session->on_lease_lost([&](const std::string&) { told.set_value(); });
  char lease[32];
  std::snprintf(lease, sizeof lease, "%llx", static_cast<unsigned long long>(lost_session->lease_id()));
  server_->etcdctl("lease revoke " + std::string(lease));
  auto told_future = told.get_future();
  await(told_future);
  go_on.set_value();
  granted->join();
  EXPECT_EQ(ran.load(), 0);
  EXPECT_TRUE(ended_for_lost_lease(*granted)) << granted->result().message;
  EXPECT_NE(granted->result().message.find("lease"), std::string::npos) << granted->result().message;
}

// A job's request goes to an etcd that does not answer in time (a proxy keeps the transaction),
// and the job is canceled. etcd then applies the transaction late: its keys must go all the same,
// and a job of another manager on the same rule must run, while the first session lives on.
TEST_F(EtcdManagerTest, ACanceledRequestWhoseTransactionEtcdAppliesLateLeavesNoKeys) {
  test::TcpProxy proxy(server_->endpoint());
  EtcdOptions options;
  options.endpoints = {proxy.endpoint()};
  options.prefix = "/managers";
  options.request_timeout = 300ms;
  auto slow = make_job_manager(EtcdSession::connect(options), JobManager::Options{2, nullptr});
  proxy.hold();
  auto canceled = job_on(slow, "canceled", rules::path("/late"), [](ProgressMonitor&) {});
  canceled->schedule();
  ASSERT_TRUE(proxy.wait_until_kept("/v3/kv/txn", true))
      << "the request's transaction timed out in the proxy";
  canceled->cancel();
  ASSERT_TRUE(canceled->join(test::patience));
  EXPECT_EQ(canceled->result().severity, Status::Severity::cancel);
  proxy.release();  // etcd gets the transaction (and its retries) now
  auto other = manager();
  std::atomic<int> ran{0};
  auto after = job_on(other, "after", rules::path("/late"), [&ran](ProgressMonitor&) { ++ran; });
  after->schedule();
  EXPECT_TRUE(after->join(test::patience)) << "waits for keys a canceled request left in etcd";
  EXPECT_EQ(ran.load(), 1);
  EXPECT_TRUE(test::eventually([&] { return claim_keys("p/late/") == 0; }));
}

TEST_F(EtcdManagerTest, EtcdDyingWhileRulesAreHeldAndWaitedForEndsInCancellationNotAHang) {
  auto first_session = session(2s), second_session = session(2s);
  auto one = manager(first_session), two = manager(second_session);
  std::promise<void> held, go_on;
  std::promise<bool> canceled_seen;
  auto holder = job_on(one, "holder", rules::path("/s"), [&](ProgressMonitor& monitor) {
    held.set_value();
    go_on.get_future().wait();
    canceled_seen.set_value(monitor.is_canceled());
  });
  holder->schedule();
  held.get_future().wait();
  std::atomic<int> ran{0};
  auto behind_here = job_on(one, "behind here", rules::path("/s/x"), [&](ProgressMonitor&) { ++ran; });
  behind_here->schedule();  // waits in `one`'s table
  auto behind_there = job_on(two, "behind there", rules::path("/s"), [&](ProgressMonitor&) { ++ran; });
  behind_there->schedule();  // waits in etcd
  ASSERT_TRUE(test::eventually([&] { return claim_keys("p/s/") == 2; }));
  std::promise<void> first_lost, second_lost;
  first_session->on_lease_lost([&](const std::string&) { first_lost.set_value(); });
  second_session->on_lease_lost([&](const std::string&) { second_lost.set_value(); });
  server_->stop();  // killed: no lease is renewed any more, no request answered
  auto first_future = first_lost.get_future(), second_future = second_lost.get_future();
  await(first_future);  // within about a TTL of the last renewal
  await(second_future);
  go_on.set_value();
  auto seen = canceled_seen.get_future();
  EXPECT_TRUE(await(seen)) << "the holder's monitor was canceled";
  holder->join();
  behind_here->join();  // granted here after the holder, then refused: the lease is gone
  behind_there->join();
  EXPECT_TRUE(ended_for_lost_lease(*behind_here)) << behind_here->result().message;
  EXPECT_TRUE(ended_for_lost_lease(*behind_there)) << behind_there->result().message;
  EXPECT_EQ(ran.load(), 0);
  // The managers and sessions go without etcd (the revocation fails after its timeout).
  one.reset();
  two.reset();
}

}  // namespace
}  // namespace tasklet::etcd
