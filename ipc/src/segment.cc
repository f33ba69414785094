#include "kvagent/ipc/segment.h"

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <new>

namespace kvagent::ipc {

namespace bip = boost::interprocess;

struct Segment::Mapping {
  bip::mapped_region region;
};

namespace {

uint64_t PageAlign(uint64_t n) { return (n + kPageBytes - 1) & ~(kPageBytes - 1); }
bool IsPowerOfTwo(uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

Status CheckRingBytes(const char* which, uint64_t bytes) {
  if (!IsPowerOfTwo(bytes) || bytes < kMinRingBytes || bytes > kMaxRingBytes) {
    return InvalidParams(std::string(which) + " ring of " + std::to_string(bytes) +
                         " bytes: use a power of two between " + std::to_string(kMinRingBytes) +
                         " and " + std::to_string(kMaxRingBytes));
  }
  return Status::Ok();
}

// True when every region of `l` lies inside [kPageBytes, total) in the declared order.
bool LayoutIsSane(const SegmentLayout& l) {
  Result<SegmentLayout> expected =
      SegmentLayout::Compute(l.request_ring_bytes, l.completion_ring_bytes, l.arena_bytes);
  return expected.ok() && *expected == l;
}

}  // namespace

Result<SegmentLayout> SegmentLayout::Compute(uint64_t request_ring_bytes,
                                             uint64_t completion_ring_bytes, uint64_t arena_bytes) {
  KVAGENT_RETURN_IF_ERROR(CheckRingBytes("request", request_ring_bytes));
  KVAGENT_RETURN_IF_ERROR(CheckRingBytes("completion", completion_ring_bytes));
  if (arena_bytes > (1ULL << 46)) {
    return InvalidParams("arena of " + std::to_string(arena_bytes) + " bytes is too large");
  }
  SegmentLayout l;
  uint64_t at = kPageBytes;  // the header's page
  l.request_control = at;
  at += PageAlign(sizeof(RingControl));
  l.request_data = at;
  l.request_ring_bytes = request_ring_bytes;
  at += request_ring_bytes;
  l.completion_control = at;
  at += PageAlign(sizeof(RingControl));
  l.completion_data = at;
  l.completion_ring_bytes = completion_ring_bytes;
  at += completion_ring_bytes;
  l.arena = at;
  l.arena_bytes = PageAlign(arena_bytes);
  l.total_bytes = at + l.arena_bytes;
  return l;
}

Segment::Segment(std::unique_ptr<Mapping> mapping, const SegmentLayout& layout)
    : mapping_(std::move(mapping)),
      base_(static_cast<uint8_t*>(mapping_->region.get_address())),
      layout_(layout) {}

Segment::Segment(Segment&&) noexcept = default;
Segment& Segment::operator=(Segment&&) noexcept = default;
Segment::~Segment() = default;

RingRef Segment::request_ring() const {
  return {reinterpret_cast<RingControl*>(base_ + layout_.request_control),
          base_ + layout_.request_data, layout_.request_ring_bytes};
}

RingRef Segment::completion_ring() const {
  return {reinterpret_cast<RingControl*>(base_ + layout_.completion_control),
          base_ + layout_.completion_data, layout_.completion_ring_bytes};
}

Result<Segment> Segment::Create(const std::string& name, const SegmentLayout& layout,
                                uint64_t agent_epoch, uint64_t client_id, SegmentOwner owner) {
  try {
    bip::permissions perms(0600);
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, perms);
    if (owner.set && fchown(shm.get_mapping_handle().handle, owner.uid, owner.gid) != 0) {
      int err = errno;
      bip::shared_memory_object::remove(name.c_str());
      return Internal("cannot give segment " + name + " to uid " + std::to_string(owner.uid) +
                      ": " + std::strerror(err));
    }
    shm.truncate(static_cast<bip::offset_t>(layout.total_bytes));
    auto mapping = std::make_unique<Mapping>();
    mapping->region = bip::mapped_region(shm, bip::read_write);
    // `shm` (and its fd) closes here; the mapping keeps the memory.
    Segment segment(std::move(mapping), layout);
    // Fresh pages are zero: a valid empty ring. Construct the atomics in place.
    auto* header = new (segment.base_) SegmentHeader{};
    header->magic = kSegmentMagic;
    header->layout_version = kSegmentLayoutVersion;
    header->header_bytes = static_cast<uint32_t>(kPageBytes);
    header->agent_epoch = agent_epoch;
    header->client_id = client_id;
    header->layout = layout;
    new (segment.base_ + layout.request_control) RingControl{};
    new (segment.base_ + layout.completion_control) RingControl{};
    return segment;
  } catch (const bip::interprocess_exception& e) {
    bip::shared_memory_object::remove(name.c_str());
    return Internal("cannot create shared-memory segment " + name + " (" +
                    std::to_string(layout.total_bytes) + " bytes): " + e.what() +
                    "; check free space in /dev/shm or lower --max-arena-bytes");
  }
}

Result<Segment> Segment::Open(const std::string& name, uint64_t expected_bytes) {
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_write);
    bip::offset_t size = 0;
    if (!shm.get_size(size) || static_cast<uint64_t>(size) != expected_bytes ||
        expected_bytes < kPageBytes) {
      return Internal("segment " + name + " is " + std::to_string(size) + " bytes, expected " +
                      std::to_string(expected_bytes) + "; the agent and SDK disagree");
    }
    auto mapping = std::make_unique<Mapping>();
    mapping->region = bip::mapped_region(shm, bip::read_write);
    const auto* header = static_cast<const SegmentHeader*>(mapping->region.get_address());
    if (header->magic != kSegmentMagic || header->layout_version != kSegmentLayoutVersion) {
      return Internal("segment " + name + " has layout version " +
                      std::to_string(header->layout_version) + ", this SDK speaks " +
                      std::to_string(kSegmentLayoutVersion) + "; upgrade the SDK or the agent");
    }
    SegmentLayout layout = header->layout;
    if (!LayoutIsSane(layout) || layout.total_bytes != expected_bytes) {
      return Internal("segment " + name + " has an inconsistent layout; restart the agent");
    }
    return Segment(std::move(mapping), layout);
  } catch (const bip::interprocess_exception& e) {
    return Internal("cannot open shared-memory segment " + name + ": " + e.what() +
                    "; the agent may have exited, or this process lacks permission");
  }
}

