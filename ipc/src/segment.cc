#include "kvagent/ipc/segment.h"
#include "kvagent/common/errno_text.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include "kvagent/common/format.h"

namespace kvagent::ipc {

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

Segment::Segment(uint8_t* base, uint64_t bytes, const SegmentLayout& layout, int fd)
    : base_(base), mapped_bytes_(bytes), layout_(layout), fd_(fd) {}

Segment::Segment(Segment&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      layout_(other.layout_),
      fd_(std::exchange(other.fd_, -1)) {}

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    this->~Segment();
    new (this) Segment(std::move(other));
  }
  return *this;
}

Segment::~Segment() {
  if (base_ != nullptr) ::munmap(base_, mapped_bytes_);
  CloseFd();
}

void Segment::CloseFd() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

RingRef Segment::request_ring() const {
  return {reinterpret_cast<RingControl*>(base_ + layout_.request_control),
          base_ + layout_.request_data, layout_.request_ring_bytes};
}

RingRef Segment::completion_ring() const {
  return {reinterpret_cast<RingControl*>(base_ + layout_.completion_control),
          base_ + layout_.completion_data, layout_.completion_ring_bytes};
}

namespace {

// The seals every segment carries: its size is fixed for the life of both mappings, and the
// client cannot remove the seals.
constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

Result<uint8_t*> Map(int fd, uint64_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return Internal("cannot map a segment of " + FormatBytes(bytes) + ": " + ErrnoText(errno));
  }
  return static_cast<uint8_t*>(p);
}

}  // namespace

Result<Segment> Segment::Create(const SegmentLayout& layout, uint64_t agent_incarnation,
                                uint64_t client_id) {
  const std::string name = "kvagent-client-" + std::to_string(client_id);
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return Internal(
        std::string("memfd_create failed: ") + ErrnoText(errno) +
        (errno == EMFILE || errno == ENFILE ? "; raise the agent's open-file limit" : ""));
  }
  struct FdGuard {
    int fd;
    ~FdGuard() {
      if (fd >= 0) ::close(fd);
    }
  } guard{fd};
  const auto bytes = static_cast<off_t>(layout.total_bytes);
  if (::ftruncate(fd, bytes) != 0) {
    return Internal("cannot size a segment to " + FormatBytes(layout.total_bytes) + ": " +
                    ErrnoText(errno));
  }
  // Allocate every page now: memory that is not there is a clear error here, not a SIGBUS in
  // the agent (or the client) on first touch.
  int rc;
  do {
    rc = ::fallocate(fd, 0, 0, bytes);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    return Status(ErrorCode::kNoSpace,
                  "cannot allocate " + FormatBytes(layout.total_bytes) +
                      " for the client's segment (" + ErrnoText(err) +
                      "): the node is short of memory; connect with a smaller arena_bytes, or "
                      "lower the agent's --max-arena-bytes");
  }
  if (::fcntl(fd, F_ADD_SEALS, kSeals) != 0) {
    return Internal(std::string("cannot seal the segment: ") + ErrnoText(errno));
  }
  auto base = Map(fd, layout.total_bytes);
  if (!base.ok()) return base.status();
  Segment segment(*base, layout.total_bytes, layout, std::exchange(guard.fd, -1));
  // Fresh pages are zero: a valid empty ring. Construct the atomics in place.
  auto* header = new (segment.base_) SegmentHeader{};
  header->magic = kSegmentMagic;
  header->layout_version = kSegmentLayoutVersion;
  header->header_bytes = static_cast<uint32_t>(kPageBytes);
  header->agent_incarnation = agent_incarnation;
  header->client_id = client_id;
  header->layout = layout;
  new (segment.base_ + layout.request_control) RingControl{};
  new (segment.base_ + layout.completion_control) RingControl{};
  return segment;
}

Result<Segment> Segment::Open(int fd, uint64_t expected_bytes) {
  struct FdGuard {
    int fd;
    ~FdGuard() {
      if (fd >= 0) ::close(fd);
    }
  } guard{fd};
  if (fd < 0) return Internal("the agent passed no segment descriptor; upgrade the agent");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != expected_bytes ||
      expected_bytes < kPageBytes) {
    return Internal("the segment is " + std::to_string(st.st_size) + " bytes, expected " +
                    std::to_string(expected_bytes) + "; the agent and SDK disagree");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return Internal("the segment is not sealed against shrinking; upgrade the agent");
  }
  auto base = Map(fd, expected_bytes);
  if (!base.ok()) return base.status();
  Segment segment(*base, expected_bytes, SegmentLayout{}, -1);
  const SegmentHeader& header = segment.header();
  if (header.magic != kSegmentMagic || header.layout_version != kSegmentLayoutVersion) {
    return Internal("the segment has layout version " + std::to_string(header.layout_version) +
                    ", this SDK speaks " + std::to_string(kSegmentLayoutVersion) +
                    "; upgrade the SDK or the agent");
  }
  SegmentLayout layout = header.layout;
  if (!LayoutIsSane(layout) || layout.total_bytes != expected_bytes) {
    return Internal("the segment has an inconsistent layout; restart the agent");
  }
  segment.layout_ = layout;
  return segment;
}

}  // namespace kvagent::ipc
