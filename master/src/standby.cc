#include "kvagent/master/standby.h"

#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <span>
#include <string_view>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "kvagent/master/oplog.h"
#include "kvagent/schemas/master_generated.h"
#include "kvagent/zmq/curve_auth.h"
#include "kvagent/zmq/zmq_limits.h"
#include "metadata_store.h"
#include "replication_log.h"

namespace kvagent::master {
namespace {

namespace fb = kvagent::master_proto;

// How long a follower of no epoch yet waits for its snapshot (Ask).
constexpr std::chrono::milliseconds kSnapshotTimeout{60'000};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

class Standby::Follower {
 public:
  Follower(Standby* owner, StandbyOptions options, std::unique_ptr<OpLog> log)
      : owner_(owner), options_(std::move(options)), log_(std::move(log)) {
    Connect();  // throws zmq::error_t for a malformed endpoint, before any thread exists
    thread_ = std::thread([this] { Run(); });
  }
  ~Follower() {
    stop_.store(true, std::memory_order_relaxed);
    if (thread_.joinable()) thread_.join();
    if (Status st = log_->Flush(); !st.ok()) LOG(ERROR) << st.ToString();
  }

 private:
  void Connect() {
    socket_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
    socket_->set(zmq::sockopt::linger, 0);
    // Each part: the reply (at most kMaxReplicationReplyBytes) or its detached records.
    socket_->set(zmq::sockopt::maxmsgsize,
                 static_cast<int64_t>(
                     std::max<uint64_t>(kMaxReplicationReplyBytes, kMaxDetachedReplicationBytes)));
    if (options_.curve) {
      if (Status st = MakeCurveClient(socket_->handle(), *options_.curve); !st.ok()) {
        LOG(ERROR) << "standby: " << st.ToString();
      }
    }
    socket_->connect(options_.primary);
  }

  // One Replicate round trip; false when the primary did not answer in time. The records of a
  // reply with detached_bytes are in `records` (a part of their own); otherwise it is emptied.
  // An answer whose parts disagree with it leaves `reply` empty.
  bool Ask(std::vector<uint8_t>* reply, zmq::message_t* records) {
    flatbuffers::FlatBufferBuilder b(256);
    const uint64_t id = ++request_id_;
    const auto follower = b.CreateString(options_.name);
    b.Finish(fb::CreateRequest(b, id, fb::Body::Replicate,
                               fb::CreateReplicate(b, owner_->applied_seq(), epoch_, 4u << 20,
                                                   static_cast<uint32_t>(options_.wait.count()),
                                                   follower, options_.electable,
                                                   /*detached_records=*/true)
                                   .Union()));
    socket_->send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    socket_->send(zmq::buffer(b.GetBufferPointer(), b.GetSize()), zmq::send_flags::none);
    // A follower of no epoch yet asks for a whole snapshot, which the primary builds and sends
    // in one message: seconds for a large state. Given only `timeout`, such a follower gave up,
    // reconnected and asked again, and never caught up.
    const auto timeout =
        epoch_ == 0 ? std::max(options_.timeout, kSnapshotTimeout) : options_.timeout;
    const int64_t deadline = NowMs() + options_.wait.count() + timeout.count();
    zmq::pollitem_t items[] = {{socket_->handle(), 0, ZMQ_POLLIN, 0}};
    while (!stop_.load(std::memory_order_relaxed)) {
      const int64_t left = deadline - NowMs();
      if (left <= 0) return false;
      zmq::poll(items, 1, std::chrono::milliseconds(std::min<int64_t>(left, 50)));
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(*socket_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        continue;
      }
      // [b"", Reply] or, when its records are detached, [b"", Reply, records].
      if (frames.size() < 2 || frames.size() > 3 || frames[0].size() != 0) continue;
      const auto* p = static_cast<const uint8_t*>(frames[1].data());
      reply->assign(p, p + frames[1].size());
      flatbuffers::Verifier v(reply->data(), reply->size());
      if (!v.VerifyBuffer<fb::Reply>(nullptr)) continue;
      const fb::Reply* r = flatbuffers::GetRoot<fb::Reply>(reply->data());
      if (r->request_id() != id) continue;  // stale
      const fb::ReplicateReply* page = r->body_as_ReplicateReply();
      const uint64_t detached = page != nullptr ? page->detached_bytes() : 0;
      const size_t parts = detached != 0 ? 3 : 2;
      if (frames.size() != parts || (detached != 0 && frames[2].size() != detached)) {
        LOG_EVERY_N(WARNING, 50) << "standby: a reply from primary " << options_.primary
                                 << " names " << detached << " detached record byte(s) but came in "
                                 << frames.size() << " part(s)"
                                 << (frames.size() == 3
                                         ? " (the last of " + std::to_string(frames[2].size()) +
                                               " bytes)"
                                         : std::string())
                                 << "; not kept; asking again";
        reply->clear();  // answered, with nothing usable
        return true;
      }
      if (detached != 0) {
        *records = std::move(frames[2]);
      } else {
        records->rebuild();
      }
      return true;
    }
    return false;
  }

  // Applies one ReplicateReply; returns the number of records applied (-1: nothing usable).
  int64_t Apply(const fb::Reply& reply, const zmq::message_t& detached) {
    if (reply.status() != 0) {
      LOG_EVERY_N(WARNING, 50) << "standby: the primary refuses to replicate: "
                               << (reply.message() ? reply.message()->str() : "");
      return -1;
    }
    const fb::ReplicateReply* r = reply.body_as_ReplicateReply();
    if (r == nullptr) return -1;
    // A page continues the history this log holds only when it comes from the same epoch: a
    // page of another master's history (a primary restarted from other state, or a different
    // master answering at the address) appended here would splice two histories, whose
    // placements may overlap. A sound primary answers an epoch it does not share with a
    // snapshot; anything else is refused and asked again.
    if (!r->snapshot() && r->master_epoch() != epoch_) {
      ++owner_->refused_pages_;
      LOG_EVERY_N(ERROR, 50) << "standby: primary " << options_.primary << " sent a page of epoch "
                             << r->master_epoch() << " to a log of epoch " << epoch_
                             << " without a snapshot; the page is not kept; asking again";
      WriteStatus();
      return -1;
    }
    std::string_view bytes;
    if (r->detached_bytes() != 0) {
      bytes = std::string_view(static_cast<const char*>(detached.data()), detached.size());
    } else if (r->records()) {
      bytes = std::string_view(reinterpret_cast<const char*>(r->records()->data()),
                               r->records()->size());
    }
    // Only records this master could replay are kept: one it cannot would make the log refuse
    // to start exactly when the standby is promoted. The page is refused whole (its records
    // depend on each other), the log stays the prefix it was, and the standby asks again.
    Status unreadable;
    uint64_t index = 0;
    const bool framed = ForEachFramedRecord(bytes, [&](std::string_view rec) {
      if (!unreadable.ok()) return;
      unreadable = MetadataStore::CheckRecord(rec);
      if (unreadable.ok()) ++index;
    });
    if (!framed) {
      LOG_EVERY_N(WARNING, 50) << "standby: malformed records from the primary; asking again";
      return -1;
    }
    if (!unreadable.ok()) {
      ++owner_->refused_pages_;
      LOG_EVERY_N(ERROR, 50) << "standby: record " << index << " of a "
                             << (r->snapshot() ? "snapshot" : "page") << " from primary "
                             << options_.primary << " is not one this kvmaster can replay ("
                             << unreadable.message()
                             << "); the page is not kept and the standby stays at seq "
                             << owner_->applied_seq()
                             << " (is the primary a newer kvmaster, or damaged?); asking again";
      WriteStatus();
      return -1;
    }
    int64_t applied = 0;
    if (r->snapshot()) {
      Status st = log_->Rewrite([&](const std::function<void(std::string_view)>& append) {
        ForEachFramedRecord(bytes, [&](std::string_view rec) {
          append(rec);
          ++applied;
        });
      });
      if (!st.ok()) {
        LOG(ERROR) << "standby: cannot write the snapshot: " << st.ToString();
        return -1;
      }
      if (epoch_ != r->master_epoch()) {
        LOG(INFO) << "standby: following primary " << options_.primary << " (epoch "
                  << r->master_epoch() << "): snapshot of " << applied << " records at seq "
                  << r->last_seq();
      }
      epoch_ = r->master_epoch();
      owner_->epoch_.store(epoch_, std::memory_order_release);
    } else {
      ForEachFramedRecord(bytes, [&](std::string_view rec) {
        log_->Append(rec);
        ++applied;
      });
      if (Status st = log_->Flush(); !st.ok()) {
        LOG(ERROR) << "standby: cannot append to the log: " << st.ToString();
        return -1;
      }
    }
    owner_->applied_seq_.store(r->last_seq(), std::memory_order_release);
    owner_->synced_.store(true, std::memory_order_release);
    WriteStatus();
    return applied;
  }

  void WriteStatus() {
    if (options_.status_file.empty()) return;
    const std::string tmp = options_.status_file + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << "primary=" << options_.primary << "\nepoch=" << epoch_
          << "\napplied_seq=" << owner_->applied_seq()
          << "\nrefused_pages=" << owner_->refused_pages() << "\n";
      if (!out) return;
    }
    std::rename(tmp.c_str(), options_.status_file.c_str());
  }

  void SleepUnlessStopped(std::chrono::milliseconds d) {
    const int64_t until = NowMs() + d.count();
    while (!stop_.load(std::memory_order_relaxed) && NowMs() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(20, d.count())));
    }
  }

