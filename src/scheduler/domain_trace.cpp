// The manager's trace recorder: started and stopped, written, and saved where TASKLET_TRACE says.
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>

#include <unistd.h>

#include "scheduler/domain.hpp"

namespace tasklet::detail {

namespace {

std::string trace_label() { return "tasklet (pid " + std::to_string(::getpid()) + ")"; }

}  // namespace

void Domain::start_trace(std::size_t max_events) {
  std::lock_guard lock(trace_mutex_);
  if (recorder_) {
    recorder_->restart(max_events);
  } else {
    recorder_ = std::make_unique<Trace>(max_events);
  }
  table_.set_trace(recorder_.get());
  trace_.store(recorder_.get(), std::memory_order_release);
}

void Domain::stop_trace() noexcept {
  std::lock_guard lock(trace_mutex_);
  trace_.store(nullptr, std::memory_order_release);
  table_.set_trace(nullptr);
  if (recorder_) recorder_->stop();  // phases still running hold it: they add nothing more
}

void Domain::write_trace(std::ostream& out, JobManager::TraceFormat format) const {
  std::lock_guard lock(trace_mutex_);
  const Trace empty(0);
  const Trace& trace = recorder_ ? *recorder_ : empty;
  if (format == JobManager::TraceFormat::html) {
    trace.write_html(out, trace_label());
  } else {
    trace.write_json(out, trace_label());
  }
}

// TASKLET_TRACE=<file>: every manager records from its start. The first saves to <file>, the next
// ones to <file> numbered before its extension (trace.json, trace-2.json, ...).
void Domain::trace_from_environment() {
  const char* file = std::getenv("TASKLET_TRACE");
  if (file == nullptr || *file == '\0') return;
  static std::atomic<unsigned> traced{0};
  const unsigned number = ++traced;
  std::string path = file;
  if (number > 1) {
    const std::size_t slash = path.find_last_of('/');
    std::size_t dot = path.find_last_of('.');
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) dot = path.size();
    path.insert(dot, "-" + std::to_string(number));
  }
  trace_file_ = std::move(path);
  start_trace(1'000'000);
}

void Domain::save_trace(const std::string& path) const {
  const bool html = path.size() >= 5 && path.compare(path.size() - 5, 5, ".html") == 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) write_trace(out, html ? JobManager::TraceFormat::html : JobManager::TraceFormat::chrome_json);
  out.close();
  if (!out) throw std::ios_base::failure("save_trace: cannot write " + path);
}

void Domain::save_trace_file() noexcept {
  if (trace_file_.empty()) return;
  try {
    stop_trace();
    save_trace(trace_file_);
  } catch (const std::exception& error) {
    std::cerr << "tasklet: TASKLET_TRACE: " << error.what() << '\n';
  }
}

}  // namespace tasklet::detail
