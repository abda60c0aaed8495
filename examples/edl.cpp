// The `edl` command-line tool. Every subcommand prints JSON (one object, or one per line for
// benchmarks) so that other programs can parse it; errors go to stderr with exit code 1.
#include <cstdio>
#include <functional>
#include <map>
#include <string>

#include <edl/core/allocator.hpp>
#include "cli/args.hpp"
#include "cli/bench_collectives.hpp"
#include "cli/bench_train.hpp"
#include "cli/bench_gemm.hpp"
#include "cli/bench_peak.hpp"
#include "cli/bench_serve.hpp"
#include "cli/convert.hpp"
#include "cli/eval.hpp"
#include "cli/generate.hpp"
#include "cli/info.hpp"
#include "cli/inspect.hpp"
#include "cli/logits.hpp"
#include "cli/loss.hpp"
#include "cli/merge_lora.hpp"
#include "cli/mesh_flag.hpp"
#include "cli/plan.hpp"
#include "cli/quantize.hpp"
#include "cli/report.hpp"
#include "cli/chat.hpp"
#include "cli/chat_template.hpp"
#include "cli/tokenize.hpp"
#ifdef EDL_CLI_HAVE_SERVE
#include "cli/serve.hpp"
#endif
#include "cli/train.hpp"

namespace {

using Command = std::function<int(edl::cli::Args&)>;

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> table = {
      {"info", edl::cli::cmd_info},
      {"bench collectives", edl::cli::cmd_bench_collectives},
      {"bench decode", edl::cli::cmd_bench_decode},
      {"bench gemm", edl::cli::cmd_bench_gemm},
      {"bench peak", edl::cli::cmd_bench_peak},
      {"bench serve", edl::cli::cmd_bench_serve},
      {"convert", edl::cli::cmd_convert},
      {"eval", edl::cli::cmd_eval},
      {"generate", edl::cli::cmd_generate},
      {"bench train", edl::cli::cmd_bench_train},
      {"inspect", edl::cli::cmd_inspect},
      {"logits", edl::cli::cmd_logits},
      {"loss", edl::cli::cmd_loss},
      {"merge-lora", edl::cli::cmd_merge_lora},
      {"plan", edl::cli::cmd_plan},
      {"quantize", edl::cli::cmd_quantize},
      {"report", edl::cli::cmd_report},
      {"train", edl::cli::cmd_train},
      {"tokenize", edl::cli::cmd_tokenize},
      {"chat-template", edl::cli::cmd_chat_template},
      {"chat", edl::cli::cmd_chat},
      {"detokenize", edl::cli::cmd_detokenize},
      {"bench tokenize", edl::cli::cmd_bench_tokenize},
#ifdef EDL_CLI_HAVE_SERVE
      {"serve", edl::cli::cmd_serve},
#endif
  };
  return table;
}

void usage() {
  std::fprintf(stderr, "usage: edl <command> [flags]\ncommands:");
  for (const auto& [name, fn] : commands()) std::fprintf(stderr, " %s", name.c_str());
  std::fprintf(stderr, "\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  edl::keep_freed_memory();  // training steps reuse their pages instead of faulting them in anew
  // Two-word commands ("bench gemm") are looked up first.
  std::string name = argv[1];
  int first = 2;
  if (argc > 2 && commands().count(name + " " + argv[2])) {
    name = name + " " + argv[2];
    first = 3;
  }
  auto it = commands().find(name);
  if (it == commands().end()) {
    std::fprintf(stderr, "edl: unknown command \"%s\"\n", name.c_str());
    usage();
    return 2;
  }
  try {
    edl::cli::init_launch(argc, argv);  // mpirun: one rank per process, rank 0 reports
    if (!edl::cli::is_primary()) std::freopen("/dev/null", "w", stdout);
    edl::cli::Args args(argc, argv, first, name);
    return it->second(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edl %s: %s\n", name.c_str(), e.what());
    edl::cli::end_launch_after_error(1);  // under mpirun: end every rank, none is left waiting
    return 1;
  }
}
