// A cluster of etcd members of a test's own, on loopback (see EtcdServer): started together, serving
// once the constructor returns, stopped and removed by the destructor.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "etcd_server.hpp"

namespace tasklet::test {

class EtcdCluster {
 public:
  explicit EtcdCluster(std::size_t size = 3) {
    std::vector<EtcdMember> members;
    std::string initial;
    for (std::size_t i = 0; i < size; ++i) {
      members.push_back({"m" + std::to_string(i), free_port(), free_port(), {}});
      initial += (i == 0 ? "" : ",") + members.back().name + "=" + members.back().peer_url();
    }
    // All start before any is waited for: a member serves only once a quorum has started.
    for (EtcdMember& member : members) {
      member.initial_cluster = initial;
      members_.push_back(std::make_unique<EtcdServer>(member));
    }
    for (const auto& member : members_) member->wait_ready();
  }

  std::size_t size() const { return members_.size(); }
  EtcdServer& member(std::size_t index) { return *members_.at(index); }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> all;
    for (const auto& member : members_) all.push_back(member->endpoint());
    return all;
  }

  /// The member that leads now, as the running members agree; throws when they do not name one.
  std::size_t leader() const {
    for (std::size_t i = 0; i < members_.size(); ++i) {
      if (!members_[i]->running()) continue;
      const nlohmann::json status = nlohmann::json::parse(members_[i]->etcdctl("endpoint status -w json"));
      const nlohmann::json& own = status.at(0).at("Status");
      if (own.at("header").at("member_id") == own.at("leader")) return i;
    }
    throw std::runtime_error("EtcdCluster: no running member leads");
  }

 private:
  std::vector<std::unique_ptr<EtcdServer>> members_;
};

}  // namespace tasklet::test
