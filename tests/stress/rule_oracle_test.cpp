// The stress oracle of the reliability contract (DESIGN.md section 6): random mixes of mutex,
// path, read path, multi and custom rules held by thousands of tasklets of several shapes and by
// plain threads using begin_rule. Every hold is recorded as an interval of a global sequence
// counter, [acquired, released], taken inside the hold (after the grant, before the release), and
// then checked against the reference conflict relation `a->is_conflicting(*b) ||
// b->is_conflicting(*a)`:
//  1. no two conflicting holds overlap;
//  2. conflicting tasklets scheduled one after another from one thread hold in that order;
//  3. every tasklet runs the phases it planned and ends (done or failed) exactly once;
//  4. afterwards no rule is held or waiting and the scheduler is idle.
// Sizes scale with TASKLET_STRESS_SCALE; TASKLET_STRESS_SEED replays a seed (see the trace).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <iostream>
#include <latch>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "support/test_support.hpp"
#include "tasklet.hpp"

namespace tasklet {
namespace {

// A user-written rule without an index (key() stays custom): conflicts with the same colour and
// with every path under "/c<colour>". Built-in rules answer false for it, so the table must ask it.
class ColourRule final : public SchedulingRule {
 public:
  explicit ColourRule(int colour) : colour_(colour), top_("c" + std::to_string(colour)) {}
  bool contains(const SchedulingRule& other) const override { return &other == this; }
  bool is_conflicting(const SchedulingRule& other) const override {
    if (const auto* same = dynamic_cast<const ColourRule*>(&other)) return same->colour_ == colour_;
    const RuleKey key = other.key();
    return key.kind == RuleKey::Kind::path && !PathSegments(key.path).empty() &&
           PathSegments(key.path).front() == top_;
  }
  std::string to_string() const override { return "colour(" + std::to_string(colour_) + ")"; }

 private:
  int colour_;
  std::string top_;  // the first path segment of this colour's paths
};

// The exception the oracle's failing tasklets throw.
struct InjectedFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::uint64_t choose_seed() {
  if (const char* text = std::getenv("TASKLET_STRESS_SEED")) return std::strtoull(text, nullptr, 0);
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device();
}

int percent(std::mt19937_64& rng) { return std::uniform_int_distribution<int>(0, 99)(rng); }
int uniform(std::mt19937_64& rng, int low, int high) {
  return std::uniform_int_distribution<int>(low, high)(rng);
}
template <class T>
const T& pick(std::mt19937_64& rng, const std::vector<T>& from) {
  return from[static_cast<std::size_t>(uniform(rng, 0, static_cast<int>(from.size()) - 1))];
}

// Busy work that widens the windows in which holds overlap.
void spin(int iterations) {
  volatile int sink = 0;
  for (int i = 0; i < iterations; ++i) sink = sink + i;
}

// ---------------------------------------------------------------------------------------------
// The rules: a pool of rule objects, the reference relation between them, and for each one the
// rules it contains (candidates for nested begin_rule).

class RulePool {
 public:
  enum Category { mutex_rule, write_path, read_path, multi_rule, custom_rule, category_count };

  explicit RulePool(std::mt19937_64& rng) {
    for (int i = 0; i < 6; ++i) add(mutex_rule, rules::mutex("m" + std::to_string(i)));
    const std::vector<std::string> tops = {"a", "b", "d", "e", "f", "g", "c0", "c1", "c2", "c3"};
    const std::vector<std::string> lower = {"x", "y", "z"};
    const auto random_path = [&] {
      std::string path = "/" + pick(rng, tops);
      for (int depth = uniform(rng, 1, 3); depth > 1; --depth) path += "/" + pick(rng, lower);
      return path;
    };
    for (int i = 0; i < 24; ++i) add(write_path, rules::path(random_path()));
    for (int i = 0; i < 16; ++i) add(read_path, rules::read_path(random_path()));
    // The root, which path requests take their intent on only once somebody claims it.
    add(write_path, rules::path("/"));
    add(read_path, rules::read_path("/"));
    for (int colour = 0; colour < 4; ++colour) {  // two objects per colour: conflicts beyond identity
      add(custom_rule, std::make_shared<ColourRule>(colour));
      add(custom_rule, std::make_shared<ColourRule>(colour));
    }
    const std::size_t atoms = rules_.size();
    for (int i = 0; i < 12; ++i) {
      std::vector<Rule> parts;
      for (int part = uniform(rng, 2, 3); part > 0; --part) {
        parts.push_back(rules_[static_cast<std::size_t>(uniform(rng, 0, static_cast<int>(atoms) - 1))]);
      }
      add(multi_rule, rules::combine(parts));
    }

    const std::size_t n = rules_.size();
    conflicts_.resize(n * n);
    nested_.resize(n);
    for (std::size_t a = 0; a < n; ++a) {
      for (std::size_t b = 0; b < n; ++b) {
        conflicts_[a * n + b] =
            rules_[a]->is_conflicting(*rules_[b]) || rules_[b]->is_conflicting(*rules_[a]);
        if (rules_[a]->contains(*rules_[b])) nested_[a].push_back(rules_[b]);
      }
      // Rules made for nesting only: "/a" then "/a/n", and reads under a read.
      const RuleKey key = rules_[a]->key();
      if (key.kind == RuleKey::Kind::path) {
        const std::string path(PathSegments(key.path).empty() ? std::string_view()
                                                              : key.path);  // "" for the root
        const std::string below = path + "/n";
        if (!key.shared) {
          nested_[a].push_back(rules::path(below));
          nested_[a].push_back(rules::read_path(path.empty() ? "/" : path));
        }
        nested_[a].push_back(rules::read_path(below + "/r"));
      }
    }
  }

