// The fault lane (label "faults", scripts/faults.sh): four processes (fault_worker.cpp) run jobs on
// overlapping path rules and named mutexes shared through a three-member etcd, each reaching every
// member through a TCP proxy of its own, and every hold reads and writes a fenced store with its
// fencing token. Meanwhile a nemesis, in seeded random rounds, kills the etcd leader and restarts
// it, pauses the leader for shorter and for longer than the lease TTL, pauses a holder process
// past its TTL, partitions a process from etcd (cut, or stalled and delivered late) but not from
// the store, and restarts the members one by one. A checker of its own then reads the store's
// record and the processes' logs:
//
//   - the store never accepted an operation whose token was lower than one it had accepted for a
//     conflicting key;
//   - no two conflicting holds overlap while the library vouched for both (each hold's span runs
//     from just before its first fencing_token call to just before its last one that answered);
//   - conflicting holds began in the order of their tokens (FIFO by revision);
//   - a hold whose operation the store refused learned of the loss before it ended: its last
//     fencing_token threw EtcdLeaseLost and its monitor was canceled;
//   - every job ran at most once, a job that ended well ran exactly once, and every other job ended
//     with a message naming the cause; every process ended once told to (nothing hangs);
//   - afterwards no key of the processes' sessions is left in etcd, and a new session is granted
//     the root of the tree.
//
// TASKLET_FAULTS_SEED replays a run (its seed is printed); TASKLET_FAULTS_CYCLES sets how many
// times every kind of fault is injected (default 3); TASKLET_FAULTS_ONLY=kill|pause|long-pause|
// holder|partition|restarts injects that kind alone.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "child_process.hpp"
#include "etcd_cluster.hpp"
#include "fenced_store.hpp"
#include "support/job_support.hpp"
#include "tasklet.hpp"
#include "tasklet/etcd/etcd.hpp"
#include "tcp_proxy.hpp"

