#include "state_dir_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "kvagent/common/errno_text.h"

namespace kvagent::master {

Result<UniqueFd> LockStateDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return InvalidParams("--state-dir " + dir + ": cannot create it (" + ec.message() +
                         "); give a writable directory");
  }
  const std::string path = dir + "/kvmaster.lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (fd.get() < 0) {
    return InvalidParams("--state-dir " + dir + ": cannot open " + path + ": " + ErrnoText(errno) +
                         "; give a writable directory");
  }
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;  // the whole file (l_start 0, l_len 0)
  if (::fcntl(fd.get(), F_SETLK, &lock) == 0) return fd;
  const int err = errno;
  if (err != EACCES && err != EAGAIN) {
    return InvalidParams("--state-dir " + dir + ": cannot lock " + path + ": " + ErrnoText(err));
  }
  std::string holder = "another process";
  struct flock held = lock;
  if (::fcntl(fd.get(), F_GETLK, &held) == 0 && held.l_type != F_UNLCK) {
    holder = "process " + std::to_string(held.l_pid);
  }
  return InvalidParams("--state-dir " + dir + " is in use by another kvmaster (" + holder +
                       " holds " + path +
                       "): each kvmaster needs a state dir of its own; stop the other one, or "
                       "give this one another --state-dir");
}

}  // namespace kvagent::master
