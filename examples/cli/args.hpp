// examples/cli/args.hpp: the `edl` tool's argument parsing.
// Flags are "--name value" or "--name" alone (a switch). Unknown flags are an error naming
// them, so a typo never silently falls back to a default. A word that is not a flag's value
// is a positional argument; only commands that ask for positional() accept them (elsewhere
// finish() rejects them, as before). Note "--flag word" always gives word to the flag.
// A flag given twice is an error unless the command reads it with all() (as edl train's
// repeatable --set), so a repeated flag never silently keeps only its last value.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <edl/core/error.hpp>

namespace edl::cli {

class Args {
 public:
  /// argv[first..argc) are parsed; `command` names the subcommand in error messages.
  Args(int argc, char** argv, int first, std::string command) : command_(std::move(command)) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) {
        positional_.push_back(a);
        continue;
      }
      if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        values_[a] = argv[++i];
      } else {
        values_[a] = "";
        switches_.insert(a);
      }
      all_[a].push_back(values_[a]);
    }
  }

  bool has(const std::string& flag) { used_.insert(flag); return values_.count(flag) > 0; }

  std::string str(const std::string& flag, const std::string& fallback) {
    used_.insert(flag);
    auto it = values_.find(flag);
    return it == values_.end() ? fallback : it->second;
  }
  std::string required(const std::string& flag) {
    used_.insert(flag);
    auto it = values_.find(flag);
    EDL_CHECK(it != values_.end() && !it->second.empty(), errc::invalid_argument, "edl " + command_,
              "missing required flag ", flag, " <value>");
    return it->second;
  }
  std::int64_t integer(const std::string& flag, std::int64_t fallback) {
    const std::string s = str(flag, "");
    if (s.empty()) return fallback;
    std::size_t pos = 0;
    long long v = 0;
    try { v = std::stoll(s, &pos); } catch (...) { pos = 0; }
    EDL_CHECK(pos == s.size(), errc::invalid_argument, "edl " + command_, flag, " expects an integer, found \"", s, "\"");
    return v;
  }
  double number(const std::string& flag, double fallback) {
    const std::string s = str(flag, "");
    if (s.empty()) return fallback;
    std::size_t pos = 0;
    double v = 0;
    try { v = std::stod(s, &pos); } catch (...) { pos = 0; }
    EDL_CHECK(pos == s.size(), errc::invalid_argument, "edl " + command_, flag, " expects a number, found \"", s, "\"");
    return v;
  }

  /// Every value of a repeatable flag, in order (empty when absent).
  std::vector<std::string> all(const std::string& flag) {
    used_.insert(flag);
    repeatable_.insert(flag);
    auto it = all_.find(flag);
    return it == all_.end() ? std::vector<std::string>{} : it->second;
  }

  /// Arguments that are neither flags nor flag values, in order. Calling this accepts them.
  const std::vector<std::string>& positional() {
    positional_used_ = true;
    return positional_;
  }

  /// Call after reading every flag: any flag not asked for is an error, and so is a positional
  /// argument when the command never asked for positional().
  void finish() const {
    EDL_CHECK(positional_used_ || positional_.empty(), errc::invalid_argument, "edl " + command_,
              "expected a flag starting with --, found \"", positional_.empty() ? "" : positional_.front(), "\"");
    for (const auto& [k, v] : values_)
      EDL_CHECK(used_.count(k), errc::invalid_argument, "edl " + command_, "unknown flag ", k);
    for (const auto& [k, vs] : all_)
      EDL_CHECK(vs.size() == 1 || repeatable_.count(k), errc::invalid_argument, "edl " + command_, "flag ", k,
                " is given ", vs.size(), " times; it takes one value");
  }

 private:
  std::string command_;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> all_;
  std::set<std::string> switches_, used_, repeatable_;
  std::vector<std::string> positional_;
  bool positional_used_ = false;
};

}  // namespace edl::cli
