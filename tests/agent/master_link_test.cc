// RemoteMaster (agent/master_link) through its public interface against a scripted kvmaster: a
// ZMQ ROUTER on loopback run by the test, which answers (or withholds answers to) each request
// as the test says. Registration and mounting, calls and their replies on the service thread,
// the link going down on an unanswered request and coming back, the End's retry across that
// (CallUntilAnswered), re-registration on known=false, fences, and ListKeys around Stop.
#include "kvagent/master_link/remote_master.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "kvagent/common/frame_stream.h"
#include "kvagent/common/tcp_socket.h"
#include "kvagent/schemas/master_generated.h"
#include "master_transports.h"

namespace kvagent::master_link {
namespace {

namespace mfb = kvagent::master_proto;
using namespace std::chrono_literals;
using Bytes = std::vector<uint8_t>;

Bytes Finish(flatbuffers::FlatBufferBuilder& fbb) {
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

// The answer kvmaster gives to each request type, as the scripted master sends it by default.
Bytes DefaultReply(const mfb::Request& r, uint64_t master_epoch, bool known) {
  flatbuffers::FlatBufferBuilder fbb;
  switch (r.body_type()) {
    case mfb::Body::RegisterAgent:
      fbb.Finish(mfb::CreateReply(fbb, r.request_id(), 0, 0, mfb::ReplyBody::RegisterAgentReply,
                                  mfb::CreateRegisterAgentReply(fbb, 7, master_epoch).Union()));
      break;
    case mfb::Body::MountPool:
      fbb.Finish(mfb::CreateReply(fbb, r.request_id(), 0, 0, mfb::ReplyBody::MountPoolReply,
                                  mfb::CreateMountPoolReply(fbb, 9, 0).Union()));
      break;
    case mfb::Body::Heartbeat:
      fbb.Finish(mfb::CreateReply(fbb, r.request_id(), 0, 0, mfb::ReplyBody::HeartbeatReply,
                                  mfb::CreateHeartbeatReply(fbb, known).Union()));
      break;
    case mfb::Body::ListKeys: {
      std::vector<flatbuffers::Offset<mfb::ListedKey>> keys = {
          mfb::CreateListedKey(fbb, fbb.CreateString("listed"), 3, fbb.CreateString("sess"))};
      fbb.Finish(mfb::CreateReply(
          fbb, r.request_id(), 0, 0, mfb::ReplyBody::ListKeysReply,
          mfb::CreateListKeysReply(fbb, fbb.CreateVector(keys), 0, false).Union()));
      break;
    }
    default:
      fbb.Finish(mfb::CreateReply(fbb, r.request_id(), 0, 0, mfb::ReplyBody::KeyCodesReply,
                                  mfb::CreateKeyCodesReply(fbb).Union()));
      break;
  }
  return Finish(fbb);
}

// A kvmaster stand-in on tcp://127.0.0.1:<OS-picked port>, a ZMQ ROUTER or (`framed`) the framed
// transport (protocol.md "Framed RPC"). `script` may answer a request itself (return bytes),
// withhold the answer (return an empty vector) or leave it to the default (nullopt). Every
// request it received is kept.
class ScriptedMaster {
 public:
  using Script = std::function<std::optional<Bytes>(const mfb::Request&)>;

  explicit ScriptedMaster(uint64_t master_epoch = 1000, bool framed = false)
      : master_epoch_(master_epoch) {
    std::promise<std::string> bound;
    auto endpoint = bound.get_future();
    thread_ = std::thread([this, &bound, framed] { framed ? RunFramed(&bound) : Run(&bound); });
    endpoint_ = endpoint.get();
  }
  ~ScriptedMaster() {
    stop_.store(true);
    thread_.join();
  }

  const std::string& endpoint() const { return endpoint_; }
  void SetScript(Script s) {
    std::lock_guard<std::mutex> lock(mu_);
    script_ = std::move(s);
  }
  void SetKnown(bool known) { known_.store(known); }
  // After each answer to a caller's request (not registration, mount or heartbeat), sends the
  // answer before it once more: a duplicated, late reply to a call that was already answered.
  void SetRepeatPrevious(bool repeat) { repeat_previous_.store(repeat); }
  // How many requests of `type` arrived so far.
  int Count(mfb::Body type) const {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const Bytes& b : received_)
      n += flatbuffers::GetRoot<mfb::Request>(b.data())->body_type() == type;
    return n;
  }
  // The last request of `type` (empty when none arrived).
  Bytes Last(mfb::Body type) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = received_.rbegin(); it != received_.rend(); ++it) {
      if (flatbuffers::GetRoot<mfb::Request>(it->data())->body_type() == type) return *it;
    }
    return {};
  }

