#include "base/trace.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ostream>
#include <sstream>
#include <string_view>

#include "base/context.hpp"

namespace tasklet::detail {

// The page's template (trace_timeline.html, embedded by the build).
extern const char* const trace_timeline_html;

namespace {

std::atomic<std::uint64_t> recorders{0};

struct SeenBy {
  std::uint64_t serial = 0;
  std::uint32_t tid = 0;
};
thread_local SeenBy seen_by;

// A JSON string. '<' is written as an escape (the same string to a JSON reader), so that the JSON
// can sit inside the page's <script>.
void write_string(std::ostream& out, std::string_view text) {
  out << '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out << "\\\"";
        break;
      case '\\':
        out << "\\\\";
        break;
      case '\n':
        out << "\\n";
        break;
      case '\t':
        out << "\\t";
        break;
      case '<':
        out << "\\u003c";  // never "</script>" nor "<!--" inside the page's script
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static constexpr char hex[] = "0123456789abcdef";
          out << "\\u00" << hex[(c >> 4) & 0xf] << hex[c & 0xf];
        } else {
          out << c;
        }
    }
  }
  out << '"';
}

// Nanoseconds as microseconds, Chrome's unit, to the nanosecond.
void write_micros(std::ostream& out, std::int64_t nanos) {
  if (nanos < 0) {
    out << '-';
    nanos = -nanos;
  }
  const std::int64_t fraction = nanos % 1000;
  out << nanos / 1000 << '.' << static_cast<char>('0' + fraction / 100)
      << static_cast<char>('0' + fraction / 10 % 10) << static_cast<char>('0' + fraction % 10);
}

}  // namespace

Trace::Nanos Trace::now() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Trace::Trace(std::size_t max_events) : max_events_(max_events), serial_(++recorders), started_(now()) {}

void Trace::restart(std::size_t max_events) {
  std::lock_guard lock(mutex_);
  max_events_ = max_events;
  serial_ = ++recorders;
  stopped_ = false;
  started_ = now();
  events_.clear();
  dropped_ = 0;
  threads_.clear();
  tids_.clear();
  workers_seen_ = 0;
  requests_.clear();
  holds_.clear();
  flows_.clear();
  parks_.clear();
}

std::uint32_t Trace::tid() {
  if (seen_by.serial == serial_) return seen_by.tid;
  const auto [at, added] = tids_.try_emplace(std::this_thread::get_id(), 0);
  if (added) {
    const bool worker = runs_on_workers();
    const std::uint32_t number =
        worker ? ++workers_seen_ : static_cast<std::uint32_t>(threads_.size()) + 1 - workers_seen_;
    threads_.push_back({(worker ? "worker " : "thread ") + std::to_string(number),
                        (worker ? 1000U : 0U) + static_cast<std::uint32_t>(threads_.size())});
    at->second = static_cast<std::uint32_t>(threads_.size());
  }
  seen_by = {serial_, at->second};
  return at->second;
}

void Trace::push(Event event) {
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(event));
}

void Trace::stop() noexcept {
  std::lock_guard lock(mutex_);
  stopped_ = true;
}

void Trace::slice(const char* category, std::string name, Nanos start, Args args) {
  const Nanos end = now();
  std::lock_guard lock(mutex_);
  if (stopped_ || start < started_) return;  // work begun before this recording is not part of it
  push({start, end - start, 0, tid(), 'X', category, std::move(name), std::move(args)});
}

void Trace::instant(const char* category, std::string name, Args args) {
  const Nanos at = now();
  std::lock_guard lock(mutex_);
  if (stopped_) return;
  push({at, 0, 0, tid(), 'i', category, std::move(name), std::move(args)});
}

void Trace::async_slice(const char* category, std::string name, Nanos from, std::uint32_t from_tid, Nanos to,
                        std::uint32_t to_tid, Args args) {
  const std::uint64_t id = ++next_id_;
  push({from, 0, id, from_tid, 'b', category, name, std::move(args)});
  push({to, 0, id, to_tid, 'e', category, std::move(name), {}});
}

Trace::Args Trace::with_owner(const Owner& owner, Args args) {
  args.insert(args.begin(), {"owner", owner.text});
  if (!owner.job.empty()) args.insert(args.begin() + 1, {"job", owner.job});
  return args;
}

