// The acceptor's handshake messages: Hello -> Welcome (+ the segment's fd) -> Attached.
#include <unistd.h>

#include <glog/logging.h>

#include "acceptor.h"
#include "kvagent/common/format.h"
#include "kvagent/schemas/agent_generated.h"

namespace kvagent::agent {
namespace {

constexpr auto kSendTimeout = std::chrono::milliseconds(1000);

bool IsPowerOfTwo(uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

}  // namespace

void Acceptor::Refuse(Connection& conn, const Status& why) {
  LOG(WARNING) << "refused a client (" << DescribePeer(conn.peer) << "): " << why.ToString();
  flatbuffers::FlatBufferBuilder fbb;
  auto message = fbb.CreateString(why.message());
  proto::WelcomeBuilder b(fbb);
  b.add_status(static_cast<uint16_t>(why.code()));
  b.add_message(message);
  b.add_protocol_version(static_cast<uint32_t>(proto::ProtocolVersion::Current));
  fbb.Finish(b.Finish());
  (void)ipc::SendMessage(conn.fd.get(), {fbb.GetBufferPointer(), fbb.GetSize()}, kSendTimeout);
}

bool Acceptor::OnHello(Connection& conn, std::span<const uint8_t> message) {
  Result<HelloRequest> hello = ReadHello(message);
  if (!hello.ok()) {
    Refuse(conn, hello.status());
    return false;
  }
  const uint32_t ours = static_cast<uint32_t>(proto::ProtocolVersion::Current);
  if (hello->protocol_version != ours) {
    Refuse(conn, InvalidParams("the client speaks protocol version " +
                               std::to_string(hello->protocol_version) + " and this agent speaks " +
                               std::to_string(ours) + "; upgrade the older of the two"));
    return false;
  }
  if (!Allowed(conn.peer)) {
    Refuse(conn, Status(ErrorCode::kAgentUnavailable,
                        "uid " + std::to_string(conn.peer.uid) + " / gid " +
                            std::to_string(conn.peer.gid) +
                            " may not attach to this agent; start it with --allow-uid " +
                            std::to_string(conn.peer.uid) + " or --allow-gid " +
                            std::to_string(conn.peer.gid)));
    return false;
  }
  if (CountClients() >= static_cast<size_t>(config_.max_clients)) {
    Refuse(conn, Status(ErrorCode::kAgentUnavailable,
                        "the agent already serves " + std::to_string(config_.max_clients) +
                            " clients (--max-clients, at most " + std::to_string(kMaxClientsLimit) +
                            "); close a client or run another agent with its own --run-dir"));
    return false;
  }
  if (config_.max_clients_per_uid > 0 &&
      CountClients(conn.peer.uid) >= static_cast<size_t>(config_.max_clients_per_uid)) {
    Refuse(conn, Status(ErrorCode::kAgentUnavailable,
                        "uid " + std::to_string(conn.peer.uid) + " already has " +
                            std::to_string(config_.max_clients_per_uid) +
                            " clients attached (--max-clients-per-uid " +
                            std::to_string(config_.max_clients_per_uid) +
                            "); close one of them, or raise the cap"));
    return false;
  }
  const uint64_t ring = hello->ring_bytes == 0
                            ? config_.ring_bytes
                            : std::min(hello->ring_bytes, config_.max_ring_bytes);
  if (!IsPowerOfTwo(ring)) {
    Refuse(conn, InvalidParams("ring_bytes " + std::to_string(ring) +
                               " is not a power of two; ask for e.g. 1 MiB"));
    return false;
  }
  const uint64_t arena = std::min(hello->arena_bytes, config_.max_arena_bytes);
  auto layout = ipc::SegmentLayout::Compute(ring, ring, arena);
  if (!layout.ok()) {
    Refuse(conn, layout.status());
    return false;
  }
  const ClientId id = next_client_id_++;
  conn.client_name = std::move(hello->client_name);
  auto segment = ipc::Segment::Create(*layout, incarnation_, id);
  if (!segment.ok()) {
    Refuse(conn, segment.status());
    return false;
  }
  conn.client_id = id;
  Status memory_refused;
  if (hello->memory_probe_address != 0) {
    const Status may = ProcessMemory::MayGrant(conn.peer.uid, config_.process_memory_any_uid);
    Result<std::shared_ptr<ProcessMemory>> memory =
        may.ok() ? ProcessMemory::Grant(conn.peer.pid, hello->memory_probe_address,
                                        hello->memory_probe_value)
                 : Result<std::shared_ptr<ProcessMemory>>(may);
    if (memory.ok()) {
      conn.memory = std::move(*memory);
    } else {
      memory_refused = memory.status();
      LOG(INFO) << "client " << id << " (" << conn.client_name << ", " << DescribePeer(conn.peer)
                << ") asked for process memory; not granted: " << memory_refused.message();
    }
  }
  conn.segment = std::make_shared<ipc::Segment>(std::move(*segment));
  conn.phase = Phase::kAwaitAttached;
  fd_of_client_[id] = conn.fd.get();

  flatbuffers::FlatBufferBuilder fbb;
  flatbuffers::Offset<flatbuffers::String> refused_off;
  if (!memory_refused.ok()) refused_off = fbb.CreateString(memory_refused.message());
  proto::WelcomeBuilder b(fbb);
  b.add_status(static_cast<uint16_t>(ErrorCode::kOk));
  b.add_protocol_version(ours);
  b.add_client_id(id);
  b.add_agent_incarnation(incarnation_);
  b.add_segment_bytes(layout->total_bytes);
  b.add_arena_bytes(layout->arena_bytes);
  b.add_ring_bytes(ring);
  b.add_process_memory(conn.memory != nullptr);
  if (!refused_off.IsNull()) b.add_process_memory_message(refused_off);
  fbb.Finish(b.Finish());
  const Status sent = ipc::SendMessage(conn.fd.get(), {fbb.GetBufferPointer(), fbb.GetSize()},
                                       kSendTimeout, conn.segment->fd());
  // The client has its own descriptor now (or never will): the agent keeps only the mapping.
  conn.segment->CloseFd();
  return sent.ok();
}

bool Acceptor::OnAttached(Connection& conn, std::span<const uint8_t> message) {
  Result<AttachedRequest> attached = ReadAttached(message);
  if (!attached.ok() || attached->client_id != conn.client_id) return false;
  if (conn.memory != nullptr && attached->has_peer_scratch) {
    Status set =
        conn.memory->SetPeerScratch(attached->peer_scratch_offset, attached->peer_scratch_length,
                                    conn.segment->layout().arena_bytes);
    if (!set.ok()) {
      LOG(WARNING) << "client " << conn.client_id << ": " << set.message();
      return false;
    }
  }
  conn.phase = Phase::kLive;
  LOG(INFO) << "client " << conn.client_id << " (" << conn.client_name << ", "
            << DescribePeer(conn.peer) << ") attached: arena "
            << FormatBytes(conn.segment->layout().arena_bytes) << ", rings "
            << FormatBytes(conn.segment->layout().request_ring_bytes)
            << (conn.memory ? ", process memory" : "");
  service_->AddClient(std::make_unique<ClientConnection>(conn.client_id, conn.client_name,
                                                         conn.peer, std::move(conn.segment),
                                                         std::move(conn.memory)));
  return true;
}

}  // namespace kvagent::agent