  const Rule& rule(int index) const { return rules_[static_cast<std::size_t>(index)]; }
  bool conflict(int a, int b) const {
    return conflicts_[static_cast<std::size_t>(a) * rules_.size() + static_cast<std::size_t>(b)] != 0;
  }
  // Rules that `index` contains: its own nested begin_rule may name them without waiting.
  const std::vector<Rule>& nested(int index) const { return nested_[static_cast<std::size_t>(index)]; }

  // A rule index: first a category, then a rule of it, so that every kind is well represented.
  int random_rule(std::mt19937_64& rng) const {
    return pick(rng, by_category_[static_cast<std::size_t>(uniform(rng, 0, category_count - 1))]);
  }

 private:
  void add(Category category, Rule rule) {
    by_category_[category].push_back(static_cast<int>(rules_.size()));
    rules_.push_back(std::move(rule));
  }

  std::vector<Rule> rules_;
  std::vector<char> conflicts_;
  std::vector<std::vector<Rule>> nested_;
  std::vector<int> by_category_[category_count];
};

// ---------------------------------------------------------------------------------------------
// What a case is made of.

struct Mix {
  int tasklets = 2000;           // times stress_scale()
  int window = 256;              // at most this many scheduled and not ended (0: all at once)
  int async_first_percent = 50;  // scheduled with async (else sync)
  int min_phases = 1;
  int max_phases = 1;
  int sync_async_sync_percent = 0;  // of multi-phase tasklets: exactly sync -> async -> sync
  int no_rule_percent = 10;
  int park_percent = 0;           // a phase parks with wait and is resumed
  int resume_done_percent = 0;    // of parks: resumed with done
  int throw_percent = 0;          // a phase throws
  int nested_percent = 0;         // a phase nests begin_rule inside the tasklet's rule
  int worker_begin_percent = 0;   // of no-rule tasklets: an async phase begins a rule (outermost)
  int threads = 0;                // plain threads using begin_rule / end_rule
  int thread_repeat_percent = 0;  // a thread begins the rule it ended last (parked: resumed or revoked)
  int thread_gap = 0;             // spin iterations between a thread's rules (while one is parked)
  int thread_iterations = 0;      // times stress_scale()
  int thread_nested_percent = 50;
};

enum class ResumeVia { own_phase, helper_tasklet, resumer_thread };

// One tasklet's script, drawn before the run.
struct Plan {
  int rule = -1;                  // pool index of the tasklet's own rule
  int begin_rule = -1;            // no-rule tasklet: pool index begun outermost in phase nested_at
  std::vector<Directive> starts;  // starts[k]: the directive that starts phase k
  int park_at = -1;               // this phase suspends itself and returns wait
  ResumeVia resume_via = ResumeVia::own_phase;
  bool resume_done = false;  // parks in its last phase and is resumed with done
  int throw_at = -1;
  int nested_at = -1;
  std::vector<Rule> nested;  // begun inside the held rule, innermost last (null: a no-op scope)
  int work = 0;

  int phases_expected() const { return throw_at >= 0 ? throw_at + 1 : static_cast<int>(starts.size()); }
};

// One hold: a tasklet's rule, a rule begun by a rule-less tasklet's phase, or a thread's rule.
struct Hold {
  enum Kind : std::uint8_t { tasklet, worker_begin, thread };
  int rule = -1;
  Kind kind = tasklet;
  bool in_order = false;  // scheduled in sequence from the spawner: part of the FIFO check
  int owner = 0;          // tasklet index, or thread number
  std::uint64_t requested = 0, acquired = 0, released = 0;
};

struct TaskletRecord {
  std::atomic<int> phases{0};
  std::atomic<int> ended{0};  // returned done (or will be resumed with done), or threw
  std::atomic<int> destroyed{0};
};

// ---------------------------------------------------------------------------------------------
// Resumes parked tasklets from a thread of its own.

class ResumerThread {
 public:
  explicit ResumerThread(std::function<void(const std::string&)> on_error)
      : on_error_(std::move(on_error)), thread_([this] { loop(); }) {}
  ~ResumerThread() { stop(); }
  ResumerThread(const ResumerThread&) = delete;
  ResumerThread& operator=(const ResumerThread&) = delete;

  void push(Rescheduler rescheduler, Directive directive) {
    {
      std::lock_guard lock(mutex_);
      queue_.emplace_back(std::move(rescheduler), directive);
    }
    changed_.notify_one();
  }

