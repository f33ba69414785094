// UseOneMallocArena: every thread then allocates from glibc's main arena (malloc_info lists one
// heap); with KVAGENT_ONE_ARENA=0 (ctest runs the test both ways) each thread gets its own.
// A binary of its own: the arena limit is fixed the first time a second thread allocates, so
// nothing may start threads before the test does.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "kvagent/common/heap_pages.h"

namespace {

// How many arenas malloc_info reports (one <heap nr="..."> element each).
int ArenaCount() {
  char* text = nullptr;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  if (out == nullptr) return -1;
  malloc_info(0, out);
  std::fclose(out);
  int n = 0;
  for (const char* p = text; (p = std::strstr(p, "<heap nr=")) != nullptr; ++p) ++n;
  std::free(text);
  return n;
}

TEST(OneMallocArena, ThreadsAllocateFromOneArenaUnlessOptedOut) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizer builds use their own allocator";
#endif
  kvagent::UseOneMallocArena();
  const char* opt = std::getenv("KVAGENT_ONE_ARENA");
  const bool opted_out = opt != nullptr && std::string(opt) == "0";
  constexpr int kThreads = 4;
  std::latch all_allocated(kThreads);
  std::latch done(1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      std::vector<std::string> held;
      for (int i = 0; i < 1000; ++i) held.emplace_back(200, 'x');  // past the thread's cache
      all_allocated.count_down();
      done.wait();  // alive together: none inherits an arena another thread left
    });
  }
  all_allocated.wait();
  const int arenas = ArenaCount();
  done.count_down();
  for (auto& t : threads) t.join();
  if (opted_out) {
    EXPECT_GT(arenas, 1) << "glibc's default gives the threads arenas of their own";
  } else {
    EXPECT_EQ(arenas, 1);
    EXPECT_NE(kvagent::HeapPagesDescription().find("one malloc arena"), std::string::npos)
        << kvagent::HeapPagesDescription();
  }
}

}  // namespace
