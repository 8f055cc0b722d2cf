// Jobs' listeners: the events of each job delivered in order, one call at a time, outside every
// lock of the manager; listeners added and removed while events are delivered. The rest of the
// jobs' side of a manager is in jobs.cpp.
#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>

#include "jobs/jobs.hpp"

namespace tasklet::detail {

bool Jobs::has_listeners(const JobCore& /*job*/) const noexcept {
  return listeners_count_.load(std::memory_order_acquire) != 0;
}

Listeners Jobs::with_added(const Listeners& listeners, std::shared_ptr<ListenerSlot> slot) {
  auto next =
      listeners != nullptr ? std::make_shared<ListenerList>(*listeners) : std::make_shared<ListenerList>();
  next->push_back(std::move(slot));
  return next;
}

void Jobs::post(JobCore& job, PendingEvent::Kind kind, JobEvent event) {
  job.extras().events.push_back(PendingEvent{kind, std::move(event)});
}

namespace {

void call_listener(ListenerSlot& slot, const PendingEvent& pending) noexcept {
  // Counted before the removed flag is read, and remove_listener sets the flag before it reads the
  // count (both sequentially consistent): either it waits for this call, or this call sees it.
  slot.calls.fetch_add(1);
  if (!slot.removed.load()) {
    const FrameScope frame(listener_call, &slot);
    JobListener& listener = *slot.listener;
    try {
      switch (pending.kind) {
        case PendingEvent::Kind::scheduled:
          listener.scheduled(pending.event);
          break;
        case PendingEvent::Kind::about_to_run:
          listener.about_to_run(pending.event);
          break;
        case PendingEvent::Kind::running:
          listener.running(pending.event);
          break;
        case PendingEvent::Kind::done:
          listener.done(pending.event);
          break;
        case PendingEvent::Kind::sleeping:
          listener.sleeping(pending.event);
          break;
        case PendingEvent::Kind::awake:
          listener.awake(pending.event);
          break;
      }
    } catch (...) {
      // A listener's failure is its own; the job and the other listeners go on.
    }
  }
  slot.calls.fetch_sub(1);
  if (slot.removed.load()) slot.calls.notify_all();
}

}  // namespace

void Jobs::deliver(JobCore& job) noexcept {
  std::unique_lock lock(mutex);
  if (job.made_extras() == nullptr) return;  // never had an event (extras are made under the lock)
  JobExtras& extras = job.extras();
  if (extras.delivering) return;  // the thread delivering now will take our events too
  extras.delivering = true;
  while (!extras.events.empty()) {
    PendingEvent pending = std::move(extras.events.front());
    extras.events.pop_front();
    Listeners of_manager = listeners_;
    Listeners of_job = extras.listeners;
    lock.unlock();
    for (const Listeners* listeners : {&of_manager, &of_job}) {
      if (*listeners == nullptr) continue;
      for (const auto& slot : **listeners) call_listener(*slot, pending);
    }
    // A removed listener may be destroyed here, outside the lock.
    of_manager.reset();
    of_job.reset();
    lock.lock();
  }
  extras.delivering = false;
  delivered_.notify_all();
}

// Delivers the job's pending events, or waits while another thread does, so that about_to_run and
// running have been told before the run starts.
void Jobs::deliver_before_run(JobCore& job) noexcept {
  deliver(job);
  std::unique_lock lock(mutex);
  JobExtras& extras = job.extras();
  delivered_.wait(lock, [&] { return !extras.delivering && extras.events.empty(); });
}

void Jobs::add_listener(JobCore& job, std::shared_ptr<JobListener> listener) {
  if (!listener) return;
  auto slot = std::make_shared<ListenerSlot>(std::move(listener));
  std::lock_guard lock(mutex);
  Listeners& listeners = job.extras().listeners;
  listeners = with_added(listeners, std::move(slot));
  listeners_count_.fetch_add(1, std::memory_order_acq_rel);
}

void Jobs::remove_listener(JobCore& job, const std::shared_ptr<JobListener>& listener) {
  Listeners* listeners = nullptr;
  {
    std::lock_guard lock(mutex);
    listeners = &job.extras().listeners;
  }
  remove_from(*listeners, listener);
}

void Jobs::add_listener(std::shared_ptr<JobListener> listener) {
  if (!listener) return;
  auto slot = std::make_shared<ListenerSlot>(std::move(listener));
  std::lock_guard lock(mutex);
  listeners_ = with_added(listeners_, std::move(slot));
  listeners_count_.fetch_add(1, std::memory_order_acq_rel);
}

void Jobs::remove_listener(const std::shared_ptr<JobListener>& listener) {
  remove_from(listeners_, listener);
}

void Jobs::remove_from(Listeners& listeners, const std::shared_ptr<JobListener>& listener) {
  ListenerList removed;
  Listeners before;  // dropped outside the lock
  {
    std::lock_guard lock(mutex);
    if (listeners == nullptr) return;
    auto kept = std::make_shared<ListenerList>();
    for (const auto& slot : *listeners) {
      if (slot->listener == listener) {
        removed.push_back(slot);
      } else {
        kept->push_back(slot);
      }
    }
    if (removed.empty()) return;
    listeners_count_.fetch_sub(static_cast<int>(removed.size()), std::memory_order_acq_rel);
    before = std::exchange(listeners, std::move(kept));
  }
  for (const auto& slot : removed) {
    slot->removed.store(true);
    // Calls in progress elsewhere end first; the ones this code is inside of cannot.
    const int mine = static_cast<int>(frames_of(listener_call, slot.get()));
    for (int now = slot->calls.load(); now > mine; now = slot->calls.load()) slot->calls.wait(now);
  }
}

void Jobs::set_progress_provider(JobManager::ProgressProvider provider) {
  std::lock_guard lock(mutex);
  provider_ = std::move(provider);
  has_provider_ = static_cast<bool>(provider_);
}

}  // namespace tasklet::detail
