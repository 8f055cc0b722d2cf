// The trace recorder: off by default, and what it writes is a valid Chrome trace (the fields the
// Trace Event Format requires, matched async slices and flows, threads' slices nested) that shows
// the sample run as it happened: who waited for which rule behind whom, which release let whom
// through, job states, parks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sample_run.hpp"
#include "support/job_support.hpp"

namespace tasklet {
namespace {

using nlohmann::json;

json written(const JobManager& manager) {
  std::ostringstream out;
  manager.write_trace(out, JobManager::TraceFormat::chrome_json);
  return json::parse(out.str());  // throws on invalid JSON
}

std::vector<json> events_of(const json& trace, const std::string& phase, const std::string& category = "") {
  std::vector<json> found;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] == phase && (category.empty() || event.value("cat", "") == category))
      found.push_back(event);
  }
  return found;
}

std::string arg(const json& event, const char* key) {
  return event.contains("args") && event["args"].contains(key) ? event["args"][key].get<std::string>() : "";
}

// The fields Chrome's Trace Event Format requires of each kind of event, and the pairs it matches.
void expect_valid_chrome_trace(const json& trace) {
  ASSERT_TRUE(trace.is_object());
  ASSERT_TRUE(trace.contains("traceEvents") && trace["traceEvents"].is_array());
  EXPECT_EQ(trace.value("displayTimeUnit", ""), "ns");
  const std::set<std::string> phases{"M", "X", "b", "e", "s", "f", "i"};
  std::set<long> named_threads, used_threads;
  std::map<std::pair<std::string, std::string>, int> open_async;
  std::map<long, int> flow_starts, flow_ends;
  for (const json& event : trace["traceEvents"]) {
    SCOPED_TRACE(event.dump());
    ASSERT_TRUE(event.contains("ph") && event["ph"].is_string());
    const std::string ph = event["ph"];
    ASSERT_TRUE(phases.contains(ph));
    ASSERT_TRUE(event.contains("name") && event["name"].is_string());
    ASSERT_TRUE(event.contains("pid") && event["pid"].is_number_integer());
    if (ph == "M") {
      ASSERT_TRUE(event.contains("args") && event["args"].is_object());
      if (event["name"] == "thread_name") {
        ASSERT_TRUE(event["tid"].is_number_integer());
        ASSERT_TRUE(event["args"]["name"].is_string());
        named_threads.insert(event["tid"].get<long>());
      }
      continue;
    }
    ASSERT_TRUE(event.contains("tid") && event["tid"].is_number_integer());
    ASSERT_TRUE(event.contains("ts") && event["ts"].is_number());
    ASSERT_TRUE(event.contains("cat") && event["cat"].is_string());
    EXPECT_GE(event["ts"].get<double>(), 0.0);
    used_threads.insert(event["tid"].get<long>());
    if (ph == "X") {
      ASSERT_TRUE(event.contains("dur") && event["dur"].is_number());
      EXPECT_GE(event["dur"].get<double>(), 0.0);
    } else if (ph == "b" || ph == "e") {
      ASSERT_TRUE(event.contains("id") && event["id"].is_string());
      open_async[{event["cat"], event["id"]}] += ph == "b" ? 1 : -1;
    } else if (ph == "s" || ph == "f") {
      ASSERT_TRUE(event.contains("id") && event["id"].is_number_integer());
      (ph == "s" ? flow_starts : flow_ends)[event["id"].get<long>()] += 1;
      if (ph == "f") {
        EXPECT_EQ(event.value("bp", ""), "e");
      }
    } else if (ph == "i") {
      EXPECT_EQ(event.value("s", ""), "t");
    }
  }
  for (const long tid : used_threads) {
    EXPECT_TRUE(named_threads.contains(tid)) << "thread " << tid << " unnamed";
  }
  for (const auto& [key, open] : open_async) {
    EXPECT_EQ(open, 0) << key.first << " " << key.second;
  }
  EXPECT_EQ(flow_starts, flow_ends);
  // Each b comes before its e.
  std::map<std::pair<std::string, std::string>, double> began;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] == "b") began[{event["cat"], event["id"]}] = event["ts"];
    if (event["ph"] == "e") {
      EXPECT_LE((began[{event["cat"], event["id"]}]), event["ts"].get<double>());
    }
  }
}

