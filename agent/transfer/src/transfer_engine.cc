#include "kvagent/transfer/transfer_engine.h"

#include <glog/logging.h>
#include <netdb.h>

#include <cstring>
#include <future>
#include <utility>

#include "batch.h"
#include "event_loop.h"
#include "kvagent/transfer/rdma_probe.h"
#include "local_memory.h"
#include "rdma_transport.h"
#include "socket.h"
#include "tcp_client.h"
#include "tcp_server.h"

namespace kvagent::transfer {
namespace {

// The host peers should use: the configured one (a name is resolved once, here), else the
// listen host, else the first non-loopback IPv4 address.
Result<std::string> AdvertisedHost(const std::string& configured, const ListenAddress& listen) {
  if (!configured.empty()) {
    Result<SocketAddress> numeric = NumericAddress(configured, 0);
    if (numeric.ok()) return HostOf(*numeric);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(configured.c_str(), nullptr, &hints, &found);
    if (rc != 0 || found == nullptr) {
      return InvalidParams("--data-advertise-host '" + configured + "' does not resolve (" +
                           gai_strerror(rc) + "); give an IP address");
    }
    SocketAddress address;
    address.length = found->ai_addrlen;
    std::memcpy(&address.storage, found->ai_addr, found->ai_addrlen);
    freeaddrinfo(found);
    return HostOf(address);
  }
  if (!IsWildcardHost(listen.host)) return listen.host;
  std::string derived = FirstNonLoopbackIpv4();
  if (derived.empty()) {
    LOG(WARNING) << "data plane: no non-loopback IPv4 address is up; advertising 127.0.0.1, "
                    "which only same-node peers can reach (set --data-advertise-host)";
    return std::string("127.0.0.1");
  }
  return derived;
}

}  // namespace

class TransferEngine::Core {
 public:
  Core(NodePool& pool, const TransferEngineOptions& options) : pool_(pool), options_(options) {}

  ~Core() {
    if (loop_) {
      loop_->Post([this] {
        if (tcp_client_) tcp_client_->FailAll("transfer engine shutting down");
      });
      loop_->Stop();
    }
    rdma_.reset();
    tcp_client_.reset();
    tcp_server_.reset();
    loop_.reset();
  }

  Status Start() {
    Result<ListenAddress> listen = ParseListenAddress(options_.listen_address);
    if (!listen.ok()) return listen.status();
    Result<std::string> host = AdvertisedHost(options_.advertise_host, *listen);
    if (!host.ok()) return host.status();
    KVAGENT_RETURN_IF_ERROR(local_.Add(pool_.base(), pool_.size()));

    if (options_.transport != TransportMode::kTcp) {
      const RdmaProbe probe = ProbeRdmaDevices();
      if (!probe.found()) {
        if (options_.transport == TransportMode::kRdma) {
          return Internal("--data-transport=rdma but " + NoRdmaDeviceLine(probe).substr(6) +
                          "; use --data-transport=auto or tcp");
        }
        LOG(INFO) << NoRdmaDeviceLine(probe);
      } else {
        Result<std::unique_ptr<RdmaTransport>> rdma = RdmaTransport::Start(
            &pool_, options_.fence, *listen, options_.peer_timeout, &counters_);
        if (rdma.ok()) {
          rdma_ = std::move(*rdma);
        } else if (options_.transport == TransportMode::kRdma) {
          return rdma.status();
        } else {
          LOG(WARNING) << "RDMA: found " << probe.devices.size() << " device(s) (first "
                       << probe.devices.front()
                       << ") but could not use them: " << rdma.status().message()
                       << "; using TCP for the data plane";
        }
      }
    }

    Result<std::unique_ptr<EventLoop>> loop = EventLoop::Create("kvagent-data");
    if (!loop.ok()) return loop.status();
    loop_ = std::move(*loop);
    const SymmetricKey* key = options_.data_plane_key ? &*options_.data_plane_key : nullptr;
    tcp_client_ =
        std::make_unique<TcpDataClient>(loop_.get(), options_.peer_timeout, &counters_, key);
    if (rdma_) {
      self_ = Endpoint{Scheme::kRdma, *host, rdma_->port()};
    } else if (!options_.serve) {
      endpoint_ = std::string(kLocalOnlyEndpoint);
    } else {
      Result<std::unique_ptr<TcpDataServer>> server =
          TcpDataServer::Listen(loop_.get(), &pool_, options_.fence, key, *listen, &counters_);
      if (!server.ok()) return server.status();
      tcp_server_ = std::move(*server);
      self_ = Endpoint{Scheme::kTcp, *host, PortOf(tcp_server_->bound())};
    }
    if (endpoint_.empty()) endpoint_ = self_.ToString();
    loop_->Start([client = tcp_client_.get(), server = tcp_server_.get()] {
      const int a = client->Tick();
      const int b = server ? server->Tick() : -1;
      return a < 0 ? b : (b < 0 ? a : std::min(a, b));
    });
    if (options_.serve || rdma_) {
      LOG(INFO) << "data plane: serving the " << FormatBytes(pool_.size()) << " node pool at "
                << endpoint_ << " (listening on " << options_.listen_address << ")"
                << (options_.data_plane_key ? "; peers must prove the cluster secret"
                                            : "; peers are not authenticated (no cluster secret)");
    } else {
      LOG(INFO) << "data plane: no data server (standalone: no peer reads or writes the pool)";
    }
    return Status::Ok();
  }

