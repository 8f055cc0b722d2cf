// An HTTP/1.1 file server on Boost.Beast whose io_context thread is the scheduler's synchronous
// thread.
//
//   file_server --root DIR [--port N] [--workers N] [--locks rules|mutex]
//
// It serves the files under DIR (plain HTTP, loopback only). Each request is a coroutine tasklet:
// the loop parses it and schedules the tasklet on a worker, which takes the request's rule, does
// the file I/O and goes back to the loop, which writes the reply. The rules say what may happen at
// once, over whole subtrees:
//
//   GET /a/b              read_path(/a/b)                     a file's bytes, or a directory's files
//   PUT /a/b              path(/a/b)                          the body becomes the file
//   DELETE /a/b           path(/a/b)                          a file or a whole directory
//   MOVE /a/b  → /c/d     path(/a/b) + path(/c/d)             files and directories (Destination:)
//   COPY /a/b  → /c/d     read_path(/a/b) + path(/c/d)        replaces what /c/d held
//
// A directory's GET lists its files with their bytes ("dir <count>\n" then "<name> <size>\n<bytes>"
// per file), so a client sees at once whether it read a whole directory.
//
// `--locks mutex` is the server people write without a hierarchy: one std::shared_mutex per file,
// taken by the worker around each file it touches (in path order when it needs several), and no
// rule. A single file is as safe as with rules, but a directory is not a unit: a GET may list a
// directory that a MOVE, COPY or DELETE is halfway through. bench/server_bench.py compares the two.
//
// It prints "listening on 127.0.0.1:<port>" once it accepts, and stops on SIGINT or SIGTERM: it
// closes the listening socket and idle connections, answers the requests it has, and exits 0.
#include <algorithm>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include "tasklet.hpp"
#include "tasklet/asio.hpp"
#include "tasklet/coroutine.hpp"

namespace {

namespace fs = std::filesystem;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

// One request, as the loop parsed it. Paths are normalised: absolute, no ".", ".." or empty part,
// no trailing slash ("/" is the root).
struct Op {
  http::verb method = http::verb::get;
  std::string target;
  std::string destination;  // MOVE and COPY
  std::string body;         // PUT
  unsigned version = 11;
  bool keep_alive = true;
};

struct Reply {
  http::status status = http::status::ok;
  std::string body;
};

// The baseline's locks: one std::shared_mutex per path ever touched (never freed: the benchmark's
// set of paths is fixed, and a real server would need reference counts here).
class FileLocks {
 public:
  std::shared_mutex& of(const std::string& target) {
    const std::lock_guard lock(mutex_);
    auto& slot = locks_[target];
    if (!slot) slot = std::make_unique<std::shared_mutex>();
    return *slot;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<std::shared_mutex>> locks_;
};

// Several files' locks taken in path order, so that two such sets never wait for each other.
class Locked {
 public:
  struct Want {
    std::string target;
    bool exclusive;
  };
  Locked(FileLocks* locks, std::vector<Want> wants) {
    if (!locks) return;
    std::sort(wants.begin(), wants.end(), [](const Want& a, const Want& b) { return a.target < b.target; });
    for (const Want& want : wants) {
      std::shared_mutex& mutex = locks->of(want.target);
      if (want.exclusive) {
        exclusive_.emplace_back(mutex);
      } else {
        shared_.emplace_back(mutex);
      }
    }
  }

 private:
  std::vector<std::unique_lock<std::shared_mutex>> exclusive_;
  std::vector<std::shared_lock<std::shared_mutex>> shared_;
};

std::string parent_of(const std::string& target) {
  const std::size_t slash = target.rfind('/');
  return slash == 0 ? "/" : target.substr(0, slash);
}

bool inside(const std::string& target, const std::string& dir) {
  return target.size() > dir.size() && target.starts_with(dir) && (dir == "/" || target[dir.size()] == '/');
}

std::string child(const std::string& dir, std::string_view name) {
  return dir == "/" ? "/" + std::string(name) : dir + "/" + std::string(name);
}

// The files under DIR. Without locks (rules mode) each operation runs under its request's rule;
// with them (mutex mode) it locks each file it touches.
class Store {
 public:
  Store(fs::path root, FileLocks* locks) : root_(std::move(root)), locks_(locks) {}

  Reply apply(const Op& op) {
    try {
      switch (op.method) {
        case http::verb::get:
          return get(op.target);
        case http::verb::put:
          return put(op.target, op.body);
        case http::verb::delete_:
          return remove(op.target);
        case http::verb::move:
          return move(op.target, op.destination);
        case http::verb::copy:
          return copy(op.target, op.destination);
        default:
          return {http::status::method_not_allowed, "GET, PUT, DELETE, MOVE or COPY\n"};
      }
    } catch (const fs::filesystem_error& error) {
      // Without a hierarchy another request may take a file away between two steps.
      if (error.code() == std::errc::no_such_file_or_directory) return {http::status::not_found, "gone\n"};
      throw;
    }
  }