namespace tasklet::etcd {
namespace {

using namespace std::chrono_literals;
using test::monotonic_ns;

constexpr int processes = 4;
constexpr auto ttl = 3s;  // the workers' lease TTL
const std::string prefix = "/faults";

enum class Fault {
  leader_kill,
  leader_pause_short,
  leader_pause_long,
  holder_pause,
  partition,
  rolling_restart
};
constexpr int fault_kinds = 6;

// For TASKLET_FAULTS_ONLY.
const char* const short_names[] = {"kill", "pause", "long-pause", "holder", "partition", "restarts"};

const char* name_of(Fault fault) {
  static const char* const names[] = {"leader killed and restarted", "leader paused < TTL",
                                      "leader paused > TTL",         "holder paused > TTL",
                                      "process partitioned",         "members restarted one by one"};
  return names[static_cast<int>(fault)];
}

struct Injected {
  Fault kind;
  int process = -1;  // the process it targets, or -1 for the cluster
  long long start = 0, end = 0;
};

struct Hold {
  std::string job;
  int process = 0;
  std::int64_t token = 0, lease = 0;
  long long before_first = 0, before_last = 0;
  bool first_ok = false, last_ok = false, canceled = false;
  int refused = 0;
  std::vector<std::pair<char, std::string>> parts;  // 'X' / 'S' path, 'N' name
};

// Leases etcd ended while their process still counted on them, and when it learned so.
using EndedEarly = std::map<std::int64_t, long long>;

struct ProcessLog {
  std::vector<Hold> holds;
  std::map<std::string, int> runs;
  std::map<std::string, std::string> ends;  // job -> "ok" or "cancel|error MESSAGE"
  int sessions_lost = 0, failed_connects = 0;
  std::vector<std::string> events;  // sessions begun and lost, for a failure's report
  EndedEarly ended_early;
};

ProcessLog read_log(const std::filesystem::path& file, int process) {
  ProcessLog log;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string what, job;
    fields >> what;
    if (what == "run") {
      fields >> job;
      ++log.runs[job];
    } else if (what == "job") {
      fields >> job;
      std::string rest;
      std::getline(fields, rest);
      log.ends[job] = rest.empty() ? rest : rest.substr(1);
    } else if (what == "hold") {
      Hold hold;
      hold.process = process;
      fields >> hold.job >> hold.token >> hold.lease >> hold.before_first >> hold.before_last >>
          hold.first_ok >> hold.last_ok >> hold.refused >> hold.canceled;
      char mode = 0;
      std::string name;
      while (fields >> mode >> name) hold.parts.emplace_back(mode, name);
      log.holds.push_back(hold);
    } else if (what == "lost") {
      ++log.sessions_lost;
      log.events.push_back(line);
      std::int64_t lease = 0;
      std::string at;
      long long when = 0;
      fields >> lease >> at >> when;
      if (line.find("is gone from etcd") != std::string::npos ||
          line.find("no longer knows") != std::string::npos)
        log.ended_early[lease] = when;
    } else if (what == "session" || what == "waiting") {
      log.events.push_back(line);
    } else if (what == "connect") {
      ++log.failed_connects;
    }
  }
  return log;
}

// The store's key of a part (fenced_store.hpp).
std::string key_of(const std::pair<char, std::string>& part) {
  return part.first == 'N' ? "#" + part.second : part.second;
}

bool holds_conflict(const Hold& a, const Hold& b) {
  for (const auto& x : a.parts) {
    for (const auto& y : b.parts) {
      if ((x.first != 'S' || y.first != 'S') && test::keys_conflict(key_of(x), key_of(y))) return true;
    }
  }
  return false;
}

std::string describe(const Hold& hold) {
  std::ostringstream text;
  text << "job " << hold.job << " token " << hold.token << " lease " << hold.lease << " ["
       << hold.before_first << ", " << hold.before_last << "] first_ok " << hold.first_ok << " last_ok "
       << hold.last_ok << " refused " << hold.refused;
  for (const auto& [mode, name] : hold.parts) text << ' ' << mode << ' ' << name;
  return text.str();
}

// The nemesis: injects faults into the cluster and the processes, and notes when and where.
class Nemesis {
 public:
  Nemesis(test::EtcdCluster& cluster, std::vector<std::vector<std::unique_ptr<test::TcpProxy>>>& proxies,
          std::vector<pid_t>& workers, test::FencedStore& store, unsigned seed)
      : cluster_(cluster), proxies_(proxies), workers_(workers), store_(store), random_(seed) {}

  void inject(Fault kind) {
    Injected fault{kind, -1, monotonic_ns(), 0};
    switch (kind) {
      case Fault::leader_kill: {
        test::EtcdServer& leader = cluster_.member(leader_now());
        leader.stop();
        std::this_thread::sleep_for(between(1000ms, 3000ms));  // the fault's length
        leader.restart();
        break;
      }
      case Fault::leader_pause_short:
      case Fault::leader_pause_long: {
        test::EtcdServer& leader = cluster_.member(leader_now());
        leader.pause();
        std::this_thread::sleep_for(kind == Fault::leader_pause_short ? between(500ms, 2000ms)
                                                                      : ttl + between(1000ms, 2500ms));
        leader.resume();
        break;
      }
      case Fault::holder_pause:
        fault.process = pick_process();
        // Paused right after it wrote: most likely in the middle of a hold.
        store_.wait_for_an_operation_of(fault.process, 10s);
        ::kill(workers_.at(static_cast<std::size_t>(fault.process)), SIGSTOP);
        std::this_thread::sleep_for(ttl + between(1000ms, 2500ms));
        ::kill(workers_.at(static_cast<std::size_t>(fault.process)), SIGCONT);
        break;
      case Fault::partition: {
        fault.process = pick_process();
        const bool cut = random_() % 2 == 0;  // or stalled: what it sent arrives when healed
        const auto& links = proxies_.at(static_cast<std::size_t>(fault.process));
        for (const auto& proxy : links) cut ? proxy->cut() : proxy->hold();
        std::this_thread::sleep_for(between(1000ms, 5000ms));  // shorter or longer than the TTL
        for (const auto& proxy : links) proxy->restore();
        break;
      }
      case Fault::rolling_restart:
        // As an operator would: the next member goes once the cluster is whole again.
        for (std::size_t i = 0; i < cluster_.size(); ++i) {
          cluster_.member(i).stop();
          cluster_.member(i).restart();
          wait_until_healthy();
        }
        break;
    }
    fault.end = monotonic_ns();
    injected_.push_back(fault);
    std::this_thread::sleep_for(between(500ms, 1500ms));  // quiet between faults
  }

