// examples/cli/command_line.hpp: the `edl` command line around the command tables of args.hpp.
// CLI11 parses argv into the flags a command declares; on top of it this file gives what the
// tool promises to the person typing:
//
//   edl --help | edl help       the commands by group, each with its one-line summary
//   edl CMD --help | -h         synopsis, every flag with its type, default and meaning, examples
//                               (exit 0, before any check of the flags given)
//   edl --version               version, instruction set, MPI and the other optional parts built in
//   edl completion bash         a bash completion script for the commands, flags and flag values
//
// and errors that help: an unknown command or flag suggests the closest names ("did you mean
// --max-new-tokens?"), a missing required flag is named, a bad value names the flag, the value
// and what is allowed. Exit codes: 0 ok, 1 runtime error, 2 usage error (docs/cli.md).
//
// Parsing keeps the rules the tool always had: "--flag value" (or --flag=value) gives the value
// to the flag unless it looks like a flag itself ("--flag --other" leaves --flag empty; a value
// starting with - is given as --flag=-x, negative numbers excepted); a switch takes no value; a
// flag given twice is an error unless it is repeatable (edl train --set); only commands that
// name positional arguments accept words that are no flag's value.
#pragma once

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <xsimd/xsimd.hpp>

#include <edl/version.hpp>
#include "args.hpp"

namespace edl::cli {

namespace command_line_detail {

/// The commands of this build, as parse_command_line was given them (read by `edl completion`).
inline const std::vector<Command>*& registered_commands() {
  static const std::vector<Command>* table = nullptr;
  return table;
}

inline bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

inline std::string strip_dashes(const std::string& s) { return s.substr(std::min(s.find_first_not_of('-'), s.size())); }

/// Optimal string alignment distance: an insertion, a deletion, a substitution or a swap of two
/// neighbours costs 1 ("--max-new-token" is 1 from "--max-new-tokens", "genreate" 1 from "generate").
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

/// The candidates close to `word`, closest first (at most 3): within an edit distance of a
/// third of its length (at least 2), or starting with it (from 3 characters on). Leading
/// dashes are not compared, so "-model" finds "--model".
inline std::vector<std::string> closest(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = strip_dashes(word);
  const std::size_t limit = std::max<std::size_t>(2, w.size() / 3);
  std::vector<std::pair<std::size_t, std::string>> scored;
  for (const auto& c : candidates) {
    const std::string s = strip_dashes(c);
    const std::size_t d = w.size() >= 3 && starts_with(s, w) ? 0 : edit_distance(w, s);
    if (d <= limit && std::none_of(scored.begin(), scored.end(), [&](const auto& p) { return p.second == c; }))
      scored.emplace_back(d, c);
  }
  std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (std::size_t i = 0; i < scored.size() && i < 3; ++i) out.push_back(scored[i].second);
  return out;
}

/// "; did you mean --top-k or --top-p?", or nothing when no name is close.
inline std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const auto near = closest(word, candidates);
  if (near.empty()) return "";
  std::string s = "; did you mean ";
  for (std::size_t i = 0; i < near.size(); ++i)
    s += (i == 0 ? "" : i + 1 == near.size() ? " or " : ", ") + near[i];
  return s + "?";
}

inline std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : sep) + i;
  return s;
}

/// A flag's line of --help after its name: its meaning, then (type, default, required, repeatable).
inline std::string flag_description(const Flag& f) {
  std::string notes = flag_type_name(f.type);
  if (!f.default_text.empty()) notes += ", default " + f.default_text;
  if (f.is_required) notes += ", required";
  if (f.is_repeatable) notes += ", repeatable";
  return f.help + " (" + notes + ")";
}

/// CLI11's help layout with edl's usage line (the command's synopsis) and labels.
class HelpFormatter : public CLI::Formatter {
 public:
  explicit HelpFormatter(const Command& c) : command_(c) {
    column_width(32);
    label("Positionals", "arguments");
  }
  std::string make_usage(const CLI::App*, std::string) const override {
    return "usage: edl " + command_.name + " " + command_.synopsis + "\n";
  }

 private:
  const Command& command_;
};

/// The CLI11 parser of one command, and the option of each of its flags.
struct CommandParser {
  std::unique_ptr<CLI::App> app;
  std::vector<std::pair<const Flag*, CLI::Option*>> options;
  CLI::Option* positional = nullptr;
};