  void Submit(std::vector<TransferOp> ops, TransferCallback done) {
    auto batch = std::make_shared<Batch>(ops.size(), std::move(done), &counters_);
    if (ops.empty()) {
      loop_->Post([batch] { batch->CompleteEmpty(); });
      return;
    }
    std::vector<PendingOp> tcp;
    std::vector<PendingOp> rdma;
    std::vector<std::pair<PendingOp, Status>> refused;
    std::string last_text;
    Result<Endpoint> last = InvalidParams("no endpoint yet");
    for (size_t i = 0; i < ops.size(); ++i) {
      TransferOp& op = ops[i];
      if (i == 0 || op.peer != last_text) {
        last = ParseEndpoint(op.peer);
        last_text = op.peer;
      }
      PendingOp pending{
          .kind = op.kind,
          .peer = last.ok() ? *last : Endpoint{},
          .peer_text = std::move(op.peer),
          .remote_offset = op.remote_offset,
          .local = static_cast<uint8_t*>(op.local),
          .length = op.length,
          .pool_incarnation = op.pool_incarnation,
          .master_epoch = op.master_epoch,
          .write_id = op.write_id,
          .received = op.kind == TransferKind::kRead ? op.received : nullptr,
          .payload_crc = op.kind == TransferKind::kWrite ? op.payload_crc : std::nullopt,
          .batch = batch,
          .index = i};
      Status verdict = Check(pending, last);
      if (!verdict.ok()) {
        refused.emplace_back(std::move(pending), std::move(verdict));
      } else if (pending.peer.scheme == Scheme::kRdma) {
        rdma.push_back(std::move(pending));
      } else {
        tcp.push_back(std::move(pending));
      }
    }
    if (!refused.empty()) {
      loop_->Post([refused = std::move(refused)]() mutable {
        for (auto& [op, status] : refused) op.Finish(std::move(status));
      });
    }
    if (!tcp.empty()) tcp_client_->Submit(std::move(tcp));
    if (!rdma.empty()) rdma_->Submit(std::move(rdma));
  }

  void Refence(std::function<void()> done) {
    loop_->Post([this, done = std::move(done)] {
      if (tcp_server_) tcp_server_->Refence();
      done();
    });
  }

  Status RegisterMemory(void* addr, uint64_t length) {
    KVAGENT_RETURN_IF_ERROR(local_.Add(addr, length));
    if (rdma_) {
      Status registered = rdma_->RegisterMemory(addr, length);
      if (!registered.ok()) {
        (void)local_.Remove(addr);
        return registered;
      }
    }
    return Status::Ok();
  }

  Status UnregisterMemory(void* addr) {
    if (addr == pool_.base()) {
      return InvalidParams(
          "UnregisterMemory: the node pool stays registered for the engine's life");
    }
    KVAGENT_RETURN_IF_ERROR(local_.Remove(addr));
    if (rdma_) rdma_->UnregisterMemory(addr);
    return Status::Ok();
  }

  bool IsLocal(std::string_view endpoint) const {
    if (!options_.serve && !rdma_) return endpoint == endpoint_;
    Result<Endpoint> parsed = ParseEndpoint(endpoint);
    return parsed.ok() && *parsed == self_;
  }