 private:
  void Run(std::promise<std::string>* bound) {
    zmq::context_t context(1);
    zmq::socket_t router(context, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    router.bind("tcp://127.0.0.1:*");
    bound->set_value(router.get(zmq::sockopt::last_endpoint));
    while (!stop_.load()) {
      zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, 20ms);
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      while (true) {
        zmq::message_t m;
        if (!router.recv(m, zmq::recv_flags::dontwait)) break;
        const bool more = m.more();
        frames.push_back(std::move(m));
        if (!more) break;
      }
      if (frames.size() != 3) continue;
      const std::optional<Bytes> reply =
          Answer(Bytes(frames[2].data<uint8_t>(), frames[2].data<uint8_t>() + frames[2].size()));
      if (!reply || reply->empty()) continue;  // withheld
      for (const Bytes* r : {&*reply, static_cast<const Bytes*>(&repeat_)}) {
        if (r->empty()) continue;
        router.send(frames[0], zmq::send_flags::sndmore);
        router.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
        router.send(zmq::buffer(r->data(), r->size()), zmq::send_flags::none);
      }
    }
  }

  // The reply to `request` (empty: withheld; nullopt: not a request).
  std::optional<Bytes> Answer(const Bytes& request) {
    flatbuffers::Verifier verifier(request.data(), request.size());
    if (!verifier.VerifyBuffer<mfb::Request>(nullptr)) {
      ADD_FAILURE() << "the link sent a request that fails verification";
      return std::nullopt;
    }
    const mfb::Request* r = flatbuffers::GetRoot<mfb::Request>(request.data());
    std::optional<Bytes> reply;
    {
      std::lock_guard<std::mutex> lock(mu_);
      received_.push_back(request);
      if (script_) reply = script_(*r);
    }
    if (!reply) reply = DefaultReply(*r, master_epoch_, known_.load());
    repeat_.clear();
    const mfb::Body type = r->body_type();
    if (repeat_previous_.load() && !reply->empty() && type != mfb::Body::RegisterAgent &&
        type != mfb::Body::MountPool && type != mfb::Body::Heartbeat) {
      repeat_ = previous_;  // sent after `reply`
      previous_ = *reply;
    }
    return reply;
  }

  // The framed transport: every connection the link makes (a new one after it dropped the
  // last), frames answered in order.
  void RunFramed(std::promise<std::string>* bound) {
    std::string endpoint;
    auto listener = ListenTcp("tcp://127.0.0.1:0", &endpoint);
    if (!listener.ok()) {
      ADD_FAILURE() << listener.status().ToString();
      bound->set_value("");
      return;
    }
    bound->set_value(endpoint);
    struct Connection {
      UniqueFd fd;
      FrameReader in{size_t{64} << 20, /*hello=*/true};
      Bytes out{kFrameHello.begin(), kFrameHello.end()};
      bool closed = false;
    };
    std::vector<std::unique_ptr<Connection>> connections;
    while (!stop_.load()) {
      std::vector<pollfd> fds = {{listener->get(), POLLIN, 0}};
      for (const auto& c : connections) {
        const short events = static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT));
        fds.push_back({c->fd.get(), events, 0});
      }
      ::poll(fds.data(), fds.size(), 20);
      for (size_t i = 0; i < connections.size(); ++i) {
        Connection& c = *connections[i];
        if ((fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
          std::span<uint8_t> space = c.in.Space(65536);
          const ssize_t n = ::read(c.fd.get(), space.data(), space.size());
          if (n <= 0) {
            c.closed = n == 0 || errno != EAGAIN;
            continue;
          }
          c.in.Commit(static_cast<size_t>(n));
          while (true) {
            auto frame = c.in.Next();
            if (!frame.ok()) {
              ADD_FAILURE() << "the link's stream: " << frame.status().ToString();
              c.closed = true;
              break;
            }
            if (!frame->has_value()) break;
            const std::optional<Bytes> reply = Answer(Bytes((*frame)->begin(), (*frame)->end()));
            if (reply && !reply->empty()) AppendFrame(&c.out, *reply);
            if (reply && !repeat_.empty()) AppendFrame(&c.out, repeat_);
          }
          c.in.Compact();
        }
        while (!c.out.empty() && !c.closed) {
          const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL);
          if (n <= 0) break;
          c.out.erase(c.out.begin(), c.out.begin() + n);
        }
      }
      std::erase_if(connections, [](const auto& c) { return c->closed; });
      if ((fds[0].revents & POLLIN) != 0) {
        UniqueFd fd = AcceptTcp(listener->get());
        if (fd.valid()) {
          auto c = std::make_unique<Connection>();
          c->fd = std::move(fd);
          connections.push_back(std::move(c));
        }
      }
    }
  }

  const uint64_t master_epoch_;
  std::atomic<bool> known_{true};
  std::atomic<bool> repeat_previous_{false};
  Bytes previous_, repeat_;  // the master's thread's
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  Script script_;
  std::vector<Bytes> received_;
  std::string endpoint_;
  std::thread thread_;
};