// On one thread, complete slices nest: none starts inside another and ends after it.
void expect_nested_slices(const json& trace) {
  // In whole nanoseconds, as recorded: the sum of two microsecond figures may round past the
  // start of the next slice.
  struct Slice {
    long long start, end;
    std::string name;
  };
  std::map<long, std::vector<Slice>> slices;
  for (const json& event : events_of(trace, "X")) {
    const long long ts = std::llround(event["ts"].get<double>() * 1000);
    slices[event["tid"]].push_back({ts, ts + std::llround(event["dur"].get<double>() * 1000), event["name"]});
  }
  for (auto& [tid, list] : slices) {
    std::sort(list.begin(), list.end(), [](const Slice& a, const Slice& b) {
      return a.start < b.start || (a.start == b.start && a.end > b.end);
    });
    std::vector<const Slice*> open;
    for (const Slice& slice : list) {
      while (!open.empty() && open.back()->end <= slice.start) open.pop_back();
      if (!open.empty()) {
        EXPECT_LE(slice.end, open.back()->end)
            << "thread " << tid << ": " << slice.name << " overlaps " << open.back()->name;
      }
      open.push_back(&slice);
    }
  }
}

// Whether `at` on thread `tid` lies inside a complete slice there.
bool inside_slice(const json& trace, long tid, double at) {
  for (const json& event : events_of(trace, "X")) {
    const double ts = event["ts"];
    if (event["tid"] == tid && ts <= at && at <= ts + event["dur"].get<double>()) return true;
  }
  return false;
}

TEST(TraceTest, OffByDefault) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  test::run_sample(manager);
  const json trace = written(*manager);
  expect_valid_chrome_trace(trace);
  for (const json& event : trace["traceEvents"]) {
    EXPECT_EQ(event["ph"], "M") << event.dump();
  }
  const RuleSnapshot snapshot = manager->rule_snapshot();
  EXPECT_TRUE(snapshot.requests.empty());
}

