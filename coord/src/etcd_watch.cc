// EtcdWatch over the JSON gateway: a POST to /v3/watch whose answer never ends; etcd writes one
// JSON document per line ({"result": WatchResponse} or {"error": ...}). A curl multi handle
// drives the transfer so that Next() can wait with a timeout on the owner thread.
#include "kvagent/coord/etcd_watch.h"

#include "etcd_http.h"

namespace kvagent::coord {
namespace {

// Whether `object` has `field` set to true (absent: false, proto3's default). Reading it with
// nlohmann's value() would throw on another type: etcd's answers are untrusted bytes.
bool IsTrue(const Json& object, const char* field) {
  const auto it = object.find(field);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace

Status ParseWatchLine(std::string_view line, const std::string& endpoint, bool* created,
                      std::vector<EtcdEvent>* out) {
  const Json message = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (message.is_discarded() || !message.is_object()) {
    return Internal("etcd watch at " + endpoint + " sent a line that is not JSON");
  }
  if (const auto e = message.find("error"); e != message.end()) {
    return StatusFromError(*e, 200);
  }
  const auto result = message.find("result");
  if (result == message.end() || !result->is_object()) {
    return Internal("etcd watch at " + endpoint + " sent a message without a result");
  }
  if (IsTrue(*result, "canceled")) {
    const int64_t compacted = JsonInt(*result, "compact_revision").value_or(0);
    return Internal("etcd canceled the watch" +
                    (compacted > 0
                         ? " (revisions before " + std::to_string(compacted) + " were compacted)"
                         : std::string()) +
                    "; read the key again");
  }
  if (IsTrue(*result, "created")) *created = true;
  const auto events = result->find("events");
  if (events == result->end()) return Status::Ok();
  if (!events->is_array()) return Internal("etcd watch sent events that are not a list");
  for (const Json& e : *events) {
    if (!e.is_object()) return Internal("etcd watch sent an event that is not an object");
    EtcdEvent event;
    const auto type = e.find("type");  // absent: PUT (proto3's default)
    if (type != e.end() && !type->is_string()) {
      return Internal("etcd watch sent an event whose type is not a name");
    }
    event.type = type != e.end() && type->get_ref<const std::string&>() == "DELETE"
                     ? EtcdEvent::Type::kDelete
                     : EtcdEvent::Type::kPut;
    const auto kv_field = e.find("kv");
    auto kv = KeyValueFrom(kv_field == e.end() ? Json::object() : *kv_field);
    if (!kv.ok()) return kv.status();
    event.kv = std::move(*kv);
    out->push_back(std::move(event));
  }
  return Status::Ok();
}

class EtcdWatch::Stream {
 public:
  Stream() : multi_(curl_multi_init()) {}
  ~Stream() {
    Detach();
    curl_multi_cleanup(multi_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Starts the watch at `endpoint` and waits for etcd's confirmation.
  Status Open(const std::string& endpoint, const std::string& payload, const EtcdTls& tls,
              const std::string& token, std::chrono::milliseconds timeout) {
    Detach();
    endpoint_ = endpoint;
    handle_.Prepare(endpoint, "watch", payload, tls, token);
    curl_easy_setopt(handle_.get(), CURLOPT_TIMEOUT_MS, 0L);  // the stream lasts
    curl_easy_setopt(handle_.get(), CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout.count()));
    curl_easy_setopt(handle_.get(), CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(handle_.get(), CURLOPT_TCP_KEEPIDLE, 2L);
    curl_easy_setopt(handle_.get(), CURLOPT_TCP_KEEPINTVL, 1L);
    curl_multi_add_handle(multi_, handle_.get());
    attached_ = true;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!created_) {
      std::vector<EtcdEvent> early;
      Status st = TakeMessages(&early);
      if (!st.ok()) return st;
      pending_.insert(pending_.end(), early.begin(), early.end());
      if (created_) break;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return Status(ErrorCode::kMasterUnavailable,
                      "etcd at " + endpoint + " did not confirm the watch in time");
      }
      KVAGENT_RETURN_IF_ERROR(Pump(left));
    }
    return Status::Ok();
  }

  Result<std::vector<EtcdEvent>> Next(std::chrono::milliseconds timeout) {
    std::vector<EtcdEvent> out = std::move(pending_);
    pending_.clear();
    KVAGENT_RETURN_IF_ERROR(TakeMessages(&out));
    if (!out.empty()) return out;
    KVAGENT_RETURN_IF_ERROR(Pump(timeout));
    KVAGENT_RETURN_IF_ERROR(TakeMessages(&out));
    return out;
  }

 private:
  void Detach() {
    if (attached_) curl_multi_remove_handle(multi_, handle_.get());
    attached_ = false;
    created_ = false;
  }

  // Moves the transfer on, waiting up to `timeout` for data. MASTER_UNAVAILABLE when it ended.
  Status Pump(std::chrono::milliseconds timeout) {
    int running = 0;
    curl_multi_perform(multi_, &running);
    if (running != 0) {
      curl_multi_poll(multi_, nullptr, 0, static_cast<int>(timeout.count()), nullptr);
      curl_multi_perform(multi_, &running);
    }
    if (running != 0) return Status::Ok();
    std::string why = "the stream ended";
    int queued = 0;
    while (CURLMsg* m = curl_multi_info_read(multi_, &queued)) {
      if (m->msg == CURLMSG_DONE && m->data.result != CURLE_OK) {
        why = handle_.Failure(m->data.result);
      }
    }
    // What arrived before the end still counts; the caller sees the error next time.
    if (!handle_.body().empty() && handle_.body().find('\n') != std::string::npos) {
      return Status::Ok();
    }
    return Status(ErrorCode::kMasterUnavailable, "etcd watch at " + endpoint_ + ": " + why);
  }

  // Parses every complete line buffered so far into `out`.
  Status TakeMessages(std::vector<EtcdEvent>* out) {
    std::string& body = handle_.body();
    size_t start = 0;
    Status status;
    while (status.ok()) {
      const size_t end = body.find('\n', start);
      if (end == std::string::npos) break;
      const std::string_view line(body.data() + start, end - start);
      start = end + 1;
      if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
      status = Parse(line, out);
    }
    body.erase(0, start);
    return status;
  }

  Status Parse(std::string_view line, std::vector<EtcdEvent>* out) {
    return ParseWatchLine(line, endpoint_, &created_, out);
  }

  CURLM* multi_;
  CurlHandle handle_;
  std::string endpoint_;
  bool attached_ = false;
  bool created_ = false;
  std::vector<EtcdEvent> pending_;  // events that came with the confirmation
};

Result<std::unique_ptr<EtcdWatch>> EtcdWatch::Open(const EtcdClientOptions& options,
                                                   std::string key, int64_t start_revision,
                                                   bool prefix) {
  if (options.endpoints.empty()) return InvalidParams("no etcd endpoint given");
  KVAGENT_RETURN_IF_ERROR(CheckEtcdTls(options.tls));
  KVAGENT_RETURN_IF_ERROR(CheckEtcdAuth(options.auth, options.tls));
  // etcd checks the token when the watch is created: a fresh one (the user's authentication
  // costs etcd a password hash, and a watch is opened at start and after a break only).
  std::string token;
  if (!options.auth.user.empty()) {
    EtcdClient::Http http(options);
    auto t = http.Token();
    if (!t.ok()) return t.status();
    token = std::move(*t);
  }
  Json create{{"key", Base64(key)}};
  if (prefix) create["range_end"] = Base64(PrefixEnd(key));
  if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
  const std::string payload = Json{{"create_request", create}}.dump();
  auto stream = std::make_unique<Stream>();
  std::string failures;
  for (const std::string& endpoint : options.endpoints) {
    Status st = stream->Open(endpoint, payload, options.tls, token, options.timeout);
    if (st.ok()) return std::unique_ptr<EtcdWatch>(new EtcdWatch(std::move(stream)));
    if (st.code() != ErrorCode::kMasterUnavailable) return st;
    failures += (failures.empty() ? "" : "; ") + st.message();
  }
  return Status(ErrorCode::kMasterUnavailable, "cannot watch etcd: " + failures);
}

EtcdWatch::EtcdWatch(std::unique_ptr<Stream> stream) : stream_(std::move(stream)) {}
EtcdWatch::~EtcdWatch() = default;

Result<std::vector<EtcdEvent>> EtcdWatch::Next(std::chrono::milliseconds timeout) {
  return stream_->Next(timeout);
}

}  // namespace kvagent::coord
