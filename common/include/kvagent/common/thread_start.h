// Starting a thread that reports whether it came up: the publisher's, the relay's and the ZAP
// handler's threads bind or connect their sockets themselves and say how that went.
#pragma once

#include <future>
#include <thread>
#include <utility>

#include "kvagent/common/status.h"

namespace kvagent {

// Starts `*thread` running `body(&started)` and waits until the body has set `started`: its
// result is returned, and a thread that failed to start is joined first. The body must set the
// promise exactly once and not touch it afterwards (it lives only until this call returns).
template <typename Body>
Status StartThreadAndWait(std::thread* thread, Body body) {
  std::promise<Status> started;
  std::future<Status> result = started.get_future();
  *thread = std::thread([&started, body = std::move(body)]() mutable { body(&started); });
  Status status = result.get();
  if (!status.ok()) thread->join();
  return status;
}

}  // namespace kvagent