 private:
  fs::path on_disk(const std::string& target) const { return root_ / target.substr(1); }

  static std::string read_file(const fs::path& file, bool& found) {
    std::ifstream in(file, std::ios::binary);
    found = static_cast<bool>(in);
    return found ? std::string(std::istreambuf_iterator<char>(in), {}) : std::string();
  }

  static void write_file(const fs::path& file, const std::string& bytes) {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) throw std::runtime_error("cannot write " + file.string());
  }

  // The files below `dir`, as targets, in path order.
  std::vector<std::string> files_under(const std::string& dir) const {
    std::vector<std::string> files;
    const fs::path base = on_disk(dir);
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(base)) {
      if (entry.is_regular_file())
        files.push_back(child(dir, entry.path().lexically_relative(base).string()));
    }
    std::sort(files.begin(), files.end());
    return files;
  }

  Reply get(const std::string& target) {
    const fs::path path = on_disk(target);
    if (fs::is_directory(path)) return list(target);
    const Locked locked(locks_, {{target, false}});
    bool found = false;
    std::string bytes = read_file(path, found);
    if (!found) return {http::status::not_found, "no such file\n"};
    return {http::status::ok, std::move(bytes)};
  }

  // A directory's own files, each with its bytes.
  Reply list(const std::string& target) {
    std::vector<std::string> names;
    for (const fs::directory_entry& entry : fs::directory_iterator(on_disk(target))) {
      if (entry.is_regular_file()) names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    std::string entries;
    std::size_t count = 0;
    for (const std::string& name : names) {
      const std::string file = child(target, name);
      const Locked locked(locks_, {{file, false}});
      bool found = false;
      const std::string bytes = read_file(on_disk(file), found);
      if (!found) continue;  // only without rules: moved or deleted since it was listed
      entries += name + ' ' + std::to_string(bytes.size()) + '\n' + bytes;
      ++count;
    }
    return {http::status::ok, "dir " + std::to_string(count) + '\n' + entries};
  }

  Reply put(const std::string& target, const std::string& body) {
    const fs::path path = on_disk(target);
    if (target == "/" || !fs::is_directory(path.parent_path()) || fs::is_directory(path)) {
      return {http::status::conflict, "no such directory, or a directory in the way\n"};
    }
    const Locked locked(locks_, {{target, true}});
    const bool existed = fs::exists(path);
    write_file(path, body);
    return {existed ? http::status::no_content : http::status::created, {}};
  }

  Reply remove(const std::string& target) {
    if (target == "/") return {http::status::forbidden, "not the root\n"};
    const fs::path path = on_disk(target);
    if (!fs::exists(path)) return {http::status::not_found, "no such file or directory\n"};
    remove_tree(target);
    return {http::status::no_content, {}};
  }

  // File by file (each under its lock without rules), then the directories left.
  void remove_tree(const std::string& target) {
    const fs::path path = on_disk(target);
    if (fs::is_directory(path)) {
      for (const std::string& file : files_under(target)) {
        const Locked locked(locks_, {{file, true}});
        fs::remove(on_disk(file));
      }
      fs::remove_all(path);
    } else {
      const Locked locked(locks_, {{target, true}});
      fs::remove(path);
    }
  }

  // The checks MOVE and COPY share; an empty reply when they pass.
  std::optional<Reply> refuse_transfer(const std::string& from, const std::string& to) const {
    if (to.empty()) return Reply{http::status::bad_request, "Destination: a path on this server\n"};
    if (from == "/" || to == "/" || from == to || inside(to, from)) {
      return Reply{http::status::forbidden, "not the root, itself or into itself\n"};
    }
    if (!fs::exists(on_disk(from))) return Reply{http::status::not_found, "no such file or directory\n"};
    if (!fs::is_directory(on_disk(parent_of(to))))
      return Reply{http::status::conflict, "no such directory\n"};
    return std::nullopt;
  }

  // One rename; without rules it locks every file it moves, at both ends.
  Reply move(const std::string& from, const std::string& to) {
    if (std::optional<Reply> refused = refuse_transfer(from, to)) return *refused;
    if (fs::exists(on_disk(to))) return {http::status::precondition_failed, "the destination exists\n"};
    std::vector<Locked::Want> wants;
    if (locks_) {
      for (const std::string& file :
           fs::is_directory(on_disk(from)) ? files_under(from) : std::vector{from}) {
        wants.push_back({file, true});
        wants.push_back({to + file.substr(from.size()), true});
      }
    }
    const Locked locked(locks_, std::move(wants));
    fs::rename(on_disk(from), on_disk(to));
    return {http::status::created, {}};
  }

  // Replaces the destination, then copies file by file.
  Reply copy(const std::string& from, const std::string& to) {
    if (std::optional<Reply> refused = refuse_transfer(from, to)) return *refused;
    const bool existed = fs::exists(on_disk(to));
    if (!fs::is_directory(on_disk(from))) {
      if (existed && fs::is_directory(on_disk(to))) remove_tree(to);
      copy_file(from, to);
    } else {
      if (existed) remove_tree(to);
      for (const std::string& file : files_under(from)) {
        const std::string copied = to + file.substr(from.size());
        fs::create_directories(on_disk(parent_of(copied)));
        copy_file(file, copied);
      }
      fs::create_directories(on_disk(to));  // an empty directory too
    }
    return {existed ? http::status::no_content : http::status::created, {}};
  }

  void copy_file(const std::string& from, const std::string& to) {
    const Locked locked(locks_, {{from, false}, {to, true}});
    bool found = false;
    const std::string bytes = read_file(on_disk(from), found);
    if (!found)
      throw fs::filesystem_error("copy", on_disk(from),
                                 std::make_error_code(std::errc::no_such_file_or_directory));
    write_file(on_disk(to), bytes);
  }

  fs::path root_;
  FileLocks* locks_;
};

// What a request holds while it runs (rules mode).
tasklet::Rule rule_of(const Op& op) {
  switch (op.method) {
    case http::verb::get:
      return tasklet::rules::read_path(op.target);
    case http::verb::move:
      return tasklet::rules::combine({tasklet::rules::path(op.target), tasklet::rules::path(op.destination)});
    case http::verb::copy:
      return tasklet::rules::combine(
          {tasklet::rules::read_path(op.target), tasklet::rules::path(op.destination)});
    default:
      return tasklet::rules::path(op.target);
  }
}

// "/a//b/" → "/a/b"; empty for a path that is not absolute or holds ".", "..", a NUL or a "%".
std::string normalise(std::string_view raw) {
  if (raw.starts_with("http://")) {  // an absolute URL in Destination:
    const std::size_t slash = raw.find('/', 7);
    raw = slash == std::string_view::npos ? std::string_view("/") : raw.substr(slash);
  }
  if (!raw.starts_with('/')) return {};
  std::string path;
  std::size_t begin = 1;
  while (begin <= raw.size()) {
    std::size_t end = raw.find('/', begin);
    if (end == std::string_view::npos) end = raw.size();
    const std::string_view part = raw.substr(begin, end - begin);
    if (part == "." || part == ".." ||
        part.find_first_of(std::string_view("\0%", 2)) != std::string_view::npos) {
      return {};
    }
    if (!part.empty()) (path += '/') += part;
    begin = end + 1;
  }
  return path.empty() ? "/" : path;
}

std::string_view std_view(boost::beast::string_view text) { return {text.data(), text.size()}; }

class Server;

// One connection: reads a request, hands it to a tasklet, writes the reply the tasklet gives back
// (on the loop), reads the next. Touched on the loop's thread only.
class Session final : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Server& server) : socket_(std::move(socket)), server_(server) {}

  void read();
  void reply(const Op& op, Reply reply);
  void close() {
    boost::system::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

 private:
  tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  http::response<http::string_body> response_;
  Server& server_;
};