// The agent's service thread as the link sees it: tasks posted to it run when the test says.
class ServiceThread {
 public:
  agent::PostFn Post() {
    return [this](std::function<void()> task) {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
      cv_.notify_all();
    };
  }
  // As the agent's service thread does while its calls are out: takes its replies from the
  // link's framed connection itself (RemoteMaster::TakeReplies) between the posted tasks.
  void TakeRepliesFrom(RemoteMaster* link) { take_from_ = link; }
  // Runs posted tasks (and takes replies) until `done` holds; false after 20 s. Then stops
  // taking replies, as the agent's service thread does before it sleeps.
  bool RunUntil(const std::function<bool()>& done) {
    const bool met = Run(done);
    if (take_from_ != nullptr) take_from_->StopTakingReplies();
    return met;
  }
  // TakeReplies calls that ran a callback.
  int taken() const { return taken_; }

 private:
  bool Run(const std::function<bool()>& done) {
    const auto limit = std::chrono::steady_clock::now() + 20s;
    while (!done()) {
      if (take_from_ != nullptr && take_from_->TakeReplies()) {
        ++taken_;
        continue;
      }
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        const auto until =
            take_from_ == nullptr ? limit : std::min(limit, std::chrono::steady_clock::now() + 1ms);
        if (!cv_.wait_until(lock, until, [&] { return !tasks_.empty(); })) {
          if (std::chrono::steady_clock::now() >= limit) return done();
          continue;
        }
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
    return true;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  RemoteMaster* take_from_ = nullptr;
  int taken_ = 0;
};

bool WaitFor(const std::function<bool()>& done) {
  for (int i = 0; i < 2000 && !done(); ++i) std::this_thread::sleep_for(10ms);
  return done();
}

uint64_t Stat(const RemoteMaster& link, const std::string& name) {
  std::vector<std::pair<std::string, uint64_t>> out;
  link.AppendStats(&out);
  for (const auto& [n, v] : out) {
    if (n == name) return v;
  }
  ADD_FAILURE() << "no link counter " << name;
  return 0;
}

flatbuffers::DetachedBuffer ExistRequest(uint64_t id, const std::string& key) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<flatbuffers::String>> keys = {fbb.CreateString(key)};
  fbb.Finish(mfb::CreateRequest(fbb, id, mfb::Body::BatchExist,
                                mfb::CreateBatchExist(fbb, fbb.CreateVector(keys)).Union()));
  return fbb.Release();
}

flatbuffers::DetachedBuffer EndRequest(uint64_t id, uint64_t write_id) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<flatbuffers::String>> keys = {fbb.CreateString("k")};
  std::vector<uint64_t> ids = {write_id};
  fbb.Finish(mfb::CreateRequest(
      fbb, id, mfb::Body::BatchPutEnd,
      mfb::CreateWriteFinish(fbb, 7, fbb.CreateVector(keys), fbb.CreateVector(ids)).Union()));
  return fbb.Release();
}

MasterTransport TransportOf(bool framed) {
  return framed ? MasterTransport::kFramed : MasterTransport::kZmq;
}

struct Link {
  std::unique_ptr<RemoteMaster> link;
  ServiceThread service;
  std::atomic<uint64_t> epoch{0};
  std::atomic<int> restarted{0};
  std::mutex fences_mu;
  std::vector<Fences> fences;

  explicit Link(const std::string& endpoint, std::chrono::milliseconds timeout = 5000ms,
                std::chrono::milliseconds heartbeat = 1000ms,
                MasterTransport transport = MasterTransport::kZmq) {
    RemoteMasterOptions o;
    o.endpoint = endpoint;
    o.transport = transport;
    o.agent_name = "node-a";
    o.incarnation = 42;
    o.pool_bytes = 1 << 20;
    o.data_endpoint = "tcp://127.0.0.1:1";
    o.timeout = timeout;
    o.heartbeat = heartbeat;
    o.backoff_min = 50ms;
    o.backoff_max = 200ms;
    o.set_master_epoch = [this](uint64_t e) { epoch.store(e); };
    o.on_master_restarted = [this] { restarted.fetch_add(1); };
    o.apply_fences = [this](const Fences& f) {
      std::lock_guard<std::mutex> lock(fences_mu);
      fences.push_back(f);
    };
    auto started = RemoteMaster::Start(std::move(o));
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    link = std::move(*started);
    link->Bind(service.Post());
    // On the framed transport the service thread reads replies too, racing the link thread.
    if (transport != MasterTransport::kZmq) service.TakeRepliesFrom(link.get());
  }
  ~Link() {
    if (link) link->Stop();  // before the members its callbacks use go
  }
};

