// The `edl` command-line tool. Every command prints JSON (one object, or one per line for
// benchmarks) so that other programs can parse it; errors go to stderr. Exit codes: 0 ok,
// 1 runtime error, 2 usage error (unknown command or flag, missing flag, bad value).
// Each command declares its flags in its header (examples/cli/*.hpp); command_line.hpp parses
// argv with CLI11 against those tables and gives `edl --help`, `edl CMD --help`, `edl --version`
// and `edl completion bash` from them.
#include <cstdio>
#include <exception>
#include <vector>

#include <edl/core/allocator.hpp>
#include "cli/args.hpp"
#include "cli/bench_collectives.hpp"
#include "cli/bench_train.hpp"
#include "cli/bench_gemm.hpp"
#include "cli/bench_peak.hpp"
#include "cli/bench_serve.hpp"
#include "cli/command_line.hpp"
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

/// Every command, in the order `edl --help` lists them (grouped by their group).
const std::vector<edl::cli::Command>& commands() {
  using namespace edl::cli;
  static const std::vector<Command> table = {
      logits_command(),
      loss_command(),
      eval_command(),
      generate_command(),
      chat_command(),
      inspect_command(),
      quantize_command(),
      convert_command(),
      merge_lora_command(),
      tokenize_command(),
      detokenize_command(),
      chat_template_command(),
      train_command(),
      report_command(),
      plan_command(),
#ifdef EDL_CLI_HAVE_SERVE
      serve_command(),
#endif
      bench_collectives_command(),
      bench_decode_command(),
      bench_gemm_command(),
      bench_peak_command(),
      bench_serve_command(),
      bench_tokenize_command(),
      bench_train_command(),
      info_command(),
      completion_command(),
  };
  return table;
}

}  // namespace

int main(int argc, char** argv) {
  edl::cli::CommandLine cl = edl::cli::parse_command_line(argc, argv, commands());
  if (!cl.command) return cl.exit_code;  // help or version printed, or a usage error reported
  const std::string& name = cl.command->name;
  edl::keep_freed_memory();  // training steps reuse their pages instead of faulting them in anew
  try {
    edl::start_launch(argc, argv);  // mpirun: one rank per process, rank 0 reports
    if (!edl::launch().is_primary()) std::freopen("/dev/null", "w", stdout);
    return cl.command->run(*cl.args);
  } catch (const edl::cli::UsageError& e) {
    edl::cli::print_error(name, e, /*usage=*/true);
    edl::abort_launch(2);  // under mpirun: end every rank, none is left waiting
    return 2;
  } catch (const std::exception& e) {
    edl::cli::print_error(name, e, /*usage=*/false);
    edl::abort_launch(1);
    return 1;
  }
}
