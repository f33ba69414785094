#include "kvagent/common/heap_pages.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>

namespace kvagent {
namespace {

constexpr std::string_view kTunable = "glibc.malloc.hugetlb=1";
constexpr std::string_view kTopPad = "glibc.malloc.top_pad=";

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kGlibcMalloc = false;
#else
constexpr bool kGlibcMalloc = true;
#endif

// The kernel's THP mode: "always", "madvise" or "never" (empty when it does not say).
std::string ThpMode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  const size_t open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "";
  return line.substr(open + 1, close - open - 1);
}

bool TunableSet() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  return tunables != nullptr && std::string_view(tunables).find(kTunable) != std::string::npos;
}

// The operator turned a heap setting off: environment `name` is "0".
bool TurnedOff(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "0") == 0;
}

bool OptedOut() { return TurnedOff("KVAGENT_HUGE_HEAP"); }

bool one_arena = false;  // set by UseOneMallocArena, in main() before any thread

std::string PagesDescription() {
  if (!kGlibcMalloc) return "4 KiB pages (sanitizer build)";
  if (TunableSet()) return "transparent huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1)";
  if (OptedOut()) return "4 KiB pages (KVAGENT_HUGE_HEAP=0)";
  const std::string mode = ThpMode();
  if (mode != "always" && mode != "madvise") {
    return "4 KiB pages (the kernel's transparent huge pages are " +
           (mode.empty() ? std::string("unknown") : mode) + ")";
  }
  return "4 KiB pages (re-executing with GLIBC_TUNABLES failed)";
}

}  // namespace

void UseOneMallocArena() {
  if (!kGlibcMalloc || TurnedOff("KVAGENT_ONE_ARENA")) return;
  one_arena = mallopt(M_ARENA_MAX, 1) == 1;
}

void PreferHugePageHeap(char** argv, size_t top_pad_bytes) {
  if (!kGlibcMalloc || OptedOut() || TunableSet()) return;
  const std::string mode = ThpMode();
  if (mode != "always" && mode != "madvise") return;
  const char* old = std::getenv("GLIBC_TUNABLES");
  std::string tunables = old != nullptr && *old != '\0' ? std::string(old) + ":" : std::string();
  tunables += kTunable;
  // An operator's own top pad wins.
  if (top_pad_bytes > 0 && tunables.find(kTopPad) == std::string::npos) {
    tunables += ":" + std::string(kTopPad) + std::to_string(top_pad_bytes);
  }
  if (setenv("GLIBC_TUNABLES", tunables.c_str(), 1) != 0) return;
  // Exec the binary by its real path, not /proc/self/exe: the kernel names the process after
  // the file exec'd (comm), and operators find kvagent and kvmaster by that name (ps, pgrep,
  // systemd's status). (A starting agent tells a live agent's segments by its pid alone:
  // ipc/segment.h, RemoveStaleSegments.)
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
    execv(self, argv);
  }
  // exec failed (no /proc?): go on with 4 KiB pages; HeapPagesDescription() says so.
  if (old != nullptr) {
    setenv("GLIBC_TUNABLES", old, 1);
  } else {
    unsetenv("GLIBC_TUNABLES");
  }
}

std::string HeapPagesDescription() {
  if (!kGlibcMalloc) return PagesDescription();
  std::string out =
      PagesDescription() + (one_arena ? ", one malloc arena" : ", a malloc arena per thread");
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const size_t pad =
      tunables == nullptr ? std::string_view::npos : std::string_view(tunables).find(kTopPad);
  if (pad != std::string_view::npos) {
    const long long bytes = std::atoll(tunables + pad + kTopPad.size());
    out += ", heap grown and kept " + std::to_string(bytes >> 20) + " MiB at a time";
  }
  return out;
}

}  // namespace kvagent
