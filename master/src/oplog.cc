#include "kvagent/master/oplog.h"
#include "kvagent/common/errno_text.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "forked_writer.h"
#include "kvagent/common/checksum.h"
#include "kvagent/common/unique_fd.h"

namespace kvagent::master {
namespace {

constexpr char kHeader[16] = {'K', 'V', 'O', 'P', 'L', 'O', 'G', 2, 2, 0, 0, 0, 0, 0, 0, 0};
constexpr uint64_t kHeaderBytes = sizeof(kHeader);
constexpr uint32_t kRecordMagic = 0x4352564B;  // "KVRC" little-endian
constexpr uint32_t kMaxRecordBytes = OpLog::kMaxRecordBytes;
constexpr uint64_t kV1FrameBytes = 8;
constexpr uint64_t kProbeBytes = 64 << 10;  // what Probe asks of a disk that was full
// A background rewrite: the most records it keeps for its new file while the child writes (the
// log grew faster than the child could write the snapshot: it is given up, and tried later).
constexpr size_t kMaxRewriteTail = 256u << 20;

uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// The version 1 frame checksum (FNV-1a), read only.
uint32_t Fnv1a(std::string_view data) {
  uint32_t h = 2166136261u;
  for (unsigned char c : data) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

uint32_t FrameCrc(uint32_t length, std::string_view payload) {
  char len[4];
  for (int i = 0; i < 4; ++i) len[i] = static_cast<char>(length >> (8 * i));
  return Crc32c(payload.data(), payload.size(), Crc32c(len, 4));
}

// The frame at `pos` of `data` when it is intact: its payload.
bool IntactFrame(std::string_view data, uint64_t pos, std::string_view* payload) {
  if (data.size() - pos < OpLog::kFrameBytes) return false;
  const char* p = data.data() + pos;
  if (LoadU32(p) != kRecordMagic) return false;
  const uint32_t len = LoadU32(p + 4);
  if (len > kMaxRecordBytes || data.size() - pos - OpLog::kFrameBytes < len) return false;
  *payload = data.substr(pos + OpLog::kFrameBytes, len);
  return FrameCrc(len, *payload) == LoadU32(p + 8);
}

// Whether any intact record starts after `pos` (so what is bad at `pos` is not a torn tail).
bool IntactFrameAfter(std::string_view data, uint64_t pos) {
  std::string_view payload;
  for (uint64_t at = pos + 1; at + OpLog::kFrameBytes <= data.size(); ++at) {
    if (static_cast<unsigned char>(data[at]) == (kRecordMagic & 0xFF) &&
        IntactFrame(data, at, &payload)) {
      return true;
    }
  }
  return false;
}

Status WriteFully(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal("cannot write " + path + ": " + ErrnoText(errno));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string_view LogSyncName(LogSync sync) { return sync == LogSync::kFsync ? "fsync" : "write"; }

Result<LogSync> ParseLogSync(std::string_view text) {
  if (text == "write") return LogSync::kWrite;
  if (text == "fsync") return LogSync::kFsync;
  return InvalidParams("--log-sync '" + std::string(text) +
                       "': use write (survives a kvmaster crash) or fsync (also a power loss)");
}

void RecordWriter::U32(uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out_->append(b, 4);
}

void RecordWriter::U64(uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  out_->append(b, 8);
}

void RecordWriter::Str(std::string_view s) {
  U32(static_cast<uint32_t>(s.size()));
  out_->append(s);
}

bool RecordReader::Need(size_t n) {
  if (!ok_ || in_.size() - pos_ < n) {
    ok_ = false;
    return false;
  }
  return true;
}

uint8_t RecordReader::U8() {
  if (!Need(1)) return 0;
  return static_cast<uint8_t>(in_[pos_++]);
}

uint32_t RecordReader::U32() {
  if (!Need(4)) return 0;
  uint32_t v = LoadU32(in_.data() + pos_);
  pos_ += 4;
  return v;
}

uint64_t RecordReader::U64() {
  uint64_t lo = U32();
  uint64_t hi = U32();
  return lo | (hi << 32);
}

std::string_view RecordReader::Str() {
  uint32_t n = U32();
  if (!Need(n)) return {};
  std::string_view s = in_.substr(pos_, n);
  pos_ += n;
  return s;
}

OpLog::OpLog(std::string dir, std::string path, int fd, OpLogOptions options)
    : dir_(std::move(dir)), path_(std::move(path)), fd_(fd), options_(options) {}

OpLog::~OpLog() {
  AbandonRewrite();
  (void)Flush();
  if (fd_ >= 0) {
    // Give back what was preallocated beyond the records.
    if (reserved_end_ > file_bytes_) (void)::ftruncate(fd_, static_cast<off_t>(file_bytes_));
    ::close(fd_);
  }
}

Result<std::unique_ptr<OpLog>> OpLog::Open(const std::string& dir, OpLogOptions options) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return InvalidParams("--state-dir " + dir + ": cannot create it (" + ec.message() +
                         "); give a writable directory");
  }
  std::string path = dir + "/master.oplog";
  // Owner only: the log holds the agents' keys (master.fbs RegisterAgent.agent_key).
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) {
    return InvalidParams("cannot open " + path + ": " + ErrnoText(errno) +
                         "; give a writable --state-dir");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Internal("cannot stat " + path + ": " + ErrnoText(errno));
  }
  if ((st.st_mode & 077) != 0 && ::fchmod(fd, st.st_mode & 07700) != 0) {  // an older kvmaster's
    LOG(WARNING) << "cannot make " << path << " readable by its owner only: " << ErrnoText(errno);
  }
  // Space a previous process preallocated beyond its last record (it died before giving it
  // back) is released: a nearly full disk needs it to compact and to take new records.
  (void)::ftruncate(fd, st.st_size);
  auto log = std::unique_ptr<OpLog>(new OpLog(dir, std::move(path), fd, options));
  log->file_bytes_ = static_cast<uint64_t>(st.st_size);
  log->reserved_end_ = log->file_bytes_;
  return log;
}

Status OpLog::CutAt(uint64_t offset, const std::string& why) {
  LOG(WARNING) << "operation log " << path_ << ": " << why << "; cutting the file at byte "
               << offset << " (" << (file_bytes_ - offset) << " byte(s) dropped)";
  if (::ftruncate(fd_, static_cast<off_t>(offset)) != 0) {
    return Internal("cannot truncate " + path_ + ": " + ErrnoText(errno));
  }
  file_bytes_ = reserved_end_ = offset;
  return Status::Ok();
}

Result<uint64_t> OpLog::Replay(const std::function<Status(std::string_view)>& apply) {
  std::string data;
  if (::lseek(fd_, 0, SEEK_SET) < 0) return Internal("cannot seek " + path_);
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Internal("cannot read " + path_ + ": " + ErrnoText(errno));
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  file_bytes_ = reserved_end_ = data.size();
  uint64_t count = 0;
  if (data.empty()) return count;
  if (data.size() < kHeaderBytes || std::memcmp(data.data(), kHeader, 8) != 0) {
    std::string_view first;
    if (data.size() <= kHeaderBytes &&
        std::memcmp(data.data(), kHeader, std::min<size_t>(data.size(), 8)) == 0) {
      // The master died writing the header of a new log: no record was ever in it.
      KVAGENT_RETURN_IF_ERROR(CutAt(0, "torn header of a new log (no record)"));
      return count;
    }
    if (data.size() > kHeaderBytes && IntactFrame(data, kHeaderBytes, &first)) {
      // A format-2 log whose header was damaged: its records are intact (each has its CRC), and
      // the header holds nothing but the format. Read it as format 2 and write the header anew.
      LOG(ERROR) << "operation log " << path_ << ": its 16-byte header is damaged, the records "
                 << "after it are intact; reading it as format 2 and writing the header anew";
      // Through a descriptor of its own: pwrite on the log's (O_APPEND) would append.
      UniqueFd header(::open(path_.c_str(), O_WRONLY | O_CLOEXEC));
      if (!header.valid() ||
          ::pwrite(header.get(), kHeader, kHeaderBytes, 0) != static_cast<ssize_t>(kHeaderBytes) ||
          ::fdatasync(header.get()) != 0) {
        return Internal("cannot repair the header of " + path_ + ": " + ErrnoText(errno));
      }
    } else {
      KVAGENT_RETURN_IF_ERROR(ReplayV1(data, apply, &count));
      needs_rewrite_ = true;  // records can only be appended in format 2
      return count;
    }
  }
  uint64_t pos = kHeaderBytes;
  while (pos < data.size()) {
    std::string_view payload;
    std::string why;
    if (IntactFrame(data, pos, &payload)) {
      Status applied = apply(payload);
      if (applied.ok()) {
        pos += kFrameBytes + payload.size();
        ++count;
        continue;
      }
      why = "record " + std::to_string(count + 1) + " does not parse (" + applied.message() + ")";
    } else {
      why = "record " + std::to_string(count + 1) + " fails its checksum";
    }
    if (!IntactFrameAfter(data, pos)) {
      // Nothing intact follows: the master died while writing its last records.
      KVAGENT_RETURN_IF_ERROR(CutAt(
          pos, "torn tail after " + std::to_string(count) + " intact record(s) (" + why + ")"));
      return count;
    }
    if (options_.truncate_damaged) {
      KVAGENT_RETURN_IF_ERROR(CutAt(pos, "damaged: " + why + " (--truncate-damaged-log)"));
      return count;
    }
    return Internal("the operation log " + path_ + " is damaged at byte offset " +
                    std::to_string(pos) + ": " + why + ", and intact records follow it. " +
                    "kvmaster does not start on a damaged log. Choices: restore the state dir "
                    "from a backup; or start once with --truncate-damaged-log to keep the " +
                    std::to_string(count) + " record(s) before offset " + std::to_string(pos) +
                    " and drop the " + std::to_string(data.size() - pos) +
                    " byte(s) from there on; or move the file aside to start empty");
  }
  return count;
}

Status OpLog::ReplayV1(std::string_view data, const std::function<Status(std::string_view)>& apply,
                       uint64_t* count) {
  uint64_t pos = 0;
  while (data.size() - pos >= kV1FrameBytes) {
    const uint32_t len = LoadU32(data.data() + pos);
    const uint32_t sum = LoadU32(data.data() + pos + 4);
    if (len > kMaxRecordBytes || data.size() - pos - kV1FrameBytes < len) break;  // torn
    std::string_view payload = data.substr(pos + kV1FrameBytes, len);
    Status applied = Fnv1a(payload) == sum ? apply(payload) : Internal("checksum mismatch");
    if (!applied.ok()) {
      if (options_.truncate_damaged) {
        return CutAt(
            pos, "damaged version-1 record (" + applied.message() + ") (--truncate-damaged-log)");
      }
      return Internal("the operation log " + path_ + " (format version 1) is damaged at byte " +
                      "offset " + std::to_string(pos) + " (" + applied.message() +
                      "). Choices: restore the state dir from a backup; or start once with " +
                      "--truncate-damaged-log to keep the " + std::to_string(*count) +
                      " record(s) before it; or move the file aside to start empty");
    }
    pos += kV1FrameBytes + len;
    ++*count;
  }
  if (pos == 0) {
    // Not one record: this is no version-1 log, nor a format-2 log whose header alone is
    // damaged. Cutting it would silently start empty.
    return Internal("the operation log " + path_ + " is damaged at its start: it has neither the " +
                    "format-2 header nor an intact first record of either format. kvmaster does " +
                    "not start on a damaged log. Choices: restore the state dir from a backup; " +
                    "or move the file aside to start empty");
  }
  if (pos != data.size()) return CutAt(pos, "torn tail of a version-1 log");
  return Status::Ok();
}

void OpLog::Frame(std::string_view payload, std::string* out) {
  RecordWriter w(out);
  const auto len = static_cast<uint32_t>(payload.size());
  w.U32(kRecordMagic);
  w.U32(len);
  w.U32(FrameCrc(len, payload));
  out->append(payload);
}

bool OpLog::Preallocate(uint64_t end) {
  if (end <= reserved_end_) return true;
  const uint64_t target = std::max(end, reserved_end_ + options_.reserve_chunk);
  int rc = ::fallocate(fd_, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(reserved_end_),
                       static_cast<off_t>(target - reserved_end_));
  if (rc == 0) {
    reserved_end_ = target;
    return true;
  }
  if (errno == EOPNOTSUPP) {
    // A file system without fallocate: the best we can do is to see the free space.
    struct statvfs vfs {};
    if (::fstatvfs(fd_, &vfs) == 0 &&
        static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize >= target - reserved_end_) {
      reserved_end_ = target;
      return true;
    }
    errno = ENOSPC;
  }
  if (target > end) {
    // Less than a chunk may still fit: ask for exactly what is needed.
    rc = ::fallocate(fd_, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(reserved_end_),
                     static_cast<off_t>(end - reserved_end_));
    if (rc == 0) {
      reserved_end_ = end;
      return true;
    }
  }
  return false;
}

bool OpLog::Reserve(uint64_t payload_bytes, uint64_t records) {
  const uint64_t need = payload_bytes + records * kFrameBytes;
  const uint64_t base = file_bytes_ == 0 ? kHeaderBytes : file_bytes_;  // a new file's header
  const uint64_t end = base + buffer_.size() + granted_ + need;
  const bool fits = end <= reserved_end_;
  // The clock only when the disk is asked (a record that fits is the common case).
  const int64_t now = fits ? 0 : NowNs();
  if (!fits && !writable_ && now < next_retry_ns_) return false;  // asked the disk just now
  if (fits || Preallocate(end) || (GiveUpRewriteForRoom() && Preallocate(end))) {
    if (!writable_) {
      LOG(WARNING) << "operation log " << path_ << ": the state dir takes records again; "
                   << "mutating requests resume";
    }
    writable_ = true;
    error_.clear();
    granted_ += need;
    return true;
  }
  const std::string reason = ErrnoText(errno);
  if (writable_) {
    LOG(ERROR) << "operation log " << path_ << ": cannot reserve " << need << " byte(s): " << reason
               << ". kvmaster refuses every change (puts, removes, registrations) until the "
               << "state dir has room again; reads go on. Free space in " << dir_;
  }
  writable_ = false;
  error_ = "kvmaster's state dir is full or failing (" + reason + " reserving " +
           std::to_string(need) + " bytes for " + path_ +
           "); the change was not made. Writes resume by themselves once " + dir_ +
           " has room again; retry later";
  next_retry_ns_ = now + 100'000'000;
  return false;
}

bool OpLog::GiveUpRewriteForRoom() {
  if (rewrite_ == nullptr) return false;
  const int reason = errno;
  LOG(WARNING) << "operation log " << path_ << ": the state dir has no room for new records ("
               << ErrnoText(reason) << "); giving up the compaction that runs, to free its space";
  AbandonRewrite();
  errno = reason;
  return true;
}

bool OpLog::Probe() {
  if (writable_) return true;
  // Room beyond what is reserved: the disk really has space again.
  if (!Preallocate(reserved_end_ + kProbeBytes)) return false;
  LOG(WARNING) << "operation log " << path_ << ": the state dir takes records again; "
               << "mutating requests resume";
  writable_ = true;
  error_.clear();
  next_retry_ns_ = 0;
  return true;
}

void OpLog::Append(std::string_view payload) {
  Frame(payload, &buffer_);
  granted_ -= std::min<uint64_t>(granted_, kFrameBytes + payload.size());
  ++records_;
}

Status OpLog::Flush() {
  if (buffer_.empty() || fd_ < 0) return Status::Ok();
  if (file_bytes_ == 0) {
    buffer_.insert(0, kHeader, kHeaderBytes);
  }
  Status st = WriteFully(fd_, buffer_, path_);
  if (st.ok() && options_.sync == LogSync::kFsync && ::fdatasync(fd_) != 0) {
    st = Internal("cannot fdatasync " + path_ + ": " + ErrnoText(errno));
  }
  if (!st.ok()) {
    // Leave no partial record behind, and nothing buffered: a caller that still wants the
    // records appends them again (a standby fetches them again), and a buffer kept here would
    // hold them twice, growing with every retry while the disk stays full.
    (void)::ftruncate(fd_, static_cast<off_t>(file_bytes_));
    buffer_.clear();
    return st;
  }
  if (rewrite_ != nullptr && !rewrite_->too_long) {
    // What the child's file needs after its snapshot (never the header of a new file: a
    // rewrite starts from a flushed, non-empty log).
    rewrite_->tail.append(buffer_, file_bytes_ == 0 ? kHeaderBytes : 0);
    if (rewrite_->tail.size() > kMaxRewriteTail) {
      rewrite_->too_long = true;
      rewrite_->tail = std::string();
    }
  }
  file_bytes_ += buffer_.size();
  reserved_end_ = std::max(reserved_end_, file_bytes_);
  buffer_.clear();
  return Status::Ok();
}

Status OpLog::Rewrite(
    const std::function<void(const std::function<void(std::string_view)>&)>& write_all) {
  AbandonRewrite();
  KVAGENT_RETURN_IF_ERROR(Flush());
  const std::string tmp = path_ + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Internal("cannot create " + tmp + ": " + ErrnoText(errno));
  if (const int failed = WriteLogFile(fd, write_all); failed != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return Internal("cannot write " + tmp + ": " + ErrnoText(failed));
  }
  return Install(fd, tmp);
}

int OpLog::WriteLogFile(
    int fd, const std::function<void(const std::function<void(std::string_view)>&)>& write_all) {
  std::string out(kHeader, kHeaderBytes);
  int failed = 0;
  write_all([&](std::string_view payload) {
    Frame(payload, &out);
    if (out.size() >= (1u << 20) && failed == 0) {
      failed = ForkedWriter::WriteAll(fd, out);
      out.clear();
    }
  });
  if (failed == 0) failed = ForkedWriter::WriteAll(fd, out);
  if (failed == 0 && ::fsync(fd) != 0) failed = errno;
  return failed;
}

// Renames the synced file `tmp` (open as `fd`, which this closes) over the log and appends to it
// from now on. On failure the old log stays.
Status OpLog::Install(int fd, const std::string& tmp) {
  struct stat st {};
  const bool sized = ::fstat(fd, &st) == 0;
  const int stat_errno = errno;
  ::close(fd);
  if (!sized) {
    ::unlink(tmp.c_str());
    return Internal("cannot stat " + tmp + ": " + ErrnoText(stat_errno));
  }
  // Opened for appending before the rename: once renamed, records must go nowhere else (a
  // descriptor of the old file would take them into a file no longer linked).
  const int nfd = ::open(tmp.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (nfd < 0) {
    const std::string err = ErrnoText(errno);
    ::unlink(tmp.c_str());
    return Internal("cannot open " + tmp + ": " + err);
  }
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    const std::string err = ErrnoText(errno);
    ::close(nfd);
    ::unlink(tmp.c_str());
    return Internal("cannot rename " + tmp + " to " + path_ + ": " + err);
  }
  // The directory entry of the new file must survive a power loss too.
  if (int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  ::close(fd_);
  fd_ = nfd;
  file_bytes_ = reserved_end_ = static_cast<uint64_t>(st.st_size);
  granted_ = 0;
  needs_rewrite_ = false;
  return Status::Ok();
}

Status OpLog::StartRewrite(
    const std::function<void(const std::function<void(std::string_view)>&)>& write_all) {
  if (rewrite_ != nullptr) return Internal("a rewrite of " + path_ + " runs already");
  if (needs_rewrite_) return Internal(path_ + " must be rewritten at once (version 1)");
  KVAGENT_RETURN_IF_ERROR(Flush());
  const std::string tmp = path_ + ".tmp";
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Internal("cannot create " + tmp + ": " + ErrnoText(errno));
  auto child = ForkedWriter::Start(
      fd, [&write_all](int out_fd) { return WriteLogFile(out_fd, write_all); }, "rewriting " + tmp);
  if (!child.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return child.status();
  }
  rewrite_ = std::make_unique<BackgroundRewrite>();
  rewrite_->child = std::move(child.value());
  rewrite_->fd = fd;
  return Status::Ok();
}

bool OpLog::FinishRewrite(Status* status) {
  *status = Status::Ok();
  if (rewrite_ == nullptr) return true;
  if (rewrite_->too_long) {
    *status = Internal("the log grew by more than " + std::to_string(kMaxRewriteTail >> 20) +
                       " MiB while " + path_ + " was rewritten; given up");
    AbandonRewrite();
    return true;
  }
  if (!rewrite_->child->Done(status)) return false;  // still writing
  if (!status->ok()) {
    EndRewrite();
    return true;
  }
  // The child's snapshot is in the file, synced; what was flushed since goes after it.
  const std::string tmp = path_ + ".tmp";
  *status = Flush();
  if (status->ok() && ::lseek(rewrite_->fd, 0, SEEK_END) < 0) {
    *status = Internal("cannot seek in " + tmp + ": " + ErrnoText(errno));
  }
  if (status->ok()) *status = WriteFully(rewrite_->fd, rewrite_->tail, tmp);
  if (status->ok() && ::fsync(rewrite_->fd) != 0) {
    *status = Internal("cannot fsync " + tmp + ": " + ErrnoText(errno));
  }
  if (!status->ok()) {
    EndRewrite();
    return true;
  }
  const int fd = rewrite_->fd;
  rewrite_->fd = -1;
  rewrite_.reset();
  *status = Install(fd, tmp);
  return true;
}

void OpLog::AbandonRewrite() {
  if (rewrite_ == nullptr) return;
  rewrite_->child.reset();  // killed and waited for
  EndRewrite();
}

// Closes and removes the file of a rewrite whose child is done (or was never waited for).
void OpLog::EndRewrite() {
  if (rewrite_ == nullptr) return;
  rewrite_->child.reset();
  if (rewrite_->fd >= 0) ::close(rewrite_->fd);
  ::unlink((path_ + ".tmp").c_str());
  rewrite_.reset();
}

}  // namespace kvagent::master