// One Call's outcome, as the service thread sees it.
struct Outcome {
  bool done = false;
  Status status;
  uint64_t reply_id = 0;
  agent::MasterReplyFn Fn() {
    return [this](Result<std::span<const uint8_t>> r) {
      done = true;
      if (!r.ok()) {
        status = r.status();
        return;
      }
      reply_id = flatbuffers::GetRoot<mfb::Reply>(r->data())->request_id();
    };
  }
};

// `calls` BatchExist calls through `link`, `in_flight` at a time, each sent from the service
// thread as an earlier one is answered (call i asks for key "key-i"). A reply is counted wrong
// unless it is OK and `good` holds for it.
struct CallChain {
  int answered = 0;
  int wrong = 0;
  bool Run(
      Link& l, int calls, int in_flight,
      const std::function<bool(uint64_t id, const std::string& key, const mfb::Reply&)>& good) {
    int sent = 0;
    std::function<void()> send_one = [&] {
      const uint64_t id = static_cast<uint64_t>(++sent);
      const std::string key = "key-" + std::to_string(id);
      l.link->Call(ExistRequest(id, key), [&, id, key](Result<std::span<const uint8_t>> r) {
        ++answered;
        if (!r.ok() || !good(id, key, *flatbuffers::GetRoot<mfb::Reply>(r->data()))) ++wrong;
        if (sent < calls) send_one();
      });
    };
    for (int i = 0; i < in_flight; ++i) send_one();
    return l.service.RunUntil([&] { return answered == calls; });
  }
};

// The tests below run on each transport the link speaks: a ZMQ DEALER, and the framed one
// (MasterTransport::kFramed), where the service thread writes its calls itself.
using MasterLinkTransports = kvagent::testing::MasterTransports;
INSTANTIATE_TEST_SUITE_P(Transports, MasterLinkTransports, kvagent::testing::kMasterTransports,
                         kvagent::testing::MasterTransportName);

TEST_P(MasterLinkTransports, RegistersMountsThePoolAndBecomesReadyWithTheMastersIds) {
  ScriptedMaster master(555, framed());
  Link l(master.endpoint(), 5000ms, 1000ms, TransportOf(framed()));
  ASSERT_TRUE(l.link->WaitReady(20s)) << l.link->Describe();
  EXPECT_EQ(l.link->identity().agent_id, 7u);
  EXPECT_EQ(l.link->identity().pool_id, 9u);
  EXPECT_EQ(l.epoch.load(), 555u) << "the pool takes the master's epoch before it is mounted";
  const Bytes reg = master.Last(mfb::Body::RegisterAgent);
  ASSERT_FALSE(reg.empty());
  const auto* r = flatbuffers::GetRoot<mfb::Request>(reg.data())->body_as_RegisterAgent();
  EXPECT_EQ(r->name()->str(), "node-a");
  EXPECT_EQ(r->incarnation(), 42u);
  const Bytes mount = master.Last(mfb::Body::MountPool);
  const auto* m = flatbuffers::GetRoot<mfb::Request>(mount.data())->body_as_MountPool();
  EXPECT_EQ(m->agent_id(), 7u);
  EXPECT_EQ(m->size(), uint64_t{1} << 20);
  EXPECT_EQ(m->endpoints()->Get(0)->str(), "tcp://127.0.0.1:1");
  EXPECT_EQ(Stat(*l.link, "registrations"), 1u);
  EXPECT_EQ(l.restarted.load(), 0) << "the first registration is no restart";
}

TEST_P(MasterLinkTransports, ACallsReplyRunsOnTheServiceThreadWithItsRequestId) {
  ScriptedMaster master(1000, framed());
  Link l(master.endpoint(), 5000ms, 1000ms, TransportOf(framed()));
  ASSERT_TRUE(l.link->WaitReady(20s));
  Outcome out;
  l.link->Call(ExistRequest(12, "k"), out.Fn());
  ASSERT_TRUE(l.service.RunUntil([&] { return out.done; }));
  EXPECT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.reply_id, 12u);
}

// Many calls in flight, each sent from the service thread as an earlier one is answered: every
// reply is taken in when it arrives, none waits for its deadline. The link watches its DEALER
// through the socket's fd, which signals commands rather than messages; a reply whose command a
// send took in is seen only because the link drains the socket after each send (PollOnce). A
// reply left waiting would sit there until its 3 s deadline took the link down.
TEST_P(MasterLinkTransports, ManyCallsInFlightAreEachAnsweredWithoutWaitingForADeadline) {
  ScriptedMaster master(1000, framed());
  Link l(master.endpoint(), 3000ms, 600000ms, TransportOf(framed()));
  ASSERT_TRUE(l.link->WaitReady(20s));
  constexpr int kCalls = 20000;
  CallChain chain;
  ASSERT_TRUE(chain.Run(
      l, kCalls, 32,
      [](uint64_t id, const std::string&, const mfb::Reply& r) { return r.request_id() == id; }))
      << chain.answered << " of " << kCalls << " answered";
  EXPECT_EQ(chain.wrong, 0);
  EXPECT_EQ(Stat(*l.link, "timeouts"), 0u);
  EXPECT_EQ(Stat(*l.link, "link_downs"), 0u);
}