inline CommandParser make_parser(const Command& c) {
  CommandParser p;
  p.app = std::make_unique<CLI::App>("edl " + c.name + ": " + c.summary + "\n", "edl " + c.name);
  p.app->formatter(std::make_shared<HelpFormatter>(c));
  p.app->allow_extras();  // unknown flags and stray words are reported here, with suggestions
  p.app->option_defaults()->group("flags");
  p.app->set_help_flag("-h,--help", "print this help and exit");
  for (const Flag& f : c.flags) {
    CLI::Option* o = nullptr;
    if (f.type == FlagType::switch_) {
      o = p.app->add_flag(f.name);
      o->disable_flag_override();  // --greedy=false is an error, not a switch that is on
    } else {
      // Zero or one value per occurrence: "--flag --other" leaves --flag empty, as always.
      o = p.app->add_option(f.name)->expected(0, 1)->type_name(f.value_name);
    }
    o->description(flag_description(f));
    o->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);  // a repeat is counted below
    p.options.emplace_back(&f, o);
  }
  if (!c.positional.empty())
    p.positional = p.app->add_option(c.positional, c.positional_help)
                       ->expected(0, CLI::detail::expected_max_vector_size)
                       ->allow_extra_args();
  if (!c.examples.empty()) p.app->footer("examples:\n  " + join(c.examples, "\n  "));
  return p;
}

[[noreturn]] inline void usage_error(const Command& c, const std::string& what) {
  throw UsageError(errc::invalid_argument, "edl " + c.name, what);
}

/// Parses argv[first..argc) as command `c`'s flags and checks them against its table. Help:
/// nothing (the help is printed). A usage error: UsageError.
inline std::optional<Args> parse_flags(const Command& c, int argc, char** argv, int first) {
  CommandParser p = make_parser(c);
  std::vector<std::string> words(argv + first, argv + argc);
  std::reverse(words.begin(), words.end());  // CLI11 takes them last first
  try {
    p.app->parse(words);
  } catch (const CLI::CallForHelp&) {
    std::cout << p.app->help();
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    usage_error(c, e.what());
  }
  std::vector<std::string> names;
  for (const Flag& f : c.flags) names.push_back(f.name);
  names.push_back("--help");
  const std::vector<std::string> rest = p.app->remaining();
  for (const std::string& r : rest)
    if (r.size() > 1 && r[0] == '-') {
      const std::string flag = r.substr(0, r.find('='));
      usage_error(c, "unknown flag " + flag + did_you_mean(flag, names));
    }
  if (!rest.empty()) usage_error(c, "expected a flag starting with --, found \"" + rest.front() + "\"");

  std::map<std::string, std::vector<std::string>> values;
  for (const auto& [f, o] : p.options) {
    if (o->count() == 0) continue;
    std::vector<std::string> v = f->type == FlagType::switch_ ? std::vector<std::string>(o->count(), "") : o->results();
    if (v.size() > 1 && !f->is_repeatable)
      usage_error(c, "flag " + f->name + " is given " + std::to_string(v.size()) + " times; it takes one value");
    for (const std::string& s : v) {
      if (s.empty()) continue;  // "--flag" without a value: the command decides (required, or its default)
      std::int64_t i = 0;
      double x = 0;
      if (f->type == FlagType::integer && !Args::parse_integer(s, i))
        usage_error(c, f->name + " expects an integer, found \"" + s + "\"");
      if (f->type == FlagType::number && !Args::parse_number(s, x))
        usage_error(c, f->name + " expects a number, found \"" + s + "\"");
      if (!f->allowed.empty() && std::find(f->allowed.begin(), f->allowed.end(), s) == f->allowed.end())
        usage_error(c, f->name + " expects one of " + join(f->allowed, ", ") + "; found \"" + s + "\"" +
                           did_you_mean(s, f->allowed));
    }
    values[f->name] = std::move(v);
  }
  for (const Flag& f : c.flags)
    if (f.is_required && (!values.count(f.name) || values[f.name].back().empty()))
      usage_error(c, "missing required flag " + f.name + " " + f.value_name);
  std::vector<std::string> positional = p.positional ? p.positional->results() : std::vector<std::string>{};
  return Args(c, std::move(values), std::move(positional));
}

