#include "kvagent/common/errno_text.h"

#include <cstring>

namespace kvagent {

std::string ErrnoText(int err) { return std::strerror(err); }

std::string WithErrno(std::string_view what, int err) {
  std::string text(what);
  text += ": ";
  text += std::strerror(err);
  return text;
}

}  // namespace kvagent
