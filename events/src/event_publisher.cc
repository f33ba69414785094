// EventPublisher: callers enqueue, one thread owns the PUB and ROUTER sockets.
//
// Hand-off. Producers append to `incoming_` under `mu_` (process-private memory, so a mutex is
// fine) and write the eventfd only when the thread said it is going to sleep (`sleeping_`, set
// under `mu_` only after the thread found `incoming_` empty; the producer that finds it set
// clears it and writes, so one wake-up per sleep). The eventfd sits in the same zmq_poll as the
// ROUTER, so one wait covers new events and replay requests.
//
// Coalescing. After a round that sent something the thread waits coalesce_window before it takes
// the queue again, and producers do not wake it meanwhile: under a steady stream of operations
// it wakes about once per window and sends what gathered as full batches, instead of waking
// (and, on a shared core, preempting the request path) once per operation. The first event
// after a quiet period still goes out at once. Flush and the destructor cut the window short.
//
// Encoding. Publish hands the events themselves over and this thread encodes them;
// EncodeAndPublish encodes on the caller's thread and hands over the bytes (EncodedRun), whose
// buffers come back to the producers once sent. Both make the same batches.
//
// Overflow. At most queue_capacity items (events or encoded payloads) wait in `incoming_`.
// What does not fit is dropped and counted, and a drop marker takes its place in the queue:
// when the thread reaches the marker it closes the batch it was building and skips one seq,
// so every subscriber sees the loss as a gap right where it happened. Consecutive drops share
// one marker (one skipped seq per run of losses).
//
// Retention and replay: EventReplay (event_replay.h), owned by the thread with the ROUTER.
// Batches go out without a copy (ZMQ holds a reference to the payload string until it has sent
// it). An evicted batch's string, or without replay one of the last few sent, is recycled as the
// next payload buffer once no message refers to it, so steady state allocates no payload
// buffers.
#include "kvagent/events/event_publisher.h"
#include "kvagent/common/errno_text.h"
#include "kvagent/common/thread_policy.h"
#include "kvagent/common/thread_start.h"

#include <sched.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <utility>
#include <variant>

#include <glog/logging.h>

#include <zmq.hpp>

#include "event_replay.h"
#include "event_socket.h"
#include "kvagent/common/unique_fd.h"
#include "kvagent/zmq/curve_auth.h"
#include "kvagent/zmq/zmq_limits.h"

namespace kvagent::events {
namespace {

// Sets who may connect to the socket file of an ipc:// endpoint we bound: the owner only, or
// also `group`. Other transports: nothing to do.
Status RestrictIpcFile(const std::string& endpoint, std::optional<uint32_t> group) {
  constexpr std::string_view kIpc = "ipc://";
  if (endpoint.rfind(kIpc, 0) != 0 || endpoint.size() == kIpc.size()) return Status::Ok();
  const std::string path = endpoint.substr(kIpc.size());
  if (group && ::chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0) {
    return InvalidParams("cannot give " + path + " to group " + std::to_string(*group) + ": " +
                         ErrnoText(errno) +
                         " (the agent must run as root or be a member of that group)");
  }
  if (::chmod(path.c_str(), group ? 0660 : 0600) != 0) {
    return Internal("cannot set the mode of " + path + ": " + ErrnoText(errno));
  }
  return Status::Ok();
}

// Removes the socket file of an ipc:// endpoint we bound (ZMQ does not always remove it when the
// socket closes). Other transports: nothing to do.
void RemoveIpcFile(const std::string& endpoint) {
  constexpr std::string_view kIpc = "ipc://";
  if (endpoint.rfind(kIpc, 0) != 0 || endpoint.size() == kIpc.size()) return;
  const std::string path = endpoint.substr(kIpc.size());
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) unlink(path.c_str());
}

// An eventfd that the publisher thread polls next to its ROUTER socket.
class WakeFd {
 public:
  WakeFd() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

  bool ok() const { return fd_.valid(); }
  int fd() const { return fd_.get(); }
  void Notify() {
    const uint64_t one = 1;
    // EAGAIN only when the counter is about to overflow: the thread is awake anyway.
    [[maybe_unused]] ssize_t n = write(fd_.get(), &one, sizeof one);
  }
  void Drain() {
    uint64_t count = 0;
    [[maybe_unused]] ssize_t n = read(fd_.get(), &count, sizeof count);
  }

