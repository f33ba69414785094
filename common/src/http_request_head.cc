#include "http_request_head.h"

namespace kvagent::metrics {
namespace {

// RFC 9110 tchar.
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// A target in origin form: '/' then visible ASCII.
bool IsOriginTarget(std::string_view s) {
  if (s.empty() || s.front() != '/') return false;
  for (char c : s) {
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return true;
}

// A field value: visible ASCII, obs-text (>= 0x80), spaces and tabs.
bool IsFieldValue(std::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 ? c != '\t' : u == 0x7f) return false;
  }
  return true;
}

// Takes the next line off `*rest` (without its LF and a CR before it). False when no LF is left.
bool NextLine(std::string_view* rest, std::string_view* line) {
  const size_t lf = rest->find('\n');
  if (lf == std::string_view::npos) return false;
  *line = rest->substr(0, lf);
  if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
  rest->remove_prefix(lf + 1);
  return true;
}

bool ParseRequestLine(std::string_view line, RequestHead* out) {
  const size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos) return false;
  const size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return false;
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method) || !IsOriginTarget(target)) return false;
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return false;
  out->method = method;
  out->path = target.substr(0, target.find('?'));
  return true;
}

bool IsHeaderLine(std::string_view line) {
  const size_t colon = line.find(':');
  if (colon == std::string_view::npos) return false;
  return IsToken(line.substr(0, colon)) && IsFieldValue(line.substr(colon + 1));
}

}  // namespace

size_t FindRequestHeadEnd(std::string_view received, size_t from) {
  // A terminator that straddles the previous end starts at most 3 bytes before it.
  size_t i = from > 3 ? from - 3 : 0;
  for (; i < received.size(); ++i) {
    if (received[i] != '\n') continue;
    if (i + 1 < received.size() && received[i + 1] == '\n') return i + 2;
    if (i + 2 < received.size() && received[i + 1] == '\r' && received[i + 2] == '\n') {
      return i + 3;
    }
  }
  return std::string_view::npos;
}

HeadShape ParseRequestHead(std::string_view head, RequestHead* out) {
  std::string_view rest = head;
  std::string_view line;
  // RFC 9112 2.2: an empty line before the request line is ignored (one: two would end the head).
  if (!NextLine(&rest, &line)) return HeadShape::kMalformed;
  if (line.empty() && !NextLine(&rest, &line)) return HeadShape::kMalformed;
  if (!ParseRequestLine(line, out)) return HeadShape::kMalformed;
  for (;;) {
    if (!NextLine(&rest, &line)) return HeadShape::kMalformed;  // no empty line at the end
    if (line.empty()) return rest.empty() ? HeadShape::kRequest : HeadShape::kMalformed;
    if (!IsHeaderLine(line)) return HeadShape::kMalformed;  // including folded lines
  }
}

}  // namespace kvagent::metrics