  // Resumes what is queued, then ends the thread.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto [rescheduler, directive] = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      try {
        rescheduler.resume(directive);
      } catch (const std::exception& error) {
        on_error_(std::string("resumer thread: ") + error.what());
      }
      lock.lock();
    }
  }

  std::function<void(const std::string&)> on_error_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<Rescheduler, Directive>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// ---------------------------------------------------------------------------------------------
// One run of a mix: the scripts, the records, the tasklets and threads that follow them, and the
// checks.

class Oracle {
 public:
  Oracle(const Mix& mix, std::uint64_t seed, JobManager& manager)
      : rng_(seed), pool_(rng_), manager_(manager), sync_thread_(std::this_thread::get_id()) {
    const int scale = test::stress_scale();
    tasklet_count_ = mix.tasklets * scale;
    window_ = mix.window;
    thread_count_ = mix.threads;
    thread_iterations_ = mix.thread_iterations * scale;
    thread_gap_ = mix.thread_gap;
    plans_.resize(static_cast<std::size_t>(tasklet_count_));
    records_ = std::make_unique<TaskletRecord[]>(static_cast<std::size_t>(tasklet_count_));
    holds_.resize(static_cast<std::size_t>(tasklet_count_ + thread_count_ * thread_iterations_));
    for (int i = 0; i < tasklet_count_; ++i) draw_plan(mix, i);
    thread_nested_.resize(static_cast<std::size_t>(thread_count_ * thread_iterations_));
    for (int t = 0; t < thread_count_; ++t) {
      for (int j = 0; j < thread_iterations_; ++j) {
        const std::size_t index = static_cast<std::size_t>(tasklet_count_ + t * thread_iterations_ + j);
        Hold& hold = holds_[index];
        hold.kind = Hold::thread;
        hold.owner = t;
        hold.rule = j > 0 && percent(rng_) < mix.thread_repeat_percent ? holds_[index - 1].rule
                                                                       : pool_.random_rule(rng_);
        if (percent(rng_) < mix.thread_nested_percent) {
          thread_nested_[index - static_cast<std::size_t>(tasklet_count_)] = draw_nested(hold.rule);
        }
      }
    }
  }

  int tasklet_count() const { return tasklet_count_; }
  int thread_count() const { return thread_count_; }

  // A sync tasklet that schedules every scripted tasklet, in index order, from the sync thread, in
  // batches; it parks while more than window_ of them are outstanding.
  std::shared_ptr<Tasklet> spawner(std::latch& threads_may_start) {
    return make_tasklet([this, &threads_may_start, next = 0](Tasklet& self) mutable {
      if (next == 0) threads_may_start.count_down();
      const int end = std::min(tasklet_count_, next + spawn_batch);
      for (; next < end; ++next) {
        const Plan& plan = plans_[static_cast<std::size_t>(next)];
        auto tasklet = std::make_shared<OracleTasklet>(*this, next);
        tasklet->set_name("oracle#" + std::to_string(next));
        if (plan.rule >= 0) tasklet->set_rule(pool_.rule(plan.rule));
        holds_[static_cast<std::size_t>(next)].requested = stamp();
        api::current().schedule(std::move(tasklet), plan.starts.front());
      }
      sample_waiting();
      if (next < tasklet_count_ && window_ > 0) {
        const int threshold = next - window_ + spawn_batch;  // resume at window_ - spawn_batch outstanding
        std::lock_guard lock(spawner_mutex_);
        if (ended_total_.load() < threshold) {
          spawner_threshold_.store(threshold);
          parked_spawner_ = api::current().suspend(self);
          return Directive::wait;
        }
      }
      return next < tasklet_count_ ? Directive::sync : Directive::done;
    });
  }

  // The body of plain thread `t`: begin_rule / end_rule with its scripted rules.
  void run_thread(int t) {
    for (int j = 0; j < thread_iterations_; ++j) {
      const std::size_t index = static_cast<std::size_t>(tasklet_count_ + t * thread_iterations_ + j);
      Hold& hold = holds_[index];
      if (j % 8 == 0) sample_waiting();
      try {
        hold.requested = stamp();
        RuleScope outer(manager_, pool_.rule(hold.rule));
        hold.acquired = stamp();
        expect_current(pool_.rule(hold.rule), "thread's outermost rule");
        with_nested(thread_nested_[index - static_cast<std::size_t>(tasklet_count_)], pool_.rule(hold.rule),
                    [&] { spin(j % 5 * 40); });
        hold.released = stamp();
      } catch (const std::exception& error) {
        note_error("thread " + std::to_string(t) + ": " + error.what());
      }
      spin(thread_gap_);
    }
  }

  ResumerThread& resumer() { return resumer_; }
  std::size_t helpers_scheduled() const { return helpers_scheduled_.load(); }
  std::size_t helpers_done() const { return helpers_done_.load(); }
  int injected_failures() const { return thrown_.load(); }
  int destroyed() const { return destroyed_.load(); }
  std::size_t max_waiting() const { return max_waiting_.load(); }