 private:
  UniqueFd fd_;
};

struct EncodedPayload {
  std::string payload;
};
struct DropMarker {};  // one skipped seq
// A producer's events, handed over as one item: moving each event into the queue on its own
// cost the master's loop a tenth of its time.
using EventRun = std::vector<KvEvent>;
// Events a producer encoded itself (EncodeAndPublish): EncodeEvent's bytes back to back, `ends`
// the end offset of each event.
struct EncodedRun {
  std::string bytes;
  std::vector<size_t> ends;
};
using QueuedItem = std::variant<KvEvent, EventRun, EncodedRun, EncodedPayload, DropMarker>;

// The PUB side: plain (ipc://, inproc://, and tcp:// without CURVE) and CURVE (tcp:// with
// it). A batch goes to every socket that has an endpoint.
struct PubSockets {
  explicit PubSockets(zmq::context_t& context)
      : plain(context, zmq::socket_type::pub), curve(context, zmq::socket_type::pub) {}
  zmq::socket_t plain;
  zmq::socket_t curve;
  bool plain_bound = false;
  bool curve_bound = false;
};

bool IsTcp(const std::string& endpoint) { return endpoint.rfind("tcp://", 0) == 0; }

// While replays are pending, the thread looks at them at least this often.
constexpr auto kReplayPumpInterval = std::chrono::milliseconds(10);

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

class EventPublisher::Thread {
 public:
  explicit Thread(EventPublisherOptions options)
      : options_(std::move(options)),
        replay_(options_.replay_batches, options_.replay_max_bytes, options_.topic) {
    if (options_.queue_capacity == 0) options_.queue_capacity = 1;
    if (options_.max_batch_events == 0) options_.max_batch_events = 1;
  }