bool Segment::Unlink(const std::string& name) {
  return bip::shared_memory_object::remove(name.c_str());
}

std::string SegmentName(int agent_pid, uint64_t agent_epoch, uint64_t client_id) {
  return std::string(kSegmentPrefix) + std::to_string(agent_pid) + "." +
         std::to_string(agent_epoch) + "." + std::to_string(client_id);
}

namespace {

// Parses "kvagent.<pid>.<epoch>.<id>" into pid and epoch.
bool ParseName(const std::string& name, int* pid, uint64_t* epoch) {
  const std::string prefix = kSegmentPrefix;
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  char* end = nullptr;
  const char* p = name.c_str() + prefix.size();
  long v = std::strtol(p, &end, 10);
  if (end == p || *end != '.' || v <= 0) return false;
  *pid = static_cast<int>(v);
  p = end + 1;
  unsigned long long e = std::strtoull(p, &end, 10);
  if (end == p || *end != '.') return false;
  *epoch = e;
  return true;
}

// Any live process with that pid counts, whatever its name (a kvagent may run under another
// name): wrongly keeping a dead agent's name only delays its removal to a later start, wrongly
// removing a live agent's would fail a client that is about to map it.
bool ProcessExists(int pid) { return kill(pid, 0) == 0 || errno == EPERM; }

template <typename Fn>
void ForEachShmName(Fn&& fn) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  while (dirent* entry = readdir(dir)) fn(std::string(entry->d_name));
  closedir(dir);
}

}  // namespace

int RemoveStaleSegments(int own_pid, uint64_t own_epoch) {
  int removed = 0;
  ForEachShmName([&](const std::string& name) {
    int pid = 0;
    uint64_t epoch = 0;
    if (!ParseName(name, &pid, &epoch)) return;
    const bool stale = pid == own_pid ? epoch != own_epoch : !ProcessExists(pid);
    if (stale && Segment::Unlink(name)) ++removed;
  });
  return removed;
}

int CountSegments(int agent_pid) {
  const std::string prefix = std::string(kSegmentPrefix) + std::to_string(agent_pid) + ".";
  int count = 0;
  ForEachShmName([&](const std::string& name) {
    if (name.compare(0, prefix.size(), prefix) == 0) ++count;
  });
  return count;
}

}  // namespace kvagent::ipc
