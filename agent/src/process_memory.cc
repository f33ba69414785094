#include "process_memory.h"

#include <linux/capability.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <vector>

#include "kvagent/common/checksum.h"
#include "kvagent/common/errno_text.h"

namespace kvagent::agent {
namespace {

// iovecs per system call: the kernel's UIO_MAXIOV.
constexpr size_t kMaxIovecs = 1024;

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// Whether this process holds CAP_SYS_PTRACE in its effective set (the kernel then lets it read
// and write processes of other users, setuid ones included).
bool MayPtraceAnyProcess() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &header, data) != 0) return true;  // cannot tell: assume it may
  return (data[CAP_SYS_PTRACE / 32].effective & (1u << (CAP_SYS_PTRACE % 32))) != 0;
}

bool PidfdAlive(int pidfd) {
  return syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) == 0 || errno == EPERM;
}

std::string Hex(uint64_t v) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%llx", static_cast<unsigned long long>(v));
  return text;
}

Status Unavailable(pid_t pid) {
  return Status(ErrorCode::kAgentUnavailable,
                "client process " + std::to_string(pid) + " has exited");
}

}  // namespace

Result<uint64_t> RangesLength(ProcessMemory::Ranges ranges, std::string_view what) {
  uint64_t total = 0;
  for (const proto::MemoryRange& r : ranges) {
    if (r.address() + r.length() < r.address()) {
      return InvalidParams(std::string(what) + ": the range at " + Hex(r.address()) + " of " +
                           std::to_string(r.length()) + " bytes wraps around the address space");
    }
    if (total + r.length() < total) {
      return InvalidParams(std::string(what) + ": the ranges add up to more than 2^64 bytes");
    }
    total += r.length();
  }
  return total;
}

Result<std::shared_ptr<ProcessMemory>> ProcessMemory::Grant(pid_t pid, uint64_t probe_address,
                                                            uint64_t probe_value) {
  if (pid <= 0) {
    return InvalidParams(
        "the client's pid is not visible from the agent's pid namespace; run both in one pid "
        "namespace (or the agent in the host's) to let the agent copy values directly");
  }
  ipc::UniqueFd pidfd(PidfdOpen(pid));
  if (!pidfd.valid()) {
    return InvalidParams("pidfd_open(" + std::to_string(pid) + ") failed: " + ErrnoText(errno));
  }
  uint64_t seen = 0;
  iovec local{&seen, sizeof(seen)};
  iovec remote{reinterpret_cast<void*>(probe_address), sizeof(seen)};
  const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (n != static_cast<ssize_t>(sizeof(seen))) {
    const int err = n < 0 ? errno : EFAULT;
    std::string hint = err == EPERM
                           ? "; run the agent as the client's user or as root (CAP_SYS_PTRACE), "
                             "or let the SDK name the agent as its ptracer (Yama)"
                           : "";
    return InvalidParams("the agent cannot read the client's memory (process_vm_readv: " +
                         ErrnoText(err) + ")" + hint);
  }
  if (seen != probe_value) {
    return InvalidParams(
        "the client's memory probe does not match: the process that connected "
        "is not the one that sent the Hello");
  }
  return std::shared_ptr<ProcessMemory>(new ProcessMemory(pid, std::move(pidfd)));
}

Status ProcessMemory::MayGrant(uid_t client_uid, bool any_uid) {
  if (any_uid || client_uid == 0 || !MayPtraceAnyProcess()) return Status::Ok();
  return InvalidParams(
      "this agent may read and write any process (it runs with CAP_SYS_PTRACE, e.g. as root) "
      "and the client runs as uid " +
      std::to_string(client_uid) +
      ": a client that execs a setuid program would keep its grant to that program's memory, so "
      "values travel through the arena instead; start the agent with --process-memory-any-uid "
      "only where every allowed user is trusted, or run it as the clients' user");
}

bool ProcessMemory::Alive() const { return PidfdAlive(pidfd_.get()); }

Status ProcessMemory::SetPeerScratch(uint64_t offset, uint64_t length, uint64_t arena_bytes) {
  if (length == 0) return Status::Ok();
  if (offset > arena_bytes || length > arena_bytes - offset) {
    return InvalidParams("peer_scratch [" + std::to_string(offset) + ", +" +
                         std::to_string(length) + ") lies outside the arena of " +
                         std::to_string(arena_bytes) + " bytes");
  }
  scratch_offset_ = offset;
  scratch_ = std::make_unique<ipc::ArenaAllocator>(length);
  return Status::Ok();
}

Result<std::unique_ptr<ProcessMemory::ScratchRange>> ProcessMemory::AllocatePeerScratch(
    uint64_t length) const {
  if (scratch_ == nullptr) {
    return Status(ErrorCode::kNoSpace,
                  "this client set aside no arena range for transfers to peers; reconnect with "
                  "a larger arena");
  }
  auto offset = scratch_->Allocate(length);
  if (!offset.ok()) {
    return Status(ErrorCode::kNoSpace, "the client's arena range for transfers to peers is full (" +
                                           offset.status().message() +
                                           "); retry, or reconnect with a larger arena");
  }
  return std::make_unique<ScratchRange>(shared_from_this(), *offset);
}

