// The Java tasklet library's motivating example, in C++: a three-state tasklet that prepares a
// request on the synchronous thread, makes a blocking call on a worker thread, and merges the
// response back on the synchronous thread, so the synchronous thread's state needs no locks.
//
// Several such calls run at once here; the synchronous thread stays free while they block.
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "tasklet.hpp"

namespace {

// State owned by the synchronous thread: touched only by sync phases, so no locks.
struct Dashboard {
  std::map<std::string, int> temperatures;
  int requests_sent = 0;
};

// Stands in for a blocking I/O call (a network request, a database query).
int fetch_temperature(const std::string& city) {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return static_cast<int>(city.size()) * 3;
}

class FetchTemperature final : public tasklet::Tasklet {
 public:
  FetchTemperature(Dashboard& dashboard, std::string city) : dashboard_(dashboard), city_(std::move(city)) {
    set_name("fetch " + city_);
  }

  tasklet::Directive task() override {
    switch (state_) {
      case State::prepare:  // synchronous thread: read and update the dashboard freely
        ++dashboard_.requests_sent;
        request_ = city_;
        state_ = State::call;
        return tasklet::Directive::async;
      case State::call:  // worker thread: block without holding up the synchronous thread
        response_ = fetch_temperature(request_);
        state_ = State::merge;
        return tasklet::Directive::sync;
      case State::merge:  // synchronous thread again: merge the result
        dashboard_.temperatures[city_] = response_;
        return tasklet::Directive::done;
    }
    return tasklet::Directive::done;
  }

 private:
  enum class State { prepare, call, merge };
  Dashboard& dashboard_;
  std::string city_;
  State state_ = State::prepare;
  std::string request_;
  int response_ = 0;
};

}  // namespace

int main() {
  Dashboard dashboard;
  auto scheduler = tasklet::api::new_scheduler();
  for (const char* city : {"Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Perth"}) {
    scheduler->schedule(std::make_shared<FetchTemperature>(dashboard, city), tasklet::Directive::sync);
  }
  const auto start = std::chrono::steady_clock::now();
  scheduler->run();  // returns when every tasklet is done
  const auto elapsed =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);

  std::printf("%d requests, %zu answers in %lld ms (the calls overlapped on the workers)\n",
              dashboard.requests_sent, dashboard.temperatures.size(),
              static_cast<long long>(elapsed.count()));
  for (const auto& [city, degrees] : dashboard.temperatures)
    std::printf("  %-8s %3d\n", city.c_str(), degrees);
  return dashboard.temperatures.size() == 6 ? 0 : 1;
}
