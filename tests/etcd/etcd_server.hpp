// An etcd of a test's own: Debian's etcd on loopback, on free ports, with a temporary data
// directory; started by the constructor (which returns once etcd serves clients) and stopped and
// removed by the destructor. etcdctl() runs Debian's etcdctl against it. EtcdCluster starts several
// as one cluster. The fault tests stop (SIGKILL), restart (on the same data), pause (SIGSTOP) and
// resume (SIGCONT) it.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

extern char** environ;

namespace tasklet::test {

/// A port nobody listens on right now (the kernel's pick; free again once this returns).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_port: socket failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd);
    throw std::runtime_error("free_port: bind failed");
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

/// One member of a cluster: its name, ports and the whole cluster's peer list.
struct EtcdMember {
  std::string name;
  int client_port = 0;
  int peer_port = 0;
  std::string initial_cluster;  // name=peer-url,... of every member
  std::string peer_url() const { return "http://127.0.0.1:" + std::to_string(peer_port); }
};

class EtcdServer {
 public:
  /// A cluster of one, serving once this returns.
  EtcdServer() {
    EtcdMember alone{"test", free_port(), free_port(), {}};
    alone.initial_cluster = alone.name + "=" + alone.peer_url();
    start(alone);
    wait_ready();
  }
  /// A member of a larger cluster, started but not waited for: it serves once a quorum of the
  /// cluster has started (wait_ready()).
  explicit EtcdServer(const EtcdMember& member) { start(member); }

  /// Returns once etcd says it serves clients; its log is read (and kept) from then on until it
  /// closes. Throws when etcd ended first.
  void wait_ready() {
    std::array<char, 4096> line{};
    bool ready = false;
    while (!ready && std::fgets(line.data(), line.size(), log_) != nullptr) {
      output_ += line.data();
      ready = std::string_view(line.data()).find("ready to serve client requests") != std::string::npos;
    }
    if (!ready) {
      stop();
      throw std::runtime_error("EtcdServer: etcd ended before serving clients:\n" + output_);
    }
    reader_ = std::thread([this] {
      std::array<char, 4096> rest{};
      while (std::fgets(rest.data(), rest.size(), log_) != nullptr) {
        std::lock_guard lock(mutex_);
        output_ += rest.data();
      }
    });
  }

  ~EtcdServer() {
    stop();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  /// Whether it was started and not stopped since.
  bool running() const { return pid_ > 0; }

  /// Starts it again after stop(), on the data it had, as etcd would come back after a crash;
  /// returns once it serves clients (for a member: once it has rejoined a quorum).
  void restart() {
    if (running()) throw std::runtime_error("EtcdServer: restart() while it runs");
    spawn_etcd();
    wait_ready();
  }
  /// Freezes it (SIGSTOP), as a stalled disk or a stop-the-world pause would; resume() thaws it.
  void pause() const { signal(SIGSTOP); }
  void resume() const { signal(SIGCONT); }

  /// Stops etcd (SIGKILL: as a crash would) and waits for it; idempotent.
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
    }
    if (reader_.joinable()) reader_.join();
    if (log_ != nullptr) {
      std::fclose(log_);
      log_ = nullptr;
    }
  }

  /// Runs etcdctl with `arguments` (words, quoted as needed) against this etcd; its output. Throws
  /// when it fails.
  std::string etcdctl(const std::string& arguments, const std::string& credentials = "") const {
    const std::string command = "ETCDCTL_API=3 etcdctl --endpoints=" + endpoint_ +
                                (credentials.empty() ? "" : " --user=" + credentials) + " " + arguments +
                                " 2>&1";
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), &::pclose);
    if (!pipe) throw std::runtime_error("etcdctl: popen failed");
    std::string output;
    std::array<char, 4096> buffer{};
    while (std::fgets(buffer.data(), buffer.size(), pipe.get()) != nullptr) output += buffer.data();
    const int status = ::pclose(pipe.release());
    if (status != 0) throw std::runtime_error("etcdctl " + arguments + " failed:\n" + output);
    return output;
  }

  /// Adds a user with a role of the same name that may read (and, with `write`, write) the keys
  /// under `prefix`.
  void add_user(const std::string& name, const std::string& password, const std::string& prefix,
                bool write) const {
    etcdctl("user add " + name + ":" + password);
    etcdctl("role add " + name);
    etcdctl("role grant-permission " + name + " --prefix=true " + (write ? "readwrite " : "read ") + prefix);
    etcdctl("user grant-role " + name + " " + name);
  }

  /// Turns authentication on, with a root user whose password is `root_password` (etcdctl() then
  /// needs credentials "root:<password>").
  void enable_auth(const std::string& root_password) const {
    etcdctl("user add root:" + root_password);
    etcdctl("role add root");
    etcdctl("user grant-role root root");
    etcdctl("auth enable");
  }

 private:
  void start(const EtcdMember& member) {
    char pattern[] = "/tmp/tasklet-etcd-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("EtcdServer: mkdtemp failed");
    dir_ = pattern;
    member_ = member;
    endpoint_ = "http://127.0.0.1:" + std::to_string(member.client_port);
    spawn_etcd();
  }

  // On a data directory that exists, etcd takes the cluster from it and ignores --initial-*.
  void spawn_etcd() {
    output_.clear();
    std::vector<std::string> args = {"etcd",
                                     "--name=" + member_.name,
                                     "--data-dir=" + dir_ + "/data",
                                     "--listen-client-urls=" + endpoint_,
                                     "--advertise-client-urls=" + endpoint_,
                                     "--listen-peer-urls=" + member_.peer_url(),
                                     "--initial-advertise-peer-urls=" + member_.peer_url(),
                                     "--initial-cluster=" + member_.initial_cluster,
                                     "--initial-cluster-state=new"};
    int log[2];
    if (::pipe(log) != 0) throw std::runtime_error("EtcdServer: pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, log[1], 2);
    posix_spawn_file_actions_adddup2(&actions, log[1], 1);
    posix_spawn_file_actions_addclose(&actions, log[0]);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const int spawned = ::posix_spawnp(&pid_, "etcd", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(log[1]);
    if (spawned != 0) {
      ::close(log[0]);
      throw std::runtime_error("EtcdServer: cannot start etcd (is Debian's etcd-server installed?)");
    }
    log_ = ::fdopen(log[0], "r");
  }

  void signal(int number) const {
    if (pid_ <= 0 || ::kill(pid_, number) != 0) throw std::runtime_error("EtcdServer: etcd does not run");
  }

  EtcdMember member_;
  std::string dir_;
  std::string endpoint_;
  pid_t pid_ = -1;
  FILE* log_ = nullptr;
  std::thread reader_;
  mutable std::mutex mutex_;
  std::string output_;
};

}  // namespace tasklet::test
