// TransferEngine: the agent's data plane. It serves peers' reads and writes of this node's pool
// and moves byte ranges between local memory and peers' pools, over TCP always or over RDMA
// (rdma-core verbs, RC QPs, one-sided WRITE/READ) when the node has an RDMA device.
//
// Typical use by the agent (flags from TransferFlags, transfer_flags.h):
//
//   auto pool = NodePool::Create(*transfer_flags.PoolOptions());            // at start
//   auto engine = TransferEngine::Create(**pool, *transfer_flags.EngineOptions());
//   master.MountPool(pool->size(), (*engine)->endpoint());   // "tcp://10.0.0.2:41234"
//   (*engine)->RegisterMemory(arena_base, arena_size);           // once per client arena
//   (*engine)->Submit(ops, [queue](std::vector<Status> results) {
//     queue->Push(std::move(results));                           // back to the pipeline thread
//   });
//
// Copies: a WRITE's bytes leave straight from `local` (sendmsg with the caller's pointer) and a
// READ's bytes land straight in it; on the receiving side of either, only what arrives in the
// same read as the message header (at most 64 KiB per op) passes through a receive buffer.
//
// Threading: every public method is thread-safe. Completion callbacks run on the engine's own
// threads (never inside Submit), one callback per batch. A callback must return quickly and must
// not block on the engine (no TransferAndWait, no destruction of the engine from inside it): hand
// the results to your own thread. Same-node placements are not moved here: the pipeline memcpy's
// into its own pool (IsLocal tells which endpoints are this agent's).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/common/cluster_secret.h"
#include "kvagent/common/status.h"
#include "kvagent/transfer/endpoint.h"
#include "kvagent/transfer/node_pool.h"
#include "kvagent/transfer/pool_fence.h"

namespace kvagent::transfer {

// The endpoint of an engine that serves no peer (TransferEngineOptions::serve false).
inline constexpr std::string_view kLocalOnlyEndpoint = "local://no-data-server";

enum class TransferKind : uint8_t {
  kWrite = 1,  // local bytes -> peer's pool at remote_offset
  kRead = 2,   // peer's pool at remote_offset -> local bytes
};

// The CRC32C of a read's bytes as they came off the wire (TransferOp::received).
struct ReceivedChecksum {
  uint32_t crc = 0;
  bool taken = false;
};

// One range to move. The engine does not own `local`: the caller keeps [local, local + length)
// valid (and, for a read, unread by anyone else) until the batch's callback has run.
struct TransferOp {
  TransferKind kind = TransferKind::kWrite;
  std::string peer;            // the peer pool's endpoint as the master gave it
  uint64_t remote_offset = 0;  // offset in the peer's pool
  void* local = nullptr;       // inside memory given to RegisterMemory (or the node pool)
  uint64_t length = 0;         // bytes, at least 1
  // What the peer's fence checks (pool_fence.h); 0: not checked. The peer's pool incarnation
  // and the master epoch come with the placement; a write also names its write id.
  uint64_t pool_incarnation = 0;
  uint64_t master_epoch = 0;
  uint64_t write_id = 0;
  // A read may ask for the CRC32C of its bytes as they arrived, taken before they were written to
  // `local` (which its client may write too): the TCP transport copies them in from its own
  // buffer, checksumming on the way, and sets *received when the op succeeds. The RDMA transport
  // (the NIC writes `local` itself) leaves it untouched. Must stay valid until the callback ran.
  ReceivedChecksum* received = nullptr;
  // A write may give the CRC32C of its bytes: the TCP transport sends it with them, and the peer
  // fails the write with DATA_CORRUPTED when what arrived does not match (damaged on the way).
  // Over RDMA the NIC places the bytes itself and nothing checks them on arrival.
  std::optional<uint32_t> payload_crc = std::nullopt;
};

// Receives one Status per op, in the order of the submitted ops. OK: the bytes are in place (a
// write is acknowledged only after the peer has stored it in its pool). Errors:
//   TRANSFER_FAILED  the peer could not be reached, closed the connection, or broke protocol;
//                    the message names the peer, the op and the reason
//   TIMEOUT          the peer made no progress for `peer_timeout` while the op was outstanding
//   BUFFER_OUT_OF_RANGE  the remote range is outside the peer's pool (checked against the size
//                    the peer announced when connecting, and again by the peer)
//   INVALID_PARAMS   the op itself is malformed (zero length, null or unregistered local
//                    memory, unparsable endpoint); nothing was sent
using TransferCallback = std::function<void(std::vector<Status> results)>;

enum class TransportMode : uint8_t {
  kAuto,  // RDMA when ibv_get_device_list finds a device, else TCP (said once in the log)
  kTcp,   // TCP even when a device exists
  kRdma,  // RDMA or fail Create
};
std::string_view TransportModeName(TransportMode mode);  // "auto", "tcp", "rdma"
// "auto" / "tcp" / "rdma" -> mode; INVALID_PARAMS otherwise.
[[nodiscard]] Result<TransportMode> ParseTransportMode(std::string_view text);

struct TransferEngineOptions {
  // --data-listen: where this agent's data server listens, "host:port" (port 0: OS-picked).
  std::string listen_address = "0.0.0.0:0";
  // --data-advertise-host: the host peers use to reach this agent. Empty: the listen host when
  // it is specific; for a wildcard listen, the first non-loopback IPv4 address of an interface
  // that is up (127.0.0.1 when there is none, with a warning). With RDMA on a multi-homed node,
  // set it (or the listen host) to the RDMA interface's address (RoCE netdev or IPoIB): rdma_cm
  // resolves peers by IP.
  std::string advertise_host;
  TransportMode transport = TransportMode::kAuto;  // --data-transport
  // --data-peer-timeout-ms: an outstanding op fails with TIMEOUT when its peer moves no bytes
  // (connect, send, receive or completion) for this long (the request pipeline then reports
  // the key's TRANSFER_FAILED, naming the timeout). Large transfers that keep moving never
  // time out.
  std::chrono::milliseconds peer_timeout{5000};
  // Which peers' ops the data server accepts for this pool (must outlive the engine); null:
  // every op inside the pool (tools and tests of the data plane alone).
  const PoolFence* fence = nullptr;
  // The data-plane key of the cluster secret (ClusterSecret::MacKey(KeyPlane::kDataPlaneMac)):
  // with one, the server serves and the client talks only to peers that prove they hold it
  // (wire protocol: tcp_wire.h); without, neither side authenticates (loopback or a trusted
  // network only).
  std::optional<SymmetricKey> data_plane_key;
  // false: no data server at all (a standalone agent: no peer ever reads or writes its pool,
  // so no port offers it); endpoint() is then kLocalOnlyEndpoint. Ops to peers still work.
  bool serve = true;
};

// Counters since Create; cheap to read from any thread.
struct TransferStats {
  uint64_t ops_ok = 0;
  uint64_t ops_failed = 0;  // every non-OK result, timeouts included
  uint64_t ops_timed_out = 0;
  uint64_t bytes_written = 0;  // payload bytes of successful writes to peers
  uint64_t bytes_read = 0;     // payload bytes of successful reads from peers
  uint64_t connections_opened = 0;
  uint64_t served_writes = 0;               // peers' writes stored into our pool
  uint64_t served_reads = 0;                // peers' reads answered from our pool
  uint64_t served_rejected = 0;             // peers' requests refused (range, or the fence)
  uint64_t served_fenced = 0;               // of those, refused by the fence
  uint64_t served_corrupted = 0;            // of those, writes whose bytes failed their CRC
  uint64_t served_unauthenticated = 0;      // connections closed for no proof of membership
  uint64_t served_shed_connections = 0;     // connections closed at once (too many, no fds)
  uint64_t served_dropped_connections = 0;  // peers disconnected for sending garbage
};

class TransferEngine {
 public:
  // Starts the data server on options.listen_address, probes RDMA devices (kAuto/kRdma) and,
  // with RDMA, registers `pool` with every device. `pool` must outlive the engine. Errors:
  // INVALID_PARAMS for a bad address or mode; INTERNAL when the listen socket cannot be bound
  // (message names the address and errno) or, in kRdma mode, when no device exists or
  // registration fails (message includes the RLIMIT_MEMLOCK hint).
  [[nodiscard]] static Result<std::unique_ptr<TransferEngine>> Create(
      NodePool& pool, const TransferEngineOptions& options);