  // Check 3: every tasklet ran its planned phases, on the right threads, and ended exactly once.
  void check_tasklets() const {
    int wrong_phases = 0, wrong_ends = 0;
    for (int i = 0; i < tasklet_count_; ++i) {
      const Plan& plan = plans_[static_cast<std::size_t>(i)];
      const TaskletRecord& record = records_[static_cast<std::size_t>(i)];
      if (record.phases.load() != plan.phases_expected() && ++wrong_phases <= 5) {
        ADD_FAILURE() << "tasklet " << i << " ran " << record.phases.load() << " phases, planned "
                      << plan.phases_expected();
      }
      if (record.ended.load() != 1 && ++wrong_ends <= 5) {
        ADD_FAILURE() << "tasklet " << i << " ended " << record.ended.load() << " times";
      }
    }
    EXPECT_EQ(wrong_phases, 0) << "tasklets that ran the wrong number of phases";
    EXPECT_EQ(wrong_ends, 0) << "tasklets that did not end exactly once";
    EXPECT_EQ(phase_on_wrong_thread_.load(), 0) << "sync phases off the sync thread, or async phases on it";
    EXPECT_EQ(ended_twice_.load(), 0) << "a tasklet's phase ran after it had ended";
    EXPECT_EQ(destroyed_badly_.load(), 0) << "a tasklet was destroyed without having ended exactly once";
    std::lock_guard lock(errors_mutex_);
    EXPECT_EQ(error_count_, 0u) << "errors seen during the run, first ones:\n" << errors_text();
  }

  // Pairs are counted among those alive together: the later one was requested before the earlier
  // one was released (every other pair is in order and apart by construction).
  struct Summary {
    std::uint64_t holds = 0, conflicting_pairs = 0, contended_pairs = 0, parallel_pairs = 0, all_pairs = 0;
  };

  // Checks 1 and 2 with the reference relation, over every pair that could break them: a hold
  // released before another was requested can neither overlap it nor be granted after it. A sweep
  // in request order keeps the holds still alive (bounded by the window and the threads), so a case
  // of 10^6 holds is checked in time linear in its length.
  Summary check_holds() const {
    Summary summary;
    std::vector<const Hold*> holds;
    int unstamped = 0;
    for (const Hold& hold : holds_) {
      if (hold.rule < 0) continue;
      if (hold.requested == 0 || hold.acquired == 0 || hold.released == 0 || hold.released < hold.acquired ||
          hold.acquired < hold.requested) {
        if (++unstamped <= 5) ADD_FAILURE() << "hold not recorded properly: " << describe_hold(hold);
        continue;
      }
      holds.push_back(&hold);
    }
    EXPECT_EQ(unstamped, 0);
    summary.holds = holds.size();
    // Stamps are unique; the spawner stamps its tasklets in schedule order.
    std::sort(holds.begin(), holds.end(),
              [](const Hold* a, const Hold* b) { return a->requested < b->requested; });
    std::vector<const Hold*> alive;
    int overlaps = 0, out_of_order = 0;
    for (const Hold* later : holds) {
      const Hold& b = *later;
      std::erase_if(alive, [&](const Hold* a) { return a->released < b.requested; });
      for (const Hold* earlier : alive) {
        const Hold& a = *earlier;
        ++summary.all_pairs;
        const bool overlap = !(a.released < b.acquired || b.released < a.acquired);
        if (!pool_.conflict(a.rule, b.rule)) {
          if (overlap) ++summary.parallel_pairs;
          continue;
        }
        ++summary.conflicting_pairs;
        if (overlap && ++overlaps <= 5) {
          ADD_FAILURE() << "conflicting holds overlap:\n  " << describe_hold(a) << "\n  " << describe_hold(b);
        }
        if (a.in_order && b.in_order) {  // a was scheduled first, b requested while a held or waited
          ++summary.contended_pairs;
          if (!(a.released < b.acquired) && ++out_of_order <= 5) {
            ADD_FAILURE() << "conflicting tasklets held out of schedule order:\n  " << describe_hold(a)
                          << "\n  " << describe_hold(b);
          }
        }
      }
      alive.push_back(later);
    }
    EXPECT_EQ(overlaps, 0) << "check 1: pairs of conflicting holds that overlapped";
    EXPECT_EQ(out_of_order, 0) << "check 2: conflicting pairs granted out of request order";
    return summary;
  }

 private:
  class OracleTasklet final : public Tasklet {
   public:
    OracleTasklet(Oracle& oracle, int index) : oracle_(oracle), index_(index) {}
    ~OracleTasklet() override {
      TaskletRecord& record = oracle_.records_[static_cast<std::size_t>(index_)];
      if (record.destroyed.fetch_add(1) != 0 || record.ended.load() != 1)
        oracle_.destroyed_badly_.fetch_add(1);
      oracle_.destroyed_.fetch_add(1);
    }
    Directive task() override { return oracle_.run_phase(*this, index_, phase_++); }

