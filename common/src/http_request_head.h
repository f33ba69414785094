// The head of an HTTP/1.x request as the /metrics endpoint reads it (RFC 9112): a request line,
// header lines, an empty line. Only the method and the path are kept; the header lines are
// checked for shape and skipped (the endpoint answers every request the same way and closes the
// connection, so no header changes how it reads or answers).
//
// Every byte comes from whoever reaches the port: the parser reads at most the bytes it is given,
// copies nothing and allocates nothing.
#pragma once

#include <cstddef>
#include <string_view>

namespace kvagent::metrics {

// Where the head that starts `received` ends: the offset just past its empty line ("\r\n\r\n",
// or "\n\n" from a client that sends bare line feeds), or npos when it has not arrived yet.
// `from` is how far an earlier call searched (the search resumes there, so a head arriving one
// byte at a time is read once, not once per byte).
size_t FindRequestHeadEnd(std::string_view received, size_t from);

enum class HeadShape {
  kRequest,  // a well-formed head: `method` and `path` are set
  kMalformed,
};

struct RequestHead {
  std::string_view method;  // a token, e.g. "GET"
  std::string_view path;    // the request target before any '?', e.g. "/metrics"
};

// Reads a complete head (as delimited by FindRequestHeadEnd): a request line `METHOD SP TARGET SP
// HTTP/1.0|HTTP/1.1` with an origin-form target (starting with '/', visible ASCII only), then
// header lines `NAME: VALUE` with a token name and no control bytes but tab in the value.
// Line folding and any other shape are kMalformed. `out` views `head`.
HeadShape ParseRequestHead(std::string_view head, RequestHead* out);

}  // namespace kvagent::metrics
