#include "kvagent/common/process_fds.h"

#include <dirent.h>
#include <glog/logging.h>
#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace kvagent {

FdLimit RaiseFdLimit() {
  FdLimit out;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return out;
  out.soft_before = out.soft = limit.rlim_cur;
  out.hard = limit.rlim_max;
  const rlim_t wanted = std::min<rlim_t>(limit.rlim_max, kMaxFdLimit);
  if (wanted > limit.rlim_cur) {
    rlimit raised = limit;
    raised.rlim_cur = wanted;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) out.soft = wanted;
  }
  return out;
}

std::string DescribeFdLimit(const FdLimit& limit) {
  std::string out = "file descriptors: up to " + std::to_string(limit.soft);
  out += limit.soft != limit.soft_before
             ? " (raised from " + std::to_string(limit.soft_before) + "; hard limit "
             : " (hard limit ";
  return out +
         (limit.hard == RLIM_INFINITY ? std::string("unlimited") : std::to_string(limit.hard)) +
         ")";
}

uint64_t FdSoftLimit() {
  rlimit limit{};
  return getrlimit(RLIMIT_NOFILE, &limit) == 0 ? limit.rlim_cur : 0;
}

namespace {

// Entries of an open /proc/self/fd, read afresh from its start, less the directory's own.
int64_t CountEntries(DIR* dir) {
  rewinddir(dir);
  int64_t count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  return count - 1;
}

// Opens /proc/self/fd; *full when that failed for want of a descriptor.
DIR* OpenFdDirectory(bool* full) {
  DIR* dir = opendir("/proc/self/fd");
  *full = dir == nullptr && (errno == EMFILE || errno == ENFILE);
  return dir;
}

}  // namespace

int64_t OpenFdCount() {
  bool full = false;
  DIR* dir = OpenFdDirectory(&full);
  if (dir == nullptr) return full ? static_cast<int64_t>(FdSoftLimit()) : -1;
  const int64_t count = CountEntries(dir);
  closedir(dir);
  return count;
}

void AppendFdMetrics(metrics::Exposition* out) {
  const int64_t open = OpenFdCount();
  if (open >= 0) {
    out->Gauge("process_open_fds", "file descriptors this process has open",
               static_cast<double>(open));
  }
  out->Gauge("process_max_fds", "the process's file descriptor limit (RLIMIT_NOFILE, soft)",
             static_cast<double>(FdSoftLimit()));
}

FdUseWord JudgeFdUse(int64_t open, uint64_t limit, bool* warned) {
  if (open < 0 || limit == 0) return FdUseWord::kNone;
  const auto used = static_cast<uint64_t>(open);
  if (!*warned && used * 10 >= limit * 9) {
    *warned = true;
    return FdUseWord::kWarn;
  }
  if (*warned && used * 10 < limit * 8) {
    *warned = false;
    return FdUseWord::kRecovered;
  }
  return FdUseWord::kNone;
}

FdUseWatch::FdUseWatch(std::string daemon, std::chrono::milliseconds period)
    : daemon_(std::move(daemon)), period_(period), thread_([this] { Run(); }) {}

FdUseWatch::~FdUseWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void FdUseWatch::Run() {
  pthread_setname_np(pthread_self(), "fd-watch");
  // Opened once and kept: a look must not need the descriptor that may be the last one.
  bool full = false;
  DIR* dir = OpenFdDirectory(&full);
  bool warned = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, period_, [this] { return stop_; })) {
    const int64_t open = dir != nullptr ? CountEntries(dir) : OpenFdCount();
    const uint64_t limit = FdSoftLimit();
    switch (JudgeFdUse(open, limit, &warned)) {
      case FdUseWord::kWarn:
        LOG(ERROR) << daemon_ << ": " << open << " of " << limit
                   << " file descriptors in use: while none is left, new connections (agents, "
                      "event subscribers, clients, peers) are refused; raise LimitNOFILE (the "
                      "hard limit) in the service's unit";
        break;
      case FdUseWord::kRecovered:
        LOG(INFO) << daemon_ << ": file descriptors back to " << open << " of " << limit;
        break;
      case FdUseWord::kNone:
        break;
    }
  }
  if (dir != nullptr) closedir(dir);
}

}  // namespace kvagent
