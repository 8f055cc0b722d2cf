// A serial executor (a strand): many threads post lines to one log writer; the lines are written
// one at a time, in the order they were posted, without a lock around the writer's state.
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tasklet.hpp"

int main() {
  tasklet::SerialExecutor writer(nullptr, "log writer");
  std::vector<std::string> written;  // touched only by the writer's tasks

  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        writer.post([&written, t, i] {
          written.push_back("thread " + std::to_string(t) + " line " + std::to_string(i));
        });
      }
    });
  }
  for (auto& thread : threads) thread.join();

  // A pending task can be canceled before it starts.
  auto late = writer.post([&written] { written.push_back("never written"); });
  const bool canceled = writer.cancel(late);
  writer.wait();

  for (const std::string& line : written) std::printf("%s\n", line.c_str());
  std::printf("%zu lines written; the late line was %s\n", written.size(), canceled ? "canceled" : "written");
  return written.size() == 20 || written.size() == 21 ? 0 : 1;
}