   private:
    Oracle& oracle_;
    int index_;
    int phase_ = 0;
  };

  static constexpr int spawn_batch = 64;

  // Counts a tasklet's end, and resumes the spawner once few enough are outstanding.
  void note_ended(TaskletRecord& record) {
    record.ended.fetch_add(1);
    const int ended = ended_total_.fetch_add(1) + 1;
    if (ended < spawner_threshold_.load()) return;  // thresholds only grow: an old one is passed
    Rescheduler parked;
    {
      std::lock_guard lock(spawner_mutex_);
      if (parked_spawner_ && ended_total_.load() >= spawner_threshold_.load()) {
        parked = std::exchange(parked_spawner_, Rescheduler{});
      }
    }
    if (parked) parked.resume(Directive::sync);
  }

  std::uint64_t stamp() { return sequence_.fetch_add(1, std::memory_order_acq_rel) + 1; }

  void sample_waiting() {
    const std::size_t waiting = manager_.rule_stats().waiting;
    std::size_t seen = max_waiting_.load();
    while (waiting > seen && !max_waiting_.compare_exchange_weak(seen, waiting)) {
    }
  }

  std::vector<Rule> draw_nested(int outer) {
    std::vector<Rule> nested;
    for (int depth = uniform(rng_, 1, 2); depth > 0; --depth) {
      nested.push_back(percent(rng_) < 10 ? nullptr : pick(rng_, pool_.nested(outer)));
    }
    return nested;
  }

  void draw_plan(const Mix& mix, int index) {
    Plan& plan = plans_[static_cast<std::size_t>(index)];
    Hold& hold = holds_[static_cast<std::size_t>(index)];
    hold.owner = index;
    const int phases = uniform(rng_, mix.min_phases, mix.max_phases);
    if (phases == 3 && percent(rng_) < mix.sync_async_sync_percent) {
      plan.starts = {Directive::sync, Directive::async, Directive::sync};
    } else {
      plan.starts.push_back(percent(rng_) < mix.async_first_percent ? Directive::async : Directive::sync);
      for (int k = 1; k < phases; ++k)
        plan.starts.push_back(percent(rng_) < 50 ? Directive::async : Directive::sync);
    }
    if (percent(rng_) >= mix.no_rule_percent) {
      plan.rule = pool_.random_rule(rng_);
      hold.rule = plan.rule;
      hold.in_order = true;
      if (percent(rng_) < mix.nested_percent) {
        plan.nested_at = uniform(rng_, 0, phases - 1);
        plan.nested = draw_nested(plan.rule);
      }
    } else if (percent(rng_) < mix.worker_begin_percent) {
      // An outermost begin_rule waits: only on a worker, where the waiting task is suspended.
      plan.nested_at = uniform(rng_, 0, phases - 1);
      plan.starts[static_cast<std::size_t>(plan.nested_at)] = Directive::async;
      plan.begin_rule = pool_.random_rule(rng_);
      plan.nested = draw_nested(plan.begin_rule);
      hold.kind = Hold::worker_begin;
      hold.rule = plan.begin_rule;
    }
    if (phases >= 2 && percent(rng_) < mix.park_percent) {
      plan.park_at = uniform(rng_, 0, phases - 2);
      plan.resume_via = static_cast<ResumeVia>(uniform(rng_, 0, 2));
      if (percent(rng_) < mix.resume_done_percent) {
        plan.resume_done = true;
        plan.starts.resize(static_cast<std::size_t>(plan.park_at + 1));
        if (plan.nested_at > plan.park_at) drop_nested(plan, hold);
      }
    }
    if (percent(rng_) < mix.throw_percent) {
      plan.throw_at = uniform(rng_, 0, static_cast<int>(plan.starts.size()) - 1);
      if (plan.park_at >= plan.throw_at) {  // never reached
        plan.park_at = -1;
        plan.resume_done = false;
      }
      if (plan.nested_at > plan.throw_at) drop_nested(plan, hold);
    }
    plan.work = uniform(rng_, 0, 300);
  }

  // The phase that would nest rules is never reached.
  static void drop_nested(Plan& plan, Hold& hold) {
    plan.nested_at = -1;
    plan.begin_rule = -1;
    plan.nested.clear();
    hold.rule = plan.rule;
    hold.kind = Hold::tasklet;
  }