/// Every command name, and the first words of two-word commands ("bench").
inline std::vector<std::string> command_words(const std::vector<Command>& table) {
  std::vector<std::string> words;
  for (const Command& c : table) {
    words.push_back(c.name);
    const std::string first = c.name.substr(0, c.name.find(' '));
    if (first != c.name && std::find(words.begin(), words.end(), first) == words.end()) words.push_back(first);
  }
  return words;
}

/// The commands whose name starts with `prefix`, by group: "models:\n  logits   run ...".
inline std::string command_list(const std::vector<Command>& table, const std::string& prefix = "") {
  std::vector<std::string> groups;
  std::size_t width = 0;
  for (const Command& c : table) {
    if (!starts_with(c.name, prefix)) continue;
    if (std::find(groups.begin(), groups.end(), c.group) == groups.end()) groups.push_back(c.group);
    width = std::max(width, c.name.size());
  }
  std::string s;
  for (const std::string& g : groups) {
    s += "\n" + g + ":\n";
    for (const Command& c : table)
      if (c.group == g && starts_with(c.name, prefix))
        s += "  " + c.name + std::string(width + 3 - c.name.size(), ' ') + c.summary + "\n";
  }
  return s;
}

inline std::string main_help(const std::vector<Command>& table) {
  return std::string("edl ") + EDL_VERSION_STRING +
         ": train, run and serve transformer language models on CPUs\n\n"
         "usage: edl <command> [flags]\n"
         "       edl <command> --help   the command's flags, their defaults, and examples\n"
         "       edl --version          version, instruction set and optional parts of this build\n" +
         command_list(table) +
         "\nEvery command prints JSON on stdout (one object, or one per line for benchmarks); errors go to\n"
         "stderr. Exit codes: 0 ok, 1 runtime error, 2 usage error (unknown command or flag, missing flag,\n"
         "bad value). docs/cli.md describes every command.\n";
}

/// The instruction-set extensions this binary was compiled for (the compiler's -march macros).
inline std::string instruction_set() {
  std::vector<std::string> isa;
#if defined(__AVX2__)
  isa.push_back("AVX2");
#endif
#if defined(__FMA__)
  isa.push_back("FMA");
#endif
#if defined(__F16C__)
  isa.push_back("F16C");
#endif
#if defined(__AVX512F__)
  isa.push_back("AVX-512F");
#endif
#if defined(__AVX512BW__)
  isa.push_back("AVX-512BW");
#endif
#if defined(__AVX512DQ__)
  isa.push_back("AVX-512DQ");
#endif
#if defined(__AVX512VL__)
  isa.push_back("AVX-512VL");
#endif
#if defined(__AVX512VNNI__)
  isa.push_back("AVX-512 VNNI");
#endif
#if defined(__AVXVNNI__)
  isa.push_back("AVX-VNNI");
#endif
#if defined(__AVX512BF16__)
  isa.push_back("AVX-512 BF16");
#endif
#if defined(__AMX_TILE__)
  isa.push_back("AMX");
#endif
#if defined(__ARM_NEON)
  isa.push_back("NEON");
#endif
  return isa.empty() ? std::string("baseline (no AVX2)") : join(isa, " ");
}

inline std::string version_text() {
  std::string s = std::string("edl ") + EDL_VERSION_STRING + "\n";
  s += "instruction set: " + instruction_set() + " (SIMD kernels: " + xsimd::default_arch::name() + ")\n";
#ifdef EDL_WITH_MPI
  s += "MPI: yes (runs under mpirun: one rank per process)\n";
#else
  s += "MPI: no (built without an MPI library: install libopenmpi-dev and rebuild to run under mpirun)\n";
#endif
#ifdef EDL_CLI_HAVE_SERVE
  s += "serve: yes (edl serve, cpp-httplib)\n";
#else
  s += "serve: no (built without cpp-httplib: no edl serve)\n";
#endif
#ifdef EDL_HAVE_OPENBLAS
  s += "OpenBLAS: yes (edl bench gemm times it beside edl)\n";
#else
  s += "OpenBLAS: no (edl bench gemm times edl alone)\n";
#endif
#ifdef EDL_CLI_HAVE_LIBEDIT
  s += "line editing: yes (edl chat, libedit)\n";
#else
  s += "line editing: no (edl chat reads plain lines)\n";
#endif
#if defined(__clang__)
  s += std::string("compiler: clang ") + __clang_version__ + "\n";
#elif defined(__GNUC__)
  s += std::string("compiler: gcc ") + __VERSION__ + "\n";
#endif
  return s;
}

