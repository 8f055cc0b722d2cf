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
  std::uint64_t held = all.gone;
  for (const TableMutex* table : all.live) held += table->held_.load(std::memory_order_relaxed);
  return TableLockReading{table_clock(), held};
}
#else
std::optional<TableLockReading> read_table_lock() noexcept { return std::nullopt; }
#endif

}  // namespace tasklet::detail
