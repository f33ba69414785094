#include "kvagent/master/oplog.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

namespace kvagent::master {
namespace {

uint32_t Checksum(std::string_view data) {
  uint32_t h = 2166136261u;
  for (unsigned char c : data) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

Status WriteFully(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal("cannot write " + path + ": " + std::strerror(errno) +
                      "; check free disk space and permissions of --state-dir");
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

constexpr size_t kHeaderBytes = 8;
constexpr uint32_t kMaxRecordBytes = 64u << 20;

}  // namespace

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

OpLog::OpLog(std::string dir, std::string path, int fd)
    : dir_(std::move(dir)), path_(std::move(path)), fd_(fd) {}

OpLog::~OpLog() {
  (void)Flush();
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<OpLog>> OpLog::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return InvalidParams("--state-dir " + dir + ": cannot create it (" + ec.message() +
                         "); give a writable directory");
  }
  std::string path = dir + "/master.oplog";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return InvalidParams("cannot open " + path + ": " + std::strerror(errno) +
                         "; give a writable --state-dir");
  }
  return std::unique_ptr<OpLog>(new OpLog(dir, std::move(path), fd));
}

Result<uint64_t> OpLog::Replay(const std::function<Status(std::string_view)>& apply) {
  std::string data;
  if (::lseek(fd_, 0, SEEK_SET) < 0) return Internal("cannot seek " + path_);
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Internal("cannot read " + path_ + ": " + std::strerror(errno));
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  size_t pos = 0;
  uint64_t count = 0;
  while (data.size() - pos >= kHeaderBytes) {
    const uint32_t len = LoadU32(data.data() + pos);
    const uint32_t sum = LoadU32(data.data() + pos + 4);
    if (len > kMaxRecordBytes || data.size() - pos - kHeaderBytes < len) break;
    std::string_view payload(data.data() + pos + kHeaderBytes, len);
    if (Checksum(payload) != sum) break;
    KVAGENT_RETURN_IF_ERROR(apply(payload));
    pos += kHeaderBytes + len;
    ++count;
  }
  if (pos != data.size()) {
    // A torn tail: the master died mid-write. Everything before it is intact.
    if (::ftruncate(fd_, static_cast<off_t>(pos)) != 0) {
      return Internal("cannot truncate the torn tail of " + path_ + ": " + std::strerror(errno));
    }
  }
  return count;
}

void OpLog::Frame(std::string_view payload, std::string* out) {
  RecordWriter w(out);
  w.U32(static_cast<uint32_t>(payload.size()));
  w.U32(Checksum(payload));
  out->append(payload);
}

void OpLog::Append(std::string_view payload) {
  Frame(payload, &buffer_);
  ++records_;
}

Status OpLog::Flush() {
  if (buffer_.empty() || fd_ < 0) return Status::Ok();
  Status st = WriteFully(fd_, buffer_, path_);
  buffer_.clear();
  return st;
}

Status OpLog::Rewrite(
    const std::function<void(const std::function<void(std::string_view)>&)>& write_all) {
  KVAGENT_RETURN_IF_ERROR(Flush());
  const std::string tmp = path_ + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Internal("cannot create " + tmp + ": " + std::strerror(errno));
  std::string out;
  Status st;
  write_all([&](std::string_view payload) {
    Frame(payload, &out);
    if (out.size() >= (1u << 20) && st.ok()) {
      st = WriteFully(fd, out, tmp);
      out.clear();
    }
  });
  if (st.ok()) st = WriteFully(fd, out, tmp);
  if (st.ok() && ::fsync(fd) != 0) st = Internal("cannot fsync " + tmp);
  ::close(fd);
  if (!st.ok()) return st;
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    return Internal("cannot rename " + tmp + " to " + path_ + ": " + std::strerror(errno));
  }
  int nfd = ::open(path_.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (nfd < 0) return Internal("cannot reopen " + path_ + ": " + std::strerror(errno));
  ::close(fd_);
  fd_ = nfd;
  return Status::Ok();
}

}  // namespace kvagent::master
