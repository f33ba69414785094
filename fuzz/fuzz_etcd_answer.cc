// What etcd's JSON gateway answers kvmaster and kvagent (plain HTTP: whoever sits on the path,
// or a compromised etcd, writes these bytes). The first input byte picks the reader, the rest is
// the answer:
//   0: a range answer (KeyValuesOf) and its header's revision,
//   1: a failed transaction's answer (KeyValuesOfFirstRange),
//   2: a watch stream, line by line (ParseWatchLine),
//   3: an error answer (StatusFromError),
//   4: the leader record and 5: a member record, as stored in etcd (records.h).
// Must never crash, throw or hit UB; a refusal must carry a message.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "etcd_http.h"
#include "kvagent/coord/records.h"

namespace {

using kvagent::Status;
using kvagent::coord::Json;

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckRefusal(const Status& st) { Check(st.ok() || !st.message().empty()); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  namespace coord = kvagent::coord;
  switch (data[0] % 6) {
    case 0: {
      const Json answer = Json::parse(text, nullptr, /*allow_exceptions=*/false);
      CheckRefusal(coord::KeyValuesOf(answer).status());
      const auto header = answer.is_object() ? answer.find("header") : answer.end();
      if (header != answer.end()) (void)coord::JsonInt(*header, "revision");
      break;
    }
    case 1:
      CheckRefusal(
          coord::KeyValuesOfFirstRange(Json::parse(text, nullptr, /*allow_exceptions=*/false))
              .status());
      break;
    case 2: {
      bool created = false;
      std::vector<coord::EtcdEvent> events;
      size_t start = 0;
      while (start < text.size()) {
        const size_t end = std::min(text.find('\n', start), text.size());
        CheckRefusal(
            coord::ParseWatchLine(text.substr(start, end - start), "fuzz", &created, &events));
        start = end + 1;
      }
      break;
    }
    case 3:
      CheckRefusal(coord::StatusFromError(Json::parse(text, nullptr, false), 400));
      Check(!coord::StatusFromError(Json::parse(text, nullptr, false), 400).ok());
      break;
    case 4:
      CheckRefusal(coord::LeaderRecord::Decode(text).status());
      break;
    case 5:
      CheckRefusal(coord::MemberRecord::Decode(text).status());
      break;
  }
  return 0;
}