TEST(TraceTest, RecordsTheSampleRunAsAValidChromeTrace) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  manager->start_trace();
  test::run_sample(manager);
  manager->stop_trace();
  const json trace = written(*manager);
  expect_valid_chrome_trace(trace);
  expect_nested_slices(trace);
  EXPECT_EQ(trace["otherData"]["dropped_events"], 0);

  // The reader waited for its rule, holding no thread, behind the holder.
  const auto waits = events_of(trace, "b", "rule-wait");
  const auto reader_wait = std::find_if(waits.begin(), waits.end(),
                                        [](const json& e) { return arg(e, "owner") == "job 'reader'"; });
  ASSERT_NE(reader_wait, waits.end()) << trace.dump(1);
  EXPECT_EQ(arg(*reader_wait, "rule"), "path(/a/x)");
  EXPECT_NE(arg(*reader_wait, "blockers").find("job 'holder' holds path(/a)"), std::string::npos)
      << arg(*reader_wait, "blockers");
  EXPECT_EQ(arg(*reader_wait, "let_through_by"), "job 'holder' releasing path(/a)");
  EXPECT_EQ(arg(*reader_wait, "job"), "reader");

  // The thread waited in begin_rule, on its own track, and then held its rule there.
  const auto thread_waits = events_of(trace, "X", "wait");
  ASSERT_EQ(thread_waits.size(), 1u);
  EXPECT_EQ(arg(thread_waits[0], "rule"), "path(/a/y)");
  EXPECT_NE(arg(thread_waits[0], "blockers").find("job 'holder'"), std::string::npos);
  const auto thread_holds = events_of(trace, "X", "hold");
  ASSERT_EQ(thread_holds.size(), 1u);
  EXPECT_EQ(arg(thread_holds[0], "rule"), "path(/a/y)");
  EXPECT_EQ(thread_holds[0]["tid"], thread_waits[0]["tid"]);

  // Jobs held their rules across their phases.
  std::set<std::string> held;
  for (const json& e : events_of(trace, "b", "hold")) held.insert(arg(e, "owner") + " " + arg(e, "rule"));
  EXPECT_TRUE(held.contains("job 'holder' path(/a)"));
  EXPECT_TRUE(held.contains("job 'reader' path(/a/x)"));
  EXPECT_TRUE(held.contains("job 'other' read_path(/b)"));

  // The holder's release let both waiters through: two arrows start inside its release slice and
  // end inside slices of the threads that went on with the rules.
  const auto releases = events_of(trace, "X", "release");
  const auto holder_release = std::find_if(releases.begin(), releases.end(),
                                           [](const json& e) { return arg(e, "owner") == "job 'holder'"; });
  ASSERT_NE(holder_release, releases.end());
  const double from = (*holder_release)["ts"], to = from + (*holder_release)["dur"].get<double>();
  int arrows_from_release = 0;
  for (const json& start : events_of(trace, "s", "grant")) {
    const double at = start["ts"];
    if (start["tid"] == (*holder_release)["tid"] && from <= at && at <= to) ++arrows_from_release;
  }
  EXPECT_EQ(arrows_from_release, 2);
  for (const json& end : events_of(trace, "f", "grant")) {
    EXPECT_TRUE(inside_slice(trace, end["tid"], end["ts"])) << end.dump();
  }

  // Phases carry their owner and the rule they ran under.
  const auto phases = events_of(trace, "X", "phase");
  EXPECT_TRUE(std::any_of(phases.begin(), phases.end(), [](const json& e) {
    return arg(e, "owner") == "job 'reader'" && arg(e, "job") == "reader" && arg(e, "rule") == "path(/a/x)" &&
           arg(e, "phase") == "async";
  }));

  // Job states in order.
  std::vector<std::string> reader_states;
  for (const json& e : events_of(trace, "i", "job")) {
    if (arg(e, "job") == "reader") reader_states.push_back(arg(e, "state"));
  }
  EXPECT_EQ(reader_states, (std::vector<std::string>{"waiting", "running", "done"}));

  // The tasklet parked between its phases.
  const auto parks = events_of(trace, "b", "park");
  ASSERT_EQ(parks.size(), 1u);
  EXPECT_EQ(arg(parks[0], "owner"), "tasklet 'parker'");

  // Threads are named.
  std::set<std::string> names;
  for (const json& e : events_of(trace, "M")) {
    if (e["name"] == "thread_name") names.insert(e["args"]["name"]);
  }
  EXPECT_TRUE(names.contains("worker 1"));
  EXPECT_TRUE(names.contains("thread 1"));
}

TEST(TraceTest, StopsRecordingAndStartsOver) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  manager->start_trace();
  test::run_sample(manager);
  manager->stop_trace();
  const std::size_t recorded = written(*manager)["traceEvents"].size();
  test::run_sample(manager);
  EXPECT_EQ(written(*manager)["traceEvents"].size(), recorded);  // stopped: nothing added
  manager->start_trace(10);
  test::run_sample(manager);
  const json trace = written(*manager);
  std::size_t events = 0;
  for (const json& event : trace["traceEvents"]) events += event["ph"] != "M" ? 1u : 0u;
  EXPECT_EQ(events, 10u);
  EXPECT_GT(trace["otherData"]["dropped_events"].get<long>(), 0);
}