void Trace::entered(const void* request, bool thread, bool waits, Owner owner, std::string rule,
                    std::string blockers) {
  const Nanos at = now();
  std::lock_guard lock(mutex_);
  if (stopped_) return;
  requests_[request] = {at, tid(), waits, thread, std::move(owner), std::move(rule), std::move(blockers), {}};
}

void Trace::granted(const void* request, bool thread, std::string by) {
  const Nanos at = now();
  std::lock_guard lock(mutex_);
  if (stopped_) return;
  const std::uint32_t here = tid();
  holds_[request] = {at, here, thread};
  const auto found = requests_.find(request);
  if (found == requests_.end() || !found->second.waits) return;
  Wait& wait = found->second;
  wait.by = std::move(by);
  if (!thread) {
    async_slice("rule-wait", "wait for " + wait.rule, wait.since, wait.tid, at, here,
                with_owner(wait.owner,
                           {{"rule", wait.rule}, {"blockers", wait.blockers}, {"let_through_by", wait.by}}));
  }
  // The arrow from this release to where the owner starts with the rule.
  const std::uint64_t id = ++next_id_;
  push({at, 0, id, here, 's', "grant", "grant", {}});
  flows_[request] = id;
}

void Trace::left(const void* request, bool held) {
  const Nanos at = now();
  std::lock_guard lock(mutex_);
  if (stopped_) return;
  const std::uint32_t here = tid();
  const auto found = requests_.find(request);
  if (found != requests_.end()) {
    const Wait& wait = found->second;
    const auto hold = holds_.find(request);
    if (held && hold != holds_.end()) {
      if (hold->second.thread) {
        push({hold->second.since, at - hold->second.since, 0, here, 'X', "hold", "hold " + wait.rule,
              with_owner(wait.owner, {{"rule", wait.rule}})});
      } else {
        async_slice("hold", "hold " + wait.rule, hold->second.since, hold->second.tid, at, here,
                    with_owner(wait.owner, {{"rule", wait.rule}}));
      }
    } else if (!held && wait.waits && !wait.thread) {
      async_slice(
          "rule-wait", "wait for " + wait.rule, wait.since, wait.tid, at, here,
          with_owner(wait.owner, {{"rule", wait.rule}, {"blockers", wait.blockers}, {"ended", "withdrawn"}}));
    }
    requests_.erase(found);
  }
  holds_.erase(request);
  flows_.erase(request);
}

std::optional<Trace::Nanos> Trace::since(const void* request) {
  std::lock_guard lock(mutex_);
  if (stopped_) return std::nullopt;
  const auto found = requests_.find(request);
  if (found == requests_.end()) return std::nullopt;
  return found->second.since;
}

void Trace::flow_end(const void* request, Nanos at) {
  std::lock_guard lock(mutex_);
  if (stopped_) return;
  const auto found = flows_.find(request);
  if (found == flows_.end()) return;
  Event end{at, 0, found->second, tid(), 'f', "grant", "grant", {}};
  flows_.erase(found);
  push(std::move(end));
}

void Trace::thread_got(const void* request, Nanos waited_since, Nanos at) {
  std::lock_guard lock(mutex_);
  if (stopped_) return;
  const auto found = requests_.find(request);
  if (found == requests_.end() || !found->second.waits) return;  // granted at once: nothing to add
  const std::uint32_t here = tid();
  const auto hold = holds_.find(request);
  if (found->second.thread) {
    // A task that suspended has its wait and hold drawn apart from the threads (granted, left).
    if (hold != holds_.end()) {
      hold->second.since = at;
      hold->second.tid = here;
    }
    const Wait& wait = found->second;
    push({waited_since, at - waited_since, 0, here, 'X', "wait", "wait for " + wait.rule,
          with_owner(wait.owner,
                     {{"rule", wait.rule}, {"blockers", wait.blockers}, {"let_through_by", wait.by}})});
  }
  const auto flow = flows_.find(request);
  if (flow != flows_.end()) {
    push({at, 0, flow->second, here, 'f', "grant", "grant", {}});
    flows_.erase(flow);
  }
}

