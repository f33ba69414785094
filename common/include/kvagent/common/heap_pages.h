// Transparent huge pages for the heap of kvmaster and kvagent.
//
// The master's metadata is millions of small allocations. With 4 KiB pages every new page of
// heap costs a page fault on first touch, and on a VM that fault is what a put spends most of
// its time in (master_bench: 0.7 M keys/s with 4 KiB pages, 1.5 M with huge pages, same run).
// glibc can ask for transparent huge pages on the memory malloc takes from the kernel, but
// only when told at start-up (GLIBC_TUNABLES=glibc.malloc.hugetlb=1), so the binaries re-execute
// themselves once with that tunable set.
#pragma once

#include <cstddef>
#include <string>

namespace kvagent {

// Call first in main(), before any thread starts or file opens. Re-executes the program by its
// own path (same pid, name, argv and environment, plus GLIBC_TUNABLES=...:glibc.malloc.hugetlb=1)
// when the kernel offers transparent huge pages (enabled: always or madvise) and glibc was not
// told yet.
// Returns without re-executing when KVAGENT_HUGE_HEAP=0, when THP is off, in sanitizer builds
// (their allocator is not glibc's), or when the exec fails.
//
// `top_pad_bytes` > 0 also sets glibc.malloc.top_pad (unless GLIBC_TUNABLES names one): each
// arena then grows by that much at a time and keeps that much when memory is freed at its top.
// A thread's arena otherwise grows a few pages at a time (a mprotect per step) on 4 KiB pages,
// and gives them back when a burst of keys is removed: a store that grows or refills takes a
// first-touch fault every few KiB of metadata, ~15-20 us each on a paravirtualized VM. kvagent
// passes 32 MiB: its service thread's arena holds the embedded master's metadata, and without
// the pad one single-key get in ten took such a fault while a store filled (e2e latency p99
// 18-25 us; with it 4-5 us once the arena had grown).
void PreferHugePageHeap(char** argv, size_t top_pad_bytes = 0);

// One malloc arena for the whole process (mallopt M_ARENA_MAX = 1) unless KVAGENT_ONE_ARENA=0.
// glibc gives each thread that allocates its own arena, and a thread's arena grows through
// mprotect of its reservation a few pages at a time: a system call per step, then page faults
// on 4 KiB pages (what glibc.malloc.hugetlb asks for reaches the main arena's brk heap). The
// master's metadata is allocated by kvmaster's loop thread, so with an arena of its own every
// key paid that way: master_bench master.put.zmq.commit.b128 166-266 k keys/s with a thread
// arena, 300-413 k with one arena, same runs. The price is one lock for all threads (small
// allocations still go through each thread's cache without it): kvmaster's other threads
// allocate little. kvagent keeps glibc's default (its service thread shares the process with the
// relay, link and data threads, and e2e_bench showed no gain above its noise). Call first in
// main(), before any thread starts: glibc fixes the arena limit the first time a second thread
// allocates. Does nothing in sanitizer builds (their allocator is not glibc's).
void UseOneMallocArena();

// One phrase for the start-up log: "transparent huge pages, one malloc arena" or "4 KiB pages
// (why), ...".
std::string HeapPagesDescription();

}  // namespace kvagent