  Directive run_phase(Tasklet& self, int index, int phase) {
    const Plan& plan = plans_[static_cast<std::size_t>(index)];
    TaskletRecord& record = records_[static_cast<std::size_t>(index)];
    Hold& hold = holds_[static_cast<std::size_t>(index)];
    record.phases.fetch_add(1);
    if (record.ended.load() != 0 || phase >= static_cast<int>(plan.starts.size())) {
      ended_twice_.fetch_add(1);
      return Directive::done;
    }
    const bool on_sync_thread = std::this_thread::get_id() == sync_thread_;
    if (on_sync_thread != (plan.starts[static_cast<std::size_t>(phase)] == Directive::sync)) {
      phase_on_wrong_thread_.fetch_add(1);
    }
    if (phase == 0 && plan.rule >= 0) hold.acquired = stamp();
    if (index % 16 == 0 && phase == 0) sample_waiting();
    const bool last = phase + 1 == static_cast<int>(plan.starts.size());
    const auto fail_here = [&] {
      if (plan.rule >= 0) hold.released = stamp();
      note_ended(record);
      thrown_.fetch_add(1);
      throw InjectedFailure("injected failure in tasklet " + std::to_string(index));
    };

    if (phase == plan.nested_at) {
      if (plan.rule >= 0) {
        expect_current(pool_.rule(plan.rule), "a tasklet's own rule");
        with_nested(plan.nested, pool_.rule(plan.rule), [&] {
          spin(plan.work);
          if (phase == plan.throw_at) fail_here();  // unwinds through the nested scopes
        });
        expect_current(pool_.rule(plan.rule), "a tasklet's own rule after nested scopes");
      } else {
        expect_current(nullptr, "a rule-less tasklet");
        hold.requested = stamp();
        RuleScope outer(manager_, pool_.rule(plan.begin_rule));
        hold.acquired = stamp();
        expect_current(pool_.rule(plan.begin_rule), "a rule begun by a rule-less tasklet");
        with_nested(plan.nested, pool_.rule(plan.begin_rule), [&] {
          spin(plan.work);
          if (phase == plan.throw_at) {
            hold.released = stamp();
            fail_here();
          }
        });
        hold.released = stamp();
      }
    } else {
      spin(plan.work);
    }
    if (phase == plan.throw_at) fail_here();

    if (last && !plan.resume_done) {
      if (plan.rule >= 0) hold.released = stamp();
      note_ended(record);
      return Directive::done;
    }
    if (phase == plan.park_at) {
      if (plan.resume_done) {  // resumed with done: this phase is the last one
        if (plan.rule >= 0) hold.released = stamp();
        note_ended(record);
      }
      park(self, plan, plan.resume_done ? Directive::done : plan.starts[static_cast<std::size_t>(phase + 1)]);
      return Directive::wait;
    }
    return plan.starts[static_cast<std::size_t>(phase + 1)];
  }

  void park(Tasklet& self, const Plan& plan, Directive resume_with) {
    Rescheduler rescheduler = api::current().suspend(self);
    switch (plan.resume_via) {
      case ResumeVia::own_phase:  // before this phase returns wait: the resume must stick
        rescheduler.resume(resume_with);
        break;
      case ResumeVia::helper_tasklet:
        helpers_scheduled_.fetch_add(1);
        api::current().schedule(make_tasklet([this, rescheduler, resume_with] {
                                  rescheduler.resume(resume_with);
                                  helpers_done_.fetch_add(1);
                                  return Directive::done;
                                }),
                                Directive::async);
        break;
      case ResumeVia::resumer_thread:
        resumer_.push(rescheduler, resume_with);
        break;
    }
  }

  // Begins `nested` one inside the other (each contained by `outer`, which is held), runs `body`
  // innermost, and checks current_rule() on the way.
  void with_nested(std::span<const Rule> nested, const Rule& enclosing, const std::function<void()>& body) {
    if (nested.empty()) {
      body();
      return;
    }
    {
      RuleScope scope(manager_, nested.front());
      const Rule& innermost = nested.front() ? nested.front() : enclosing;
      expect_current(innermost, "a nested rule");
      with_nested(nested.subspan(1), innermost, body);
    }
    expect_current(enclosing, "the enclosing rule after a nested scope");
  }

  void expect_current(const Rule& expected, const char* what) {
    const Rule current = manager_.current_rule();
    if (current != expected) {
      note_error(std::string("current_rule() is ") + describe(current) + " inside " + what + ", expected " +
                 describe(expected));
    }
  }

  void note_error(const std::string& message) {
    std::lock_guard lock(errors_mutex_);
    if (errors_.size() < 10) errors_.push_back(message);
    ++error_count_;
  }
  std::string errors_text() const {
    std::string text;
    for (const std::string& error : errors_) text += "  " + error + "\n";
    return text;
  }

  std::string describe_hold(const Hold& hold) const {
    static const char* const kinds[] = {"tasklet", "rule-less tasklet's begin_rule", "thread"};
    std::string text = std::string(kinds[hold.kind]) + " " + std::to_string(hold.owner) + " " +
                       describe(pool_.rule(hold.rule)) + " requested " + std::to_string(hold.requested) +
                       " held [" + std::to_string(hold.acquired) + ", " + std::to_string(hold.released) + "]";
    if (hold.kind != Hold::thread) {
      const Plan& plan = plans_[static_cast<std::size_t>(hold.owner)];
      text += " phases " + std::to_string(plan.starts.size()) + " park_at " + std::to_string(plan.park_at) +
              " throw_at " + std::to_string(plan.throw_at) + " nested_at " + std::to_string(plan.nested_at);
    }
    return text;
  }