  TransferStats Stats() const {
    auto get = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
    TransferStats s;
    s.ops_ok = get(counters_.ops_ok);
    s.ops_failed = get(counters_.ops_failed);
    s.ops_timed_out = get(counters_.ops_timed_out);
    s.bytes_written = get(counters_.bytes_written);
    s.bytes_read = get(counters_.bytes_read);
    s.connections_opened = get(counters_.connections_opened);
    s.served_writes = get(counters_.served_writes);
    s.served_reads = get(counters_.served_reads);
    s.served_rejected = get(counters_.served_rejected);
    s.served_fenced = get(counters_.served_fenced);
    s.served_corrupted = get(counters_.served_corrupted);
    s.served_unauthenticated = get(counters_.served_unauthenticated);
    s.served_shed_connections = get(counters_.served_shed_connections);
    s.served_dropped_connections = get(counters_.served_dropped_connections);
    return s;
  }

  const std::string& endpoint() const { return endpoint_; }
  Scheme scheme() const { return self_.scheme; }

 private:
  Status Check(const PendingOp& op, const Result<Endpoint>& peer) const {
    if (!peer.ok()) return peer.status();
    if (op.kind != TransferKind::kWrite && op.kind != TransferKind::kRead) {
      return InvalidParams("op kind " + std::to_string(static_cast<int>(op.kind)) +
                           " is neither kWrite nor kRead");
    }
    if (op.length == 0 || op.local == nullptr) {
      return InvalidParams(op.Describe() + ": an op needs a non-null local buffer and >= 1 byte");
    }
    if (!local_.Contains(op.local, op.length)) {
      return InvalidParams(op.Describe() +
                           ": the local buffer is neither in the node pool nor in memory given to "
                           "RegisterMemory; register each client arena once at attach");
    }
    if (op.peer.scheme == Scheme::kRdma && !rdma_) {
      return Status(ErrorCode::kTransferFailed,
                    op.Describe() +
                        ": the peer serves over RDMA but RDMA is not active on this "
                        "node; run every agent with --data-transport=tcp");
    }
    return Status::Ok();
  }

  NodePool& pool_;
  TransferEngineOptions options_;
  EngineCounters counters_;
  LocalMemory local_;
  Endpoint self_;
  std::string endpoint_;
  std::unique_ptr<RdmaTransport> rdma_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<TcpDataServer> tcp_server_;
  std::unique_ptr<TcpDataClient> tcp_client_;
};

std::string_view TransportModeName(TransportMode mode) {
  switch (mode) {
    case TransportMode::kAuto:
      return "auto";
    case TransportMode::kTcp:
      return "tcp";
    case TransportMode::kRdma:
      return "rdma";
  }
  return "auto";
}

Result<TransportMode> ParseTransportMode(std::string_view text) {
  if (text == "auto") return TransportMode::kAuto;
  if (text == "tcp") return TransportMode::kTcp;
  if (text == "rdma") return TransportMode::kRdma;
  return InvalidParams("--data-transport '" + std::string(text) + "': use auto, tcp or rdma");
}

Result<std::unique_ptr<TransferEngine>> TransferEngine::Create(
    NodePool& pool, const TransferEngineOptions& options) {
  if (options.peer_timeout.count() <= 0) {
    return InvalidParams("--data-peer-timeout-ms must be positive");
  }
  auto core = std::make_unique<Core>(pool, options);
  KVAGENT_RETURN_IF_ERROR(core->Start());
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(core)));
}

TransferEngine::TransferEngine(std::unique_ptr<Core> core) : core_(std::move(core)) {}
TransferEngine::~TransferEngine() = default;

const std::string& TransferEngine::endpoint() const { return core_->endpoint(); }
Scheme TransferEngine::scheme() const { return core_->scheme(); }
bool TransferEngine::IsLocal(std::string_view endpoint) const { return core_->IsLocal(endpoint); }

Status TransferEngine::RegisterMemory(void* addr, uint64_t length) {
  return core_->RegisterMemory(addr, length);
}
Status TransferEngine::UnregisterMemory(void* addr) { return core_->UnregisterMemory(addr); }

void TransferEngine::Submit(std::vector<TransferOp> ops, TransferCallback done) {
  core_->Submit(std::move(ops), std::move(done));
}

std::vector<Status> TransferEngine::TransferAndWait(std::vector<TransferOp> ops) {
  // Shared: the engine thread may still be inside set_value when get() returns here.
  auto promise = std::make_shared<std::promise<std::vector<Status>>>();
  std::future<std::vector<Status>> future = promise->get_future();
  Submit(std::move(ops),
         [promise](std::vector<Status> results) { promise->set_value(std::move(results)); });
  return future.get();
}

TransferStats TransferEngine::stats() const { return core_->Stats(); }

void TransferEngine::Refence(std::function<void()> done) { core_->Refence(std::move(done)); }

}  // namespace kvagent::transfer
