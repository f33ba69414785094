// transfer_bench: the data plane's throughput against baselines measured in the same run.
//
//   transfer.pool_prefault            GB/s   faulting the pool in at Create
//   transfer.pool_memcpy.1m           GB/s   1 MiB memcpy's into the pre-faulted pool
//   transfer.fresh_memcpy.1m          GB/s   the same into never-touched pages (baseline)
//   transfer.pool_memcpy.1m.vs_fresh  x      ratio of the two
//   transfer.tcp.<size>               GB/s   engine WRITEs over loopback, one batch per round
//   transfer.raw_tcp.<size>           GB/s   send() of the same bytes in the same chunk size
//                                            over a plain loopback TCP socket (baseline)
//   transfer.tcp.<size>.vs_raw        x      ratio of the two
//   transfer.tcp.<size>.payload_crc   GB/s   the engine WRITEs again, each with its payload's
//                                            CRC32C (taken beforehand, as a put's copy does),
//                                            which the server checks as the bytes arrive;
//                                            .vs_plain: over transfer.tcp.<size> of the same rounds
//   transfer.tcp_read.1m              GB/s   engine READs over loopback
//   transfer.sealed_tcp.<aead>.1m     GB/s   the raw TCP stream again, every message sealed by
//                                            the sender and opened by the receiver in records
//                                            of at most 64 KiB (libsodium ChaCha20-Poly1305, and
//                                            AES-256-GCM where the CPU has AES-NI): the least an
//                                            encrypted data plane (or an encrypting overlay
//                                            such as WireGuard or IPsec) costs
//   transfer.sealed_tcp.<aead>.1m.vs_raw  x  over transfer.raw_tcp.1m of the same rounds
//
// The machine is shared: numbers move with whatever else runs. Each figure is the best of a
// few rounds, which is the least noisy estimate of what the code can do.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kvagent/common/checksum.h"
#include "kvagent/transfer/node_pool.h"
#include "kvagent/transfer/transfer_engine.h"

