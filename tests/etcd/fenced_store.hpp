// A fenced store for the tests of rules shared through etcd: the resource that processes holding
// rules write to and read from, on loopback TCP, outside every process it serves (a paused or
// partitioned holder cannot stop it). It remembers the largest fencing token it accepted per key
// and refuses an operation whose token is lower than one it already accepted for a conflicting
// key, so a holder whose lease expired while it was paused cannot overwrite what a later holder
// wrote. It records every operation, accepted or not, in the order it decided them.
//
// Keys are paths ("/a/x", conflicting with their ancestors and descendants) or names ("#n",
// conflicting with the same name only). A write conflicts with any operation on a conflicting key,
// a read only with writes. FencedStoreClient speaks to it from another process: one line per
// operation, "W|R KEY TOKEN PROCESS HOLD\n", answered "1\n" (accepted) or "0\n" (refused).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "child_process.hpp"

namespace tasklet::test {

/// Whether two store keys conflict (see the header comment).
inline bool keys_conflict(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty() || (a[0] == '#') != (b[0] == '#')) return false;
  if (a[0] == '#') return a == b;
  const auto under = [](const std::string& path, const std::string& dir) {
    return dir == "/" || path == dir ||
           (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
  };
  return under(a, b) || under(b, a);
}

class FencedStore {
 public:
  struct Operation {
    long long at_ns = 0;  // when the store decided it (monotonic_ns)
    bool write = false;
    std::string key;
    std::int64_t token = 0;
    int process = 0;
    std::string hold;  // the holder's name for the hold it made it under
    bool accepted = false;
  };

  /// Listens on a free loopback port, served by a thread per connection until destroyed.
  FencedStore() {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof address;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(listener_, 64) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &size) != 0)
      throw std::runtime_error("FencedStore: cannot listen");
    port_ = ntohs(address.sin_port);
    acceptor_ = std::thread([this] { accept_all(); });
  }
  ~FencedStore() {
    ::shutdown(listener_, SHUT_RDWR);  // ends accept()
    acceptor_.join();
    std::vector<std::thread> servers;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      for (const int fd : connections_) ::shutdown(fd, SHUT_RDWR);  // ends their recv()
      servers.swap(servers_);
    }
    for (std::thread& server : servers) server.join();
    ::close(listener_);
  }
  FencedStore(const FencedStore&) = delete;
  FencedStore& operator=(const FencedStore&) = delete;

  int port() const { return port_; }

  /// Decides one operation: accepted unless a conflicting key saw a larger token (for a read: a
  /// larger token of a write). Thread-safe.
  bool apply(bool write, const std::string& key, std::int64_t token, int process, const std::string& hold) {
    std::lock_guard lock(mutex_);
    bool accepted = true;
    for (const auto& [other, largest] : largest_) {
      if (keys_conflict(key, other) && std::max(largest.write, write ? largest.read : 0) > token)
        accepted = false;
    }
    if (accepted) {
      Largest& own = largest_[key];
      (write ? own.write : own.read) = std::max(write ? own.write : own.read, token);
    }
    record_.push_back({monotonic_ns(), write, key, token, process, hold, accepted});
    operated_.notify_all();
    return accepted;
  }

  /// Waits until `process` has an operation accepted after this call; whether it did within
  /// `patience`. A holder that just wrote is in the middle of its hold, most likely.
  bool wait_for_an_operation_of(int process, std::chrono::milliseconds patience) {
    std::unique_lock lock(mutex_);
    const std::size_t from = record_.size();
    return operated_.wait_for(lock, patience, [&] {
      for (std::size_t i = from; i < record_.size(); ++i) {
        if (record_[i].process == process && record_[i].accepted) return true;
      }
      return false;
    });
  }

  /// Every operation so far, in the order decided.
  std::vector<Operation> record() const {
    std::lock_guard lock(mutex_);
    return record_;
  }

 private:
  struct Largest {
    std::int64_t write = 0, read = 0;
  };

  void accept_all() {
    for (;;) {
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd < 0) return;
      std::lock_guard lock(mutex_);
      if (stopping_) {
        ::close(fd);
        return;
      }
      connections_.push_back(fd);
      servers_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    std::string pending;
    char buffer[4096];
    for (;;) {
      const ssize_t got = ::recv(fd, buffer, sizeof buffer, 0);
      if (got <= 0) break;
      pending.append(buffer, static_cast<std::size_t>(got));
      for (std::size_t end; (end = pending.find('\n')) != std::string::npos; pending.erase(0, end + 1)) {
        std::istringstream line(pending.substr(0, end));
        std::string kind, key, hold;
        std::int64_t token = 0;
        int process = 0;
        line >> kind >> key >> token >> process >> hold;
        const char* answer = apply(kind == "W", key, token, process, hold) ? "1\n" : "0\n";
        if (::send(fd, answer, 2, MSG_NOSIGNAL) != 2) break;
      }
    }
    std::lock_guard lock(mutex_);
    std::erase(connections_, fd);
    ::close(fd);
  }

  int listener_ = -1;
  int port_ = 0;
  std::thread acceptor_;
  mutable std::mutex mutex_;  // guards what follows
  std::condition_variable operated_;
  bool stopping_ = false;
  std::vector<int> connections_;
  std::vector<std::thread> servers_;
  std::map<std::string, Largest> largest_;
  std::vector<Operation> record_;
};

/// One connection to a FencedStore, from any process. Not thread-safe: one per thread, or a lock.
class FencedStoreClient {
 public:
  explicit FencedStoreClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
      throw std::runtime_error("FencedStoreClient: cannot connect to port " + std::to_string(port));
    const int on = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  }
  ~FencedStoreClient() { ::close(fd_); }
  FencedStoreClient(const FencedStoreClient&) = delete;
  FencedStoreClient& operator=(const FencedStoreClient&) = delete;

  /// Whether the store accepted the operation. Throws when the store is gone.
  bool apply(bool write, const std::string& key, std::int64_t token, int process, const std::string& hold) {
    const std::string line = std::string(write ? "W " : "R ") + key + ' ' + std::to_string(token) + ' ' +
                             std::to_string(process) + ' ' + hold + '\n';
    if (::send(fd_, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
      throw std::runtime_error("FencedStoreClient: the store is gone");
    char answer[2];
    for (std::size_t got = 0; got < 2;) {
      const ssize_t read = ::recv(fd_, answer + got, 2 - got, 0);
      if (read <= 0) throw std::runtime_error("FencedStoreClient: the store is gone");
      got += static_cast<std::size_t>(read);
    }
    return answer[0] == '1';
  }

 private:
  int fd_ = -1;
};

}  // namespace tasklet::test