TEST_P(MasterLinkTransports, ACallWhileNoMasterIsReachableFailsAtOnce) {
  std::string endpoint;
  {
    ScriptedMaster gone(1000, framed());
    endpoint = gone.endpoint();
  }  // nobody listens there now
  Link l(endpoint, 5000ms, 1000ms, TransportOf(framed()));
  Outcome out;
  l.link->Call(ExistRequest(1, "k"), out.Fn());
  EXPECT_TRUE(out.done) << "failed inside Call, not after a timeout";
  EXPECT_EQ(out.status.code(), ErrorCode::kMasterUnavailable);
  EXPECT_NE(out.status.message().find("not reachable"), std::string::npos) << out.status.message();
}

// A request the master never answers takes the link down: it fails with MASTER_UNAVAILABLE,
// and the link reconnects and registers again by itself.
TEST_P(MasterLinkTransports, AnUnansweredRequestTakesTheLinkDownAndItComesBackByItself) {
  ScriptedMaster master(1000, framed());
  Link l(master.endpoint(), 300ms, 1000ms, TransportOf(framed()));
  ASSERT_TRUE(l.link->WaitReady(20s));
  master.SetScript([](const mfb::Request& r) -> std::optional<Bytes> {
    if (r.body_type() == mfb::Body::BatchExist) return Bytes{};  // never answered
    return std::nullopt;
  });
  Outcome out;
  l.link->Call(ExistRequest(3, "k"), out.Fn());
  ASSERT_TRUE(l.service.RunUntil([&] { return out.done; }));
  EXPECT_EQ(out.status.code(), ErrorCode::kMasterUnavailable);
  EXPECT_NE(out.status.message().find("did not answer"), std::string::npos) << out.status.message();
  EXPECT_TRUE(WaitFor([&] { return Stat(*l.link, "registrations") >= 2; }));
  EXPECT_TRUE(l.link->WaitReady(20s));
  EXPECT_GE(Stat(*l.link, "timeouts"), 1u);
  EXPECT_EQ(l.restarted.load(), 0) << "the same master epoch: no restart";
}

// An End whose link drops is kept and sent again after the next registration, so a commit the
// master made is answered rather than failed.
TEST_P(MasterLinkTransports, AnEndIsSentAgainAfterTheLinkCameBackAndItsAnswerArrives) {
  ScriptedMaster master(1000, framed());
  Link l(master.endpoint(), 300ms, 1000ms, TransportOf(framed()));
  ASSERT_TRUE(l.link->WaitReady(20s));
  std::atomic<int> ends{0};
  master.SetScript([&](const mfb::Request& r) -> std::optional<Bytes> {
    if (r.body_type() == mfb::Body::BatchPutEnd && ends.fetch_add(1) == 0) return Bytes{};
    return std::nullopt;
  });
  Outcome out;
  l.link->CallUntilAnswered(EndRequest(21, 77), out.Fn(), std::chrono::steady_clock::now() + 60s);
  ASSERT_TRUE(l.service.RunUntil([&] { return out.done; }));
  EXPECT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.reply_id, 21u);
  EXPECT_EQ(master.Count(mfb::Body::BatchPutEnd), 2);
  EXPECT_GE(Stat(*l.link, "registrations"), 2u);
  EXPECT_EQ(Stat(*l.link, "retried_calls"), 1u);
  const Bytes again = master.Last(mfb::Body::BatchPutEnd);
  EXPECT_EQ(
      flatbuffers::GetRoot<mfb::Request>(again.data())->body_as_BatchPutEnd()->write_ids()->Get(0),
      77u)
      << "the same write, sent again unchanged";
}

// An End that no master answers before its retry time fails with MASTER_UNAVAILABLE (the
// pipeline turns that into TIMEOUT, "may be stored").
TEST_P(MasterLinkTransports, AnEndNobodyAnswersBeforeItsRetryTimeFails) {
  ScriptedMaster master(1000, framed());
  Link l(master.endpoint(), 200ms, 1000ms, TransportOf(framed()));
  ASSERT_TRUE(l.link->WaitReady(20s));
  master.SetScript([](const mfb::Request& r) -> std::optional<Bytes> {
    if (r.body_type() == mfb::Body::BatchPutEnd) return Bytes{};
    return std::nullopt;
  });
  Outcome out;
  l.link->CallUntilAnswered(EndRequest(22, 78), out.Fn(), std::chrono::steady_clock::now() + 700ms);
  ASSERT_TRUE(l.service.RunUntil([&] { return out.done; }));
  EXPECT_EQ(out.status.code(), ErrorCode::kMasterUnavailable);
}

