// Values in a client's own memory: the agent reads a put's bytes straight out of the client
// process and writes a get's bytes straight into it (process_vm_readv / process_vm_writev), so
// a value crosses memory once between the engine's buffers (a host KV pool) and the node pool,
// with no staging in the client's arena.
//
// Access. A client asks for it in its Hello with a probe: the address of 8 bytes of its memory
// and their value. The agent reads them from the process that connected (its pid from
// SO_PEERCRED) and grants access only when they match, so the pid is the client's (also across
// pid namespaces, where SO_PEERCRED translates it) and the kernel lets this agent read it (same
// uid, or CAP_SYS_PTRACE; under Yama ptrace_scope 1 the SDK names the agent with
// prctl(PR_SET_PTRACER)). The agent keeps a pidfd of the process from then on and checks it
// before it touches the memory, so a pid reused after the client died is never read or written.
//
// Safety. Addresses come from the client and are never dereferenced by the agent: the kernel
// copies them and reports an unmapped or unwritable range as EFAULT, which becomes
// INVALID_PARAMS for that key. A client can only name memory of its own process.
//
// Peers. The data plane moves bytes only between registered memory (the node pool, client
// arenas), and the client's own memory is not registered. A client granted process memory
// therefore sets aside a range of its arena (Attached.peer_scratch): a put's part bound for a
// peer's pool is read into it first, a get's part read from a peer lands in it and is then
// written into the client's memory. A part that finds no room there fails with NO_SPACE.
//
// Checksums. Every copy computes the CRC32C (common/checksum.h) of the bytes it moves, in
// chunks small enough to stay in cache: a read checksums each chunk right after the kernel wrote
// it into the pool, a write checksums each chunk of the pool just before the kernel reads it out.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvagent/common/status.h"
#include "kvagent/ipc/arena_allocator.h"
#include "kvagent/ipc/unix_socket.h"
#include "kvagent/schemas/agent_generated.h"

namespace kvagent::agent {

// The memory of one client process, once access is granted. Shared by the client's connection and
// its requests in flight (the pidfd lives as long as any of them).
class ProcessMemory : public std::enable_shared_from_this<ProcessMemory> {
 public:
  // Grants access when the 8 bytes at `probe_address` in process `pid` read as `probe_value`.
  // INVALID_PARAMS (with why) when the process cannot be read, its pid is unknown here (0: it
  // lives in a pid namespace this agent cannot see), or the bytes differ.
  [[nodiscard]] static Result<std::shared_ptr<ProcessMemory>> Grant(pid_t pid,
                                                                    uint64_t probe_address,
                                                                    uint64_t probe_value);

  // Whether a client of uid `client_uid` may be granted its memory at all. A grant is to a pid,
  // and a process that execs keeps its pid: a client that execs a setuid program (keeping its
  // connection and ring in a forked child) would have the agent read and write the new
  // program's memory. The kernel refuses that to an agent without CAP_SYS_PTRACE (the program
  // is not dumpable, its euid differs); an agent with it (root, as the shipped unit runs) could
  // do it, so such an agent grants only clients that are root themselves, unless `any_uid`
  // (--process-memory-any-uid) says every allowed user is trusted. INVALID_PARAMS saying so.
  [[nodiscard]] static Status MayGrant(uid_t client_uid, bool any_uid);

  pid_t pid() const { return pid_; }
  // False once the process has exited (its pid may then belong to another process).
  bool Alive() const;

  // One key's value in the client: its ranges in order, gathered for a put, filled for a get.
  using Ranges = std::span<const proto::MemoryRange>;

  // Copies bytes [offset, offset + length) of the value held in `ranges` into `dst` (memory of
  // this process, e.g. the node pool) and returns their CRC32C (0 without `checksum`).
  // INVALID_PARAMS when part of the range is not readable in the client (the message names the
  // range), AGENT_UNAVAILABLE when the client process is gone.
  [[nodiscard]] Result<uint32_t> Read(Ranges ranges, uint64_t offset, uint8_t* dst, uint64_t length,
                                      bool checksum = true) const;

  // Copies `length` bytes from `src` into bytes [offset, offset + length) of the value's ranges
  // in the client and returns the CRC32C of the bytes of `src` (0 without `checksum`). Errors as
  // for Read (a range that is not writable is INVALID_PARAMS); bytes before a failing chunk may
  // already have been written.
  [[nodiscard]] Result<uint32_t> Write(Ranges ranges, uint64_t offset, const uint8_t* src,
                                       uint64_t length, bool checksum = true) const;

  // The CRC32C of bytes [offset, offset + length) of the value, read through a small buffer of
  // the agent (for a part that is copied nowhere here). Errors as for Read.
  [[nodiscard]] Result<uint32_t> Checksum(Ranges ranges, uint64_t offset, uint64_t length) const;

  // Bytes moved per system call: each chunk is checksummed while it is in cache.
  static constexpr uint64_t kChunkBytes = 256 << 10;

  // The client's peer scratch: [offset, offset + length) of its arena of `arena_bytes`. Set once,
  // at attach, before the memory is shared; INVALID_PARAMS when it lies outside the arena.
  [[nodiscard]] Status SetPeerScratch(uint64_t offset, uint64_t length, uint64_t arena_bytes);

  // A range of the peer scratch (arena offset), given back when the object dies (any thread).
  class ScratchRange {
   public:
    ScratchRange(std::shared_ptr<const ProcessMemory> owner, uint64_t offset)
        : owner_(std::move(owner)), offset_(offset) {}
    ScratchRange(const ScratchRange&) = delete;
    ScratchRange& operator=(const ScratchRange&) = delete;
    ~ScratchRange();
    uint64_t arena_offset() const { return owner_->scratch_offset_ + offset_; }

   private:
    std::shared_ptr<const ProcessMemory> owner_;
    uint64_t offset_;
  };
  // `length` bytes of the peer scratch; NO_SPACE when none is set or it is full.
  [[nodiscard]] Result<std::unique_ptr<ScratchRange>> AllocatePeerScratch(uint64_t length) const;

 private:
  ProcessMemory(pid_t pid, ipc::UniqueFd pidfd) : pid_(pid), pidfd_(std::move(pidfd)) {}
  // Walks bytes [offset, offset + length) of `ranges` in chunks of at most kChunkBytes (and
  // kMaxIovecs ranges), calling copy(at, n, remote iovecs, crc so far) -> Result<crc> for each.
  template <typename Copy>
  Result<uint32_t> Move(Ranges ranges, uint64_t offset, uint64_t length, uint32_t crc,
                        Copy copy) const;
  // Reads `n` bytes of the value, at its offset `at`, from `remote` into dst.
  Status ReadChunk(uint8_t* dst, uint64_t at, uint64_t n, std::span<const iovec> remote) const;

  const pid_t pid_;
  const ipc::UniqueFd pidfd_;
  uint64_t scratch_offset_ = 0;
  std::unique_ptr<ipc::ArenaAllocator> scratch_;  // thread-safe; null without a scratch
};

// The total length of a value's ranges; INVALID_PARAMS when it overflows 64 bits.
[[nodiscard]] Result<uint64_t> RangesLength(ProcessMemory::Ranges ranges, std::string_view what);

}  // namespace kvagent::agent
