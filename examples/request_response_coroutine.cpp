// request_response.cpp's three-state tasklet written as a coroutine: the state machine becomes
// straight-line code, and each co_await says where the next lines run. Prepare on the synchronous
// thread, make the blocking call on a worker, merge on the synchronous thread again; the
// synchronous thread's state still needs no locks, and the synchronous thread stays free while the
// calls block.
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tasklet.hpp"
#include "tasklet/coroutine.hpp"

namespace {

// State owned by the synchronous thread: touched only by sync segments, so no locks.
struct Dashboard {
  std::map<std::string, int> temperatures;
  int requests_sent = 0;
};

// Stands in for a blocking I/O call (a network request, a database query).
int fetch_temperature(const std::string& city) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return static_cast<int>(city.size()) * 3;
}

tasklet::Task<int> fetch(Dashboard& dashboard, std::string city) {
  ++dashboard.requests_sent;  // synchronous thread: read and update the dashboard freely
  const std::string request = city;
  co_await tasklet::async();
  const int response = fetch_temperature(request);  // a worker: block without holding up the others
  co_await tasklet::sync();
  dashboard.temperatures[city] = response;  // synchronous thread again: merge the result
  co_return response;
}

}  // namespace

int main() {
  Dashboard dashboard;
  auto scheduler = tasklet::api::new_scheduler();
  std::vector<std::shared_ptr<tasklet::CoroutineTasklet<int>>> fetches;
  for (const char* city : {"Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Perth"}) {
    fetches.push_back(tasklet::make_tasklet(fetch(dashboard, city)));
    fetches.back()->set_name(std::string("fetch ") + city);
    scheduler->schedule(fetches.back(), tasklet::Directive::sync);
  }
  const auto start = std::chrono::steady_clock::now();
  scheduler->run();  // returns when every coroutine is done
  const auto elapsed =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);

  std::printf("%d requests, %zu answers in %lld ms (the calls overlapped on the workers)\n",
              dashboard.requests_sent, dashboard.temperatures.size(),
              static_cast<long long>(elapsed.count()));
  int total = 0;
  for (const auto& fetched : fetches) total += fetched->result();
  for (const auto& [city, degrees] : dashboard.temperatures)
    std::printf("  %-8s %3d\n", city.c_str(), degrees);
  return dashboard.temperatures.size() == 6 && total == 3 * (6 + 4 + 7 + 4 + 5 + 5) ? 0 : 1;
}