TEST(TraceTest, SnapshotSaysSinceWhenWhileRecording) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  manager->start_trace();
  test::HoldingJob holder(manager, "holder", rules::path("/a"));
  auto waiter = make_job(
      "waiter", [](ProgressMonitor&) {}, manager);
  waiter->set_rule(rules::path("/a"));
  waiter->schedule();
  const RuleSnapshot snapshot = manager->rule_snapshot();
  ASSERT_EQ(snapshot.requests.size(), 2u);
  for (const auto& request : snapshot.requests) {
    ASSERT_TRUE(request.since.has_value()) << request.owner;
    EXPECT_LE(*request.since, snapshot.taken);
  }
  EXPECT_LE(*snapshot.requests[0].since, *snapshot.requests[1].since);  // the holder asked first
  EXPECT_NE(snapshot.to_string().find("(exclusive, for "), std::string::npos) << snapshot.to_string();
  manager->stop_trace();
  EXPECT_FALSE(manager->rule_snapshot().requests[0].since.has_value());
  holder.release();
  waiter->join();
}

TEST(TraceTest, HtmlTimelineCarriesTheTraceSafely) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  manager->start_trace();
  test::run_sample(manager, "x</script><b><!--x\"quoted\"");
  std::ostringstream page;
  manager->write_trace(page, JobManager::TraceFormat::html);
  const std::string html = page.str();
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.find("/*TASKLET_TRACE_DATA*/"), std::string::npos);  // filled in
  // Nothing from the network (SVG's namespace URI is a name, not a fetch).
  for (const char* fetching :
       {"src=\"http", "href=\"http", "url(http", "@import", "<link", "fetch(", "XMLHttpRequest"}) {
    EXPECT_EQ(html.find(fetching), std::string::npos) << fetching;
  }
  // The job's name can neither end the page's script nor open an HTML comment in it: its '<' are
  // written as escapes.
  EXPECT_EQ(html.find("x</script>"), std::string::npos);
  EXPECT_EQ(html.find("<!--x"), std::string::npos);
  EXPECT_NE(html.find(R"(x\u003c/script>\u003cb>\u003c!--x\"quoted\")"), std::string::npos);
}

// A user's rule: its to_string() is user code, which the table must not call under its lock.
class CustomRule final : public SchedulingRule {
 public:
  bool contains(const SchedulingRule& other) const override { return &other == this; }
  bool is_conflicting(const SchedulingRule& other) const override { return &other == this; }
  std::string to_string() const override { return "my rule"; }
};

TEST(TraceTest, ACustomRuleIsNamedByTheLibraryWhereTheTableRecords) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  manager->start_trace();
  const Rule rule = std::make_shared<CustomRule>();
  {
    test::HoldingJob holder(manager, "holder", rule);
    auto waiter = make_job(
        "waiter", [](ProgressMonitor&) {}, manager);
    waiter->set_rule(rule);
    waiter->schedule();
    holder.release();
    waiter->join();
  }
  manager->stop_trace();
  const json trace = written(*manager);
  const auto waits = events_of(trace, "b", "rule-wait");
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(arg(waits[0], "rule").rfind("custom rule@", 0), 0u) << arg(waits[0], "rule");
  EXPECT_NE(arg(waits[0], "blockers").find("job 'holder' holds custom rule@"), std::string::npos);
  EXPECT_NE(arg(waits[0], "let_through_by").find("job 'holder' releasing custom rule@"), std::string::npos);
  // Outside the table's lock (a phase's slice), the rule's own text.
  const auto phases = events_of(trace, "X", "phase");
  EXPECT_TRUE(
      std::any_of(phases.begin(), phases.end(), [](const json& e) { return arg(e, "rule") == "my rule"; }));
}

