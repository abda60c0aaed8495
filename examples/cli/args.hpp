// examples/cli/args.hpp: what each `edl` command declares about its command line, and how its
// body reads the values given.
//
// A Command is a name ("generate", "bench decode"), the group `edl --help` lists it under, a
// one-line summary, a synopsis, its flags, its examples and the function that runs it. A Flag
// is one declaration: name, type (text, integer, number or switch), the name of its value,
// its default as --help shows it, its allowed values and its meaning. command_line.hpp turns
// these tables into the CLI11 parser, `--help`, the errors and the shell completion, so what
// is accepted, what is documented and what is completed cannot drift apart.
//
// The body reads what was given through Args (has / str / required / integer / number / all /
// positional / finish), as it did when Args parsed argv itself. Reading a flag its table does
// not declare is a programming error (std::logic_error), so no flag is accepted undocumented.
// Errors in how the tool was called are UsageError (exit code 2); EDL_CLI_USAGE_CHECK raises
// one with the message format of EDL_CHECK.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <edl/core/error.hpp>

namespace edl::cli {

/// An error in how the tool was called (unknown flag, missing flag, bad value, flags that do
/// not go together): `edl` exits with 2 instead of 1 and points to the command's --help.
class UsageError : public Error {
 public:
  using Error::Error;
};

/// EDL_CHECK for the command line: raises a UsageError.
#define EDL_CLI_USAGE_CHECK(cond, code, where, ...)                                                     \
  do {                                                                                                 \
    if (!(cond)) throw ::edl::cli::UsageError((code), (where), ::edl::detail::concat(__VA_ARGS__));   \
  } while (0)

enum class FlagType { text, integer, number, switch_ };

inline const char* flag_type_name(FlagType t) {
  switch (t) {
    case FlagType::text: return "text";
    case FlagType::integer: return "integer";
    case FlagType::number: return "number";
    case FlagType::switch_: return "switch";
  }
  return "text";
}

/// One flag of a command. Built with text_flag / integer_flag / number_flag / switch_flag and
/// refined with .defaults(), .one_of(), .required() and .repeatable().
struct Flag {
  std::string name{};                  // "--max-new-tokens"
  FlagType type = FlagType::text;
  std::string value_name{};            // its value in --help: DIR, N, standard|int8|paged (none for a switch)
  std::string help{};                  // what it means, in a line
  std::string default_text{};          // the default as --help shows it ("" when absent means absent)
  std::vector<std::string> allowed{};  // when not empty: the only values accepted
  bool is_required = false;
  bool is_repeatable = false;          // given several times, every value counts (edl train --set)

  Flag&& defaults(std::string text) && {
    default_text = std::move(text);
    return std::move(*this);
  }
  /// Only these values are accepted; the value name becomes a|b|c unless one was given.
  Flag&& one_of(std::vector<std::string> values) && {
    allowed = std::move(values);
    if (value_name.empty())
      for (const auto& v : allowed) value_name += (value_name.empty() ? "" : "|") + v;
    return std::move(*this);
  }
  Flag&& required() && {
    is_required = true;
    return std::move(*this);
  }
  Flag&& repeatable() && {
    is_repeatable = true;
    return std::move(*this);
  }
};

inline Flag text_flag(std::string name, std::string value_name, std::string help) {
  return Flag{std::move(name), FlagType::text, std::move(value_name), std::move(help)};
}
inline Flag integer_flag(std::string name, std::string value_name, std::string help) {
  return Flag{std::move(name), FlagType::integer, std::move(value_name), std::move(help)};
}
inline Flag number_flag(std::string name, std::string value_name, std::string help) {
  return Flag{std::move(name), FlagType::number, std::move(value_name), std::move(help)};
}
inline Flag switch_flag(std::string name, std::string help) {
  return Flag{std::move(name), FlagType::switch_, "", std::move(help)};
}

/// The flags of several groups in order: flags({model}, adapter_flag_specs(), {...}).
inline std::vector<Flag> flags(std::initializer_list<std::vector<Flag>> groups) {
  std::vector<Flag> all;
  for (const auto& g : groups) all.insert(all.end(), g.begin(), g.end());
  return all;
}

class Args;

/// A command of the tool, as `edl --help`, `edl NAME --help`, the parser and the shell
/// completion see it.
struct Command {
  std::string name{};                   // "generate", or two words: "bench decode"
  std::string group{};                  // the heading edl --help lists it under: models, training, ...
  std::string summary{};                // one line for edl --help
  std::string synopsis{};               // the usage line after "edl NAME "
  std::vector<Flag> flags{};
  std::string positional{};             // its arguments in --help ("FILE"); empty: it takes none
  std::string positional_help{};
  std::vector<std::string> examples{};  // whole command lines
  int (*run)(Args&) = nullptr;
};

/// What a command was given, read by its body. Built by command_line.hpp from CLI11's parse,
/// after every flag was checked against the command's table (known, given once unless
/// repeatable, of its type, one of its allowed values, required ones present).
class Args {
 public:
  /// values: every value of each flag given, in order (a switch: "" per time given).
  Args(const Command& command, std::map<std::string, std::vector<std::string>> values,
       std::vector<std::string> positional)
      : command_(&command), values_(std::move(values)), positional_(std::move(positional)) {}

