#include "kvagent/common/flags.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <toml++/toml.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <sstream>
#include <string>

#include "kvagent/common/errno_text.h"
#include "kvagent/common/unique_fd.h"

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

}  // namespace

namespace {

// A config file: a regular file, or a pipe (`--config <(...)`), of at most kMaxConfigBytes.
// A directory or a device (`/dev/zero`) is refused rather than read as empty or forever.
constexpr size_t kMaxConfigBytes = 1 << 20;

Result<std::string> ReadConfigFile(const std::string& path) {
  const std::string what = "--config: cannot read '" + path + "'";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) return InvalidParams(what + ": " + ErrnoText(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return InvalidParams(what + ": " + ErrnoText(errno));
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
    return InvalidParams(what + ": not a regular file");
  }
  std::string text(kMaxConfigBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return InvalidParams(what + ": " + ErrnoText(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > kMaxConfigBytes) {
    return InvalidParams("--config: '" + path + "' is larger than " +
                         std::to_string(kMaxConfigBytes >> 20) + " MiB; is it the right file?");
  }
  text.resize(got);
  return text;
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

namespace {

// A TOML value as the text its flag parses (the same rules as on the command line).
Result<std::string> ValueText(const toml::node& node) {
  if (const auto* v = node.as_string()) return std::string(v->get());
  if (const auto* v = node.as_integer()) return std::to_string(v->get());
  if (const auto* v = node.as_boolean()) return std::string(v->get() ? "true" : "false");
  if (const auto* v = node.as_floating_point()) {
    std::ostringstream text;
    text.precision(17);
    text << v->get();
    return text.str();
  }
  return InvalidParams("expected a string, a number or a boolean");
}

// The most dots a config may have outside its strings and comments. Options are at most two
// levels deep (`table.key`), so a real config has a few (dotted keys, floats); toml++ builds a
// dotted key or table header of N parts by recursing N deep, and a few tens of thousands of
// parts overflow the stack (a crash, not an error), within the 1 MiB a config may have.
constexpr size_t kMaxConfigDots = 4096;

// The line of the first dot past kMaxConfigDots outside strings and comments, as toml++ reads
// them (basic and literal strings end at a line's end; multi-line ones at their closing
// quotes, including up to two quotes of content before them), or 0 when there are at most
// kMaxConfigDots.
uint32_t LineOfTooManyDots(std::string_view text) {
  size_t dots = 0;
  uint32_t line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      ++line;
    } else if (c == '#') {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      const bool multi = text.substr(i, 3) == std::string(3, c);
      const std::string_view close = multi ? text.substr(i, 3) : text.substr(i, 1);
      i += close.size();
      for (; i < text.size(); ++i) {
        if (text[i] == '\n') {
          if (!multi) break;  // an unterminated string: toml++ stops there too
          ++line;
        } else if (c == '"' && text[i] == '\\') {
          if (i + 1 < text.size() && text[i + 1] != '\n') ++i;  // an escaped character
        } else if (text.substr(i, close.size()) == close) {
          // A multi-line string may end with up to two more quotes (its last characters): the
          // whole run of quotes closes it.
          size_t run = close.size();
          while (multi && i + run < text.size() && text[i + run] == c) ++run;
          i += run - 1;
          break;
        }
      }
      if (i < text.size() && text[i] == '\n') ++line;
    } else if (c == '.' && ++dots > kMaxConfigDots) {
      return line;
    }
  }
  return 0;
}

// One `key = value` of a config file, with where it is.
struct ConfigEntry {
  std::string key;     // as written (a table's keys: "table.key")
  std::string option;  // the flag it sets
  const toml::node* value;
  uint32_t line;
};

}  // namespace

Status FlagSet::ApplyConfigText(std::string_view text, std::string_view origin) {
  const std::string file(origin);
  if (const uint32_t line = LineOfTooManyDots(text); line != 0) {
    return InvalidParams(file + ":" + std::to_string(line) + ": more than " +
                         std::to_string(kMaxConfigDots) +
                         " dots outside strings (dotted keys, table headers, numbers): options "
                         "are at most two levels deep; is it the right file?");
  }
  toml::table root;
  try {
    root = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    return InvalidParams(file + ":" + std::to_string(e.source().begin.line) + ": " +
                         std::string(e.description()));
  }
  // Every key, in the order of the file, so the first error reported is the first in the file.
  // A key inside a table `[t]` sets the option "t-key" when there is one, else "key" (a
  // `[section]` header only groups, as it always did).
  std::vector<ConfigEntry> entries;
  for (auto&& [key, node] : root) {
    const std::string name(key.str());
    if (const toml::table* table = node.as_table()) {
      for (auto&& [inner_key, inner] : *table) {
        const std::string inner_name(inner_key.str());
        const std::string nested = Canonical(name + "-" + inner_name);
        entries.push_back({name + "." + inner_name, Find(nested) ? nested : inner_name, &inner,
                           inner.source().begin.line});
      }
      continue;
    }
    entries.push_back({name, name, &node, node.source().begin.line});
  }
  std::sort(entries.begin(), entries.end(),
            [](const ConfigEntry& a, const ConfigEntry& b) { return a.line < b.line; });
  for (const ConfigEntry& e : entries) {
    const std::string where = file + ":" + std::to_string(e.line) + ": ";
    Flag* flag = Find(e.option);
    if (flag == nullptr) return InvalidParams(where + "unknown option '" + e.key + "'");
    if (e.value->is_table()) {
      return InvalidParams(where + "'" + e.key + "' is a table; options are one level deep");
    }
    if (const toml::array* items = e.value->as_array()) {
      if (!flag->is_list) return InvalidParams(where + "'" + e.key + "' is not a list");
      flag->clear();
      for (const toml::node& item : *items) {
        Result<std::string> value = ValueText(item);
        if (!value.ok() || item.is_boolean()) {
          return InvalidParams(where + "'" + e.key + "': array items must be strings or numbers");
        }
        KVAGENT_RETURN_IF_ERROR(SetFlag(flag->name, *value, where));
      }
      continue;
    }
    Result<std::string> value = ValueText(*e.value);
    if (!value.ok()) {
      return InvalidParams(where + "'" + e.key + "': " + value.status().message());
    }
    if (flag->is_list) flag->clear();
    KVAGENT_RETURN_IF_ERROR(SetFlag(flag->name, *value, where));
  }
  return Status::Ok();
}

Status FlagSet::Parse(int argc, char** argv, std::vector<std::string>* positionals) {
  help_requested_ = false;
  version_requested_ = false;
  // CLI11 reads the command line; the values are applied below, after the config file, with
  // this FlagSet's own parsers (the same as for config files) and messages.
  CLI::App app(summary_, program_);
  app.set_help_flag();  // --help prints Usage(), not CLI11's text
  app.allow_extras();   // positionals and unknown options: sorted out below, in order
  CLI::Option* help = app.add_flag("-h,--help");
  CLI::Option* version = app.add_flag("--version");
  CLI::Option* config = app.add_option("--config")->expected(1);
  std::vector<CLI::Option*> options;
  options.reserve(flags_.size());
  for (const Flag& f : flags_) {
    std::string names = "--" + f.name;
    std::string underscored = f.name;
    std::replace(underscored.begin(), underscored.end(), '-', '_');
    if (underscored != f.name) names += ",--" + underscored;
    CLI::Option* o = f.is_bool ? app.add_flag(names) : app.add_option(names)->expected(1);
    o->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    options.push_back(o);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ArgumentMismatch& e) {
    // "--name: 1 required TEXT missing": the flag was last, without its value.
    const std::string what = e.what();
    const std::string name = Canonical(what.substr(0, what.find(':')));
    if (name == "--config") return InvalidParams("--config needs a value: the config file's path");
    return InvalidParams(name + " needs a value");
  } catch (const CLI::ParseError& e) {
    return InvalidParams(std::string(e.what()) + " (see " + program_ + " --help)");
  }
  for (const std::string& extra : app.remaining()) {
    if (extra.rfind("--", 0) == 0 && extra != "--") {
      return InvalidParams("unknown option '" + extra.substr(0, extra.find('=')) + "' (see " +
                           program_ + " --help)");
    }
    if (extra == "--") continue;
    if (positionals == nullptr) {
      return InvalidParams("unexpected argument '" + extra + "' (see " + program_ + " --help)");
    }
    positionals->push_back(extra);
  }
  // A --config file applies first so that command-line flags override it.
  if (config->count() > 0) {
    const std::string path = config->results().back();
    if (path.empty()) return InvalidParams("--config needs a value: the config file's path");
    Result<std::string> text = ReadConfigFile(path);
    if (!text.ok()) return text.status();
    KVAGENT_RETURN_IF_ERROR(ApplyConfigText(*text, path));
    config_path_ = path;
  }
  for (size_t i = 0; i < flags_.size(); ++i) {
    const std::vector<std::string>& given = options[i]->results();
    if (given.empty()) continue;
    Flag& f = flags_[i];
    if (f.is_list) {
      f.clear();  // the command line's list replaces the config file's
      for (const std::string& v : given) KVAGENT_RETURN_IF_ERROR(SetFlag(f.name, v, ""));
    } else {
      KVAGENT_RETURN_IF_ERROR(SetFlag(f.name, given.back(), ""));
    }
  }
  help_requested_ = help->count() > 0;
  version_requested_ = version->count() > 0;
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