  std::mt19937_64 rng_;
  RulePool pool_;
  JobManager& manager_;
  const std::thread::id sync_thread_;
  int tasklet_count_ = 0;
  int window_ = 0;
  int thread_count_ = 0;
  int thread_iterations_ = 0;
  int thread_gap_ = 0;
  std::vector<Plan> plans_;
  std::vector<Hold> holds_;  // tasklets in schedule order, then each thread's iterations
  std::vector<std::vector<Rule>> thread_nested_;
  std::unique_ptr<TaskletRecord[]> records_;

  std::atomic<std::uint64_t> sequence_{0};
  std::atomic<int> ended_total_{0};
  std::atomic<int> spawner_threshold_{0};
  std::mutex spawner_mutex_;
  Rescheduler parked_spawner_;  // guarded by spawner_mutex_
  std::atomic<std::size_t> max_waiting_{0};
  std::atomic<int> thrown_{0};
  std::atomic<int> destroyed_{0};
  std::atomic<int> destroyed_badly_{0};
  std::atomic<int> ended_twice_{0};
  std::atomic<int> phase_on_wrong_thread_{0};
  std::atomic<std::size_t> helpers_scheduled_{0};
  std::atomic<std::size_t> helpers_done_{0};

  mutable std::mutex errors_mutex_;
  std::vector<std::string> errors_;
  std::size_t error_count_ = 0;

  ResumerThread resumer_{[this](const std::string& message) { note_error(message); }};
};

// ---------------------------------------------------------------------------------------------

class RuleOracleTest : public test::WorkerCountTest {
 protected:
  void TearDown() override {
    WorkerCountTest::TearDown();
    const auto stats = manager_->rule_stats();
    EXPECT_EQ(stats.held, 0u) << "a rule is still held";
    EXPECT_EQ(stats.waiting, 0u) << "a request is still waiting";
  }

  void run_mix(const Mix& mix) {
    const std::uint64_t seed = choose_seed();
    SCOPED_TRACE(
        "seed " + std::to_string(seed) + " (replay with TASKLET_STRESS_SEED=" + std::to_string(seed) +
        " and --gtest_filter=" + ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name() +
        "." + ::testing::UnitTest::GetInstance()->current_test_info()->name() + ")");
    const auto started = std::chrono::steady_clock::now();
    Oracle oracle(mix, seed, *manager_);

    std::latch threads_may_start(1);
    std::vector<std::thread> threads;
    for (int t = 0; t < oracle.thread_count(); ++t) {
      threads.emplace_back([&, t] {
        threads_may_start.wait();
        oracle.run_thread(t);
      });
    }
    scheduler().schedule(oracle.spawner(threads_may_start), Directive::sync);
    bool rethrown = false;
    try {
      scheduler().run();
    } catch (const InjectedFailure&) {
      rethrown = true;
    } catch (const std::exception& error) {
      ADD_FAILURE() << "run() threw something the oracle did not inject: " << error.what();
    }
    for (std::thread& thread : threads) thread.join();
    oracle.resumer().stop();

    // Check 4: quiescence.
    const auto stats = manager_->rule_stats();
    EXPECT_EQ(stats.held, 0u);
    EXPECT_EQ(stats.waiting, 0u);
    EXPECT_EQ(scheduler().active_count(), 0u);
    EXPECT_EQ(oracle.destroyed(), oracle.tasklet_count())
        << "the scheduler kept tasklets after run() returned";

    // Failures: run() rethrows the first after draining; failures() has every one.
    const int thrown = oracle.injected_failures();
    EXPECT_EQ(rethrown, thrown > 0);
    const auto failures = scheduler().failures();
    EXPECT_EQ(failures.size(), static_cast<std::size_t>(thrown));
    for (const Failure& failure : failures) {
      try {
        std::rethrow_exception(failure.error);
      } catch (const InjectedFailure&) {
      } catch (const std::exception& error) {
        ADD_FAILURE() << "unexpected failure of " << failure.tasklet << ": " << error.what();
      }
    }
    EXPECT_EQ(oracle.helpers_done(), oracle.helpers_scheduled());

    oracle.check_tasklets();
    const Oracle::Summary summary = oracle.check_holds();

    // Not vacuous: many pairs conflict, and later requests really had to wait for earlier ones.
    EXPECT_GT(summary.conflicting_pairs * 33, summary.all_pairs) << "fewer than 3% of the pairs conflict";
    EXPECT_GE(summary.contended_pairs, static_cast<std::uint64_t>(oracle.tasklet_count() / 4))
        << "too few conflicting tasklet pairs were requested while the earlier one held";
    EXPECT_GT(oracle.max_waiting(), 0u) << "no request was ever seen waiting";

    const auto elapsed =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    std::cout << "[ oracle   ] seed " << seed << ": " << oracle.tasklet_count() << " tasklets, "
              << summary.holds << " holds, " << summary.conflicting_pairs << " conflicting pairs ("
              << summary.contended_pairs << " contended), " << summary.parallel_pairs
              << " parallel pairs, max waiting " << oracle.max_waiting() << ", " << thrown << " failures, "
              << elapsed.count() << " ms\n";
  }
};
TASKLET_WORKER_COUNTS(RuleOracleTest);

