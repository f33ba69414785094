#include "kvagent/common/private_file.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "kvagent/common/errno_text.h"

namespace kvagent {
namespace {

std::string Octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

}  // namespace

Result<std::string> ReadPrivateFile(const std::string& path, const std::string& what,
                                    size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return InvalidParams("cannot open " + what + ": " + ErrnoText(err) +
                         (err == EACCES ? " (run as its owner, or give this user a copy)" : ""));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return InvalidParams("cannot stat " + what + ": " + ErrnoText(errno));
  }
  if (!S_ISREG(st.st_mode)) return InvalidParams(what + " is not a regular file");
  if ((st.st_mode & 077) != 0) {
    return InvalidParams(what + " has mode " + Octal(st.st_mode) +
                         ": group or others may access it; run `chmod 600 " + path + "`");
  }
  if (st.st_uid != ::geteuid() && st.st_uid != 0) {
    return InvalidParams(what + " is owned by uid " + std::to_string(st.st_uid) +
                         ", neither this process's user (uid " + std::to_string(::geteuid()) +
                         ") nor root; run `chown " + std::to_string(::geteuid()) + " " + path +
                         "`");
  }
  if (st.st_size > static_cast<off_t>(max_bytes)) {
    return InvalidParams(what + " is " + std::to_string(st.st_size) + " bytes; at most " +
                         std::to_string(max_bytes) + " are expected (is it the right file?)");
  }
  std::string content(max_bytes + 1, '\0');
  size_t got = 0;
  while (got < content.size()) {
    const ssize_t n = ::read(fd, content.data() + got, content.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      WipeString(content);
      return InvalidParams("cannot read " + what + ": " + ErrnoText(errno));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes) {  // it grew since fstat
    WipeString(content);
    return InvalidParams(what + " is larger than " + std::to_string(max_bytes) + " bytes");
  }
  content.resize(got);
  return content;
}

void WipeString(std::string& s) {
  if (!s.empty()) sodium_memzero(s.data(), s.size());
  s.clear();
}

}  // namespace kvagent
