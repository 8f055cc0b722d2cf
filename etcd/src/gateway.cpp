// etcd's v3 JSON gateway through libcurl: one easy handle per thread (so its connections are
// reused), endpoints tried in turn, and etcd's gRPC errors mapped to the library's exceptions.
#include "etcd/gateway.hpp"

#include <algorithm>

#include <curl/curl.h>

#include <memory>
#include <mutex>
#include <utility>

#include <boost/archive/iterators/base64_from_binary.hpp>
#include <boost/archive/iterators/binary_from_base64.hpp>
#include <boost/archive/iterators/transform_width.hpp>

namespace tasklet::etcd::detail {

namespace {

// gRPC status codes that etcd's gateway reports in its error bodies.
constexpr int grpc_permission_denied = 7;
constexpr int grpc_unavailable = 14;
constexpr int grpc_unauthenticated = 16;

void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct HandleDeleter {
  void operator()(CURL* handle) const noexcept { curl_easy_cleanup(handle); }
};

// This thread's handle: kept between calls, so that its connection to etcd is reused.
CURL* thread_handle() {
  thread_local std::unique_ptr<CURL, HandleDeleter> handle;
  if (!handle) {
    init_curl_once();
    handle.reset(curl_easy_init());
    if (!handle) throw EtcdError("etcd: libcurl could not make a handle");
  }
  curl_easy_reset(handle.get());
  return handle.get();
}

struct HeaderList {
  curl_slist* list = nullptr;
  ~HeaderList() { curl_slist_free_all(list); }
  void add(const std::string& header) {
    curl_slist* longer = curl_slist_append(list, header.c_str());
    if (longer == nullptr) throw std::bad_alloc();
    list = longer;
  }
};

std::size_t append_body(char* data, std::size_t size, std::size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

bool mentions(const std::string& text, const char* what) { return text.find(what) != std::string::npos; }

// What every request to etcd carries: a POST of `body` as JSON, the token, the TLS settings.
// `url`, `body` and `headers` must outlive the transfer.
void prepare_post(CURL* handle, const std::string& url, const std::string& body, HeaderList& headers,
                  const std::string& token, const EtcdOptions& options) {
  headers.add("Content-Type: application/json");
  headers.add("Expect:");  // the whole request at once: no wait for "100 Continue" on larger bodies
  if (!token.empty()) headers.add("Authorization: " + token);
  curl_easy_setopt(handle, CURLOPT_URL, url.c_str());
  curl_easy_setopt(handle, CURLOPT_POST, 1L);
  curl_easy_setopt(handle, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(handle, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  curl_easy_setopt(handle, CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);  // timeouts without signals: any thread may call
  if (!options.ca_file.empty()) curl_easy_setopt(handle, CURLOPT_CAINFO, options.ca_file.c_str());
  if (!options.cert_file.empty()) curl_easy_setopt(handle, CURLOPT_SSLCERT, options.cert_file.c_str());
  if (!options.key_file.empty()) curl_easy_setopt(handle, CURLOPT_SSLKEY, options.key_file.c_str());
}

// A stream's answer: one JSON object per line, each handed to on_message once its line is whole.
struct StreamLines {
  const std::function<bool(const Json&)>* on_message;
  std::string pending;  // received, not yet a whole message
  bool ended = false;   // on_message said so
  std::string bad;      // what was not JSON

  static std::size_t on_data(char* data, std::size_t size, std::size_t count, void* out) {
    auto& stream = *static_cast<StreamLines*>(out);
    stream.pending.append(data, size * count);
    for (std::size_t end = stream.pending.find('\n'); end != std::string::npos;
         end = stream.pending.find('\n')) {
      const std::string line = stream.pending.substr(0, end);
      stream.pending.erase(0, end + 1);
      if (!line.empty() && !stream.ended && !stream.take(line)) return 0;  // ends the transfer
    }
    return stream.ended ? 0 : size * count;
  }
  // False when the line is not JSON.
  bool take(const std::string& line) {
    Json message = Json::parse(line, nullptr, false);
    if (message.is_discarded()) {
      bad = line.substr(0, 200);
      return false;
    }
    if (!(*on_message)(message)) ended = true;
    return true;
  }
};

// Why a stream's transfer ended, from its multi handle.
std::string stream_end(CURLM* multi) {
  int left = 0;
  CURLcode result = CURLE_OK;
  while (CURLMsg* message = curl_multi_info_read(multi, &left)) {
    if (message->msg == CURLMSG_DONE) result = message->data.result;
  }
  return result == CURLE_OK ? std::string("closed by etcd") : curl_easy_strerror(result);
}

}  // namespace

std::int64_t integer_of(const Json& value) {
  if (value.is_string()) return std::stoll(value.get<std::string>());
  if (value.is_number_integer()) return value.get<std::int64_t>();
  return 0;
}

std::string base64(std::string_view bytes) {
  using namespace boost::archive::iterators;
  using Encode = base64_from_binary<transform_width<std::string_view::const_iterator, 6, 8>>;
  std::string text(Encode(bytes.begin()), Encode(bytes.end()));
  text.append((3 - bytes.size() % 3) % 3, '=');
  return text;
}

std::string unbase64(std::string_view text) {
  using namespace boost::archive::iterators;
  using Decode = transform_width<binary_from_base64<std::string_view::const_iterator>, 8, 6>;
  std::size_t padding = 0;
  while (!text.empty() && text.back() == '=') {
    text.remove_suffix(1);
    ++padding;
  }
  try {
    return std::string(Decode(text.begin()), Decode(text.end()));
  } catch (const std::exception& error) {
    throw EtcdError(std::string("etcd: an answer carried bad base64: ") + error.what());
  }
}

Gateway::Gateway(EtcdOptions options) : options_(std::move(options)) {}

std::string Gateway::endpoint() const {
  std::lock_guard lock(mutex_);
  return options_.endpoints[current_];
}

Gateway::Answer Gateway::post(const std::string& endpoint, const std::string& path, const std::string& body,
                              const std::string& token, std::chrono::milliseconds limit) const {
  CURL* handle = thread_handle();
  HeaderList headers;
  Answer answer;
  const std::string url = endpoint + path;
  const auto timeout = static_cast<long>(
      std::max<std::int64_t>(1, (limit.count() > 0 ? limit : options_.request_timeout).count()));
  prepare_post(handle, url, body, headers, token, options_);
  curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, &append_body);
  curl_easy_setopt(handle, CURLOPT_WRITEDATA, &answer.body);
  curl_easy_setopt(handle, CURLOPT_TIMEOUT_MS, timeout);
  curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, timeout);
  const CURLcode code = curl_easy_perform(handle);
  if (code != CURLE_OK) throw EtcdUnavailable(url + ": " + curl_easy_strerror(code));
  curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &answer.status);
  return answer;
}

Json Gateway::call_once(const std::string& path, const Json& body, const std::string& token,
                        std::chrono::milliseconds timeout) {
  const std::string text = body.dump();
  std::size_t first = 0;
  {
    std::lock_guard lock(mutex_);
    first = current_;
  }
  std::string failures;
  for (std::size_t tried = 0; tried < options_.endpoints.size(); ++tried) {
    const std::size_t at = (first + tried) % options_.endpoints.size();
    const std::string& endpoint = options_.endpoints[at];
    Answer answer;
    try {
      answer = post(endpoint, path, text, token, timeout);
    } catch (const EtcdUnavailable& unreachable) {
      failures += std::string(failures.empty() ? "" : "; ") + unreachable.what();
      continue;
    }
    Json parsed = Json::parse(answer.body, nullptr, false);
    if (parsed.is_discarded() || !parsed.is_object()) {
      throw EtcdError("etcd at " + endpoint + path + " answered HTTP " + std::to_string(answer.status) +
                      " with something other than JSON: " + answer.body.substr(0, 200));
    }
    if (answer.status == 200 && !parsed.contains("error")) {
      std::lock_guard lock(mutex_);
      current_ = at;
      return parsed;
    }
    const int code = parsed.value("code", 0);
    const std::string message = parsed.value("message", parsed.value("error", std::string("no message")));
    const std::string where = "etcd at " + endpoint + path + ": " + message;
    if (code == grpc_unavailable) {
      failures += std::string(failures.empty() ? "" : "; ") + where;
      continue;
    }
    if (code == grpc_unauthenticated || mentions(message, "authentication failed") ||
        mentions(message, "invalid auth token") || mentions(message, "user name is empty") ||
        mentions(message, "user name not found")) {
      throw EtcdAuthFailed(where);
    }
    if (code == grpc_permission_denied || mentions(message, "permission denied"))
      throw EtcdPermissionDenied(where);
    throw EtcdError(where);
  }
  throw EtcdUnavailable("etcd: no endpoint answered " + path + " (" + failures + ")");
}

Json Gateway::call(const std::string& path, const Json& body, std::chrono::milliseconds timeout) {
  std::string token;
  {
    std::lock_guard lock(mutex_);
    token = token_;
  }
  try {
    return call_once(path, body, token, timeout);
  } catch (const EtcdAuthFailed&) {
    if (token.empty()) throw;
    authenticate();  // simple tokens expire: sign in again, once
    std::lock_guard lock(mutex_);
    token = token_;
  }
  return call_once(path, body, token, timeout);
}

void StreamStop::stop() noexcept {
  std::lock_guard lock(mutex_);
  stopped_ = true;
  if (multi_ != nullptr) curl_multi_wakeup(static_cast<CURLM*>(multi_));
}

bool StreamStop::stopped() const noexcept {
  std::lock_guard lock(mutex_);
  return stopped_;
}

void StreamStop::restart() noexcept {
  std::lock_guard lock(mutex_);
  restarting_ = true;
  if (multi_ != nullptr) curl_multi_wakeup(static_cast<CURLM*>(multi_));
}

bool StreamStop::ending() noexcept {
  std::lock_guard lock(mutex_);
  return stopped_ || std::exchange(restarting_, false);
}

void Gateway::stream(const std::string& path, const Json& body,
                     const std::function<bool(const Json&)>& on_message, StreamStop& stop) {
  std::string token;
  std::string endpoint;
  {
    std::lock_guard lock(mutex_);
    token = token_;
    endpoint = options_.endpoints[current_];
  }
  StreamLines received{&on_message, {}, false, {}};
  init_curl_once();
  std::unique_ptr<CURL, HandleDeleter> handle(curl_easy_init());
  std::unique_ptr<CURLM, decltype(&curl_multi_cleanup)> multi(curl_multi_init(), &curl_multi_cleanup);
  if (!handle || !multi) throw EtcdError("etcd: libcurl could not make a handle");
  HeaderList headers;
  const std::string url = endpoint + path;
  const std::string text = body.dump();
  prepare_post(handle.get(), url, text, headers, token, options_);
  curl_easy_setopt(handle.get(), CURLOPT_WRITEFUNCTION, &StreamLines::on_data);
  curl_easy_setopt(handle.get(), CURLOPT_WRITEDATA, &received);
  curl_easy_setopt(handle.get(), CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(options_.request_timeout.count()));
  curl_multi_add_handle(multi.get(), handle.get());
  {
    std::lock_guard lock(stop.mutex_);
    if (stop.stopped_) {
      curl_multi_remove_handle(multi.get(), handle.get());
      return;
    }
    stop.multi_ = multi.get();
    stop.restarting_ = false;  // a restart asked for before this stream began is this one
  }
  struct Unregister {
    StreamStop& stop;
    CURLM* multi;
    CURL* handle;
    ~Unregister() {
      std::lock_guard lock(stop.mutex_);
      stop.multi_ = nullptr;
      curl_multi_remove_handle(multi, handle);
    }
  } const unregister{stop, multi.get(), handle.get()};
  int running = 1;
  bool ending = false;
  while (running != 0 && !(ending = stop.ending()) && !received.ended) {
    if (curl_multi_perform(multi.get(), &running) != CURLM_OK) break;
    if (running != 0) curl_multi_poll(multi.get(), nullptr, 0, 1000, nullptr);
  }
  if (ending || stop.stopped() || received.ended) return;
  if (!received.bad.empty())
    throw EtcdError("etcd at " + url + " streamed something other than JSON: " + received.bad);
  throw EtcdUnavailable("etcd: the stream from " + url + " ended: " + stream_end(multi.get()));
}

void Gateway::authenticate() {
  if (options_.user.empty()) return;
  const Json answer =
      call_once("/v3/auth/authenticate", Json{{"name", options_.user}, {"password", options_.password}}, {});
  const std::string token = answer.value("token", std::string());
  if (token.empty()) throw EtcdAuthFailed("etcd: signing in as '" + options_.user + "' gave no token");
  std::lock_guard lock(mutex_);
  token_ = token;
}

}  // namespace tasklet::etcd::detail
