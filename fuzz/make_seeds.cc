// Writes the fuzzers' seed corpora: real messages built with the project's own encoders (and
// master replies produced by a real MasterService), one file per message, under DIR/<harness>/.
//
//   fuzz_make_seeds DIR
#include <flatbuffers/flatbuffers.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "kvagent/common/frame_cipher.h"
#include "kvagent/common/frame_stream.h"
#include "kvagent/events/kv_event.h"
#include "kvagent/master/master_rpc.h"
#include "kvagent/master/master_service.h"
#include "kvagent/master/oplog.h"
#include "kvagent/schemas/agent_generated.h"
#include "kvagent/schemas/master_generated.h"
#include "tcp_wire.h"

namespace {

namespace fs = std::filesystem;
namespace ap = kvagent::proto;
namespace mp = kvagent::master_proto;
using Bytes = std::vector<uint8_t>;

fs::path root;

void Write(const std::string& harness, const std::string& name, const Bytes& bytes) {
  fs::create_directories(root / harness);
  std::ofstream(root / harness / name, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

Bytes Take(flatbuffers::FlatBufferBuilder& b) {
  return Bytes(b.GetBufferPointer(), b.GetBufferPointer() + b.GetSize());
}

// ---- agent ring requests ------------------------------------------------------------------

Bytes AgentRequest(ap::Op op, int keys, bool sessions, bool blocks) {
  flatbuffers::FlatBufferBuilder b;
  std::vector<std::string> k, s;
  std::vector<ap::BufferRef> buffers;
  for (int i = 0; i < keys; ++i) {
    k.push_back("key-" + std::to_string(i));
    s.push_back("session-" + std::to_string(i % 2));
    buffers.emplace_back(uint64_t(i) * 4096, 4096);
  }
  auto kv = keys ? b.CreateVectorOfStrings(k).o : 0;
  auto sv = sessions ? b.CreateVectorOfStrings(s).o : 0;
  auto bv = (op == ap::Op::Put || op == ap::Op::Upsert || op == ap::Op::Get) && keys
                ? b.CreateVectorOfStructs(buffers).o
                : 0;
  flatbuffers::uoffset_t blv = 0;
  if (blocks) {
    std::vector<flatbuffers::Offset<ap::BlockMeta>> metas;
    for (int i = 0; i < keys; ++i) {
      const kvagent::block_proto::BlockHash h(1000 + i, i % 2 == 0);
      const kvagent::block_proto::BlockHash parent(999, false);
      const std::vector<uint32_t> tokens(4, 7);
      metas.push_back(ap::CreateBlockMeta(b, b.CreateVectorOfStructs(&h, 1), &parent,
                                          b.CreateVector(tokens), 4, b.CreateString("lora")));
    }
    blv = b.CreateVector(metas).o;
  }
  auto prefix = op == ap::Op::List ? b.CreateString("key-").o : 0;
  ap::RequestBuilder r(b);
  r.add_request_id(42);
  r.add_op(op);
  if (kv)
    r.add_keys(
        flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>>(kv));
  if (sv)
    r.add_session_ids(
        flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>>(sv));
  if (bv) r.add_buffers(flatbuffers::Offset<flatbuffers::Vector<const ap::BufferRef*>>(bv));
  if (blv)
    r.add_blocks(flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<ap::BlockMeta>>>(blv));
  if (prefix) r.add_prefix(flatbuffers::Offset<flatbuffers::String>(prefix));
  r.add_options(ap::CreateWriteOptions(b, 2, true, 1000, false));
  r.add_limit(100);
  r.add_timeout_ms(1000);
  b.Finish(r.Finish());
  return Take(b);
}

void AgentRequests() {
  Write("fuzz_agent_request", "ping", AgentRequest(ap::Op::Ping, 0, false, false));
  Write("fuzz_agent_request", "put", AgentRequest(ap::Op::Put, 3, true, true));
  Write("fuzz_agent_request", "upsert", AgentRequest(ap::Op::Upsert, 2, false, false));
  Write("fuzz_agent_request", "get", AgentRequest(ap::Op::Get, 3, false, false));
  Write("fuzz_agent_request", "exist", AgentRequest(ap::Op::Exist, 2, false, false));
  Write("fuzz_agent_request", "remove", AgentRequest(ap::Op::Remove, 2, false, false));
  Write("fuzz_agent_request", "remove_all", AgentRequest(ap::Op::RemoveAll, 0, false, false));
  Write("fuzz_agent_request", "list", AgentRequest(ap::Op::List, 0, false, false));
  Write("fuzz_agent_request", "stat", AgentRequest(ap::Op::Stat, 0, false, false));
}

// ---- master requests and the replies a real master gives -----------------------------------

Bytes MasterRequest(
    mp::Body type,
    const std::function<flatbuffers::Offset<void>(flatbuffers::FlatBufferBuilder&)>& body) {
  flatbuffers::FlatBufferBuilder b;
  b.Finish(mp::CreateRequest(b, 7, type, body(b)));
  return Take(b);
}

void MasterMessages() {
  using B = flatbuffers::FlatBufferBuilder;
  // A real master with one agent: the requests name it, and its replies become the reply seeds.
  kvagent::master::ManualClock clock;
  kvagent::master::MasterOptions options;
  options.replication_log_bytes = 1 << 20;
  auto service = std::move(kvagent::master::MasterService::Open(options, &clock).value());
  const uint32_t agent = service->RegisterAgent("node-a", 1).value();
  const std::vector<std::string_view> eps = {"tcp://127.0.0.1:7000"};
  (void)service->MountPool(agent, 0, 64 << 20, eps);
  kvagent::master::MasterRpc rpc(service.get());
  const std::vector<std::string> keys = {"obj-a", "obj-b"};
  std::vector<std::pair<std::string, Bytes>> requests;
  requests.emplace_back("register", MasterRequest(mp::Body::RegisterAgent, [](B& b) {
                          return mp::CreateRegisterAgentDirect(b, "node-a", 1).Union();
                        }));
  requests.emplace_back(
      "mount", MasterRequest(mp::Body::MountPool, [&](B& b) {
        const std::vector<std::string> eps = {"tcp://127.0.0.1:7000"};
        return mp::CreateMountPool(b, agent, 0, 64 << 20, b.CreateVectorOfStrings(eps)).Union();
      }));
  requests.emplace_back("heartbeat", MasterRequest(mp::Body::Heartbeat, [&](B& b) {
                          return mp::CreateHeartbeat(b, agent, 0).Union();
                        }));
  requests.emplace_back(
      "put_start", MasterRequest(mp::Body::BatchPutStart, [&](B& b) {
        const std::vector<uint64_t> sizes = {100, 3 << 20};
        const std::vector<std::string> sessions = {"s1", ""};
        const kvagent::block_proto::BlockHash h(77, false);
        const std::vector<uint32_t> tokens(2, 5);
        std::vector<flatbuffers::Offset<mp::BlockMeta>> metas = {
            mp::CreateBlockMeta(b, b.CreateVectorOfStructs(&h, 1), 0, b.CreateVector(tokens), 2),
            mp::CreateBlockMeta(b)};
        return mp::CreateWriteStart(b, agent, b.CreateVectorOfStrings(keys), b.CreateVector(sizes),
                                    b.CreateVectorOfStrings(sessions), b.CreateVector(metas),
                                    mp::CreateWriteOptions(b, 2))
            .Union();
      }));
  requests.emplace_back("put_end", MasterRequest(mp::Body::BatchPutEnd, [&](B& b) {
                          const std::vector<uint64_t> ids = {1, 2};
                          const std::vector<uint32_t> counts = {1, 1};
                          const std::vector<uint32_t> sums = {0xdeadbeef, 0x12345678};
                          const mp::FailedReplica failed(1, 0, 3);
                          return mp::CreateWriteFinish(b, agent, b.CreateVectorOfStrings(keys),
                                                       b.CreateVector(ids), b.CreateVector(counts),
                                                       b.CreateVector(sums),
                                                       b.CreateVectorOfStructs(&failed, 1))
                              .Union();
                        }));
  requests.emplace_back("get", MasterRequest(mp::Body::BatchGet, [&](B& b) {
                          return mp::CreateBatchGet(b, b.CreateVectorOfStrings(keys)).Union();
                        }));
  requests.emplace_back("exist", MasterRequest(mp::Body::BatchExist, [&](B& b) {
                          return mp::CreateBatchExist(b, b.CreateVectorOfStrings(keys)).Union();
                        }));
  requests.emplace_back("list", MasterRequest(mp::Body::ListKeys, [](B& b) {
                          return mp::CreateListKeys(b, 0, 100, b.CreateString("obj")).Union();
                        }));
  requests.emplace_back(
      "stats", MasterRequest(mp::Body::Stats, [](B& b) { return mp::CreateStats(b).Union(); }));
  requests.emplace_back("replicate", MasterRequest(mp::Body::Replicate, [](B& b) {
                          return mp::CreateReplicate(b, 0, 0, 65536).Union();
                        }));
  requests.emplace_back("bad_replicas", MasterRequest(mp::Body::ReportBadReplicas, [&](B& b) {
                          const std::vector<uint64_t> versions = {1};
                          const std::vector<uint32_t> parts = {0}, pools = {1};
                          const std::vector<std::string> one = {"obj-a"};
                          return mp::CreateReportBadReplicas(b, agent, b.CreateVectorOfStrings(one),
                                                             b.CreateVector(versions),
                                                             b.CreateVector(parts),
                                                             b.CreateVector(pools))
                              .Union();
                        }));
  requests.emplace_back(
      "reserve", MasterRequest(mp::Body::ReserveWrites, [&](B& b) {
        const std::vector<uint64_t> returned = {3};
        return mp::CreateReserveWrites(b, agent, 4096, 2, 4, b.CreateVector(returned)).Union();
      }));
  requests.emplace_back("commit", MasterRequest(mp::Body::BatchPutCommit, [&](B& b) {
                          const std::vector<uint64_t> sizes = {4096, 4096};
                          const auto start = mp::CreateWriteStart(
                              b, agent, b.CreateVectorOfStrings(keys), b.CreateVector(sizes), 0, 0,
                              mp::CreateWriteOptions(b, 2));
                          const std::vector<uint64_t> ids = {5, 6};
                          const auto finish =
                              mp::CreateWriteFinish(b, agent, 0, b.CreateVector(ids));
                          return mp::CreateWriteCommit(b, start, finish, 1).Union();
                        }));
  requests.emplace_back(
      "remove", MasterRequest(mp::Body::BatchRemove, [&](B& b) {
        return mp::CreateBatchRemove(b, b.CreateVectorOfStrings(keys), true).Union();
      }));
  requests.emplace_back("remove_all", MasterRequest(mp::Body::RemoveAll, [](B& b) {
                          return mp::CreateRemoveAll(b, false).Union();
                        }));
  for (const auto& [name, bytes] : requests) Write("fuzz_master_request", name, bytes);

  // The replies of that master to those requests.
  for (const auto& [name, request] : requests) {
    const auto reply = rpc.Handle(request);
    Bytes seed = {static_cast<uint8_t>(keys.size())};  // the key count the reader expects
    seed.insert(seed.end(), reply.begin(), reply.end());
    Write("fuzz_master_reply", name, seed);
  }
}

// ---- handshake ----------------------------------------------------------------------------

Bytes Framed(const Bytes& message) {
  Bytes out(4);
  const uint32_t n = static_cast<uint32_t>(message.size());
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), message.begin(), message.end());
  return out;
}

void Handshake() {
  flatbuffers::FlatBufferBuilder hello;
  hello.Finish(ap::CreateHello(hello, static_cast<uint32_t>(ap::ProtocolVersion::Current),
                               hello.CreateString("engine:1234"), 64 << 20, 1 << 20));
  flatbuffers::FlatBufferBuilder attached;
  attached.Finish(ap::CreateAttached(attached, 1));
  Bytes both = Framed(Take(hello));
  const Bytes second = Framed(Take(attached));
  Write("fuzz_handshake", "hello", both);
  both.insert(both.end(), second.begin(), second.end());
  Write("fuzz_handshake", "hello_attached", both);
}

// ---- data-plane headers -------------------------------------------------------------------

void DataHeaders() {
  namespace wire = kvagent::transfer::wire;
  Bytes hello(wire::kHelloBytes), request(wire::kRequestBytes), reply(wire::kReplyBytes);
  wire::Hello h;
  h.flags = wire::kHelloAuthRequired;
  h.pool_size = 1 << 30;
  h.pool_incarnation = 77;
  h.nonce.fill(0x5a);
  wire::EncodeHello(h, hello.data());
  wire::EncodeRequest(wire::Request{wire::Opcode::kWrite, 9, 4096, 65536, 77, 5, 11},
                      request.data());
  wire::EncodeReply(wire::Reply{0, 9, 0}, reply.data());
  Write("fuzz_data_header", "hello", hello);
  Write("fuzz_data_header", "write", request);
  Bytes read(wire::kRequestBytes);
  wire::EncodeRequest(wire::Request{wire::Opcode::kRead, 10, 0, 4096, 77, 5, 0}, read.data());
  Write("fuzz_data_header", "read", read);
  Bytes checked(wire::kRequestBytes);
  wire::EncodeRequest(
      wire::Request{wire::Opcode::kWrite, 12, 8192, 4096, 77, 5, 13, true, 0x12345678},
      checked.data());
  Write("fuzz_data_header", "write_with_crc", checked);
  Write("fuzz_data_header", "reply", reply);
  wire::Auth auth;
  auth.nonce.fill(1);
  auth.proof.fill(2);
  Bytes auth_bytes(wire::kAuthBytes), ok_bytes(wire::kAuthOkBytes);
  wire::EncodeAuth(auth, auth_bytes.data());
  wire::EncodeAuthOk(auth.proof, ok_bytes.data());
  Write("fuzz_data_header", "auth", auth_bytes);
  Write("fuzz_data_header", "auth_ok", ok_bytes);
}

// ---- events -------------------------------------------------------------------------------

void Events() {
  using namespace kvagent::events;
  BlockStored stored;
  stored.block_hashes = {BlockHash::Unsigned(1), BlockHash::Signed(-2)};
  stored.parent_block_hash = BlockHash::Unsigned(9);
  stored.token_ids = {1, 2, 3, 4};
  stored.block_size = 2;
  stored.lora_name = "adapter";
  stored.session_id = "session-1";
  stored.object_key = "obj-a";
  BlockRemoved removed;
  removed.block_hashes = {BlockHash::Unsigned(1)};
  removed.object_key = "obj-a";
  EventBatchBuilder builder;
  builder.Add(stored);
  builder.Add(removed);
  builder.Add(AllBlocksCleared{});
  std::string payload;
  builder.Finish(1700000000.5, 0, &payload);
  Write("fuzz_event_decode", "three_events", Bytes(payload.begin(), payload.end()));
  EventBatchBuilder one;
  one.Add(AllBlocksCleared{});
  one.Finish(1.0, std::nullopt, &payload);
  Write("fuzz_event_decode", "cleared_no_rank", Bytes(payload.begin(), payload.end()));
}

// ---- the operation log ----------------------------------------------------------------------

// The records a real master logs (agents, pools, objects with two replicas of several parts,
// session tags, block metadata, a pin, a removal), as fuzz_master_restore reads them: a 2-byte
// little-endian length before each record, after one byte of options.
void Restore() {
  namespace km = kvagent::master;
  const fs::path dir = fs::temp_directory_path() / "fuzz_make_seeds.oplog";
  fs::remove_all(dir);
  {
    km::ManualClock clock;
    km::MasterOptions options;
    options.state_dir = dir.string();
    auto service = std::move(km::MasterService::Open(options, &clock).value());
    const std::vector<std::string_view> eps = {"tcp://127.0.0.1:7000"};
    std::vector<uint32_t> agents;
    for (const char* name : {"node-a", "node-b"}) {
      agents.push_back(service->RegisterAgent(name, 1, 0x5eed0000u + agents.size()).value());
      (void)service->MountPool(agents.back(), 0, 64 << 20, eps);
    }
    // An agent that restarted: its record names the incarnation it replaced.
    (void)service->RegisterAgent("node-c", 1, 0x5eedcccc);
    (void)service->RegisterAgent("node-c", 2, 0x5eedcccc);
    const std::vector<std::string_view> keys = {"obj-a", "obj-b", "obj-c"};
    const std::vector<uint64_t> sizes = {100, 5 << 20, 4096};
    const std::vector<std::string_view> sessions = {"s1", "", "s2"};
    const kvagent::events::BlockHash hash = kvagent::events::BlockHash::Unsigned(77);
    const std::vector<uint32_t> tokens(2, 5);
    km::BlockMetaView meta;
    meta.block_hashes = {&hash, 1};
    meta.token_ids = tokens;
    meta.block_size = 2;
    meta.lora_name = "adapter";
    const std::vector<km::BlockMetaView> blocks = {meta, {}, {}};
    km::WriteStartRequest start;
    start.agent = agents[0];
    start.keys = keys;
    start.sizes = sizes;
    start.session_ids = sessions;
    start.blocks = blocks;
    start.options.replica_count = 2;
    start.options.soft_pin = true;
    km::PlacementBatch placed;
    km::KeyResults ended;
    (void)service->BatchPutStart(start, &placed);
    (void)service->BatchPutEnd(agents[0], keys, &ended);
    const std::vector<std::string_view> removed = {"obj-c"};
    (void)service->BatchRemove(removed, false, &ended);
    (void)service->Flush();
  }
  Bytes seed = {0};
  auto log = std::move(km::OpLog::Open(dir.string()).value());
  (void)log->Replay([&](std::string_view record) {
    if (record.size() > 0xFFFF) return kvagent::Status::Ok();  // the harness's lengths are 2 bytes
    seed.push_back(static_cast<uint8_t>(record.size() & 0xFF));
    seed.push_back(static_cast<uint8_t>(record.size() >> 8));
    seed.insert(seed.end(), record.begin(), record.end());
    return kvagent::Status::Ok();
  });
  log.reset();
  fs::remove_all(dir);
  Write("fuzz_master_restore", "two_agents_three_objects", seed);
}

// ---- framed RPC streams: [read size, hello flag] then what a client sends ---------------------

void FramedStreams() {
  const Bytes request =
      MasterRequest(mp::Body::RegisterAgent, [](flatbuffers::FlatBufferBuilder& b) {
        return mp::CreateRegisterAgentDirect(b, "node-a", 1).Union();
      });
  for (const auto& [name, cut, hello] :
       {std::tuple{"client_whole", 255, 1}, std::tuple{"client_bytewise", 0, 1},
        std::tuple{"no_hello_pieces", 3, 0}}) {
    Bytes seed = {static_cast<uint8_t>(cut), static_cast<uint8_t>(hello)};
    if (hello != 0)
      seed.insert(seed.end(), kvagent::kFrameHello.begin(), kvagent::kFrameHello.end());
    kvagent::AppendFrame(&seed, request);
    kvagent::AppendFrame(&seed, {});
    kvagent::AppendFrame(&seed, request);
    Write("fuzz_frame_stream", name, seed);
  }
  // fuzz_frame_cipher: a member's payloads (odd first byte: length-prefixed payloads, sealed by
  // the harness), and a hostile peer's stream (even: a real client's hello, then a frame sealed
  // under another key).
  Bytes member = {1};
  for (const Bytes& p : {request, Bytes{}, Bytes(200, 7)}) {
    member.push_back(static_cast<uint8_t>(std::min<size_t>(p.size(), 255)));
    member.insert(member.end(), p.begin(), p.begin() + std::min<size_t>(p.size(), 255));
  }
  Write("fuzz_frame_cipher", "member_payloads", member);
  const kvagent::SymmetricKey other = kvagent::FramedRpcKey(
      *kvagent::ClusterSecret::FromBytes("another cluster's secret, 32 bytes or more"));
  kvagent::FramedClientHandshake client(other);
  Bytes hostile = {0};
  const Bytes hello = client.Hello();
  hostile.insert(hostile.end(), hello.begin(), hello.end());
  kvagent::FrameSealer forged(other);
  forged.Append(&hostile, request);
  Write("fuzz_frame_cipher", "hostile_forged_frame", hostile);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds DIR\n");
    return 2;
  }
  root = argv[1];
  AgentRequests();
  MasterMessages();
  Handshake();
  DataHeaders();
  Events();
  Restore();
  FramedStreams();
  return 0;
}
