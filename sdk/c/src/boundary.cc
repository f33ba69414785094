#include "boundary.h"

namespace kvagent::c_abi {
namespace {

// The last message per thread. `t_view` points into `t_message`, or at a static text when the
// message could not be stored; it is never null.
thread_local std::string t_message;
thread_local const char* t_view = "";

}  // namespace

kv_status_t SetLastError(kv_status_t code, std::string_view message) noexcept {
  try {
    t_message.assign(message);
    t_view = t_message.c_str();
  } catch (...) {
    t_view = "libkvclient ran out of memory while recording an error message";
  }
  return code;
}

const char* LastErrorMessage() noexcept { return t_view; }

}  // namespace kvagent::c_abi