ProcessMemory::ScratchRange::~ScratchRange() { owner_->scratch_->Free(offset_); }

template <typename Copy>
Result<uint32_t> ProcessMemory::Move(Ranges ranges, uint64_t offset, uint64_t length, uint32_t crc,
                                     Copy copy) const {
  // Skip to the range that holds `offset`.
  size_t r = 0;
  uint64_t in_range = offset;
  while (r < ranges.size() && in_range >= ranges[r].length()) in_range -= ranges[r++].length();
  std::vector<iovec> remote;
  remote.reserve(std::min<size_t>(ranges.size(), kMaxIovecs));
  uint64_t done = 0;
  while (done < length) {
    // One chunk: up to kChunkBytes over as many ranges as it takes (at most kMaxIovecs).
    remote.clear();
    const uint64_t chunk = std::min(kChunkBytes, length - done);
    uint64_t gathered = 0;
    while (gathered < chunk && r < ranges.size() && remote.size() < kMaxIovecs) {
      const uint64_t take = std::min(ranges[r].length() - in_range, chunk - gathered);
      if (take > 0) {
        remote.push_back(iovec{reinterpret_cast<void*>(ranges[r].address() + in_range), take});
      }
      gathered += take;
      in_range += take;
      if (in_range == ranges[r].length()) {
        ++r;
        in_range = 0;
      }
    }
    if (gathered == 0) {
      return InvalidParams("the value's ranges hold fewer than " + std::to_string(offset + length) +
                           " bytes");
    }
    auto result = copy(done, gathered, std::span<const iovec>(remote), crc);
    if (!result.ok()) {
      if (!Alive()) return Unavailable(pid_);
      return result.status();
    }
    crc = *result;
    done += gathered;
  }
  return crc;
}

Result<uint32_t> ProcessMemory::Read(Ranges ranges, uint64_t offset, uint8_t* dst, uint64_t length,
                                     bool checksum) const {
  if (!Alive()) return Unavailable(pid_);
  return Move(ranges, offset, length, 0,
              [&](uint64_t at, uint64_t n, std::span<const iovec> remote,
                  uint32_t so_far) -> Result<uint32_t> {
                KVAGENT_RETURN_IF_ERROR(ReadChunk(dst + at, offset + at, n, remote));
                // The chunk is in cache now: checksum it before the next one evicts it.
                return checksum ? Crc32c(dst + at, n, so_far) : 0;
              });
}

Result<uint32_t> ProcessMemory::Write(Ranges ranges, uint64_t offset, const uint8_t* src,
                                      uint64_t length, bool checksum) const {
  if (!Alive()) return Unavailable(pid_);
  return Move(
      ranges, offset, length, 0,
      [&](uint64_t at, uint64_t n, std::span<const iovec> remote,
          uint32_t so_far) -> Result<uint32_t> {
        // Checksum the chunk first: the kernel then reads it from cache.
        const uint32_t next = checksum ? Crc32c(src + at, n, so_far) : 0;
        iovec local{const_cast<uint8_t*>(src + at), n};
        const ssize_t put = process_vm_writev(pid_, &local, 1, remote.data(), remote.size(), 0);
        if (put != static_cast<ssize_t>(n)) {
          return InvalidParams(
              "bytes " + std::to_string(offset + at) + ".." + std::to_string(offset + at + n) +
              " of the target (at " + Hex(reinterpret_cast<uint64_t>(remote[0].iov_base)) +
              ") are not writable in the client process (" + ErrnoText(put < 0 ? errno : EFAULT) +
              "); pass buffers of mapped, writable memory");
        }
        return next;
      });
}

Status ProcessMemory::ReadChunk(uint8_t* dst, uint64_t at, uint64_t n,
                                std::span<const iovec> remote) const {
  iovec local{dst, n};
  const ssize_t got = process_vm_readv(pid_, &local, 1, remote.data(), remote.size(), 0);
  if (got == static_cast<ssize_t>(n)) return Status::Ok();
  return InvalidParams("bytes " + std::to_string(at) + ".." + std::to_string(at + n) +
                       " of the value (at " + Hex(reinterpret_cast<uint64_t>(remote[0].iov_base)) +
                       ") are not readable in the client process (" +
                       ErrnoText(got < 0 ? errno : EFAULT) + "); pass buffers of mapped memory");
}

Result<uint32_t> ProcessMemory::Checksum(Ranges ranges, uint64_t offset, uint64_t length) const {
  if (!Alive()) return Unavailable(pid_);
  // One walk over the ranges, a chunk at a time through one buffer (a Read per chunk walked
  // them from the first each time: chunks x ranges, 10^10 steps for a million ranges).
  std::vector<uint8_t> chunk(std::min(length, kChunkBytes));
  return Move(ranges, offset, length, 0,
              [&](uint64_t at, uint64_t n, std::span<const iovec> remote,
                  uint32_t so_far) -> Result<uint32_t> {
                KVAGENT_RETURN_IF_ERROR(ReadChunk(chunk.data(), offset + at, n, remote));
                return Crc32c(chunk.data(), n, so_far);
              });
}

}  // namespace kvagent::agent
