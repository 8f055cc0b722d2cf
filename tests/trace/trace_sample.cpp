// Writes the sample run's trace as an HTML timeline (argument 1), for the rendering test.
#include <iostream>

#include "sample_run.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: trace_sample <timeline.html>\n";
    return 2;
  }
  auto manager = tasklet::JobManager::create(tasklet::JobManager::Options{2, nullptr});
  manager->start_trace();
  tasklet::test::run_sample(manager);
  manager->stop_trace();
  manager->save_trace(argv[1]);
  return 0;
}
