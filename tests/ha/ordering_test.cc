// Epochs are ordered for agents that find their master through etcd: a master answering with an
// epoch older than the leader key's (a deposed leader that still runs) is refused — its
// registration is never taken, its replies never acted on — and the agent registers once the
// answers carry the current epoch. A scripted master (a ROUTER in this process) plays both.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include <zmq_addon.hpp>
#include "ha_support.h"
#include "kvagent/schemas/master_generated.h"

namespace kvagent::testing {
namespace {

namespace mfb = kvagent::master_proto;

// Answers an agent's link like a master of epoch `epoch` (changeable while it runs).
class ScriptedMaster {
 public:
  ScriptedMaster()
      : router_(context_, zmq::socket_type::router), pub_(context_, zmq::socket_type::pub) {
    router_.set(zmq::sockopt::linger, 0);
    router_.bind("tcp://127.0.0.1:0");
    pub_.set(zmq::sockopt::linger, 0);
    pub_.bind("tcp://127.0.0.1:0");
    rpc_ = router_.get(zmq::sockopt::last_endpoint);
    events_ = pub_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { Run(); });
  }
  ~ScriptedMaster() {
    stop_ = true;
    thread_.join();
  }
  void set_epoch(uint64_t e) { epoch_ = e; }
  const std::string& rpc() const { return rpc_; }
  const std::string& events() const { return events_; }
  int registrations() const { return registrations_.load(); }

 private:
  void Run() {
    zmq::pollitem_t items[] = {{router_.handle(), 0, ZMQ_POLLIN, 0}};
    while (!stop_) {
      zmq::poll(items, 1, std::chrono::milliseconds(20));
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(router_, std::back_inserter(frames), zmq::recv_flags::dontwait) ||
          frames.size() != 3) {
        continue;
      }
      const std::vector<uint8_t> bytes(
          static_cast<const uint8_t*>(frames[2].data()),
          static_cast<const uint8_t*>(frames[2].data()) + frames[2].size());
      flatbuffers::Verifier v(bytes.data(), bytes.size());
      if (!v.VerifyBuffer<mfb::Request>(nullptr)) continue;
      const auto* req = flatbuffers::GetRoot<mfb::Request>(bytes.data());
      flatbuffers::FlatBufferBuilder b;
      flatbuffers::Offset<void> body;
      mfb::ReplyBody type = mfb::ReplyBody::NONE;
      const uint64_t epoch = epoch_.load();
      switch (req->body_type()) {
        case mfb::Body::RegisterAgent:
          ++registrations_;
          type = mfb::ReplyBody::RegisterAgentReply;
          body = mfb::CreateRegisterAgentReply(b, 7, epoch).Union();
          break;
        case mfb::Body::MountPool:
          type = mfb::ReplyBody::MountPoolReply;
          body = mfb::CreateMountPoolReply(b, 9, 0).Union();
          break;
        case mfb::Body::Heartbeat:
          type = mfb::ReplyBody::HeartbeatReply;
          body = mfb::CreateHeartbeatReply(b, true, 0, 0).Union();
          break;
        case mfb::Body::ListKeys:
          type = mfb::ReplyBody::ListKeysReply;
          body = mfb::CreateListKeysReply(b).Union();
          break;
        default:
          break;
      }
      mfb::ReplyBuilder r(b);
      r.add_request_id(req->request_id());
      if (type != mfb::ReplyBody::NONE) {
        r.add_body_type(type);
        r.add_body(body);
      }
      r.add_master_epoch(epoch);
      b.Finish(r.Finish());
      router_.send(frames[0], zmq::send_flags::sndmore);
      router_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
      router_.send(zmq::const_buffer(b.GetBufferPointer(), b.GetSize()), zmq::send_flags::none);
    }
  }

  zmq::context_t context_{1};
  zmq::socket_t router_;
  zmq::socket_t pub_;
  std::string rpc_, events_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> registrations_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(EpochOrder, AnAgentRefusesAMasterOfAnOlderEpochThanTheLeaderKeys) {
  ASSERT_TRUE(access(kEtcdBinary, X_OK) == 0) << "etcd-server is not installed (make deps)";
  TempDir dir;
  EtcdProcess etcd(dir.path());
  ASSERT_TRUE(etcd.Start()) << "see " << etcd.log_path();
  ScriptedMaster master;
  auto client = coord::EtcdClient::Create({{etcd.endpoint()}, 2000ms});
  ASSERT_TRUE(client.ok());
  const coord::LeaderRecord record{"scripted", master.rpc(), master.events(), "", ""};
  auto created = (*client)->CreateIfAbsent(coord::ClusterKeys("ord").leader(), record.Encode(), 0);
  ASSERT_TRUE(created.ok() && created->created);
  const uint64_t epoch = static_cast<uint64_t>(created->create_revision);
  master.set_epoch(epoch - 1);  // a deposed leader's epoch

  NodeAgent agent(ClusterAgentArgs(etcd.ClusterUrl("ord")));
  ASSERT_TRUE(agent.started());
  auto c = ConnectClient(agent, 3000ms);
  ASSERT_TRUE(c);
  ASSERT_TRUE(WaitUntil([&] { return master.registrations() >= 2; }));  // it keeps trying
  const Reply refused = c->Stat();
  EXPECT_EQ(CounterOf(refused, "agent.master_link.ready"), 0u);
  EXPECT_GT(CounterOf(refused, "agent.master_link.stale_replies"), 0u);
  EXPECT_EQ(CounterOf(refused, "agent.master_link.epoch"), 0u);  // never registered with it

  master.set_epoch(epoch);  // the same endpoint now answers as the current leader
  ASSERT_TRUE(WaitUntil([&] { return CounterOf(c->Stat(), "agent.master_link.ready") == 1; }));
  EXPECT_EQ(CounterOf(c->Stat(), "agent.master_link.epoch"), epoch);

  // It answers with the old epoch again (a deposed leader woke up on that address): the agent
  // drops what it says and leaves it.
  const uint64_t stale = CounterOf(c->Stat(), "agent.master_link.stale_replies");
  master.set_epoch(epoch - 1);
  ASSERT_TRUE(WaitUntil([&] {
    return CounterOf(c->Stat(), "agent.master_link.stale_replies") > stale &&
           CounterOf(c->Stat(), "agent.master_link.ready") == 0;
  }));
  EXPECT_EQ(CounterOf(c->Stat(), "agent.master_link.epoch"), epoch);
}

}  // namespace
}  // namespace kvagent::testing
