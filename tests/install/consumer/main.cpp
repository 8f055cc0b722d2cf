// Uses an installed tasklet: one tasklet goes sync -> async -> sync on a scheduler, and the
// program checks that each phase ran on the thread its directive promised. Exit status 0 only
// when every check holds. It also links tasklet::rules, and tasklet::etcd when built with
// WITH_ETCD (find_package(tasklet COMPONENTS etcd)).
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <tasklet.hpp>
#ifdef TASKLET_CONSUMER_ETCD
#include <tasklet/etcd/etcd.hpp>
#endif

namespace {

std::vector<std::string> problems;

void check(bool ok, const std::string& what) {
  if (!ok) problems.push_back(what);
}

}  // namespace

int main() {
  using tasklet::Directive;
  const std::thread::id sync_thread = std::this_thread::get_id();
  const auto scheduler = tasklet::api::new_scheduler();

  int phase = 0;
  const tasklet::Scheduler* current_in_async = nullptr;
  auto job = tasklet::make_tasklet([&]() -> Directive {
    const bool on_sync_thread = std::this_thread::get_id() == sync_thread;
    switch (phase++) {
      case 0:
        check(on_sync_thread, "first sync phase ran off the synchronous thread");
        return Directive::async;
      case 1:
        check(!on_sync_thread, "async phase ran on the synchronous thread");
        current_in_async = &tasklet::api::current();
        return Directive::sync;
      case 2:
        check(on_sync_thread, "second sync phase ran off the synchronous thread");
        return Directive::done;
      default:
        check(false, "a phase ran after done");
        return Directive::done;
    }
  });
  job->set_name("install-consumer");

  scheduler->schedule(job, Directive::sync);
  scheduler->run();

  check(phase == 3, "expected 3 phases, saw " + std::to_string(phase));
  check(current_in_async == scheduler.get(), "api::current() in the async phase was not its scheduler");
  check(!job->is_active(), "the tasklet is still active after run()");
  check(scheduler->active_count() == 0, "the scheduler still counts active tasklets");
  check(scheduler->failures().empty(), "the scheduler recorded failures");

  // tasklet::rules comes along with the package.
  const tasklet::Rule project = tasklet::rules::path("/project");
  const tasklet::Rule source = tasklet::rules::path("/project/src");
  check(project->contains(*source) && project->is_conflicting(*source),
        "path rule /project does not cover /project/src");

#ifdef TASKLET_CONSUMER_ETCD
  // tasklet::etcd, asked for: an endpoint where nothing listens is a typed error at once.
  tasklet::etcd::EtcdOptions options;
  options.endpoints = {"http://127.0.0.1:1"};
  try {
    (void)tasklet::etcd::EtcdSession::connect(options);
    check(false, "connecting to a closed port succeeded");
  } catch (const tasklet::etcd::EtcdUnavailable&) {
  }
#endif

  if (!problems.empty()) {
    for (const std::string& problem : problems) std::cerr << "FAIL: " << problem << "\n";
    return EXIT_FAILURE;
  }
  std::cout << "install consumer: sync -> async -> sync on the expected threads\n";
  return EXIT_SUCCESS;
}