/// A bash word list, quoted for the script.
inline std::string bash_words(const std::vector<std::string>& words) { return "'" + join(words, " ") + "'"; }

/// The bash completion script of `table`: command names, then each command's flags, and the
/// allowed values after a flag that has them; files otherwise (complete -o default).
inline std::string bash_completion(const std::vector<Command>& table) {
  std::vector<std::string> first_words = {"--help", "--version", "help"};
  std::map<std::string, std::vector<std::string>> second_words;  // "bench" -> decode, gemm, ...
  for (const Command& c : table) {
    const std::size_t sp = c.name.find(' ');
    const std::string first = c.name.substr(0, sp);
    if (std::find(first_words.begin(), first_words.end(), first) == first_words.end()) first_words.push_back(first);
    if (sp != std::string::npos) second_words[first].push_back(c.name.substr(sp + 1));
  }
  std::ostringstream s;
  s << "# bash completion for edl (from `edl completion bash`): commands, their flags, and the values\n"
       "# a flag allows. Load it with: source <(edl completion bash)\n"
       "_edl() {\n"
       "  local cur=${COMP_WORDS[COMP_CWORD]-} prev=${COMP_WORDS[COMP_CWORD-1]-} cmd=${COMP_WORDS[1]-}\n"
       "  COMPREPLY=()\n"
       "  if ((COMP_CWORD == 1)); then\n"
       "    COMPREPLY=($(compgen -W "
    << bash_words(first_words)
    << " -- \"$cur\"))\n"
       "    return\n"
       "  fi\n"
       "  case $cmd in\n";
  for (const auto& [first, seconds] : second_words)
    s << "    " << first << ")\n"
      << "      if ((COMP_CWORD == 2)); then\n"
      << "        COMPREPLY=($(compgen -W " << bash_words(seconds) << " -- \"$cur\"))\n"
      << "        return\n"
      << "      fi\n"
      << "      cmd=\"" << first << " ${COMP_WORDS[2]-}\" ;;\n";
  s << "  esac\n"
       "  local flags=\n"
       "  case $cmd in\n";
  for (const Command& c : table) {
    std::vector<std::string> names = {"--help"};
    for (const Flag& f : c.flags) names.push_back(f.name);
    s << "    '" << c.name << "')\n"
      << "      flags=" << bash_words(names) << "\n";
    bool any_values = false;
    for (const Flag& f : c.flags)
      if (!f.allowed.empty()) any_values = true;
    if (any_values) {
      s << "      case $prev in\n";
      for (const Flag& f : c.flags)
        if (!f.allowed.empty())
          s << "        " << f.name << ") COMPREPLY=($(compgen -W " << bash_words(f.allowed)
            << " -- \"$cur\")); return ;;\n";
      s << "      esac\n";
    }
    s << "      ;;\n";
  }
  s << "  esac\n"
       "  if [[ $cur == -* ]]; then\n"
       "    COMPREPLY=($(compgen -W \"$flags\" -- \"$cur\"))\n"
       "  fi\n"
       "  return 0\n"
       "}\n"
       "complete -o default -F _edl edl\n";
  return s.str();
}

/// edl completion bash
inline int cmd_completion(Args& args) {
  const auto& pos = args.positional();
  args.finish();
  EDL_CLI_USAGE_CHECK(pos.size() == 1, errc::invalid_argument, "edl completion", "expected one shell (bash), found ",
                      pos.size(), " arguments");
  EDL_CLI_USAGE_CHECK(pos[0] == "bash", errc::invalid_argument, "edl completion",
                      "only bash is supported, found \"", pos[0], "\"");
  std::cout << bash_completion(*registered_commands());
  return 0;
}

}  // namespace command_line_detail