  const std::string& command() const { return command_->name; }

  bool has(const std::string& flag) {
    use(flag);
    return values_.count(flag) > 0;
  }

  /// The flag's value, or `fallback` when it was not given.
  std::string str(const std::string& flag, const std::string& fallback) {
    use(flag);
    auto it = values_.find(flag);
    return it == values_.end() ? fallback : it->second.back();
  }
  std::string required(const std::string& flag) {
    use(flag);
    auto it = values_.find(flag);
    EDL_CLI_USAGE_CHECK(it != values_.end() && !it->second.back().empty(), errc::invalid_argument, where(),
                        "missing required flag ", flag, " ", value_name(flag));
    return it->second.back();
  }
  std::int64_t integer(const std::string& flag, std::int64_t fallback) {
    const std::string s = str(flag, "");
    if (s.empty()) return fallback;
    std::int64_t v = 0;
    EDL_CLI_USAGE_CHECK(parse_integer(s, v), errc::invalid_argument, where(), flag, " expects an integer, found \"", s,
                        "\"");
    return v;
  }
  double number(const std::string& flag, double fallback) {
    const std::string s = str(flag, "");
    if (s.empty()) return fallback;
    double v = 0;
    EDL_CLI_USAGE_CHECK(parse_number(s, v), errc::invalid_argument, where(), flag, " expects a number, found \"", s,
                        "\"");
    return v;
  }

  /// Every value of a repeatable flag, in order (empty when absent).
  std::vector<std::string> all(const std::string& flag) {
    use(flag);
    auto it = values_.find(flag);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }

  /// The arguments that are neither flags nor flag values, in order (only a command whose
  /// table names positional arguments is given any).
  const std::vector<std::string>& positional() {
    positional_used_ = true;
    return positional_;
  }

  /// Call after reading every flag. A flag given but never read means the command's table and
  /// its body disagree: a programming error, never silently ignored.
  void finish() const {
    EDL_CLI_USAGE_CHECK(positional_used_ || positional_.empty(), errc::invalid_argument, where(),
                        "expected a flag starting with --, found \"", positional_.empty() ? "" : positional_.front(),
                        "\"");
    for (const auto& [flag, values] : values_)
      if (!used_.count(flag))
        throw std::logic_error(where() + " declares " + flag + " but never reads it");
  }

  /// Whole-string conversions, as the parser checks the integer and number flags.
  static bool parse_integer(const std::string& s, std::int64_t& out) {
    std::size_t pos = 0;
    try {
      out = std::stoll(s, &pos);
    } catch (...) {
      return false;
    }
    return !s.empty() && pos == s.size();
  }
  static bool parse_number(const std::string& s, double& out) {
    std::size_t pos = 0;
    try {
      out = std::stod(s, &pos);
    } catch (...) {
      return false;
    }
    return !s.empty() && pos == s.size();
  }

 private:
  std::string where() const { return "edl " + command_->name; }

  const Flag& declared(const std::string& flag) const {
    for (const auto& f : command_->flags)
      if (f.name == flag) return f;
    throw std::logic_error(where() + " reads " + flag + ", which its flag table does not declare");
  }
  void use(const std::string& flag) {
    declared(flag);
    used_.insert(flag);
  }
  std::string value_name(const std::string& flag) const {
    const std::string& v = declared(flag).value_name;
    return v.empty() ? "<value>" : v;
  }

  const Command* command_;
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
  std::set<std::string> used_;
  bool positional_used_ = false;
};

}  // namespace edl::cli
