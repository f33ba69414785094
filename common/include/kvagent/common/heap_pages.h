// Transparent huge pages for the heap of kvmaster and kvagent.
//
// The master's metadata is millions of small allocations. With 4 KiB pages every new page of
// heap costs a page fault on first touch, and on a VM that fault is what a put spends most of
// its time in (master_bench: 0.7 M keys/s with 4 KiB pages, 1.5 M with huge pages, same run).
// glibc can ask for transparent huge pages on the memory malloc takes from the kernel, but
// only when told at start-up (GLIBC_TUNABLES=glibc.malloc.hugetlb=1), so the binaries re-execute
// themselves once with that tunable set.
#pragma once

#include <string>

namespace kvagent {

// Call first in main(), before any thread starts or file opens. Re-executes the program by its
// own path (same pid, name, argv and environment, plus GLIBC_TUNABLES=...:glibc.malloc.hugetlb=1)
// when the kernel offers transparent huge pages (enabled: always or madvise) and glibc was not
// told yet.
// Returns without re-executing when KVAGENT_HUGE_HEAP=0, when THP is off, in sanitizer builds
// (their allocator is not glibc's), or when the exec fails.
void PreferHugePageHeap(char** argv);

// One phrase for the start-up log: "transparent huge pages" or "4 KiB pages (why)".
std::string HeapPagesDescription();

}  // namespace kvagent
