#include "tasklet/progress_monitor.hpp"

namespace tasklet {

bool ProgressMonitor::is_canceled() const noexcept {
  return canceled_.load(std::memory_order_acquire) || (parent_ != nullptr && parent_->is_canceled());
}

void ProgressMonitor::set_canceled(bool canceled) noexcept {
  canceled_.store(canceled, std::memory_order_release);
  try {
    on_canceled(canceled);
  } catch (...) {
  }
}

void ProgressMonitor::begin_task(std::string_view name, int total_work) {
  {
    std::lock_guard lock(mutex_);
    task_name_ = std::string(name);
  }
  total_.store(total_work, std::memory_order_relaxed);
  done_work_.store(0, std::memory_order_relaxed);
  on_begin_task(name, total_work);
}

void ProgressMonitor::worked(int work) {
  if (work > 0) add_work(work);
}

void ProgressMonitor::add_work(double work) {
  const int total = total_.load(std::memory_order_relaxed);
  double before = done_work_.load(std::memory_order_relaxed);
  double after = 0;
  do {
    after = before + work;
    if (total >= 0 && after > total) after = total;
  } while (!done_work_.compare_exchange_weak(before, after, std::memory_order_relaxed));
  if (parent_ != nullptr && total > 0) {
    // Report the share of our progress to the parent, in its units (its hooks outside our lock).
    const double share = parent_share_ * (after / total);
    double delta = 0;
    {
      std::lock_guard lock(mutex_);
      delta = share - reported_to_parent_;
      if (delta > 0) reported_to_parent_ = share;
    }
    if (delta > 0) parent_->add_work(delta);
  }
  on_worked(after, total);
}

void ProgressMonitor::subtask(std::string_view name) {
  {
    std::lock_guard lock(mutex_);
    subtask_name_ = std::string(name);
  }
  on_subtask(name);
}

void ProgressMonitor::done() {
  if (finished_.exchange(true)) return;
  const int total = total_.load(std::memory_order_relaxed);
  if (total > 0) add_work(total - done_work_.load(std::memory_order_relaxed));
  if (parent_ != nullptr) {
    double delta = 0;
    {
      std::lock_guard lock(mutex_);
      delta = parent_share_ - reported_to_parent_;
      reported_to_parent_ = parent_share_;
    }
    if (delta > 0) parent_->add_work(delta);
  }
  on_done();
}

void ProgressMonitor::set_blocked(std::string_view reason) {
  {
    std::lock_guard lock(mutex_);
    blocked_reason_ = reason;
  }
  on_blocked(reason);
  if (parent_ != nullptr) parent_->set_blocked(reason);
}

void ProgressMonitor::clear_blocked() {
  {
    std::lock_guard lock(mutex_);
    blocked_reason_.clear();
  }
  on_unblocked();
  if (parent_ != nullptr) parent_->clear_blocked();
}

std::string ProgressMonitor::blocked_reason() const {
  std::lock_guard lock(mutex_);
  return blocked_reason_;
}

std::string ProgressMonitor::task_name() const {
  std::lock_guard lock(mutex_);
  return task_name_;
}

std::string ProgressMonitor::subtask_name() const {
  std::lock_guard lock(mutex_);
  return subtask_name_;
}

std::unique_ptr<ProgressMonitor> ProgressMonitor::split(int work) {
  auto child = std::make_unique<ProgressMonitor>();
  child->parent_ = this;
  child->parent_share_ = work > 0 ? work : 0;
  return child;
}

}  // namespace tasklet
