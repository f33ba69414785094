// The one way our messages name a failed system call's errno.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>

namespace kvagent {

// strerror(err): "No such file or directory".
std::string ErrnoText(int err);

// "<what>: <strerror(err)>", e.g. WithErrno("connect to /run/kvagent/agent.sock") for a message.
// `err` defaults to the errno of the call that just failed.
std::string WithErrno(std::string_view what, int err = errno);

}  // namespace kvagent
