// Command-line flags and config files for the binaries (kvagent, kvmaster, kvctl).
//
// Every option is declared once, with a help line, and can be given as `--name value`,
// `--name=value`, or as `name = value` in a TOML config file passed with `--config FILE` (a
// regular file or a pipe, at most 1 MiB; a directory or a device is refused).
// The command line is read with CLI11 and config files with toml++ (full TOML: strings, numbers,
// booleans, arrays; a key inside a table `[t]` sets the option `t-key` when there is one, else
// `key`, so a `[section]` header may simply group keys). Flags on the command line override the
// file; a list flag given on the command line replaces the file's list. Dashes and underscores
// in names are interchangeable (`pool-size` == `pool_size`). Unknown options and bad values are
// errors naming the flag, or the file and line.
//
// Sizes accept binary suffixes (`64KiB`, `512MiB`, `1GiB`, also `K`, `M`, `G`); durations are
// plain milliseconds in flags named `*-ms`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kvagent/common/status.h"

namespace kvagent {

class FlagSet {
 public:
  // `program` and `summary` head the usage text.
  FlagSet(std::string program, std::string summary);

  FlagSet(const FlagSet&) = delete;
  FlagSet& operator=(const FlagSet&) = delete;

  // Declare options. `target` keeps its current value as the default (shown in --help) and is
  // overwritten when the option is given. The pointers must outlive Parse().
  void String(std::string name, std::string* target, std::string help);
  void Int(std::string name, int64_t* target, std::string help);
  void Uint(std::string name, uint64_t* target, std::string help);
  void Double(std::string name, double* target, std::string help);
  void Bool(std::string name, bool* target, std::string help);      // `--name`, `--name=false`
  void Size(std::string name, uint64_t* target, std::string help);  // bytes, with suffixes
  // Repeatable: each occurrence on the command line appends; the command line's occurrences
  // replace a config file's list, and a config array sets the whole list.
  void StringList(std::string name, std::vector<std::string>* target, std::string help);

  // Parses argv[1..]. Arguments that do not start with `--` are collected as positionals when
  // `positionals` is not null, and are an error otherwise. Returns INVALID_PARAMS with one line
  // naming the bad flag or value (print it and exit 2). `--help` sets help_requested().
  Status Parse(int argc, char** argv, std::vector<std::string>* positionals = nullptr);

  // Applies a config file's content (as with --config). Exposed for tests.
  Status ApplyConfigText(std::string_view text, std::string_view origin);

  bool help_requested() const { return help_requested_; }
  // `--version` was given: print the program's version (kvagent::kVersion) and exit 0.
  bool version_requested() const { return version_requested_; }
  std::string Usage() const;

 private:
  struct Flag {
    std::string name;  // canonical, with dashes
    std::string help;
    std::string default_text;
    bool is_bool = false;
    bool is_list = false;
    // Sets the value from text; returns an error message or "".
    std::function<std::string(std::string_view)> set;
    std::function<void()> clear;  // lists only: a config array replaces the list
  };

  void Add(Flag flag);
  Flag* Find(std::string_view name);
  Status SetFlag(std::string_view name, std::string_view value, std::string_view origin);

  std::string program_;
  std::string summary_;
  std::vector<Flag> flags_;
  std::string config_path_;
  bool help_requested_ = false;
  bool version_requested_ = false;
};

// "1GiB" -> 1073741824. Exposed for tests and for kvctl.
Result<uint64_t> ParseSize(std::string_view text);

}  // namespace kvagent
