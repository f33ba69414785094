// libkvclient.so as a shared library: what it exports, its SONAME, and a plain C program
// (compiled as C11 with -pedantic) that uses the header against a real agent.
#include <dlfcn.h>
#include <link.h>

#include <string>

#include "c_abi.h"
#include "process_guard.h"

#ifndef KVCLIENT_LIBRARY
#error "KVCLIENT_LIBRARY must name libkvclient.so"
#endif
#ifndef KVCLIENT_C_PROGRAM
#error "KVCLIENT_C_PROGRAM must name the C test program"
#endif

namespace kvagent::testing {
namespace {

class Library {
 public:
  Library() : handle_(dlopen(KVCLIENT_LIBRARY, RTLD_NOW | RTLD_LOCAL)) {}
  ~Library() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  void* handle() const { return handle_; }
  bool Exports(const char* symbol) const { return dlsym(handle_, symbol) != nullptr; }

  // DT_SONAME from the loaded object's dynamic section ("" when absent).
  std::string Soname() const {
    link_map* map = nullptr;
    if (dlinfo(handle_, RTLD_DI_LINKMAP, &map) != 0) return "";
    const char* strtab = nullptr;
    ElfW(Xword) soname = 0;
    bool has_soname = false;
    for (const ElfW(Dyn)* d = map->l_ld; d->d_tag != DT_NULL; ++d) {
      if (d->d_tag == DT_STRTAB) strtab = reinterpret_cast<const char*>(d->d_un.d_ptr);
      if (d->d_tag == DT_SONAME) {
        soname = d->d_un.d_val;
        has_soname = true;
      }
    }
    return strtab && has_soname ? std::string(strtab + soname) : "";
  }

 private:
  void* handle_;
};

TEST(KvclientLibrary, ExportsTheCAbiAndHidesTheCppSdk) {
  Library lib;
  ASSERT_NE(lib.handle(), nullptr) << dlerror();
  for (const char* c :
       {"kv_connect", "kv_client_free", "kv_allocate", "kv_put", "kv_get", "kv_submit_remove_all",
        "kv_pending_wait", "kv_result_free", "kv_last_error_message", "kv_version",
        "kv_client_agent_incarnation", "kv_client_agent_epoch" /* deprecated, kept in .so.0 */}) {
    EXPECT_TRUE(lib.Exports(c)) << c;
  }
  // Linked in statically and used by the library (nm shows them as local "t"), but hidden.
  for (const char* cpp :
       {"_ZN7kvagent13ErrorCodeNameENS_9ErrorCodeE",
        "_ZN7kvagent6Client7ConnectENS_13ClientOptionsE",
        "_ZN7kvagent15FindInvalidUtf8ESt17basic_string_viewIcSt11char_traitsIcEE"}) {
    EXPECT_FALSE(lib.Exports(cpp)) << cpp;
  }
  EXPECT_FALSE(lib.Exports("kv_connect_options_init"));  // inline in the header
}

TEST(KvclientLibrary, SonameCarriesTheMajorVersion) {
  Library lib;
  ASSERT_NE(lib.handle(), nullptr) << dlerror();
  const std::string version = kv_version();
  EXPECT_EQ(lib.Soname(), "libkvclient.so." + version.substr(0, version.find('.')));
}

TEST_F(CAbiTest, APlainCProgramConnectsAllocatesAndPings) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl(KVCLIENT_C_PROGRAM, KVCLIENT_C_PROGRAM, agent_.run_dir().c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  ProcessGuard program(pid);
  const int status = program.Wait();
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the program's stderr above";
}

}  // namespace
}  // namespace kvagent::testing
