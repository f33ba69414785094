#include "kvagent/common/flags.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

namespace kvagent {
namespace {

std::string Canonical(std::string_view name) {
  std::string out(name);
  for (char& c : out) {
    if (c == '_') c = '-';
  }
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

template <typename T>
std::string ParseInteger(std::string_view text, T* out) {
  T value{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty()) {
    return "expected an integer, got '" + std::string(text) + "'";
  }
  *out = value;
  return "";
}

// Reads one TOML string literal starting at s[0] ('"' or '\''); returns the decoded text and
// advances `s` past it, or an error.
Result<std::string> ReadTomlString(std::string_view* s) {
  const char quote = s->front();
  std::string out;
  size_t i = 1;
  for (; i < s->size(); ++i) {
    char c = (*s)[i];
    if (c == quote) break;
    if (c == '\\' && quote == '"') {
      if (++i >= s->size()) break;
      switch ((*s)[i]) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case '\\':
          out += '\\';
          break;
        case '"':
          out += '"';
          break;
        default:
          return InvalidParams("unsupported escape in string");
      }
      continue;
    }
    out += c;
  }
  if (i >= s->size()) return InvalidParams("unterminated string");
  s->remove_prefix(i + 1);
  return out;
}

// Strips a trailing comment that is outside any string.
std::string_view StripComment(std::string_view line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quote) {
      if (c == '\\' && quote == '"') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      return line.substr(0, i);
    }
  }
  return line;
}

}  // namespace

Result<uint64_t> ParseSize(std::string_view text) {
  text = Trim(text);
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0)
    return InvalidParams("expected a size like 1GiB or 4096, got '" + std::string(text) + "'");
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + digits, value);
  if (ec != std::errc()) return InvalidParams("size '" + std::string(text) + "' is too large");
  std::string_view suffix = Trim(text.substr(digits));
  uint64_t mult = 1;
  if (suffix.empty() || suffix == "B") {
    mult = 1;
  } else if (suffix == "K" || suffix == "KiB" || suffix == "k") {
    mult = 1ULL << 10;
  } else if (suffix == "M" || suffix == "MiB") {
    mult = 1ULL << 20;
  } else if (suffix == "G" || suffix == "GiB") {
    mult = 1ULL << 30;
  } else if (suffix == "T" || suffix == "TiB") {
    mult = 1ULL << 40;
  } else {
    return InvalidParams("unknown size suffix '" + std::string(suffix) +
                         "' (use B, KiB, MiB, GiB or TiB)");
  }
  if (value > UINT64_MAX / mult) {
    return InvalidParams("size '" + std::string(text) + "' is too large");
  }
  return value * mult;
}