  void Run() {
    std::vector<uint8_t> reply;
    zmq::message_t records;
    while (!stop_.load(std::memory_order_relaxed)) {
      if (!Ask(&reply, &records)) {
        if (stop_.load(std::memory_order_relaxed)) break;
        LOG_EVERY_N(WARNING, 20) << "standby: primary " << options_.primary << " silent for "
                                 << owner_->silent_for().count() << " ms; reconnecting";
        Connect();  // drops the unanswered request: no stale reply can arrive
        continue;
      }
      owner_->last_answer_ms_.store(NowMs(), std::memory_order_release);
      const int64_t applied =
          reply.empty() ? -1 : Apply(*flatbuffers::GetRoot<fb::Reply>(reply.data()), records);
      records.rebuild();          // a snapshot's bytes are not kept until the next one
      if (applied > 0) continue;  // there may be more right away
      // A long poll that came back empty already waited; ask again at once.
      if (applied == 0 && options_.wait.count() > 0) continue;
      SleepUnlessStopped(applied < 0 ? std::chrono::milliseconds(1000) : options_.poll);
    }
  }

  Standby* owner_;
  StandbyOptions options_;
  std::unique_ptr<OpLog> log_;
  zmq::context_t context_{1};
  std::unique_ptr<zmq::socket_t> socket_;
  uint64_t epoch_ = 0;
  uint64_t request_id_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

Result<std::unique_ptr<Standby>> Standby::Start(StandbyOptions options) {
  if (options.state_dir.empty()) {
    return InvalidParams("a standby needs --state-dir: the followed operation log is kept there");
  }
  if (options.primary.empty()) return InvalidParams("a standby needs the primary's endpoint");
  auto log = OpLog::Open(options.state_dir);
  if (!log.ok()) return log.status();
  std::unique_ptr<Standby> standby(new Standby());
  standby->last_answer_ms_.store(NowMs());
  const std::string primary = options.primary;
  try {
    standby->follower_ =
        std::make_unique<Follower>(standby.get(), std::move(options), std::move(log.value()));
  } catch (const zmq::error_t& e) {
    return InvalidParams("cannot follow the primary at '" + primary + "': " + e.what() +
                         " (expected a ZMQ endpoint such as tcp://HOST:50051)");
  }
  return standby;
}

Standby::~Standby() = default;

void Standby::Stop() { follower_.reset(); }

std::chrono::milliseconds Standby::silent_for() const {
  return std::chrono::milliseconds(NowMs() - last_answer_ms_.load(std::memory_order_acquire));
}

}  // namespace kvagent::master