namespace {

using kvagent::transfer::NodePool;
using kvagent::transfer::TransferEngine;
using kvagent::transfer::TransferKind;
using kvagent::transfer::TransferOp;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr int kRounds = 5;

void Bench(const std::string& name, double value, const char* unit) {
  std::printf("BENCH %s %.3f %s\n", name.c_str(), value, unit);
  std::fflush(stdout);
}

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::unique_ptr<NodePool> MakePool(uint64_t bytes) {
  auto pool = NodePool::Create({.size_bytes = bytes});
  if (!pool.ok()) {
    std::fprintf(stderr, "transfer_bench: %s\n", pool.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*pool);
}

std::unique_ptr<TransferEngine> MakeEngine(NodePool& pool) {
  kvagent::transfer::TransferEngineOptions options;
  options.listen_address = "127.0.0.1:0";
  options.transport = kvagent::transfer::TransportMode::kTcp;
  auto engine = TransferEngine::Create(pool, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "transfer_bench: %s\n", engine.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*engine);
}

// memcpy's `total` bytes in 1 MiB chunks into `dst`; GB/s.
double MemcpyRate(uint8_t* dst, const uint8_t* src, uint64_t total) {
  const auto start = Clock::now();
  for (uint64_t off = 0; off < total; off += kMiB) std::memcpy(dst + off, src, kMiB);
  return static_cast<double>(total) / Seconds(start) / 1e9;
}

void BenchMemcpy(NodePool& pool) {
  Bench("transfer.pool_prefault",
        static_cast<double>(pool.size()) / std::max(pool.prefault_seconds(), 1e-9) / 1e9, "GB/s");
  const uint64_t total = pool.size();
  std::vector<uint8_t> src(kMiB, 0x5A);
  double into_pool = 0;
  double into_fresh = 0;
  for (int round = 0; round < kRounds; ++round) {
    into_pool = std::max(into_pool, MemcpyRate(pool.base(), src.data(), total));
    void* fresh = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fresh == MAP_FAILED) std::exit(1);
    into_fresh = std::max(into_fresh, MemcpyRate(static_cast<uint8_t*>(fresh), src.data(), total));
    munmap(fresh, total);
  }
  Bench("transfer.pool_memcpy.1m", into_pool, "GB/s");
  Bench("transfer.fresh_memcpy.1m", into_fresh, "GB/s");
  Bench("transfer.pool_memcpy.1m.vs_fresh", into_pool / into_fresh, "x");
}

// How a read's bytes are checksummed, as a get's are (read_batch.cc).
enum class ReadCrc {
  kNone,
  kAfter,     // one CRC32C pass over the destination once the op is done (before 2026-12-04)
  kReceived,  // TransferOp::received: taken by the transport as the bytes arrive
};

// One batch of `total / size` ops of `size` bytes from the client's pool to the server's; GB/s.
// `sent_crcs` (writes): each op's payload CRC, sent for the server to check.
double EngineRate(TransferEngine& client, NodePool& client_pool, const std::string& peer,
                  TransferKind kind, uint64_t size, uint64_t total, ReadCrc crc = ReadCrc::kNone,
                  const std::vector<uint32_t>* sent_crcs = nullptr) {
  std::vector<TransferOp> ops;
  std::vector<kvagent::transfer::ReceivedChecksum> received(total / size);
  for (uint64_t off = 0; off + size <= total; off += size) {
    ops.push_back({kind, peer, off, client_pool.base() + off, size});
    if (crc == ReadCrc::kReceived) ops.back().received = &received[off / size];
    if (sent_crcs != nullptr) ops.back().payload_crc = (*sent_crcs)[off / size];
  }
  const auto start = Clock::now();
  auto results = client.TransferAndWait(std::move(ops));
  uint32_t sum = 0;
  if (crc == ReadCrc::kAfter) {
    for (uint64_t off = 0; off + size <= total; off += size) {
      sum ^= kvagent::Crc32c(client_pool.base() + off, size);
    }
  }
  const double seconds = Seconds(start);
  for (const kvagent::transfer::ReceivedChecksum& r : received) sum ^= r.crc;
  if (sum == 0x12345678) std::printf("# (checksum sink)\n");  // keeps the passes
  for (const auto& status : results) {
    if (!status.ok()) {
      std::fprintf(stderr, "transfer_bench: %s\n", status.ToString().c_str());
      std::exit(1);
    }
  }
  return static_cast<double>(total) / seconds / 1e9;
}

// A connected loopback TCP pair: the sending end (TCP_NODELAY) and the receiving end.
std::pair<int, int> LoopbackPair() {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::exit(1);
  }
  int sender = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(sender, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (connect(sender, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) std::exit(1);
  int receiver = accept(listener, nullptr, nullptr);
  close(listener);
  return {sender, receiver};
}

// Sends all `n` bytes at `p` (exits on an error: the benchmark cannot go on).
void SendAll(int fd, const uint8_t* p, uint64_t n) {
  for (uint64_t sent = 0; sent < n;) {
    ssize_t got = send(fd, p + sent, n - sent, MSG_NOSIGNAL);
    if (got <= 0) std::exit(1);
    sent += static_cast<uint64_t>(got);
  }
}

// A plain loopback TCP connection: a thread receives into `sink`, the caller sends `total`
// bytes from `src` in chunks of `size`; GB/s measured from the first send to the last byte
// received.
double RawTcpRate(const uint8_t* src, uint8_t* sink, uint64_t size, uint64_t total) {
  const auto [sender, receiver] = LoopbackPair();
  std::thread reader([&] {
    uint64_t got = 0;
    while (got < total) {
      ssize_t n = recv(receiver, sink + got, std::min<uint64_t>(total - got, 16 * kMiB), 0);
      if (n <= 0) break;
      got += static_cast<uint64_t>(n);
    }
  });
  const auto start = Clock::now();
  for (uint64_t off = 0; off < total; off += size) {
    SendAll(sender, src + off, size);
  }
  reader.join();
  const double seconds = Seconds(start);
  close(sender);
  close(receiver);
  return static_cast<double>(total) / seconds / 1e9;
}

// An authenticated cipher as libsodium offers it (both take a 32-byte key, a 12-byte nonce and
// add a 16-byte tag).
struct Aead {
  const char* name;
  int (*seal)(unsigned char* c, unsigned long long* clen, const unsigned char* m,
              unsigned long long mlen, const unsigned char* ad, unsigned long long adlen,
              const unsigned char* nsec, const unsigned char* npub, const unsigned char* k);
  int (*open)(unsigned char* m, unsigned long long* mlen, unsigned char* nsec,
              const unsigned char* c, unsigned long long clen, const unsigned char* ad,
              unsigned long long adlen, const unsigned char* npub, const unsigned char* k);
};

constexpr uint64_t kRecordBytes = 64 * 1024;  // the most one tag covers
constexpr uint64_t kTagBytes = 16;

// The record `counter` as a nonce (each is used once under the key).
std::array<unsigned char, 12> RecordNonce(uint64_t counter) {
  std::array<unsigned char, 12> nonce{};
  std::memcpy(nonce.data(), &counter, sizeof(counter));
  return nonce;
}

// RawTcpRate's stream, encrypted: the sender seals each message of `size` bytes in records of
// at most kRecordBytes into a buffer and sends that; the receiver reads a record at a time and
// opens it into `sink` (it reads every record, so the sender never waits on a full socket, and
// a record that failed its tag ends the benchmark after the run). GB/s of plaintext.
double SealedTcpRate(const Aead& aead, const uint8_t* src, uint8_t* sink, uint64_t size,
                     uint64_t total) {
  std::array<unsigned char, 32> key{};
  randombytes_buf(key.data(), key.size());
  const auto [sender, receiver] = LoopbackPair();
  bool all_opened = true;
  std::thread reader([&] {
    std::vector<unsigned char> record(kRecordBytes + kTagBytes);
    uint64_t counter = 0;
    for (uint64_t off = 0; off < total; off += size) {
      for (uint64_t at = 0; at < size; at += kRecordBytes) {
        const uint64_t plain = std::min(kRecordBytes, size - at);
        uint64_t got = 0;
        while (got < plain + kTagBytes) {
          ssize_t n = recv(receiver, record.data() + got, plain + kTagBytes - got, 0);
          if (n <= 0) std::exit(1);
          got += static_cast<uint64_t>(n);
        }
        const auto nonce = RecordNonce(counter++);
        unsigned long long out = 0;
        all_opened &= aead.open(sink + off + at, &out, nullptr, record.data(), got, nullptr, 0,
                                nonce.data(), key.data()) == 0;
      }
    }
  });
  std::vector<unsigned char> sealed(size + (size / kRecordBytes + 1) * kTagBytes);
  uint64_t counter = 0;
  const auto start = Clock::now();
  for (uint64_t off = 0; off < total; off += size) {
    uint64_t bytes = 0;
    for (uint64_t at = 0; at < size; at += kRecordBytes) {
      const uint64_t plain = std::min(kRecordBytes, size - at);
      const auto nonce = RecordNonce(counter++);
      unsigned long long out = 0;
      aead.seal(sealed.data() + bytes, &out, src + off + at, plain, nullptr, 0, nullptr,
                nonce.data(), key.data());
      bytes += out;
    }
    SendAll(sender, sealed.data(), bytes);
  }
  reader.join();
  const double seconds = Seconds(start);
  close(sender);
  close(receiver);
  if (!all_opened) {
    std::fprintf(stderr, "transfer_bench: a sealed record failed to open\n");
    std::exit(1);
  }
  return static_cast<double>(total) / seconds / 1e9;
}

}  // namespace

int main() {
  std::printf("# transfer_bench: loopback on a shared machine; best of %d rounds per figure\n",
              kRounds);
  auto client_pool = MakePool(256 * kMiB);
  auto server_pool = MakePool(256 * kMiB);
  BenchMemcpy(*client_pool);

  auto client = MakeEngine(*client_pool);
  auto server = MakeEngine(*server_pool);
  const std::string peer = server->endpoint();
  struct Case {
    const char* label;
    uint64_t size;
    uint64_t total;
  };
  for (const Case& c : {Case{"4k", 4096, 64 * kMiB}, Case{"1m", kMiB, 256 * kMiB},
                        Case{"16m", 16 * kMiB, 256 * kMiB}}) {
    double engine = 0;
    double raw = 0;
    double checked = 0;
    std::vector<uint32_t> crcs;
    for (uint64_t off = 0; off + c.size <= c.total; off += c.size) {
      crcs.push_back(kvagent::Crc32c(client_pool->base() + off, c.size));
    }
    for (int round = 0; round < kRounds; ++round) {
      engine = std::max(
          engine, EngineRate(*client, *client_pool, peer, TransferKind::kWrite, c.size, c.total));
      raw = std::max(raw, RawTcpRate(client_pool->base(), server_pool->base(), c.size, c.total));
      checked = std::max(checked, EngineRate(*client, *client_pool, peer, TransferKind::kWrite,
                                             c.size, c.total, ReadCrc::kNone, &crcs));
    }
    Bench(std::string("transfer.tcp.") + c.label, engine, "GB/s");
    Bench(std::string("transfer.raw_tcp.") + c.label, raw, "GB/s");
    Bench(std::string("transfer.tcp.") + c.label + ".vs_raw", engine / raw, "x");
    Bench(std::string("transfer.tcp.") + c.label + ".payload_crc", checked, "GB/s");
    Bench(std::string("transfer.tcp.") + c.label + ".payload_crc.vs_plain", checked / engine, "x");
  }
  // What encrypting the stream would cost: the raw stream sealed and opened, against the raw
  // stream measured again in the same rounds.
  if (sodium_init() < 0) {
    std::fprintf(stderr, "transfer_bench: libsodium failed to initialise\n");
    return 1;
  }
  std::vector<Aead> aeads = {{"chacha20poly1305", crypto_aead_chacha20poly1305_ietf_encrypt,
                              crypto_aead_chacha20poly1305_ietf_decrypt}};
  if (crypto_aead_aes256gcm_is_available()) {
    aeads.push_back({"aes256gcm", crypto_aead_aes256gcm_encrypt, crypto_aead_aes256gcm_decrypt});
  } else {
    std::printf("# no AES-256-GCM: libsodium offers it only with AES-NI and PCLMUL\n");
  }
  // 1 MiB messages: at 4 KiB both streams are bound by their system calls, not the bytes.
  for (const Case& c : {Case{"1m", kMiB, 256 * kMiB}}) {
    std::vector<double> sealed(aeads.size(), 0);
    double raw = 0;
    for (int round = 0; round < kRounds; ++round) {
      raw = std::max(raw, RawTcpRate(client_pool->base(), server_pool->base(), c.size, c.total));
      for (size_t a = 0; a < aeads.size(); ++a) {
        sealed[a] = std::max(sealed[a], SealedTcpRate(aeads[a], client_pool->base(),
                                                      server_pool->base(), c.size, c.total));
      }
    }
    for (size_t a = 0; a < aeads.size(); ++a) {
      const std::string name = std::string("transfer.sealed_tcp.") + aeads[a].name + "." + c.label;
      Bench(name, sealed[a], "GB/s");
      Bench(name + ".vs_raw", sealed[a] / raw, "x");
    }
  }
  // Reads as a get makes them from a peer: checksummed as the bytes arrive (through the
  // transport's buffer), against the plain read followed by a CRC pass over the destination.
  for (const Case& c : {Case{"4k", 4096, 64 * kMiB}, Case{"1m", kMiB, 256 * kMiB}}) {
    double read = 0, after = 0, received = 0;
    for (int round = 0; round < kRounds; ++round) {
      read = std::max(
          read, EngineRate(*client, *client_pool, peer, TransferKind::kRead, c.size, c.total));
      after = std::max(after, EngineRate(*client, *client_pool, peer, TransferKind::kRead, c.size,
                                         c.total, ReadCrc::kAfter));
      received = std::max(received, EngineRate(*client, *client_pool, peer, TransferKind::kRead,
                                               c.size, c.total, ReadCrc::kReceived));
    }
    const std::string name = std::string("transfer.tcp_read.") + c.label;
    Bench(name, read, "GB/s");
    Bench(name + ".crc_after", after, "GB/s");
    Bench(name + ".crc_received", received, "GB/s");
    Bench(name + ".crc_received.vs_crc_after", received / after, "x");
  }
  return 0;
}
