// tasklet_bench_etcd: claims held in etcd (tasklet::etcd) against etcd's own lock service, on one
// etcd that the benchmark starts on loopback (Debian's etcd-server).
//
//   claims     an uncontended acquire + release of one exclusive path (one transaction that puts
//              the request's key and reads its blockers, then one that deletes it), against the
//              v3lock service's Lock + Unlock of one name, with the same session's lease (<= 1.5x)
//
// Both run back to back on this thread over the same HTTP connection kind (libcurl to the JSON
// gateway), so the ratio compares the protocols, not the clients.
#include <chrono>
#include <cstddef>
#include <future>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include "etcd_server.hpp"
#include "gateway.hpp"
#include "harness.hpp"
#include "session_access.hpp"
#include "tasklet/etcd/etcd.hpp"

namespace {

using tasklet::bench::Comparison;
using tasklet::bench::comparison_row;
using tasklet::bench::Options;
using tasklet::bench::Report;
using namespace tasklet::etcd;

void bench_claims(Report& report, const Options& options) {
  tasklet::test::EtcdServer server;
  EtcdOptions settings;
  settings.endpoints = {server.endpoint()};
  settings.prefix = "/bench";
  auto session = EtcdSession::connect(settings);
  detail::Locks& locks = detail::SessionAccess::locks(*session);
  detail::Gateway lock_service(settings);
  const std::string lease = std::to_string(session->lease_id());
  const std::size_t n = options.quick ? 50 : 500;

  const auto ours = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      std::promise<std::int64_t> granted;
      auto ticket = locks.request({{"/bench/mutex", true}},
                                  {.granted = [&granted](std::int64_t revision) { granted.set_value(revision); }});
      granted.get_future().get();
      locks.release(ticket);
    }
  };
  const auto v3lock = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      const detail::Json locked = lock_service.call(
          "/v3/lock/lock", detail::Json{{"name", detail::base64("bench-mutex")}, {"lease", lease}});
      const std::string key = locked.value("key", std::string());
      if (key.empty()) throw std::runtime_error("v3lock gave no key: " + locked.dump());
      lock_service.call("/v3/lock/unlock", detail::Json{{"key", key}});
    }
  };
  const Comparison result = tasklet::bench::compare(options.repeats, n, v3lock, ours);
  report.add(comparison_row("claims: uncontended acquire+release vs v3lock Lock+Unlock", n, result, 1.5));
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = tasklet::bench::parse_options(argc, argv);
  std::cout << "tasklet etcd benchmarks: median of " << options.repeats
            << " interleaved runs; ratio = median of (ours / baseline) over back-to-back pairs\n\n";
  Report::print_header(std::cout);
  Report report("tasklet etcd benchmarks (ns/op: medians; ratio: median of paired ours/baseline)");
  if (options.selected("claims")) bench_claims(report, options);
  tasklet::bench::finish(report, options);
  return 0;
}
