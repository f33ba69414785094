// getpid() from memory (common/src/cached_pid.cc): the same answer as the kernel's, in the
// parent and in a forked child, and the definition every shared library binds to.
#include <dlfcn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

extern "C" bool kvagent_cached_pid_fork_safe();

namespace {

pid_t KernelPid() { return static_cast<pid_t>(syscall(SYS_getpid)); }

TEST(CachedPid, AnswersWhatTheKernelSays) {
  EXPECT_TRUE(kvagent_cached_pid_fork_safe());
  EXPECT_EQ(getpid(), KernelPid());
  EXPECT_EQ(getpid(), KernelPid());  // from the cache now
}

TEST(CachedPid, AForkedChildGetsItsOwnPid) {
  const pid_t parent = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // 0: right; 1: the parent's pid (the cache was not refreshed); 2: some other pid.
    const pid_t mine = getpid();
    _exit(mine == KernelPid() ? 0 : mine == parent ? 1 : 2);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(getpid(), parent);
  EXPECT_EQ(getpid(), KernelPid());
}

TEST(CachedPid, SharedLibrariesBindToIt) {
  // What the dynamic linker binds a library's call of getpid to (libzmq's, in the daemons): the
  // first definition in the global scope, this executable's when it exports it.
  void* bound = dlsym(RTLD_DEFAULT, "getpid");
  ASSERT_NE(bound, nullptr);
  EXPECT_EQ(bound, reinterpret_cast<void*>(&getpid));
  EXPECT_NE(bound, dlsym(RTLD_NEXT, "getpid"));  // libc's, the one it replaces
}

}  // namespace
