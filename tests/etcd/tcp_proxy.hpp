// A loopback TCP proxy between the library and an etcd, for the fault tests: it passes bytes both
// ways until told to hold what clients send (a stalled network, or a server that received the
// bytes and does not get to them); released, it forwards what it kept. A client that gives up
// and closes its connection does not close the proxy's connection to the server, so a request
// kept from it still reaches the server, which applies it late, as a slow etcd would. Cut, it
// drops every connection and refuses new ones until restored: a partition.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tasklet::test {

class TcpProxy {
 public:
  /// Listens on a free loopback port and forwards to `target` ("http://127.0.0.1:PORT").
  explicit TcpProxy(const std::string& target) : target_port_(port_of(target)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address = loopback(0);
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(listener_, 64) != 0)
      throw std::runtime_error("TcpProxy: cannot listen");
    socklen_t size = sizeof address;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &size);
    endpoint_ = "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port));
    if (::pipe(wake_) != 0) throw std::runtime_error("TcpProxy: cannot make a pipe");
    thread_ = std::thread([this] { serve(); });
  }
  ~TcpProxy() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    poke();
    thread_.join();
    for (const auto& link : links_) {
      if (link->client >= 0) ::close(link->client);
      if (link->server >= 0) ::close(link->server);
    }
    ::close(listener_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  const std::string& endpoint() const { return endpoint_; }

  /// From now on, what clients send is kept here.
  void hold() {
    std::lock_guard lock(mutex_);
    holding_ = true;
  }
  /// Forwards what was kept, and passes everything from now on.
  void release() {
    {
      std::lock_guard lock(mutex_);
      holding_ = false;
    }
    poke();
  }
  /// Drops every connection (what was kept is lost) and refuses new ones until restore().
  void cut() {
    {
      std::lock_guard lock(mutex_);
      cut_ = true;
    }
    poke();
  }
  /// Ends a cut or a hold: connections are taken and pass again.
  void restore() {
    {
      std::lock_guard lock(mutex_);
      cut_ = false;
    }
    release();
  }
  /// Waits (up to a minute) until what is kept contains `text`, and its client has given up on it
  /// (closed the connection) when `given_up`; whether it did.
  bool wait_until_kept(const std::string& text, bool given_up = false) {
    std::unique_lock lock(mutex_);
    return kept_changed_.wait_for(lock, std::chrono::minutes(1), [&] {
      for (const auto& link : links_) {
        if (link->kept.find(text) != std::string::npos && (!given_up || link->client < 0)) return true;
      }
      return false;
    });
  }

 private:
  struct Link {
    int client;
    int server;
    std::string kept;  // from the client, not forwarded yet
  };

  static sockaddr_in loopback(int port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    return address;
  }
  static int port_of(const std::string& endpoint) {
    return std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  }
  static void write_all(int fd, const char* data, std::size_t size) {
    while (size > 0) {
      const ssize_t wrote = ::send(fd, data, size, MSG_NOSIGNAL);
      if (wrote <= 0) return;  // the peer went: what is left is lost, as on a network
      data += wrote;
      size -= static_cast<std::size_t>(wrote);
    }
  }
  void poke() {
    const char byte = 0;
    [[maybe_unused]] const ssize_t wrote = ::write(wake_[1], &byte, 1);
  }

  void serve() {
    std::array<char, 65536> buffer{};
    for (;;) {
      std::vector<pollfd> fds{{listener_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      {
        std::lock_guard lock(mutex_);
        if (stopping_) return;
        if (cut_) drop_links();
        for (const auto& link : links_) {
          if (!holding_ && !link->kept.empty()) {
            write_all(link->server, link->kept.data(), link->kept.size());
            link->kept.clear();
          }
          fds.push_back({link->client, POLLIN, 0});  // -1 (client gone) is left out by poll
          fds.push_back({link->server, POLLIN, 0});
        }
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;
      if (fds[1].revents != 0) {
        char drained[64];
        [[maybe_unused]] const ssize_t read = ::read(wake_[0], drained, sizeof drained);
      }
      if (fds[0].revents & POLLIN) accept_one();
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < (fds.size() - 2) / 2; ++i) {  // links accepted since come next time
        Link& link = *links_[i];
        if (fds[2 + 2 * i].revents != 0) {
          const ssize_t got = ::recv(link.client, buffer.data(), buffer.size(), 0);
          if (got <= 0) {
            ::close(link.client);  // the server's side stays open: a kept request still arrives
            link.client = -1;
            kept_changed_.notify_all();
          } else if (holding_ || !link.kept.empty()) {
            link.kept.append(buffer.data(), static_cast<std::size_t>(got));
            kept_changed_.notify_all();
          } else {
            write_all(link.server, buffer.data(), static_cast<std::size_t>(got));
          }
        }
        if (fds[3 + 2 * i].revents != 0) {
          const ssize_t got = ::recv(link.server, buffer.data(), buffer.size(), 0);
          if (got <= 0) {
            if (link.client >= 0) ::close(link.client);
            ::close(link.server);
            link.client = link.server = -1;
          } else if (link.client >= 0) {
            write_all(link.client, buffer.data(), static_cast<std::size_t>(got));
          }
        }
      }
      std::erase_if(links_, [](const auto& link) { return link->server < 0; });
    }
  }

  // Under the lock.
  void drop_links() {
    for (const auto& link : links_) {
      if (link->client >= 0) ::close(link->client);
      ::close(link->server);
    }
    links_.clear();
  }

  void accept_one() {
    const int client = ::accept(listener_, nullptr, nullptr);
    if (client < 0) return;
    if (std::lock_guard lock(mutex_); cut_) {
      ::close(client);
      return;
    }
    const int server = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address = loopback(target_port_);
    if (server < 0 || ::connect(server, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      ::close(client);
      if (server >= 0) ::close(server);
      return;
    }
    std::lock_guard lock(mutex_);
    links_.push_back(std::make_unique<Link>(Link{client, server, {}}));
  }

  int target_port_;
  int listener_ = -1;
  int wake_[2] = {-1, -1};
  std::string endpoint_;
  std::mutex mutex_;  // guards what follows
  std::condition_variable kept_changed_;
  bool holding_ = false;
  bool cut_ = false;
  bool stopping_ = false;
  std::vector<std::unique_ptr<Link>> links_;
  std::thread thread_;
};

}  // namespace tasklet::test