// known=false: the master dropped or forgot this agent; it registers and mounts again. A new
// master epoch at that registration tells the relay to re-announce.
TEST_P(MasterLinkTransports, AHeartbeatAnsweredUnknownRegistersAgain) {
  ScriptedMaster master(1000, framed());
  Link l(master.endpoint(), 5000ms, 50ms, TransportOf(framed()));
  ASSERT_TRUE(l.link->WaitReady(20s));
  master.SetKnown(false);
  EXPECT_TRUE(WaitFor([&] { return master.Count(mfb::Body::RegisterAgent) >= 2; }));
  master.SetKnown(true);
  EXPECT_TRUE(WaitFor([&] { return Stat(*l.link, "registrations") >= 2; }));
  EXPECT_EQ(l.restarted.load(), 0);
}

TEST_P(MasterLinkTransports, ANewMasterEpochAtReregistrationIsReportedAsARestart) {
  ScriptedMaster master(1000, framed());
  Link l(master.endpoint(), 5000ms, 50ms, TransportOf(framed()));
  ASSERT_TRUE(l.link->WaitReady(20s));
  std::atomic<bool> reborn{false};
  master.SetScript([&](const mfb::Request& r) -> std::optional<Bytes> {
    if (r.body_type() == mfb::Body::Heartbeat && !reborn.load()) {
      reborn.store(true);
      return DefaultReply(r, 2000, /*known=*/false);
    }
    if (r.body_type() == mfb::Body::RegisterAgent && reborn.load()) {
      return DefaultReply(r, 2000, true);
    }
    return std::nullopt;
  });
  EXPECT_TRUE(WaitFor([&] { return l.restarted.load() == 1; }));
  EXPECT_EQ(l.epoch.load(), 2000u);
}

// Fences of a heartbeat reply are applied, then acknowledged in the next heartbeat.
TEST_P(MasterLinkTransports, HeartbeatFencesAreAppliedAndAcknowledged) {
  ScriptedMaster master(1000, framed());
  Link l(master.endpoint(), 5000ms, 50ms, TransportOf(framed()));
  ASSERT_TRUE(l.link->WaitReady(20s));
  master.SetScript([](const mfb::Request& r) -> std::optional<Bytes> {
    if (r.body_type() != mfb::Body::Heartbeat) return std::nullopt;
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<uint64_t> fenced = {31, 33};
    fbb.Finish(mfb::CreateReply(
        fbb, r.request_id(), 0, 0, mfb::ReplyBody::HeartbeatReply,
        mfb::CreateHeartbeatReply(fbb, true, 4, 30, fbb.CreateVector(fenced)).Union()));
    return Finish(fbb);
  });
  ASSERT_TRUE(WaitFor([&] {
    const Bytes hb = master.Last(mfb::Body::Heartbeat);
    return !hb.empty() &&
           flatbuffers::GetRoot<mfb::Request>(hb.data())->body_as_Heartbeat()->fence_ack() == 4;
  }));
  std::lock_guard<std::mutex> lock(l.fences_mu);
  ASSERT_FALSE(l.fences.empty());
  EXPECT_EQ(l.fences[0].master_epoch, 1000u);
  EXPECT_EQ(l.fences[0].fence_seq, 4u);
  EXPECT_EQ(l.fences[0].write_watermark, 30u);
  EXPECT_EQ(l.fences[0].fenced_writes, (std::vector<uint64_t>{31, 33}));
  EXPECT_EQ(l.fences.size(), 1u) << "the same fences are applied once";
}

TEST_P(MasterLinkTransports, ListKeysReturnsThePageFromAnotherThread) {
  ScriptedMaster master(1000, framed());
  Link l(master.endpoint(), 5000ms, 1000ms, TransportOf(framed()));
  ASSERT_TRUE(l.link->WaitReady(20s));
  Result<KeyPage> page = Status(ErrorCode::kInternal, "not run");
  std::thread relay([&] { page = l.link->ListKeys(0, 100); });
  relay.join();
  ASSERT_TRUE(page.ok()) << page.status().ToString();
  ASSERT_EQ(page->keys.size(), 1u);
  EXPECT_EQ(page->keys[0].key, "listed");
  EXPECT_EQ(page->keys[0].session_id, "sess");
  EXPECT_EQ(page->next_cursor, 0u);
}