  const std::vector<Injected>& injected() const { return injected_; }

 private:
  std::chrono::milliseconds between(std::chrono::milliseconds low, std::chrono::milliseconds high) {
    return low + std::chrono::milliseconds(random_() % static_cast<unsigned>((high - low).count() + 1));
  }
  int pick_process() { return static_cast<int>(random_() % static_cast<unsigned>(workers_.size())); }
  // Until every member answers a linearizable read (etcdctl endpoint health).
  void wait_until_healthy() {
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    for (std::size_t i = 0; i < cluster_.size();) {
      try {
        cluster_.member(i).etcdctl("endpoint health");
        ++i;
      } catch (const std::exception&) {
        if (std::chrono::steady_clock::now() > give_up) throw;
      }
    }
  }
  // The leader once the running members agree on one (an election may be under way).
  std::size_t leader_now() {
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    for (;;) {
      try {
        return cluster_.leader();
      } catch (const std::exception&) {
        if (std::chrono::steady_clock::now() > give_up) throw;
      }
    }
  }

  test::EtcdCluster& cluster_;
  std::vector<std::vector<std::unique_ptr<test::TcpProxy>>>& proxies_;
  std::vector<pid_t>& workers_;
  test::FencedStore& store_;
  std::mt19937 random_;
  std::vector<Injected> injected_;
};

// The fault most likely behind a refusal at `at` to `process`: the latest one that began before it
// and ended less than a TTL and two seconds before it, targeting that process if one did.
const Injected* cause_of(const std::vector<Injected>& injected, long long at, int process) {
  const Injected* found = nullptr;
  const long long slack = std::chrono::nanoseconds(ttl + 2s).count();
  for (const Injected& fault : injected) {
    if (fault.start > at || fault.end + slack < at || (fault.process != -1 && fault.process != process))
      continue;
    if (found == nullptr || (found->process == -1 && fault.process != -1) || found->start < fault.start)
      found = &fault;
  }
  return found;
}

// The store kept its contract: replayed in its order, no accepted operation has a token lower
// than an earlier accepted one on a conflicting key (writes conflict with everything, reads with
// writes).
void check_store(const std::vector<test::FencedStore::Operation>& record) {
  std::vector<const test::FencedStore::Operation*> accepted;
  for (const auto& op : record) {
    if (!op.accepted) continue;
    for (const auto* earlier : accepted) {
      if ((op.write || earlier->write) && test::keys_conflict(op.key, earlier->key)) {
        ASSERT_GE(op.token, earlier->token)
            << "the store accepted job " << op.hold << "'s token " << op.token << " on " << op.key
            << " after job " << earlier->hold << "'s " << earlier->token << " on " << earlier->key;
      }
    }
    // Only the largest token per key and kind can be the one a later operation is checked against.
    std::erase_if(accepted, [&](const auto* earlier) {
      return earlier->key == op.key && earlier->write == op.write && earlier->token <= op.token;
    });
    accepted.push_back(&op);
  }
}

// Leases etcd ended while their process still counted on them (it learned so from etcd: its key
// was gone, or etcd no longer knew the lease) are protected by the fence alone: a deposed etcd
// leader can answer a renewal it does not honour. Their holds are checked apart
// (check_ended_early).
// Holds in the order they began: conflicting ones never overlap while both were vouched for, and
// began in the order of their tokens (holds of leases etcd ended early left out).
void check_holds(std::vector<Hold> holds, const EndedEarly& ended, long long& pairs) {
  std::erase_if(holds, [&](const Hold& hold) { return !hold.first_ok || ended.count(hold.lease) != 0; });
  std::sort(holds.begin(), holds.end(),
            [](const Hold& a, const Hold& b) { return a.before_first < b.before_first; });
  // The vouched hold that ended last and the hold with the largest token so far, per part.
  std::map<std::pair<char, std::string>, const Hold*> latest_end, largest_token;
  for (const Hold& hold : holds) {
    for (const auto& [part, earlier] : largest_token) {
      Hold only;
      only.parts = {part};
      if (!holds_conflict(only, hold)) continue;
      ++pairs;
      ASSERT_LT(earlier->token, hold.token)
          << "began out of token order:\n  " << describe(*earlier) << "\n  " << describe(hold);
      const Hold* vouched = latest_end.count(part) != 0 ? latest_end[part] : nullptr;
      if (vouched != nullptr) {
        ASSERT_LT(vouched->before_last, hold.before_first)
            << "conflicting holds overlap:\n  " << describe(*vouched) << "\n  " << describe(hold);
      }
    }
    for (const auto& part : hold.parts) {
      if (largest_token.count(part) == 0 || largest_token[part]->token < hold.token)
        largest_token[part] = &hold;
      if (hold.last_ok && (latest_end.count(part) == 0 || latest_end[part]->before_last < hold.before_last))
        latest_end[part] = &hold;
    }
  }
}

// A hold of a lease etcd ended early may meet a later holder: its process must learn of the loss
// within a TTL of that holder's start. Returns how many such meetings there were.
int check_ended_early(const std::vector<Hold>& holds, const EndedEarly& ended) {
  int met = 0;
  const long long within = std::chrono::nanoseconds(ttl).count();
  for (const Hold& early : holds) {
    const auto lost = ended.find(early.lease);
    if (lost == ended.end() || !early.first_ok) continue;
    for (const Hold& other : holds) {
      if (!other.first_ok || other.lease == early.lease || !holds_conflict(early, other)) continue;
      const bool overlap = other.before_first > early.before_first && other.before_first < early.before_last;
      const bool out_of_order = other.token > early.token && other.before_first < early.before_first;
      if (!overlap && !out_of_order) continue;
      ++met;
      EXPECT_LE(lost->second - other.before_first, within)
          << "the loss of lease " << early.lease << " was learned late:\n  " << describe(early) << "\n  "
          << describe(other);
    }
  }
  return met;
}

TEST(EtcdFaultsTest, FencedHoldsSurviveLeaderLossPausesPartitionsAndRestarts) {
  const char* seed_text = std::getenv("TASKLET_FAULTS_SEED");
  const unsigned seed =
      seed_text != nullptr ? static_cast<unsigned>(std::stoul(seed_text)) : std::random_device{}();
  const char* cycles_text = std::getenv("TASKLET_FAULTS_CYCLES");
  const int cycles = cycles_text != nullptr ? std::stoi(cycles_text) : 3;
  const char* only = std::getenv("TASKLET_FAULTS_ONLY");
  std::printf("[ faults   ] seed %u (TASKLET_FAULTS_SEED=%u replays it), %d cycles\n", seed, seed, cycles);
  std::fflush(stdout);

  test::EtcdCluster cluster(3);
  test::FencedStore store;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tasklet-faults-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::filesystem::path stop = dir / "stop";
  std::vector<std::vector<std::unique_ptr<test::TcpProxy>>> proxies(processes);
  std::vector<pid_t> workers;
  for (int p = 0; p < processes; ++p) {
    std::string endpoints;
    auto& links = proxies.at(static_cast<std::size_t>(p));
    for (std::size_t m = 0; m < cluster.size(); ++m) {  // each prefers another member first
      const std::size_t member = (m + static_cast<std::size_t>(p)) % cluster.size();
      links.push_back(std::make_unique<test::TcpProxy>(cluster.member(member).endpoint()));
      endpoints += (m == 0 ? "" : ",") + links.back()->endpoint();
    }
    workers.push_back(test::spawn({TASKLET_ETCD_FAULT_WORKER, endpoints, prefix, std::to_string(store.port()),
                                   std::to_string(p), std::to_string(seed + static_cast<unsigned>(p)),
                                   stop.string(), (dir / ("log" + std::to_string(p))).string()}));
  }

  Nemesis nemesis(cluster, proxies, workers, store, seed);
  std::mt19937 order(seed);
  for (int cycle = 0; cycle < cycles; ++cycle) {
    std::vector<Fault> kinds;
    for (int k = 0; k < fault_kinds; ++k) {
      if (only == nullptr || std::string(only) == short_names[k]) kinds.push_back(static_cast<Fault>(k));
    }
    std::shuffle(kinds.begin(), kinds.end(), order);
    for (const Fault kind : kinds) nemesis.inject(kind);
  }
  std::this_thread::sleep_for(ttl);  // a quiet spell: every process works again
  std::ofstream(stop).put('\n');
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  bool reported = false;
  for (const pid_t worker : workers) {
    auto ended = std::async(std::launch::async, [worker] { return test::exit_status(worker); });
    if (ended.wait_until(give_up) != std::future_status::ready) {
      ADD_FAILURE() << "process " << worker << " hangs: it did not end within a minute of being told to";
      if (!std::exchange(reported, true)) {  // what etcd holds: the keys and the leases
        std::printf("%s", cluster.member(0).etcdctl("get --prefix --keys-only " + prefix).c_str());
        std::istringstream leases(cluster.member(0).etcdctl("lease list"));
        for (std::string lease; leases >> lease;) {
          if (lease.size() == 16)
            std::printf("%s", cluster.member(0).etcdctl("lease timetolive " + lease).c_str());
        }
      }
      // Where its threads wait, when gdb is at hand.
      const std::string where = "gdb -p " + std::to_string(worker) + " -batch -ex 'thread apply all bt' 2>&1";
      [[maybe_unused]] const int shown = std::system(where.c_str());
      ::kill(worker, SIGKILL);
    }
    EXPECT_EQ(ended.get(), 0) << "process " << worker;
  }

  // What the processes and the store saw.
  std::vector<Hold> holds;
  int sessions_lost = 0, failed_connects = 0, jobs = 0, jobs_ok = 0;
  std::map<std::string, int> causes;
  std::vector<std::string> events;
  EndedEarly ended_early;
  for (int p = 0; p < processes; ++p) {
    const ProcessLog log = read_log(dir / ("log" + std::to_string(p)), p);
    sessions_lost += log.sessions_lost;
    for (const std::string& event : log.events) events.push_back(std::to_string(p) + ": " + event);
    failed_connects += log.failed_connects;
    holds.insert(holds.end(), log.holds.begin(), log.holds.end());
    ended_early.insert(log.ended_early.begin(), log.ended_early.end());
    std::map<std::string, const Hold*> hold_of;
    for (const Hold& hold : log.holds) hold_of[hold.job] = &hold;
    for (const auto& [job, runs] : log.runs)
      EXPECT_EQ(runs, 1) << "job " << job << " ran " << runs << " times";
    for (const auto& [job, end] : log.ends) {
      ++jobs;
      if (end == "ok") {
        ++jobs_ok;
        EXPECT_EQ(log.runs.count(job), 1u) << "job " << job << " ended well without running";
        const Hold* hold = hold_of.count(job) != 0 ? hold_of[job] : nullptr;
        EXPECT_TRUE(hold != nullptr && hold->last_ok && hold->refused == 0) << "job " << job << " ended well";
        continue;
      }
      const std::string message = end.substr(end.find(' ') + 1);
      EXPECT_TRUE(message.find("etcd") != std::string::npos ||
                  message.find("the store refused") != std::string::npos)
          << "job " << job << " ended without naming its cause: " << end;
      ++causes[end.substr(0, end.find(' ')) + ": " + message.substr(0, message.find_first_of("0123456789"))];
    }
  }
  const std::vector<test::FencedStore::Operation> record = store.record();
  check_store(record);
  long long pairs = 0;
  check_holds(holds, ended_early, pairs);
  const int met_early = check_ended_early(holds, ended_early);

  // A refused holder had learned of its loss before it ended.
  int refused_holds = 0;
  for (const Hold& hold : holds) {
    if (hold.refused == 0) continue;
    ++refused_holds;
    if (ended_early.count(hold.lease) != 0) continue;  // the fence alone (check_ended_early)
    EXPECT_FALSE(hold.last_ok) << "the store refused a hold the library still vouched for: "
                               << describe(hold);
    EXPECT_TRUE(hold.canceled) << "a lost hold's monitor was not canceled: " << describe(hold);
  }
  std::map<std::string, int> refused_by_cause, injected_by_kind;
  long long accepted = 0, refused = 0;
  for (const auto& op : record) {
    if (op.accepted) {
      ++accepted;
      continue;
    }
    ++refused;
    const Injected* cause = cause_of(nemesis.injected(), op.at_ns, op.process);
    ++refused_by_cause[cause != nullptr ? name_of(cause->kind) : "no fault nearby"];
  }
  for (const Injected& fault : nemesis.injected()) ++injected_by_kind[name_of(fault.kind)];

  // Afterwards: no key of the processes is left once their leases are gone, and a new session works.
  EXPECT_TRUE(test::eventually([&] {
    return cluster.member(0).etcdctl("get --prefix --keys-only " + prefix).find(prefix) == std::string::npos;
  })) << "keys left in etcd:\n"
      << cluster.member(0).etcdctl("get --prefix --keys-only " + prefix);
  EtcdOptions options;
  options.endpoints = cluster.endpoints();
  options.prefix = prefix;
  const auto manager = make_job_manager(EtcdSession::connect(options));
  const Rule root = rules::path("/");
  manager->begin_rule(root);
  EXPECT_GT(fencing_token(*manager, root), 0);
  manager->end_rule(root);

  std::printf("[ faults   ] seed %u: %zu faults injected:", seed, nemesis.injected().size());
  for (const auto& [kind, count] : injected_by_kind) std::printf(" %s %d;", kind.c_str(), count);
  std::printf(
      "\n[ faults   ] %d jobs, %d ended well; %zu holds, %lld conflicting pairs checked; %d sessions lost "
      "(%zu "
      "ended by etcd while renewed, whose holds met %d later holders), %d failed connects\n"
      "[ faults   ] store: %lld operations accepted, %lld refused (%d holds):",
      jobs, jobs_ok, holds.size(), pairs, sessions_lost, ended_early.size(), met_early, failed_connects,
      accepted, refused, refused_holds);
  for (const auto& [cause, count] : refused_by_cause) std::printf(" %s %d;", cause.c_str(), count);
  std::printf("\n[ faults   ] jobs that did not end well, by cause:\n");
  for (const auto& [cause, count] : causes) std::printf("[ faults   ]   %d  %s\n", count, cause.c_str());
  EXPECT_GT(jobs_ok, 0);
  if (injected_by_kind.count(name_of(Fault::holder_pause)) != 0) {
    EXPECT_GT(refused, 0) << "no stale write reached the store: the fence was never tested";
  }
  if (HasFailure()) {
    std::printf("[ faults   ] what happened, on the monotonic clock:\n");
    for (const Injected& fault : nemesis.injected())
      std::printf("[ faults   ]   %lld..%lld %s (process %d)\n", fault.start, fault.end, name_of(fault.kind),
                  fault.process);
    for (const std::string& event : events) std::printf("[ faults   ]   %s\n", event.c_str());
  }
  if (!HasFailure()) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tasklet::etcd
