// Private: the trace recorder of one JobManager (JobManager::start_trace). It records what ran on
// which thread, who waited for which rule and why, holds, and which release let whom through, and
// writes it as Chrome's Trace Event Format (JSON) or as a self-contained HTML timeline.
//
// The layers report to it only while it is on (each checks one pointer), so it costs nothing off.
// It knows none of their types: requests, tasklets and threads are keys (their addresses, unique
// while they live), and what they are is given as text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <iosfwd>
#include <mutex>

#include <oneapi/tbb/mutex.h>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/container/small_vector.hpp>

namespace tasklet::detail {

class Trace {
 public:
  /// steady_clock time since its epoch, in nanoseconds.
  using Nanos = std::int64_t;
  static Nanos now() noexcept;

  /// An event's arguments: a key (a literal) and its text.
  using Args = boost::container::small_vector<std::pair<const char*, std::string>, 4>;

  /// Whom an event is about: the owner as diagnostics name it, and the job it works for (empty:
  /// none), which the events carry as an argument of its own.
  struct Owner {
    std::string text;
    std::string job;
  };
  /// `args` with the owner's arguments ("owner", and "job" when it has one) in front.
  static Args with_owner(const Owner& owner, Args args);

  explicit Trace(std::size_t max_events);
  Trace(const Trace&) = delete;
  /// Drops what was recorded and starts again, keeping at most `max_events` events (later ones are
  /// counted as dropped). Safe while other threads record.
  void restart(std::size_t max_events);
  /// Ends the recording: once this returns, nothing more is added to it (until restart()), and a
  /// slice ending later is dropped, even one begun before. Safe while other threads record.
  void stop() noexcept;
  Trace& operator=(const Trace&) = delete;

  // On the thread that did it; every call is thread-safe and takes the recorder's lock.

  /// A slice of work on this thread, from `start` to now (Chrome "X"): a phase ("phase"), a rule
  /// release ("release"). Dropped when it began before the recording (re)started.
  void slice(const char* category, std::string name, Nanos start, Args args);
  /// Something that happened now on this thread (Chrome "i"): a job's state ("job").
  void instant(const char* category, std::string name, Args args);

  // The rule table's side, under its lock. `request` is the request's address; `thread` whether
  // a thread waits for it (begin_rule), else a tasklet or job does, holding no thread.

  /// A request entered the table. `waits`: it was not granted at once; `blockers` says whom it
  /// waits for.
  void entered(const void* request, bool thread, bool waits, Owner owner, std::string rule,
               std::string blockers);
  /// A request was granted, at once or after waiting; `by` names the exit that let it through
  /// (empty: none). After a wait, a flow starts here (on the releasing thread) and ends where its
  /// owner starts: flow_end().
  void granted(const void* request, bool thread, std::string by);
  /// A request left the table: released when `held`, else withdrawn or canceled.
  void left(const void* request, bool held);
  /// Since when `request` is in the table, when it entered while recording.
  std::optional<Nanos> since(const void* request);

  // The owners' side, on their threads.

  /// The owner of `request` starts on this thread at `at` with the rule it was granted after a
  /// wait: the flow from the release that let it through ends here.
  void flow_end(const void* request, Nanos at);
  /// A thread got `request` (begin_rule) at `at`, having asked at `waited_since`. When it had to
  /// wait, the wait is a slice of its own, and the hold starts here (until the request leaves).
  void thread_got(const void* request, Nanos waited_since, Nanos at);
  /// A tasklet parked (it returned WAIT) and was resumed: the park is drawn when it resumes.
  void parked(const void* tasklet, Owner owner);
  void resumed(const void* tasklet, Nanos at);

  /// Chrome's JSON Object Format: {"traceEvents": [...], ...}. `label` names the process.
  void write_json(std::ostream& out, const std::string& label) const;
  /// A page that draws the trace without any network access (the JSON inside it).
  void write_html(std::ostream& out, const std::string& label) const;
  std::size_t recorded() const;

 private:
  struct Event {
    Nanos ts = 0;
    Nanos dur = 0;
    std::uint64_t id = 0;  // async slices and flows
    std::uint32_t tid = 0;
    char phase = 'X';
    const char* category = "";
    std::string name;
    Args args;
  };
  struct Wait {
    Nanos since = 0;
    std::uint32_t tid = 0;
    bool waits = false;
    bool thread = false;
    Owner owner;
    std::string rule, blockers, by;
  };
  struct Hold {
    Nanos since = 0;
    std::uint32_t tid = 0;
    bool thread = false;
  };
  // The caller's thread number (assigned and named on first sight). Under mutex_.
  std::uint32_t tid();
  void push(Event event);
  // An async slice (Chrome "b" and "e"), recorded once it is over.
  void async_slice(const char* category, std::string name, Nanos from, std::uint32_t from_tid, Nanos to,
                   std::uint32_t to_tid, Args args);
  void write_events(std::ostream& out, const std::string& label) const;

  // Held briefly by every recording thread: oneTBB's mutex spins before it sleeps (as the rule
  // table's), where a futex mutex turned most collisions into a sleep and a wake-up.
  mutable oneapi::tbb::mutex mutex_;
  std::size_t max_events_;
  std::uint64_t serial_;      // tells recorders (and restarts) apart in threads' caches
  Nanos started_;             // when this recording (re)started
  bool stopped_ = false;      // stop() was called: nothing more is recorded
  std::deque<Event> events_;  // grows without moving what it holds
  std::size_t dropped_ = 0;
  std::uint64_t next_id_ = 0;
  struct Thread {
    std::string name;
    std::uint32_t sort = 0;
  };
  std::vector<Thread> threads_;  // by tid - 1
  std::unordered_map<std::thread::id, std::uint32_t> tids_;
  std::uint32_t workers_seen_ = 0;
  std::unordered_map<const void*, Wait> requests_;        // in the table: since when, and its wait
  std::unordered_map<const void*, Hold> holds_;           // granted, not yet left
  std::unordered_map<const void*, std::uint64_t> flows_;  // granted after a wait, owner not started
  std::unordered_map<const void*, std::pair<Nanos, Owner>> parks_;
};

/// A phase being recorded (TaskState::traced_phase while it runs). Where its task suspends (a
/// worker runs other work meanwhile) the slice so far is recorded, and a new one starts where the
/// task resumes, perhaps on another thread: a thread's slices never overlap.
struct TracedPhase {
  Trace& trace;
  Trace::Nanos since;
  std::string name;
  Trace::Args args;
  bool ended = false;  // recorded by end(): what the phase does after it is not drawn
  void cut() noexcept;
  void go_on() noexcept { since = Trace::now(); }
  /// Records the slice now, its next step `next`, for a phase whose work is over before the phase
  /// returns (a job's run, before the job can be seen as done): a reader who saw the end finds the
  /// slice in the recording.
  void end(const char* next) noexcept;
};

}  // namespace tasklet::detail
