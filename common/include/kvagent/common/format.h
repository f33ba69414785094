// Text for people: sizes in logs, errors and `kvctl stat`.
#pragma once

#include <cstdint>
#include <string>

namespace kvagent {

// "512 B", "4.00 KiB", "1.50 MiB", "1.00 GiB" (binary units, two decimals).
std::string FormatBytes(uint64_t bytes);

}  // namespace kvagent