void Trace::parked(const void* tasklet, Owner owner) {
  const Nanos at = now();
  std::lock_guard lock(mutex_);
  if (stopped_) return;
  parks_[tasklet] = {at, std::move(owner)};
}

void Trace::resumed(const void* tasklet, Nanos at) {
  std::lock_guard lock(mutex_);
  if (stopped_) return;
  const auto found = parks_.find(tasklet);
  if (found == parks_.end()) return;
  const std::uint32_t here = tid();
  async_slice("park", "parked", found->second.first, here, at, here, with_owner(found->second.second, {}));
  parks_.erase(found);
}

void TracedPhase::cut() noexcept {
  if (ended) return;
  try {
    Trace::Args piece = args;
    piece.emplace_back("next", "suspended");
    trace.slice("phase", name, since, std::move(piece));
  } catch (...) {
    // Out of memory: the trace misses this piece.
  }
}

void TracedPhase::end(const char* next) noexcept {
  if (std::exchange(ended, true)) return;
  try {
    args.emplace_back("next", next);
    trace.slice("phase", std::move(name), since, std::move(args));
  } catch (...) {
    // Out of memory: the trace misses this phase.
  }
}

std::size_t Trace::recorded() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

void Trace::write_events(std::ostream& out, const std::string& label) const {
  std::vector<Event> events;
  std::vector<Thread> threads;
  std::size_t dropped = 0;
  {
    std::lock_guard lock(mutex_);
    events.assign(events_.begin(), events_.end());
    threads = threads_;
    dropped = dropped_;
  }
  // Sorted by time (Chrome does not need it; a reader of the file does), from the first event on.
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.ts < b.ts; });
  const Nanos origin = events.empty() ? 0 : events.front().ts;
  out << "{\"traceEvents\":[\n";
  out << R"({"ph":"M","name":"process_name","pid":1,"args":{"name":)";
  write_string(out, label);
  out << "}}";
  for (std::size_t i = 0; i < threads.size(); ++i) {
    out << ",\n"
        << R"({"ph":"M","name":"thread_name","pid":1,"tid":)" << i + 1 << R"(,"args":{"name":)";
    write_string(out, threads[i].name);
    out << "}},\n"
        << R"({"ph":"M","name":"thread_sort_index","pid":1,"tid":)" << i + 1 << R"(,"args":{"sort_index":)"
        << threads[i].sort << "}}";
  }
  for (const Event& event : events) {
    out << ",\n{\"ph\":\"" << event.phase << "\",\"cat\":";
    write_string(out, event.category);
    out << ",\"name\":";
    write_string(out, event.name);
    out << ",\"pid\":1,\"tid\":" << event.tid << ",\"ts\":";
    write_micros(out, event.ts - origin);
    switch (event.phase) {
      case 'X':
        out << ",\"dur\":";
        write_micros(out, event.dur);
        break;
      case 'b':
      case 'e':
        out << ",\"id\":\"0x" << std::hex << event.id << std::dec << '"';
        break;
      case 's':
        out << ",\"id\":" << event.id;
        break;
      case 'f':
        out << ",\"id\":" << event.id << ",\"bp\":\"e\"";
        break;
      case 'i':
        out << ",\"s\":\"t\"";
        break;
      default:
        break;
    }
    if (!event.args.empty()) {
      out << ",\"args\":{";
      for (std::size_t i = 0; i < event.args.size(); ++i) {
        const auto& [key, value] = event.args[i];
        if (i != 0) out << ',';
        write_string(out, key);
        out << ':';
        write_string(out, value);
      }
      out << '}';
    }
    out << '}';
  }
  out << "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{\"library\":\"tasklet\",\"dropped_events\":"
      << dropped << "}}\n";
}

void Trace::write_json(std::ostream& out, const std::string& label) const { write_events(out, label); }

void Trace::write_html(std::ostream& out, const std::string& label) const {
  const std::string_view page = trace_timeline_html;
  constexpr std::string_view slot = "/*TASKLET_TRACE_DATA*/null";
  const std::size_t at = page.find(slot);
  out << page.substr(0, at);
  if (at != std::string_view::npos) {
    write_events(out, label);
    out << page.substr(at + slot.size());
  }
}

}  // namespace tasklet::detail