class Server {
 public:
  Server(boost::asio::io_context& io, const fs::path& root, unsigned short port, int workers, bool with_rules)
      : store_(root, with_rules ? nullptr : &locks_),
        with_rules_(with_rules),
        acceptor_(io, tcp::endpoint(boost::asio::ip::address_v4::loopback(), port)),
        signals_(io, SIGINT, SIGTERM) {
    tasklet::SchedulerOptions options;
    options.concurrency = workers;
    scheduler_ = tasklet::asio::make_scheduler(io, std::move(options));
    signals_.async_wait([this](const boost::system::error_code& error, int) {
      if (!error) stop();
    });
    accept();
  }

  unsigned short port() const { return acceptor_.local_endpoint().port(); }
  bool stopping() const { return stopping_; }
  std::size_t requests() const { return requests_; }
  std::size_t replies() const { return replies_; }
  void received() { ++requests_; }
  void replied() { ++replies_; }

  // On the loop: a request becomes a tasklet that starts on a worker.
  void serve(std::shared_ptr<Session> session, Op op) {
    scheduler_->schedule(tasklet::make_tasklet(handle(std::move(session), std::move(op))),
                         tasklet::Directive::async);
  }

 private:
  tasklet::Task<void> handle(std::shared_ptr<Session> session, Op op) {
    Reply reply;
    try {
      if (with_rules_) {
        auto held = co_await tasklet::hold(rule_of(op));
        reply = store_.apply(op);
      } else {
        reply = store_.apply(op);
      }
    } catch (const std::exception& error) {
      reply = {http::status::internal_server_error, std::string(error.what()) + '\n'};
    }
    co_await tasklet::sync();  // the loop writes the reply
    session->reply(op, std::move(reply));
  }

