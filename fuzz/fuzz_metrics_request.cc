// What anyone who reaches a --metrics-listen port sends: the head of an HTTP request, arriving
// in pieces. The first input byte is the size of the pieces (0 counts as 1), the rest the bytes.
// The endpoint's reader (common/src/http_request_head.cc) must find the same end of the head
// piece by piece as in one search, never read past what it was given, and parse any head
// without crashing; a request it accepts must have a token method and a path starting with '/'
// inside the head.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "http_request_head.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = data[0] == 0 ? 1 : data[0];
  const std::string_view all(reinterpret_cast<const char*>(data + 1), size - 1);
  using kvagent::metrics::FindRequestHeadEnd;
  const size_t whole = FindRequestHeadEnd(all, 0);
  size_t end = std::string_view::npos;
  size_t searched = 0;
  for (size_t have = 0; have < all.size() && end == std::string_view::npos;) {
    have = std::min(all.size(), have + piece);
    end = FindRequestHeadEnd(all.substr(0, have), searched);
    searched = have;
  }
  Check(end == whole);
  if (end == std::string_view::npos) return 0;
  Check(end <= all.size());
  const std::string_view head = all.substr(0, end);
  kvagent::metrics::RequestHead request;
  if (kvagent::metrics::ParseRequestHead(head, &request) != kvagent::metrics::HeadShape::kRequest) {
    return 0;
  }
  Check(!request.method.empty() && !request.path.empty() && request.path.front() == '/');
  Check(request.method.data() >= head.data() &&
        request.method.data() + request.method.size() <= head.data() + head.size());
  Check(request.path.data() >= head.data() &&
        request.path.data() + request.path.size() <= head.data() + head.size());
  return 0;
}