  ~Thread() {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
      }
      wake_.Notify();
      thread_.join();
    }
    // Only endpoints this publisher bound (empty when a bind failed: the file is someone else's).
    RemoveIpcFile(endpoint_);
    RemoveIpcFile(replay_endpoint_);
    for (const std::string& extra : extra_endpoints_) RemoveIpcFile(extra);
  }

  // Starts the thread, which creates and binds the sockets; returns the bind result.
  Status Start() {
    if (!wake_.ok()) return Internal(std::string("eventfd failed: ") + ErrnoText(errno));
    return StartThreadAndWait(&thread_, [this](std::promise<Status>* bound) { Run(bound); });
  }

  void Enqueue(std::vector<KvEvent>&& events) {
    if (events.empty()) return;
    const size_t offered = events.size();
    EnqueueRun(std::move(events), offered, offered,
               [](std::vector<KvEvent>& run, size_t taken) { run.resize(taken); });
  }

  void EncodeAndEnqueue(std::span<const KvEvent> events) {
    if (events.empty()) return;
    EncodedRun run;  // into buffers the thread gave back: no allocation per call once warm
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!spare_runs_.empty()) {
        run = std::move(spare_runs_.back());
        spare_runs_.pop_back();
      }
    }
    // No more than the queue can ever hold: the rest would be dropped unread.
    const size_t offered = events.size();
    const std::span<const KvEvent> encoded =
        events.first(std::min(offered, options_.queue_capacity));
    run.ends.reserve(encoded.size());
    for (const KvEvent& e : encoded) {
      EncodeEvent(e, &run.bytes);
      run.ends.push_back(run.bytes.size());
    }
    EnqueueRun(std::move(run), encoded.size(), offered, [](EncodedRun& r, size_t taken) {
      r.bytes.resize(r.ends[taken - 1]);
      r.ends.resize(taken);
    });
  }

  void Enqueue(KvEvent&& event) { EnqueueOne(QueuedItem(std::move(event))); }
  void Enqueue(EncodedPayload&& payload) { EnqueueOne(QueuedItem(std::move(payload))); }

  void Flush() {
    wake_.Notify();  // do not wait out a coalescing window
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = submitted_;
    flushed_.wait(lock, [&] { return completed_ >= target || exited_; });
  }

  std::string endpoint() const { return endpoint_; }
  std::string replay_endpoint() const { return replay_endpoint_; }
  std::vector<std::string> extra_endpoints() const { return extra_endpoints_; }

  EventPublisherStats stats() const {
    EventPublisherStats s;
    s.next_seq = next_seq_.load(std::memory_order_relaxed);
    s.published_batches = published_batches_.load(std::memory_order_relaxed);
    s.published_events = published_events_.load(std::memory_order_relaxed);
    s.dropped_batches = dropped_batches_.load(std::memory_order_relaxed);
    s.replay_requests = replay_requests_.load(std::memory_order_relaxed);
    s.bad_replay_requests = bad_replay_requests_.load(std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    s.dropped_events = dropped_events_;
    return s;
  }

 private:
  void EnqueueOne(QueuedItem&& item) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      wake = std::exchange(sleeping_, false);
      if (queued_ >= options_.queue_capacity) {
        RecordDropLocked(std::holds_alternative<KvEvent>(item) ? 1 : 0);
      } else {
        incoming_.push_back(std::move(item));
        ++queued_;
        ++submitted_;
      }
    }
    if (wake) wake_.Notify();
  }

  // Queues what fits of a run of `count` events, one item, as far as the queue has room: `trim`
  // cuts the run to its first `taken` events when not all fit. Of the `offered` events the
  // producer gave (`count` and any it did not make into the run), the rest are counted as dropped.
  template <typename Run, typename Trim>
  void EnqueueRun(Run&& run, size_t count, size_t offered, Trim&& trim) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      wake = std::exchange(sleeping_, false);
      const size_t room = options_.queue_capacity - std::min(queued_, options_.queue_capacity);
      const size_t taken = std::min(room, count);
      if (taken > 0) {
        if (taken < count) trim(run, taken);
        incoming_.emplace_back(std::forward<Run>(run));
        queued_ += taken;
        ++submitted_;  // one item (completed_ counts items)
      }
      if (taken < offered) RecordDropLocked(offered - taken);
    }
    if (wake) wake_.Notify();
  }

  // Counts `events` lost and makes sure a drop marker follows what is queued.
  void RecordDropLocked(size_t events) {
    dropped_events_ += events;
    if (!incoming_.empty() && std::holds_alternative<DropMarker>(incoming_.back())) return;
    incoming_.emplace_back(DropMarker{});
    ++submitted_;
  }

  // ---- the publisher thread ------------------------------------------------------------------

  // Binds `endpoint` on the plain or the CURVE PUB; returns the endpoint actually bound.
  Result<std::string> BindPub(PubSockets& pub, const std::string& endpoint) {
    const bool curve = options_.curve && IsTcp(endpoint);
    zmq::socket_t& socket = curve ? pub.curve : pub.plain;
    KVAGENT_RETURN_IF_ERROR(BindEventSocket(socket, endpoint, "event PUB"));
    (curve ? pub.curve_bound : pub.plain_bound) = true;
    std::string bound = socket.get(zmq::sockopt::last_endpoint);
    KVAGENT_RETURN_IF_ERROR(RestrictIpcFile(bound, options_.ipc_group));
    return bound;
  }

  Status BindSockets(PubSockets& pub, zmq::socket_t& router) {
    for (zmq::socket_t* socket : {&pub.plain, &pub.curve}) {
      socket->set(zmq::sockopt::sndhwm, SubscriberQueueBatches(options_));
      socket->set(zmq::sockopt::linger, 0);
      socket->set(zmq::sockopt::maxmsgsize, kMaxSubscriptionBytes);
    }
    if (options_.curve) {
      KVAGENT_RETURN_IF_ERROR(MakeCurveServer(pub.curve.handle(), *options_.curve));
    }
    auto main = BindPub(pub, options_.endpoint);
    if (!main.ok()) return main.status();
    endpoint_ = *main;
    for (const std::string& extra : options_.extra_endpoints) {
      auto bound = BindPub(pub, extra);
      if (!bound.ok()) return bound.status();
      extra_endpoints_.push_back(*bound);
    }
    if (options_.replay_endpoint.empty()) return Status::Ok();
    EventReplay::Configure(router);
    if (options_.curve && IsTcp(options_.replay_endpoint)) {
      KVAGENT_RETURN_IF_ERROR(MakeCurveServer(router.handle(), *options_.curve));
    }
    KVAGENT_RETURN_IF_ERROR(
        BindEventSocket(router, options_.replay_endpoint, "event replay ROUTER"));
    replay_endpoint_ = router.get(zmq::sockopt::last_endpoint);
    return RestrictIpcFile(replay_endpoint_, options_.ipc_group);
  }

  void Run(std::promise<Status>* bound) {
    zmq::context_t context(1);
    // Events may wait a scheduler tick; the thread that stored them may not (thread_policy.h).
    // Its ZMQ I/O thread, which starts with the first socket, runs in the same class.
    if (MarkThisThreadBackground()) {
      zmq_ctx_set(context.handle(), ZMQ_THREAD_SCHED_POLICY, SCHED_BATCH);
    }
    // Checks the clients of the CURVE sockets; goes before the context does.
    std::unique_ptr<ZapHandler> zap;
    PubSockets pub(context);
    zmq::socket_t router(context, zmq::socket_type::router);
    Status status;
    try {
      if (options_.curve) {
        auto handler = ZapHandler::Start(context.handle(), {options_.curve->client.public_key});
        status = handler.ok() ? Status::Ok() : handler.status();
        if (handler.ok()) zap = std::move(*handler);
      }
      if (status.ok()) status = BindSockets(pub, router);
    } catch (const zmq::error_t& e) {  // a socket option refused: a bug, not an operator error
      status = Internal(std::string("event publisher: cannot set up its sockets: ") + e.what());
    }
    const bool serve_replay = status.ok() && !options_.replay_endpoint.empty();
    bound->set_value(status);  // `bound` dies with Start(): not touched again
    if (!status.ok()) return;

    std::vector<QueuedItem> work;
    zmq::pollitem_t items[2] = {{nullptr, wake_.fd(), ZMQ_POLLIN, 0},
                                {router.handle(), 0, ZMQ_POLLIN, 0}};
    // busy: the last round sent something, so wait out the coalescing window (producers do not
    // wake us meanwhile) and look again; otherwise sleep until a producer, a replay request or
    // the replay pump needs us.
    // After a stop request the window is not waited: what is left goes out at once.
    bool busy = false;
    bool stop = false;
    while (true) {
      auto wait = busy && !stop
                      ? std::chrono::ceil<std::chrono::milliseconds>(options_.coalesce_window)
                  : busy              ? std::chrono::milliseconds(0)
                  : replay_.pending() ? kReplayPumpInterval
                                      : std::chrono::milliseconds(-1);
      if (!busy) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!incoming_.empty() || stopping_) {
          wait = std::chrono::milliseconds(0);
        } else {
          sleeping_ = true;
        }
      }
      try {
        zmq::poll(items, serve_replay ? 2 : 1, wait);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        LOG(ERROR) << "event publisher: zmq_poll failed: " << e.what() << "; stopping";
        break;
      }
      if (items[0].revents & ZMQ_POLLIN) wake_.Drain();
      if (serve_replay && (items[1].revents & ZMQ_POLLIN)) {
        replay_.OnReadable(router);
        replay_requests_.store(replay_.stats().requests, std::memory_order_relaxed);
        bad_replay_requests_.store(replay_.stats().bad_requests, std::memory_order_relaxed);
      }
      if (serve_replay && replay_.pending()) replay_.Pump(router);
      {
        std::lock_guard<std::mutex> lock(mu_);
        sleeping_ = false;
        work.swap(incoming_);
        queued_ = 0;
        stop = stopping_;
      }
      busy = !work.empty();
      if (!busy) {
        if (stop) break;  // everything queued before the stop request has been sent
        continue;
      }
      Publish(pub, work, serve_replay);
      {
        std::lock_guard<std::mutex> lock(mu_);
        completed_ += work.size();
        for (QueuedItem& item : work) {  // EncodedRun buffers go back to the producers
          auto* run = std::get_if<EncodedRun>(&item);
          if (run == nullptr || spare_runs_.size() >= kSpareRuns ||
              run->bytes.capacity() > kMaxSpareRunBytes) {
            continue;  // freed with `work`: a mass removal's run is not kept for ever
          }
          run->bytes.clear();
          run->ends.clear();
          spare_runs_.push_back(std::move(*run));
        }
      }
      work.clear();
      flushed_.notify_all();
    }
    {
      // However the loop ended, Flush must not wait for a thread that is gone.
      std::lock_guard<std::mutex> lock(mu_);
      exited_ = true;
    }
    flushed_.notify_all();
  }

  // Turns the queued items into batches: events are grouped up to max_batch_events and
  // max_batch_bytes; an encoded payload or a drop marker closes the batch being built.
  void Publish(PubSockets& pub, std::vector<QueuedItem>& work, bool retain) {
    for (QueuedItem& item : work) {
      if (auto* event = std::get_if<KvEvent>(&item)) {
        Add(pub, *event, retain);
      } else if (auto* run = std::get_if<EventRun>(&item)) {
        for (const KvEvent& e : *run) Add(pub, e, retain);
      } else if (auto* encoded_run = std::get_if<EncodedRun>(&item)) {
        size_t start = 0;
        for (const size_t end : encoded_run->ends) {
          AddEncoded(pub, std::string_view(encoded_run->bytes).substr(start, end - start), retain);
          start = end;
        }
      } else if (auto* encoded = std::get_if<EncodedPayload>(&item)) {
        SendBuilt(pub, retain);
        payload_.swap(encoded->payload);
        SendPayload(pub, retain, 0);
      } else {
        SendBuilt(pub, retain);
        next_seq_.fetch_add(1, std::memory_order_relaxed);
        dropped_batches_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    SendBuilt(pub, retain);
  }

  // Adds one event to the batch being built, sending it first or after when it is full.
  void Add(PubSockets& pub, const KvEvent& event, bool retain) {
    builder_.Add(event);
    if (builder_.event_count() > 1 && builder_.payload_bound() > options_.max_batch_bytes) {
      builder_.RemoveLast();
      SendBuilt(pub, retain);
      builder_.Add(event);
    }
    SendIfFull(pub, retain);
  }
  // The same for one event EncodeEvent encoded.
  void AddEncoded(PubSockets& pub, std::string_view event, bool retain) {
    builder_.AddEncoded(event);
    if (builder_.event_count() > 1 && builder_.payload_bound() > options_.max_batch_bytes) {
      builder_.RemoveLast();
      SendBuilt(pub, retain);
      builder_.AddEncoded(event);
    }
    SendIfFull(pub, retain);
  }
  void SendIfFull(PubSockets& pub, bool retain) {
    if (builder_.event_count() >= options_.max_batch_events ||
        builder_.payload_bound() >= options_.max_batch_bytes) {
      SendBuilt(pub, retain);
    }
  }

  void SendBuilt(PubSockets& pub, bool retain) {
    if (builder_.empty()) return;
    const size_t events = builder_.event_count();
    builder_.Finish(NowSeconds(), options_.dp_rank, &payload_);
    SendPayload(pub, retain, events);
  }

  // Sends payload_ with the next seq, then moves it into the replay ring. The sockets and the
  // ring share the one buffer: ZMQ sends it without a copy (a copy cost a malloc and a memcpy
  // of the batch per socket and, on the thread's own malloc arena, page faults as the arena
  // grew and shrank: about a quarter of this thread's time).
  void SendPayload(PubSockets& pub, bool retain, size_t events) {
    const uint64_t seq = next_seq_.load(std::memory_order_relaxed);
    const std::string seq_frame = EncodeSeq(seq);
    auto sent = std::make_shared<std::string>(std::move(payload_));
    payload_ = std::string();
    for (auto [socket, bound] :
         {std::pair{&pub.plain, pub.plain_bound}, std::pair{&pub.curve, pub.curve_bound}}) {
      if (!bound) continue;
      if (!(SendFrame(*socket, options_.topic, true) && SendFrame(*socket, seq_frame, true) &&
            SendSharedFrame(*socket, sent))) {
        LOG_EVERY_N(WARNING, 1000) << "event publisher: PUB send failed for seq " << seq;
      }
    }
    next_seq_.store(seq + 1, std::memory_order_relaxed);
    published_batches_.fetch_add(1, std::memory_order_relaxed);
    published_events_.fetch_add(events, std::memory_order_relaxed);
    if (!retain || !replay_.Retain(seq, sent, &payload_)) Recycle(std::move(sent));
  }

  // Without a replay ring: the last few sent buffers wait here, and the oldest becomes the next
  // payload buffer once ZMQ has let go of it.
  void Recycle(std::shared_ptr<std::string> sent) {
    spent_.push_back(std::move(sent));
    if (spent_.size() <= kSpentBuffers) return;
    TakeSentBuffer(spent_.front(), &payload_);
    spent_.pop_front();
  }

  EventPublisherOptions options_;
  WakeFd wake_;
  std::thread thread_;
  std::string endpoint_;                      // written by the thread before Start() returns
  std::string replay_endpoint_;               // idem
  std::vector<std::string> extra_endpoints_;  // idem

  // Shared between callers and the thread, guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable flushed_;
  std::vector<QueuedItem> incoming_;
  size_t queued_ = 0;       // events and payloads in incoming_ (drop markers not counted)
  uint64_t submitted_ = 0;  // items ever appended to incoming_
  uint64_t completed_ = 0;  // items the thread has sent or dropped
  uint64_t dropped_events_ = 0;
  bool stopping_ = false;
  bool exited_ = false;    // the thread has left its loop
  bool sleeping_ = false;  // the thread waits for the eventfd: the next producer writes it
  // Emptied EncodedRun buffers the thread gives back for the producers' next calls.
  static constexpr size_t kSpareRuns = 8;
  static constexpr size_t kMaxSpareRunBytes = size_t{1} << 20;
  std::vector<EncodedRun> spare_runs_;

  // Owned by the thread; the atomics are read by stats().
  EventBatchBuilder builder_;
  std::string payload_;
  static constexpr size_t kSpentBuffers = 4;
  std::deque<std::shared_ptr<std::string>> spent_;  // Recycle's
  EventReplay replay_;
  std::atomic<uint64_t> next_seq_{0};
  std::atomic<uint64_t> published_batches_{0};
  std::atomic<uint64_t> published_events_{0};
  std::atomic<uint64_t> dropped_batches_{0};
  std::atomic<uint64_t> replay_requests_{0};
  std::atomic<uint64_t> bad_replay_requests_{0};
};

Result<std::unique_ptr<EventPublisher>> EventPublisher::Start(EventPublisherOptions options) {
  if (options.endpoint.empty()) {
    return InvalidParams("event publisher: no PUB endpoint; set e.g. tcp://*:5557");
  }
  auto thread = std::make_unique<Thread>(std::move(options));
  KVAGENT_RETURN_IF_ERROR(thread->Start());
  return std::unique_ptr<EventPublisher>(new EventPublisher(std::move(thread)));
}

EventPublisher::EventPublisher(std::unique_ptr<Thread> thread) : thread_(std::move(thread)) {}
EventPublisher::~EventPublisher() = default;

void EventPublisher::Publish(std::vector<KvEvent> events) { thread_->Enqueue(std::move(events)); }
void EventPublisher::Publish(KvEvent event) { thread_->Enqueue(std::move(event)); }

int SubscriberQueueBatches(const EventPublisherOptions& options) {
  if (options.sndhwm > 0) return options.sndhwm;
  constexpr size_t kMinBatches = 16;
  const size_t batches =
      options.subscriber_queue_bytes / std::max<size_t>(options.max_batch_bytes, 1);
  return static_cast<int>(std::clamp<size_t>(batches, kMinBatches, 1'000'000));
}

void EventPublisher::EncodeAndPublish(std::span<const KvEvent> events) {
  thread_->EncodeAndEnqueue(events);
}
void EventPublisher::PublishEncoded(std::string payload) {
  thread_->Enqueue(EncodedPayload{std::move(payload)});
}
void EventPublisher::Flush() { thread_->Flush(); }
std::string EventPublisher::endpoint() const { return thread_->endpoint(); }
std::string EventPublisher::replay_endpoint() const { return thread_->replay_endpoint(); }
std::vector<std::string> EventPublisher::extra_endpoints() const {
  return thread_->extra_endpoints();
}
EventPublisherStats EventPublisher::stats() const { return thread_->stats(); }

}  // namespace kvagent::events