  void accept() {
    acceptor_.async_accept([this](const boost::system::error_code& error, tcp::socket socket) {
      if (error) return;  // closed by stop()
      auto session = std::make_shared<Session>(std::move(socket), *this);
      std::erase_if(sessions_, [](const std::weak_ptr<Session>& weak) { return weak.expired(); });
      sessions_.push_back(session);
      session->read();
      accept();
    });
  }

  void stop() {
    stopping_ = true;
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    // Idle connections close now; one with a request in flight closes after its reply.
    for (const std::weak_ptr<Session>& weak : sessions_) {
      if (const std::shared_ptr<Session> session = weak.lock()) session->close();
    }
  }

  FileLocks locks_;
  Store store_;
  bool with_rules_;
  tcp::acceptor acceptor_;
  boost::asio::signal_set signals_;
  std::vector<std::weak_ptr<Session>> sessions_;
  bool stopping_ = false;
  std::size_t requests_ = 0;
  std::size_t replies_ = 0;
  std::shared_ptr<tasklet::Scheduler> scheduler_;  // last: destroyed first, with the tasklets it holds
};

void Session::read() {
  request_ = {};
  http::async_read(socket_, buffer_, request_,
                   [self = shared_from_this()](const boost::system::error_code& error, std::size_t) {
                     if (error) return self->close();
                     self->server_.received();
                     const http::request<http::string_body>& request = self->request_;
                     Op op;
                     op.method = request.method();
                     op.target = normalise(std_view(request.target()));
                     op.destination = normalise(std_view(request[http::field::destination]));
                     op.body = std::move(self->request_.body());
                     op.version = request.version();
                     op.keep_alive = request.keep_alive();
                     if (op.target.empty()) return self->reply(op, {http::status::bad_request, "bad path\n"});
                     self->server_.serve(self, std::move(op));
                   });
}

void Session::reply(const Op& op, Reply reply) {
  server_.replied();
  if (!socket_.is_open()) return;  // closed by stop() while the request ran
  response_ = http::response<http::string_body>(reply.status, op.version);
  response_.set(http::field::server, "tasklet file_server");
  response_.set(http::field::content_type, "application/octet-stream");
  response_.keep_alive(op.keep_alive && !server_.stopping());
  response_.body() = std::move(reply.body);
  response_.prepare_payload();
  http::async_write(socket_, response_,
                    [self = shared_from_this()](const boost::system::error_code& error, std::size_t) {
                      if (error || !self->response_.keep_alive()) return self->close();
                      self->read();
                    });
}

struct Arguments {
  fs::path root;
  unsigned short port = 0;
  int workers = 2;
  bool with_rules = true;
};

bool parse(int argc, char** argv, Arguments& arguments) {
  const auto number = [](std::string_view text, auto& value) {
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    return error == std::errc() && end == text.data() + text.size();
  };
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const std::string_view value = argv[i + 1];
    if (flag == "--root") {
      arguments.root = fs::path(value);
    } else if (flag == "--port") {
      if (!number(value, arguments.port)) return false;
    } else if (flag == "--workers") {
      if (!number(value, arguments.workers) || arguments.workers < 1) return false;
    } else if (flag == "--locks" && (value == "rules" || value == "mutex")) {
      arguments.with_rules = value == "rules";
    } else {
      return false;
    }
  }
  return argc % 2 == 1 && !arguments.root.empty() && fs::is_directory(arguments.root);
}

}  // namespace

int main(int argc, char** argv) {
  Arguments arguments;
  if (!parse(argc, argv, arguments)) {
    std::fprintf(stderr, "usage: file_server --root DIR [--port N] [--workers N] [--locks rules|mutex]\n");
    return 2;
  }
  boost::asio::io_context io(1);
  Server server(io, fs::canonical(arguments.root), arguments.port, arguments.workers, arguments.with_rules);
  std::printf("listening on 127.0.0.1:%u\n", static_cast<unsigned>(server.port()));
  std::fflush(stdout);
  for (;;) {
    try {
      io.run();  // the synchronous thread: parsing, replies and the scheduler's sync phases
      break;
    } catch (const std::exception& error) {
      std::fprintf(stderr, "file_server: %s\n", error.what());
      io.restart();
    }
  }
  std::printf("stopped: %zu requests, %zu replies\n", server.requests(), server.replies());
  return server.requests() == server.replies() ? 0 : 1;
}
