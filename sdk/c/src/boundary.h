// The C ABI's boundary rules in one place: the thread-local last-error message, the guard that
// turns every escaping exception into KV_INTERNAL, and the reading of versioned option structs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <string_view>

#include "kvagent/client_c.h"
#include "kvagent/common/status.h"

namespace kvagent::c_abi {

// Records `message` as this thread's kv_last_error_message() and returns `code`. Never throws:
// if the message cannot be stored, a fixed text takes its place.
kv_status_t SetLastError(kv_status_t code, std::string_view message) noexcept;
inline kv_status_t SetLastError(const Status& status) noexcept {
  return SetLastError(static_cast<kv_status_t>(status.code()), status.message());
}
inline kv_status_t ClearLastError() noexcept { return SetLastError(KV_OK, {}); }

const char* LastErrorMessage() noexcept;

// Runs `body` (which returns kv_status_t) and converts any exception into KV_INTERNAL with a
// message: nothing thrown inside the library ever reaches a C caller.
template <typename Body>
kv_status_t Guarded(Body&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return SetLastError(KV_INTERNAL,
                        "libkvclient ran out of memory; free memory or send smaller batches");
  } catch (const std::exception& e) {
    return SetLastError(KV_INTERNAL, std::string("libkvclient: unexpected exception (") + e.what() +
                                         "); report this bug");
  } catch (...) {
    return SetLastError(KV_INTERNAL, "libkvclient: unexpected exception; report this bug");
  }
}

// Reads a caller's options struct `given` (NULL: keep `*out`, which holds the defaults) into
// `*out`. Every struct in client_c.h starts with size_t struct_size. Versions only grow: the
// fields of this version are all read when struct_size covers them; a larger struct_size (a
// newer header) is accepted only if the bytes this library does not know are zero, so a caller
// never silently loses an option it set.
// `init` names the struct's init function for the message.
// `out` holds the defaults (its *_init). A struct_size between `first_size` (the struct as first
// published) and sizeof(T) comes from an older header: the fields it lacks keep their defaults.
template <typename T>
Status ReadOptions(const T* given, T* out, std::string_view name, std::string_view init,
                   size_t first_size = sizeof(T)) {
  if (given == nullptr) return Status::Ok();
  const size_t size = given->struct_size;
  if (size < first_size) {
    return InvalidParams(std::string(name) + ".struct_size is " + std::to_string(size) +
                         "; initialize it with " + std::string(init) + " (sizeof is " +
                         std::to_string(sizeof(T)) + ")");
  }
  if (size > sizeof(T)) {
    const auto* extra = reinterpret_cast<const unsigned char*>(given) + sizeof(T);
    for (size_t i = 0; i < size - sizeof(T); ++i) {
      if (extra[i] != 0) {
        return InvalidParams(
            std::string(name) + " sets fields this libkvclient (" + std::to_string(sizeof(T)) +
            "-byte struct) does not know; upgrade libkvclient or leave them unset");
      }
    }
  }
  std::memcpy(static_cast<void*>(out), given, std::min(size, sizeof(T)));
  out->struct_size = sizeof(T);
  return Status::Ok();
}

}  // namespace kvagent::c_abi