TEST(TraceTest, EnvironmentVariableRecordsEveryManagerToAFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("tasklet-trace-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "run.json").string();
  ::setenv("TASKLET_TRACE", file.c_str(), 1);
  {
    auto manager = JobManager::create(JobManager::Options{2, nullptr});
    ::unsetenv("TASKLET_TRACE");
    test::run_sample(manager);
  }  // saved as the manager goes
  std::ifstream in(file);
  ASSERT_TRUE(in.good()) << file;
  const json trace = json::parse(in);
  expect_valid_chrome_trace(trace);
  EXPECT_FALSE(events_of(trace, "b", "rule-wait").empty());
  std::filesystem::remove_all(dir);
}

TEST(TraceTest, SaveTraceNamesThePathItCannotWrite) {
  auto manager = JobManager::create(JobManager::Options{1, nullptr});
  try {
    manager->save_trace("/nonexistent-dir/trace.json");
    FAIL() << "no exception";
  } catch (const std::ios_base::failure& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent-dir/trace.json"), std::string::npos);
  }
}

// A done listener that waits for the test: the job's worker is still inside its run's phase.
class DoneWaits final : public JobListener {
 public:
  explicit DoneWaits(test::Gate& gate) : gate_(gate) {}
  void done(const JobEvent&) override { gate_.wait(); }

 private:
  test::Gate& gate_;
};

TEST(TraceTest, AJobsPhaseIsInTheTraceOnceJoinReturns) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  manager->start_trace();
  test::Gate listener_may_end;
  test::HoldingJob holder(manager, "A", rules::path("/t"));
  auto b = make_job(
      "B", [](ProgressMonitor&) {}, manager);
  b->set_rule(rules::path("/t"));
  b->add_listener(std::make_shared<DoneWaits>(listener_may_end));
  b->schedule();
  ASSERT_TRUE(test::eventually([&] { return manager->rule_snapshot().requests.size() == 2; }));
  holder.release();
  b->join();
  manager->stop_trace();  // the documented sequence: work, stop_trace(), save or write
  const json trace = written(*manager);
  listener_may_end.open();
  const auto phases = events_of(trace, "X", "phase");
  const auto b_phase = std::find_if(phases.begin(), phases.end(),
                                    [](const json& e) { return e["name"] == "job 'B' (async)"; });
  ASSERT_NE(b_phase, phases.end()) << "B is done, but its phase is not in the trace";
  const auto states = events_of(trace, "i", "job");
  EXPECT_TRUE(
      std::any_of(states.begin(), states.end(), [](const json& e) { return e["name"] == "job 'B': done"; }));
  // The arrow from A's release ends where B's phase starts.
  const auto ends = events_of(trace, "f");
  ASSERT_FALSE(ends.empty());
  EXPECT_TRUE(
      std::any_of(ends.begin(), ends.end(), [&](const json& e) { return e["ts"] == (*b_phase)["ts"]; }));
}

TEST(TraceTest, NothingIsAddedOnceStopTraceReturns) {
  auto manager = JobManager::create(JobManager::Options{2, nullptr});
  manager->start_trace();
  test::Gate in_run, release;
  auto c = make_job(
      "C",
      [&](ProgressMonitor&) {
        in_run.open();
        release.wait();
      },
      manager);
  c->schedule();
  ASSERT_TRUE(in_run.wait());
  manager->stop_trace();
  std::ostringstream first;
  manager->write_trace(first, JobManager::TraceFormat::chrome_json);
  release.open();  // C's phase, begun before the stop, ends after it
  c->join();
  auto d = make_job(
      "D", [](ProgressMonitor&) {}, manager);
  d->schedule();
  d->join();
  std::ostringstream second;
  manager->write_trace(second, JobManager::TraceFormat::chrome_json);
  EXPECT_EQ(first.str(), second.str());
  // Started again, the new recording has only what began after it.
  manager->start_trace();
  d->schedule();
  d->join();
  manager->stop_trace();
  const json again = written(*manager);
  for (const json& phase : events_of(again, "X", "phase")) EXPECT_NE(phase["name"], "job 'C' (async)");
}

}  // namespace
}  // namespace tasklet