// ListKeys calls racing Stop (the event relay at agent shutdown) all return "shutting down" or
// their page; none is left for its 2 x timeout + 1 s guard (which held the agent's exit up to
// 11 s). The race is narrow; many rounds make it likely to be hit.
TEST(MasterLink, ListKeysRacingStopNeverWaitsForItsTimeout) {
  ScriptedMaster master;
  for (int round = 0; round < 30; ++round) {
    Link l(master.endpoint());
    ASSERT_TRUE(l.link->WaitReady(20s));
    std::atomic<bool> stopped{false};
    std::vector<Status> failures;
    std::thread relay([&] {
      while (true) {
        const bool after = stopped.load();
        Result<KeyPage> page = l.link->ListKeys(0, 10);
        if (!page.ok()) failures.push_back(page.status());
        if (after) return;
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(round % 5));
    l.link->Stop();
    stopped.store(true);
    relay.join();
    for (const Status& st : failures) {
      EXPECT_EQ(st.code(), ErrorCode::kMasterUnavailable);
      EXPECT_EQ(st.message().find("in time"), std::string::npos) << st.message();
    }
  }
}

// --master-transport auto: a registration reply's framed endpoint is a hint from outside. One
// that is no endpoint, names port 0, is oversized, or cannot be reached leaves the link on the
// ROUTER, ready, with every call answered; only the unreachable one counts as a fallback.
TEST(MasterLink, AnAutoLinkStaysOnZmqWhenTheFramedEndpointItIsToldCannotServe) {
  const std::string hints[] = {"not an endpoint", "tcp://127.0.0.1:0", "tcp://127.0.0.1:99999",
                               "tcp://127.0.0.1:" + std::string(4000, '7'),
                               "tcp://127.0.0.1:1"};  // nothing listens on port 1
  for (const std::string& hint : hints) {
    ScriptedMaster master(1000);
    master.SetScript([&](const mfb::Request& r) -> std::optional<Bytes> {
      if (r.body_type() != mfb::Body::RegisterAgent) return std::nullopt;
      flatbuffers::FlatBufferBuilder fbb;
      fbb.Finish(mfb::CreateReply(
          fbb, r.request_id(), 0, 0, mfb::ReplyBody::RegisterAgentReply,
          mfb::CreateRegisterAgentReplyDirect(fbb, 7, 1000, nullptr, nullptr, hint.c_str())
              .Union()));
      return Finish(fbb);
    });
    Link l(master.endpoint(), 5000ms, 1000ms, MasterTransport::kAuto);
    ASSERT_TRUE(l.link->WaitReady(20s)) << hint << ": " << l.link->Describe();
    Outcome out;
    l.link->Call(ExistRequest(12, "k"), out.Fn());
    ASSERT_TRUE(l.service.RunUntil([&] { return out.done; })) << hint;
    EXPECT_TRUE(out.status.ok()) << hint << ": " << out.status.ToString();
    EXPECT_EQ(Stat(*l.link, "framed"), 0u) << hint;
    EXPECT_EQ(Stat(*l.link, "framed_fallbacks"), hint == "tcp://127.0.0.1:1" ? 1u : 0u) << hint;
  }
}

// On the framed transport the service thread reads its calls' replies itself while it waits for
// them (RemoteMaster::TakeReplies), with no wake-up of the link thread: the callback runs inside
// TakeReplies, with its own request's reply. From the write of a call until the service thread
// stops taking (before it sleeps) the link thread leaves the connection's input alone, so every
// one of many calls, plain and CallUntilAnswered, is answered there, once.
TEST(MasterLink, OnTheFramedTransportTheServiceThreadTakesItsOwnReplies) {
  ScriptedMaster master(1000, /*framed=*/true);
  Link l(master.endpoint(), 5000ms, 600000ms, MasterTransport::kFramed);
  ASSERT_TRUE(l.link->WaitReady(20s));
  constexpr int kCalls = 2000;
  int answered = 0;
  int wrong = 0;
  for (int i = 1; i <= kCalls; ++i) {
    const uint64_t id = static_cast<uint64_t>(i);
    auto fn = [&, id](Result<std::span<const uint8_t>> r) {
      ++answered;
      if (!r.ok() || flatbuffers::GetRoot<mfb::Reply>(r->data())->request_id() != id) ++wrong;
    };
    if (i % 2 == 0) {
      l.link->CallUntilAnswered(ExistRequest(id, "k"), fn, std::chrono::steady_clock::now() + 60s);
    } else {
      l.link->Call(ExistRequest(id, "k"), fn);
    }
    ASSERT_TRUE(l.service.RunUntil([&] { return answered == i; })) << "call " << i;
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(l.service.taken(), kCalls) << "every reply taken by the service thread itself";
  EXPECT_EQ(Stat(*l.link, "replies_taken_by_service"), uint64_t{kCalls});
  EXPECT_EQ(Stat(*l.link, "in_flight"), 0u);
  EXPECT_EQ(Stat(*l.link, "link_downs"), 0u);
}

// A duplicated, late reply (each answer is followed by the one before it again) is never taken
// for another call: every call, on either transport and with the service thread taking replies
// on the framed one, gets its own answer, which names the call's own key.
TEST_P(MasterLinkTransports, ARepeatedLateReplyIsNeverTakenForAnotherCall) {
  ScriptedMaster master(1000, framed());
  Link l(master.endpoint(), 5000ms, 600000ms, TransportOf(framed()));
  ASSERT_TRUE(l.link->WaitReady(20s));
  master.SetScript([](const mfb::Request& r) -> std::optional<Bytes> {
    if (r.body_type() != mfb::Body::BatchExist) return std::nullopt;
    flatbuffers::FlatBufferBuilder fbb;
    const auto key = fbb.CreateString(r.body_as_BatchExist()->keys()->Get(0)->string_view());
    fbb.Finish(mfb::CreateReply(fbb, r.request_id(), 0, key, mfb::ReplyBody::KeyCodesReply,
                                mfb::CreateKeyCodesReply(fbb).Union()));
    return Finish(fbb);
  });
  master.SetRepeatPrevious(true);
  constexpr int kCalls = 2000;
  CallChain chain;  // 8 in flight: a repeat arrives while other calls wait for their answers
  ASSERT_TRUE(chain.Run(l, kCalls, 8,
                        [](uint64_t, const std::string& key, const mfb::Reply& r) {
                          return r.message() != nullptr && r.message()->str() == key;
                        }))
      << chain.answered << " of " << kCalls << " answered";
  // Let the last repeat arrive and be dropped too before the counts are read.
  Outcome last;
  l.link->Call(ExistRequest(kCalls + 1, "key-last"), last.Fn());
  ASSERT_TRUE(l.service.RunUntil([&] { return last.done; }));
  EXPECT_EQ(chain.answered, kCalls) << "no call answered twice";
  EXPECT_EQ(chain.wrong, 0);
  EXPECT_EQ(Stat(*l.link, "link_downs"), 0u);
}

// A reply the service thread reads that is not a plain answer (here: the master says it does not
// serve) is not taken as one: it goes to the link thread, which takes the link down; the call
// fails with the master's reason, and the link registers again by itself.
TEST(MasterLink, ANotServingReplyTheServiceThreadReadsTakesTheLinkDown) {
  ScriptedMaster master(1000, /*framed=*/true);
  Link l(master.endpoint(), 5000ms, 600000ms, MasterTransport::kFramed);
  ASSERT_TRUE(l.link->WaitReady(20s));
  std::atomic<bool> refuse{true};
  master.SetScript([&](const mfb::Request& r) -> std::optional<Bytes> {
    if (r.body_type() != mfb::Body::BatchExist || !refuse.load()) return std::nullopt;
    flatbuffers::FlatBufferBuilder fbb;
    const auto message = fbb.CreateString("lost its leadership");
    mfb::ReplyBuilder reply(fbb);
    reply.add_request_id(r.request_id());
    reply.add_status(static_cast<uint16_t>(ErrorCode::kMasterUnavailable));
    reply.add_message(message);
    reply.add_master_epoch(1000);
    reply.add_not_serving(true);
    fbb.Finish(reply.Finish());
    return Finish(fbb);
  });
  Outcome out;
  l.link->Call(ExistRequest(5, "k"), out.Fn());
  ASSERT_TRUE(l.service.RunUntil([&] { return out.done; }));
  EXPECT_EQ(out.status.code(), ErrorCode::kMasterUnavailable) << out.status.ToString();
  EXPECT_NE(out.status.message().find("does not serve"), std::string::npos) << out.status.message();
  EXPECT_TRUE(WaitFor([&] { return Stat(*l.link, "link_downs") == 1; }));
  refuse.store(false);
  ASSERT_TRUE(WaitFor([&] { return Stat(*l.link, "registrations") >= 2; }));
  ASSERT_TRUE(l.link->WaitReady(20s));
  Outcome again;
  l.link->Call(ExistRequest(6, "k"), again.Fn());
  ASSERT_TRUE(l.service.RunUntil([&] { return again.done; }));
  EXPECT_TRUE(again.status.ok()) << again.status.ToString();
}

TEST(MasterLink, StartRefusesAnEndpointThatIsNoKvmasterAddress) {
  RemoteMasterOptions o;
  o.endpoint = "10.0.0.1:50051";
  o.agent_name = "node-a";
  auto started = RemoteMaster::Start(std::move(o));
  ASSERT_FALSE(started.ok());
  EXPECT_EQ(started.status().code(), ErrorCode::kInvalidParams);
  EXPECT_NE(started.status().message().find("tcp://"), std::string::npos);
}

}  // namespace
}  // namespace kvagent::master_link