/// `edl completion`: its table entry (the command list itself comes from parse_command_line).
inline Command completion_command() {
  return {.name = "completion",
          .group = "shell",
          .summary = "print a bash completion script for the commands, flags and flag values",
          .synopsis = "bash",
          .positional = "SHELL",
          .positional_help = "the shell: bash",
          .examples = {"source <(edl completion bash)",
                       "edl completion bash > ~/.local/share/bash-completion/completions/edl"},
          .run = command_line_detail::cmd_completion};
}

/// Prints a failed command's error: `edl CMD: <message>`, and for a usage error where to read
/// how the command is called.
inline void print_error(const std::string& command, const std::exception& e, bool usage) {
  std::fprintf(stderr, "edl %s: %s\n", command.c_str(), e.what());
  if (usage) std::fprintf(stderr, "(edl %s --help lists its flags, their defaults, and examples)\n", command.c_str());
}

/// What argv asks for: a command to run with its Args, or nothing more to do (help or the
/// version printed: exit_code 0; a usage error printed: exit_code 2).
struct CommandLine {
  const Command* command = nullptr;
  std::optional<Args> args;
  int exit_code = 0;
};

inline CommandLine parse_command_line(int argc, char** argv, const std::vector<Command>& table) {
  namespace d = command_line_detail;
  d::registered_commands() = &table;
  CommandLine out;
  const auto usage = [&](const std::string& message, const std::string& hint) {
    std::fprintf(stderr, "%s\n(%s)\n", message.c_str(), hint.c_str());
    out.exit_code = 2;
    return out;
  };
  if (argc < 2) {
    std::fputs(d::main_help(table).c_str(), stderr);
    out.exit_code = 2;
    return out;
  }
  std::string first = argv[1];
  if (first == "--help" || first == "-h" || (first == "help" && argc == 2)) {
    std::fputs(d::main_help(table).c_str(), stdout);
    return out;
  }
  if (first == "--version") {
    std::fputs(d::version_text().c_str(), stdout);
    return out;
  }
  // edl help CMD: edl CMD --help
  std::vector<char*> help_argv;
  if (first == "help") {
    help_argv.assign(argv, argv + argc);
    help_argv.erase(help_argv.begin() + 1);
    static char help_flag[] = "--help";
    help_argv.push_back(help_flag);
    argv = help_argv.data();
    argc = static_cast<int>(help_argv.size());
    first = argv[1];
  }
  if (first.size() > 1 && first[0] == '-')
    return usage("edl: unknown flag " + first + d::did_you_mean(first, {"--help", "--version"}),
                 "flags follow the command: edl <command> [flags]; edl --help lists the commands");
  const auto find = [&](const std::string& name) -> const Command* {
    for (const Command& c : table)
      if (c.name == name) return &c;
    return nullptr;
  };
  // Two-word commands ("bench gemm") are looked up first.
  int rest = 2;
  const Command* c = nullptr;
  if (argc > 2 && (c = find(first + " " + argv[2]))) rest = 3;
  else c = find(first);
  if (!c) {
    const auto words = d::command_words(table);
    const bool is_group = std::find(words.begin(), words.end(), first) != words.end();  // "bench"
    if (is_group) {
      const std::string second = argc > 2 ? argv[2] : "";
      if (second == "--help" || second == "-h") {
        std::fputs(("edl " + first + " commands:\n" + d::command_list(table, first + " ")).c_str(), stdout);
        return out;
      }
      if (second.empty() || second[0] == '-')
        return usage("edl " + first + ": expected one of its commands:\n" + d::command_list(table, first + " "),
                     "edl " + first + " <command> --help shows how to call one");
      std::vector<std::string> names;
      for (const Command& k : table)
        if (d::starts_with(k.name, first + " ")) names.push_back(k.name);
      return usage("edl: unknown command \"" + first + " " + second + "\"" + d::did_you_mean(first + " " + second, names),
                   "edl --help lists the commands");
    }
    return usage("edl: unknown command \"" + first + "\"" + d::did_you_mean(first, words), "edl --help lists the commands");
  }
  try {
    out.args = d::parse_flags(*c, argc, argv, rest);
  } catch (const UsageError& e) {
    print_error(c->name, e, true);
    out.exit_code = 2;
    return out;
  }
  if (out.args) out.command = c;  // else the help was printed
  return out;
}

}  // namespace edl::cli