  // Stops serving, fails every op still outstanding with TRANSFER_FAILED ("engine shutting
  // down"), runs their callbacks on the engine thread, then joins the threads and closes sockets.
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // What this agent advertises to the master for its pool: "tcp://<host>:<port>", or
  // "rdma://<host>:<port>" when RDMA is active.
  const std::string& endpoint() const;
  Scheme scheme() const;

  // True when `endpoint` names this engine's own data server (bytes for it are a local memcpy).
  bool IsLocal(std::string_view endpoint) const;

  // Makes [addr, addr + length) usable as the local side of ops (with RDMA: one ibv_reg_mr per
  // device, so call it once per client arena at attach, never per request). The node pool is
  // registered by Create. Errors: INVALID_PARAMS for a null/empty range or one overlapping a
  // registered range; INTERNAL when the NIC refuses it (message includes the memlock hint).
  [[nodiscard]] Status RegisterMemory(void* addr, uint64_t length);
  // Forgets a range given to RegisterMemory (by its start address). The caller must have no op
  // in flight that uses it. INVALID_PARAMS when `addr` does not start a registered range.
  [[nodiscard]] Status UnregisterMemory(void* addr);

  // Starts every op of `ops` (concurrently; ops to one peer are pipelined on one connection) and
  // calls `done` exactly once, on an engine thread, with one Status per op. Never blocks on the
  // network. An empty batch completes at once (still on an engine thread).
  void Submit(std::vector<TransferOp> ops, TransferCallback done);

  // Submit, then block the calling thread until the batch completes. For tools and tests; never
  // call it from a completion callback.
  std::vector<Status> TransferAndWait(std::vector<TransferOp> ops);

  // After the fence changed (PoolFence::Apply / SetEpoch): the data server checks every WRITE
  // whose payload is still arriving again and discards the rest of a refused one; then `done`
  // runs on the engine thread. Once it ran, no byte of a fenced write reaches the pool.
  void Refence(std::function<void()> done);

  TransferStats stats() const;

  class Core;  // the implementation; private to the library

 private:
  explicit TransferEngine(std::unique_ptr<Core> core);
  std::unique_ptr<Core> core_;
};

}  // namespace kvagent::transfer
