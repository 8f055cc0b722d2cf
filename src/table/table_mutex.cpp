#include "table/table_mutex.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

namespace tasklet::detail {

#if TASKLET_TABLE_OCCUPANCY
namespace {
// Every live table's lock, and what the locks of tables already gone were held for.
struct Registry {
  std::mutex mutex;
  std::vector<const TableMutex*> live;
  std::uint64_t gone = 0;
};
// Never destroyed: a table may outlive static destruction (a manager held by a static).
Registry& registry() {
  static auto* const instance = new Registry;
  return *instance;
}
}  // namespace

TableMutex::TableMutex() {
  Registry& all = registry();
  std::lock_guard lock(all.mutex);
  all.live.push_back(this);
}

TableMutex::~TableMutex() {
  Registry& all = registry();
  std::lock_guard lock(all.mutex);
  all.gone += held_.load(std::memory_order_relaxed);
  std::erase(all.live, this);
}

std::optional<TableLockReading> read_table_lock() noexcept {
  Registry& all = registry();
  std::lock_guard lock(all.mutex);
  TableLockReading reading{table_clock(), all.gone, {}};
  try {
    reading.locks.reserve(all.live.size());
  } catch (...) {
    return std::nullopt;
  }
  for (const TableMutex* table : all.live) {
    const std::uint64_t held = table->held_.load(std::memory_order_relaxed);
    reading.held += held;
    reading.locks.emplace_back(table, held);
  }
  return reading;
}
#else
std::optional<TableLockReading> read_table_lock() noexcept { return std::nullopt; }
#endif

double busiest_lock_share(const TableLockReading& before, const TableLockReading& after) noexcept {
  if (after.now <= before.now) return 0.0;
  std::uint64_t busiest = 0;
  for (const auto& now : after.locks) {
    const auto was = std::find_if(before.locks.begin(), before.locks.end(),
                                  [&now](const auto& seen) { return seen.first == now.first; });
    if (was != before.locks.end()) busiest = std::max(busiest, now.second - was->second);
  }
  return static_cast<double>(busiest) / static_cast<double>(after.now - before.now);
}

}  // namespace tasklet::detail