FlagSet::FlagSet(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void FlagSet::Add(Flag flag) {
  flag.name = Canonical(flag.name);
  flags_.push_back(std::move(flag));
}

FlagSet::Flag* FlagSet::Find(std::string_view name) {
  std::string canonical = Canonical(name);
  for (Flag& f : flags_) {
    if (f.name == canonical) return &f;
  }
  return nullptr;
}

void FlagSet::String(std::string name, std::string* target, std::string help) {
  Add(Flag{std::move(name), std::move(help), target->empty() ? "" : *target, false, false,
           [target](std::string_view v) {
             *target = std::string(v);
             return std::string();
           },
           nullptr});
}

void FlagSet::Int(std::string name, int64_t* target, std::string help) {
  Add(Flag{std::move(name), std::move(help), std::to_string(*target), false, false,
           [target](std::string_view v) { return ParseInteger(v, target); }, nullptr});
}

void FlagSet::Uint(std::string name, uint64_t* target, std::string help) {
  Add(Flag{std::move(name), std::move(help), std::to_string(*target), false, false,
           [target](std::string_view v) { return ParseInteger(v, target); }, nullptr});
}

void FlagSet::Double(std::string name, double* target, std::string help) {
  std::ostringstream def;
  def << *target;
  Add(Flag{std::move(name), std::move(help), def.str(), false, false,
           [target](std::string_view v) {
             std::string s(v);
             char* end = nullptr;
             errno = 0;
             double d = std::strtod(s.c_str(), &end);
             if (s.empty() || end != s.c_str() + s.size() || errno != 0) {
               return "expected a number, got '" + s + "'";
             }
             *target = d;
             return std::string();
           },
           nullptr});
}

void FlagSet::Bool(std::string name, bool* target, std::string help) {
  Add(Flag{std::move(name), std::move(help), *target ? "true" : "false", true, false,
           [target](std::string_view v) {
             if (v == "true" || v == "1" || v == "yes") {
               *target = true;
             } else if (v == "false" || v == "0" || v == "no") {
               *target = false;
             } else {
               return "expected true or false, got '" + std::string(v) + "'";
             }
             return std::string();
           },
           nullptr});
}

void FlagSet::Size(std::string name, uint64_t* target, std::string help) {
  Add(Flag{std::move(name), std::move(help), std::to_string(*target), false, false,
           [target](std::string_view v) {
             auto r = ParseSize(v);
             if (!r.ok()) return r.status().message();
             *target = *r;
             return std::string();
           },
           nullptr});
}

void FlagSet::StringList(std::string name, std::vector<std::string>* target, std::string help) {
  std::string def;
  for (const auto& s : *target) def += (def.empty() ? "" : ",") + s;
  Add(Flag{std::move(name), std::move(help), def, false, true,
           [target](std::string_view v) {
             target->emplace_back(v);
             return std::string();
           },
           [target] { target->clear(); }});
}

Status FlagSet::SetFlag(std::string_view name, std::string_view value, std::string_view origin) {
  Flag* flag = Find(name);
  if (flag == nullptr) {
    return InvalidParams(std::string(origin) + "unknown option '" + std::string(name) + "' (see " +
                         program_ + " --help)");
  }
  std::string err = flag->set(value);
  if (!err.empty()) {
    return InvalidParams(std::string(origin) + "--" + flag->name + ": " + err);
  }
  return Status::Ok();
}

Status FlagSet::ApplyConfigText(std::string_view text, std::string_view origin) {
  size_t line_no = 0;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    const std::string where = std::string(origin) + ":" + std::to_string(line_no) + ": ";
    line = Trim(StripComment(line));
    if (line.empty() || line.front() == '[') continue;
    size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      return InvalidParams(where + "expected 'name = value'");
    }
    std::string_view key = Trim(line.substr(0, eq));
    std::string_view raw = Trim(line.substr(eq + 1));
    Flag* flag = Find(key);
    if (flag == nullptr) {
      return InvalidParams(where + "unknown option '" + std::string(key) + "'");
    }
    if (raw.empty()) return InvalidParams(where + "missing value for '" + std::string(key) + "'");
    if (raw.front() == '[') {
      if (!flag->is_list) return InvalidParams(where + "'" + std::string(key) + "' is not a list");
      if (raw.back() != ']') return InvalidParams(where + "unterminated array");
      std::string_view items = Trim(raw.substr(1, raw.size() - 2));
      flag->clear();
      while (!items.empty()) {
        if (items.front() != '"' && items.front() != '\'') {
          return InvalidParams(where + "array items must be strings");
        }
        auto s = ReadTomlString(&items);
        if (!s.ok()) return InvalidParams(where + s.status().message());
        KVAGENT_RETURN_IF_ERROR(SetFlag(key, *s, where));
        items = Trim(items);
        if (!items.empty()) {
          if (items.front() != ',') return InvalidParams(where + "expected ',' in array");
          items = Trim(items.substr(1));
        }
      }
      continue;
    }
    std::string value;
    if (raw.front() == '"' || raw.front() == '\'') {
      auto s = ReadTomlString(&raw);
      if (!s.ok()) return InvalidParams(where + s.status().message());
      if (!Trim(raw).empty()) return InvalidParams(where + "unexpected text after the string");
      value = std::move(*s);
    } else {
      value = std::string(raw);
    }
    if (flag->is_list) flag->clear();
    KVAGENT_RETURN_IF_ERROR(SetFlag(key, value, where));
  }
  return Status::Ok();
}

Status FlagSet::Parse(int argc, char** argv, std::vector<std::string>* positionals) {
  // A --config file applies first so that command-line flags override it.
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string path;
    if (arg == "--config" && i + 1 < argc) {
      path = argv[i + 1];
    } else if (arg.rfind("--config=", 0) == 0) {
      path = std::string(arg.substr(9));
    } else {
      continue;
    }
    std::ifstream in(path);
    if (!in) return InvalidParams("--config: cannot read '" + path + "'");
    std::stringstream buf;
    buf << in.rdbuf();
    KVAGENT_RETURN_IF_ERROR(ApplyConfigText(buf.str(), path));
    config_path_ = path;
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg == "--version") {
      version_requested_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      if (positionals == nullptr) {
        return InvalidParams("unexpected argument '" + std::string(arg) + "' (see " + program_ +
                             " --help)");
      }
      positionals->emplace_back(arg);
      continue;
    }
    std::string_view body = arg.substr(2);
    std::string_view name = body;
    std::optional<std::string_view> value;
    if (size_t eq = body.find('='); eq != std::string_view::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
    }
    if (Canonical(name) == "config") {
      if (!value) ++i;  // already applied above
      continue;
    }
    Flag* flag = Find(name);
    if (flag == nullptr) {
      return InvalidParams("unknown option '--" + std::string(name) + "' (see " + program_ +
                           " --help)");
    }
    if (!value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return InvalidParams("--" + flag->name + " needs a value");
      }
    }
    KVAGENT_RETURN_IF_ERROR(SetFlag(name, *value, ""));
  }
  return Status::Ok();
}

std::string FlagSet::Usage() const {
  std::string out = "Usage: " + program_ + " [options]\n" + summary_ + "\n\nOptions:\n";
  out += "  --config FILE\n      read options from FILE (`name = value` lines); flags override\n";
  for (const Flag& f : flags_) {
    out += "  --" + f.name + (f.is_bool ? "" : " VALUE") + "\n      " + f.help;
    // A help line that already explains its default keeps its own words.
    if (!f.default_text.empty() && f.help.find("(default:") == std::string::npos) {
      out += " (default: " + f.default_text + ")";
    }
    out += "\n";
  }
  out += "  --version\n      print the version and exit\n";
  out += "  --help\n      show this help\n";
  return out;
}

}  // namespace kvagent
