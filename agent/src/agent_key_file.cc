#include "agent_key_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <random>

#include "kvagent/common/errno_text.h"
#include "kvagent/common/private_file.h"

namespace kvagent::agent {
namespace {

constexpr size_t kKeyFileBytes = 17;  // 16 hexadecimal digits and a newline

uint64_t DrawKey() {
  uint64_t key = 0;
  if (::getrandom(&key, sizeof(key), 0) != static_cast<ssize_t>(sizeof(key))) {
    std::random_device rd;  // the same source, through the C++ library
    key = (uint64_t{rd()} << 32) | rd();
  }
  return key == 0 ? 1 : key;
}

Result<uint64_t> ParseKey(const std::string& text, const std::string& what) {
  uint64_t key = 0;
  bool ok = text.size() == kKeyFileBytes && text.back() == '\n';
  for (size_t i = 0; ok && i + 1 < kKeyFileBytes; ++i) {
    const char c = text[i];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    ok = digit >= 0;
    key = (key << 4) | static_cast<uint64_t>(digit & 0xf);
  }
  if (!ok || key == 0) {
    return InvalidParams(what +
                         " is not an agent key (16 lowercase hexadecimal digits, not all 0, and a "
                         "newline): remove it, and this agent draws a new key (kvmaster then "
                         "gives it this agent's name once the agent that held it was silent for "
                         "the agent TTL)");
  }
  return key;
}

// Writes `key` to `path` through a file beside it renamed into place: a crash leaves either no
// file or a whole one.
Status WriteKey(const std::string& path, uint64_t key) {
  const std::string aside = path + ".new";
  ::unlink(aside.c_str());
  const int fd = ::open(aside.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Internal("cannot create " + aside + ": " + ErrnoText(errno));
  char text[kKeyFileBytes + 1];
  std::snprintf(text, sizeof(text), "%016llx\n", static_cast<unsigned long long>(key));
  const bool written =
      ::write(fd, text, kKeyFileBytes) == static_cast<ssize_t>(kKeyFileBytes) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!written || ::rename(aside.c_str(), path.c_str()) != 0) {
    const int rename_err = written ? errno : err;
    ::unlink(aside.c_str());
    return Internal("cannot write the agent key to " + path + ": " + ErrnoText(rename_err));
  }
  return Status::Ok();
}

}  // namespace

Result<AgentKey> LoadOrCreateAgentKey(const std::string& run_dir) {
  const std::string path = run_dir + "/" + kAgentKeyFile;
  const std::string what = "the agent key file " + path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return InvalidParams("cannot stat " + what + ": " + ErrnoText(errno));
    AgentKey key{DrawKey(), ""};
    if (Status written = WriteKey(path, key.value); !written.ok()) key.unsaved = written.message();
    return key;
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidParams(what +
                         " is not a regular file: remove it, and this agent draws a new key");
  }
  auto text = ReadPrivateFile(path, what, kKeyFileBytes);
  if (!text.ok()) return text.status();
  auto key = ParseKey(*text, what);
  WipeString(*text);
  if (!key.ok()) return key.status();
  return AgentKey{*key, ""};
}

}  // namespace kvagent::agent