TEST_P(RuleOracleTest, SingleAsyncPhase) {
  Mix mix;
  mix.async_first_percent = 100;
  run_mix(mix);
}

TEST_P(RuleOracleTest, EveryTaskletScheduledAtOnce) {
  // No window: nearly every request waits behind an earlier conflicting one.
  Mix mix;
  mix.window = 0;
  mix.max_phases = 2;
  run_mix(mix);
}

TEST_P(RuleOracleTest, RuleHeldAcrossPhases) {
  Mix mix;
  mix.min_phases = 2;
  mix.max_phases = 5;
  mix.sync_async_sync_percent = 70;
  run_mix(mix);
}

TEST_P(RuleOracleTest, ParkedAndResumedElsewhere) {
  Mix mix;
  mix.min_phases = 2;
  mix.max_phases = 4;
  mix.park_percent = 60;
  mix.resume_done_percent = 10;
  run_mix(mix);
}

TEST_P(RuleOracleTest, FailingPhasesReleaseTheirRules) {
  Mix mix;
  mix.min_phases = 1;
  mix.max_phases = 3;
  mix.throw_percent = 8;
  run_mix(mix);
}

TEST_P(RuleOracleTest, ThreadsWithBeginRule) {
  Mix mix;
  mix.min_phases = 1;
  mix.max_phases = 3;
  mix.threads = 3;
  mix.thread_iterations = 200;
  run_mix(mix);
}

// Threads that take the same rule again and again mostly resume their parked requests, and the
// tasklets and other threads that want those rules revoke them, or wait for a real release.
TEST_P(RuleOracleTest, ThreadsRepeatingTheirRules) {
  Mix mix;
  mix.min_phases = 1;
  mix.max_phases = 2;
  mix.threads = 4;
  mix.thread_iterations = 400;
  mix.thread_repeat_percent = 85;
  mix.thread_gap = 20000;
  run_mix(mix);
}

TEST_P(RuleOracleTest, BeginRuleInsidePhases) {
  Mix mix;
  mix.min_phases = 1;
  mix.max_phases = 3;
  mix.no_rule_percent = 25;
  mix.nested_percent = 50;
  mix.worker_begin_percent = 100;
  run_mix(mix);
}

TEST_P(RuleOracleTest, EverythingAtOnce) {
  Mix mix;
  mix.min_phases = 1;
  mix.max_phases = 4;
  mix.sync_async_sync_percent = 50;
  mix.no_rule_percent = 20;
  mix.park_percent = 30;
  mix.resume_done_percent = 10;
  mix.throw_percent = 4;
  mix.nested_percent = 30;
  mix.worker_begin_percent = 60;
  mix.threads = 3;
  mix.thread_iterations = 150;
  run_mix(mix);
}

// Throws from `depth` frames down, each with a local array (ASan puts redzones around it). A phase
// that throws this after its begin_rule waited on a worker (its task suspended and resumed) is
// what ASan misread on oneTBB's swapped stacks: the asan preset's oneTBB runs them on threads.
[[noreturn]] void throw_from_depth(int depth) {
  volatile char frame[64] = {};
  frame[depth % 64] = 1;
  if (depth > 0) throw_from_depth(depth - 1);
  throw std::runtime_error("thrown from depth " + std::to_string(frame[0]));
}

TEST(RuleOracleRegressionTest, ThrowAfterResumingFromBeginRule) {
  // Fifty async phases wait in begin_rule on the only worker (each task suspended), are resumed
  // one by one when the holder lets go, and throw from a few frames down inside the rule scope.
  auto manager = JobManager::create(JobManager::Options{1, nullptr});
  auto scheduler = Scheduler::create(SchedulerOptions{manager, nullptr, 0});
  const Rule m = rules::mutex("m");
  const int waiters = 50;
  std::latch held(1), may_release(1);
  std::thread holder([&] {
    RuleScope scope(*manager, m);
    held.count_down();
    may_release.wait();
  });
  held.wait();
  for (int i = 0; i < waiters; ++i) {
    scheduler->schedule(make_tasklet([&, i, phase = 0]() mutable -> Directive {
                          if (phase++ == 0) return Directive::async;
                          RuleScope scope(*manager, m);  // waits: the task is suspended, then resumed
                          throw_from_depth(i % 7);
                        }),
                        Directive::sync);
  }
  scheduler->schedule(make_tasklet([&] {  // polls politely (re-queued) until every phase waits
                        if (manager->rule_stats().waiting < static_cast<std::size_t>(waiters)) {
                          return Directive::sync;
                        }
                        may_release.count_down();
                        return Directive::done;
                      }),
                      Directive::sync);
  EXPECT_THROW(scheduler->run(), std::runtime_error);
  holder.join();
  EXPECT_EQ(scheduler->failures().size(), static_cast<std::size_t>(waiters));
  EXPECT_EQ(manager->rule_stats().held, 0u);
  EXPECT_EQ(manager->rule_stats().waiting, 0u);
}

}  // namespace
}  // namespace tasklet
