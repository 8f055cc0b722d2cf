// Private: calls to etcd's v3 JSON gateway (the /v3/... endpoints) through libcurl, on the first
// of the session's endpoints that answers.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tasklet/etcd/etcd.hpp"

namespace tasklet::etcd::detail {

using Json = nlohmann::json;

/// etcd's JSON gives 64-bit integers as strings; 0 for anything else (a field left out).
std::int64_t integer_of(const Json& value);

/// etcd's JSON carries keys and values as base64.
std::string base64(std::string_view bytes);
std::string unbase64(std::string_view text);

/// Lets another thread end a Gateway::stream.
class StreamStop {
 public:
  /// Ends the stream (soon, from its own thread) and any later one given this StreamStop.
  void stop() noexcept;
  bool stopped() const noexcept;
  /// Ends the running stream only (Gateway::stream returns as if it had ended).
  void restart() noexcept;

 private:
  friend class Gateway;
  bool ending() noexcept;  // stopped, or restarted since the stream began (which it clears)
  mutable std::mutex mutex_;
  bool stopped_ = false;
  bool restarting_ = false;
  void* multi_ = nullptr;  // the running stream's curl multi handle
};

class Gateway {
 public:
  explicit Gateway(EtcdOptions options);

  /// POSTs `body` to `path` ("/v3/kv/put") and returns the answer. An endpoint that cannot be
  /// reached, or answers "unavailable", is left for the next one. Throws EtcdUnavailable when none
  /// answered; EtcdAuthFailed, EtcdPermissionDenied, or EtcdError with etcd's message otherwise.
  /// When signed in, an expired token is renewed once, transparently. `timeout`: per attempt,
  /// instead of the options' request_timeout when positive.
  Json call(const std::string& path, const Json& body, std::chrono::milliseconds timeout = {});

  /// POSTs `body` to a streaming `path` ("/v3/watch") on the endpoint that answered last, and hands
  /// each JSON message of the answer to `on_message`, until the stream ends (returns), `stop` is
  /// stopped, or `on_message` returns false. Throws EtcdUnavailable when the endpoint cannot be
  /// reached or the stream breaks, EtcdError for an answer that is not a stream of JSON objects.
  void stream(const std::string& path, const Json& body, const std::function<bool(const Json&)>& on_message,
              StreamStop& stop);

  /// Signs in with the options' user and password (nothing when there is no user).
  void authenticate();

  /// The endpoint that answered last.
  std::string endpoint() const;
  const EtcdOptions& options() const noexcept { return options_; }

 private:
  struct Answer {
    long status = 0;
    std::string body;
  };
  // One attempt on one endpoint; throws EtcdUnavailable when it cannot be reached.
  Answer post(const std::string& endpoint, const std::string& path, const std::string& body,
              const std::string& token, std::chrono::milliseconds timeout) const;
  Json call_once(const std::string& path, const Json& body, const std::string& token,
                 std::chrono::milliseconds timeout = {});

  EtcdOptions options_;
  mutable std::mutex mutex_;  // guards token_ and current_
  std::string token_;
  std::size_t current_ = 0;
};

}  // namespace tasklet::etcd::detail
