// examples/cli/serve.hpp: `edl serve`, an OpenAI-compatible HTTP server (docs/serving.md).
//
//   edl serve --model DIR [--adapter DIR] [--host 127.0.0.1] [--port 8080] [--api-key KEY]
//             [--max-batch N] [--max-queue N] [--threads N] [--mesh dp=1,...]
//             [--tokenizer DIR] [--served-model-name NAME] [--max-model-len N]
//             [--page-size N] [--cache-bytes N] [--prefill-chunk N] [--max-body-bytes N]
//             [--timeout S] [--shutdown-grace S] [--dtype f32|bf16|f16]
//             [--kv-cache f32|int8]
//
// --model may name a preset (tiny, small, gqa1b: random weights) for benchmarks; it then needs
// --tokenizer DIR. Prints {"listening": "http://HOST:PORT"} on stdout once it accepts connections (--port 0:
// a free port). --dtype bf16|f16 serves the weights converted after loading (half the memory
// of f32; compute stays f32); --kv-cache int8 keeps the KV cache as int8 (a quarter of the
// bytes: four times the tokens in the same --cache-bytes). SIGTERM or SIGINT: new requests get 503, in-flight ones finish within
// --shutdown-grace seconds (then are cancelled), and the process exits 0.
#pragma once

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <cerrno>
#include <unistd.h>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include <edl/serve/server.hpp>
#include "adapter_flags.hpp"
#include "args.hpp"
#include "generate.hpp"
#include "mesh_flag.hpp"

namespace edl::cli {

namespace serve_detail {
inline int signal_pipe[2] = {-1, -1};
/// Async-signal-safe: one write.
inline void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!::write(signal_pipe[1], &b, 1);
}

/// Serves `model` until a signal or the server's own shutdown (cmd_serve's flags parsed).
template <class Pol>
int run_server(const models::LlamaForCausalLM<Pol>& model, const serve::ServiceOptions& svc,
               const tokenizer::Tokenizer& tok, const generate::GenerationConfig& defaults,
               const serve::ServerOptions& so, double grace) {
  const std::string where = "edl serve";
  serve::Metrics metrics;
  serve::Service<Pol> service(model, svc, &metrics);
  serve::Server<Pol> server(service, tok, defaults, so, metrics);
  const int port = server.bind();
  // SIGTERM / SIGINT may land on any thread (the MPI runtime and the kernels' pool start
  // theirs before this point): the handler only writes the signal number to a pipe, and one
  // watcher thread reads it and shuts down.
  EDL_CHECK(::pipe(signal_pipe) == 0, errc::io, where, "cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  std::thread watcher([&] {
    unsigned char sig = 0;
    while (::read(signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig == 0) return;  // woken to leave: listen() ended by itself
    std::cerr << "edl serve: signal " << int(sig) << ", shutting down (up to " << grace << " s for in-flight requests)\n";
    server.shutdown(std::chrono::duration<double>(grace));
  });
  nlohmann::ordered_json j;
  j["listening"] = "http://" + so.host + ":" + std::to_string(port);
  std::cout << j.dump() << std::endl;
  server.listen();
  const unsigned char leave = 0;  // wakes the watcher if no signal came (unread if one did)
  (void)!::write(signal_pipe[1], &leave, 1);
  watcher.join();
  service.shutdown(std::chrono::seconds(0));
  return 0;
}
}  // namespace serve_detail

inline int cmd_serve(Args& args) {
  std::signal(SIGPIPE, SIG_IGN);  // a client that left: the write fails instead
  const AdapterFlags af = adapter_flags(args, args.required("--model"), "serve");
  const std::string dir = af.model;
  const bool args_tokenizer_given = args.has("--tokenizer");
  const std::string tok_dir = args.str("--tokenizer", dir);
  serve::ServerOptions so;
  so.host = args.str("--host", so.host);
  so.port = static_cast<int>(args.integer("--port", so.port));
  so.api_key = args.str("--api-key", "");
  so.model_name = args.str("--served-model-name", std::filesystem::path(dir).filename().string());
  so.max_body_bytes = static_cast<std::size_t>(args.integer("--max-body-bytes", static_cast<std::int64_t>(so.max_body_bytes)));
  so.read_timeout_s = so.write_timeout_s = static_cast<int>(args.integer("--timeout", so.read_timeout_s));
  serve::ServiceOptions svc;
  svc.engine.max_batch = args.integer("--max-batch", 8);
  svc.max_queue = args.integer("--max-queue", 64);
  svc.engine.prefill_chunk = args.integer("--prefill-chunk", svc.engine.prefill_chunk);
  svc.engine.paged.page_size = args.integer("--page-size", svc.engine.paged.page_size);
  svc.engine.max_model_length = args.integer("--max-model-len", 0);
  const std::int64_t cache_bytes = args.integer("--cache-bytes", 0);
  const double grace = args.number("--shutdown-grace", 10);
  const double burst_ms = args.number("--burst-window", 2);
  const std::int64_t threads = args.integer("--threads", 0);
  const std::string dtype = args.str("--dtype", "f32");
  svc.engine.kv_cache = gen_detail::kv_cache_flag(args);
  const MeshDims dims = mesh_flag(args);
  args.finish();
  EDL_CLI_USAGE_CHECK(launch().ranks == 1, errc::unsupported, "edl serve",
                      "the server runs in one process (its --mesh devices are threads of it); start it without mpirun");
  svc.engine.mesh = dims;
  EDL_CLI_USAGE_CHECK(so.port >= 0 && so.port <= 65535, errc::invalid_argument, "--port", "expected 0..65535, found ", so.port);
  EDL_CLI_USAGE_CHECK(svc.engine.max_batch >= 1, errc::invalid_argument, "--max-batch", "must be >= 1, found ", svc.engine.max_batch);
  EDL_CLI_USAGE_CHECK(svc.max_queue >= 0, errc::invalid_argument, "--max-queue", "must be >= 0, found ", svc.max_queue);
  EDL_CLI_USAGE_CHECK(cache_bytes >= 0, errc::invalid_argument, "--cache-bytes", "must be >= 0, found ", cache_bytes);
  EDL_CLI_USAGE_CHECK(grace >= 0, errc::invalid_argument, "--shutdown-grace", "must be >= 0, found ", grace);
  EDL_CLI_USAGE_CHECK(burst_ms >= 0 && burst_ms <= 1000, errc::invalid_argument, "--burst-window", "expected 0..1000 ms, found ",
                      burst_ms);
  svc.burst_window = std::chrono::microseconds(static_cast<std::int64_t>(burst_ms * 1000));

  // A preset name (tiny, small, gqa1b: random weights, for benchmarks) with --tokenizer, or
  // an HF folder.
  const auto preset = gen_detail::preset_config(dir);
  const std::filesystem::path d(dir);
  EDL_CHECK(preset || std::filesystem::is_directory(d), errc::io, "--model " + dir,
            "not a directory (or a preset: tiny, small, gqa1b, small_moe, small_wide)");
  EDL_CLI_USAGE_CHECK(!preset || args_tokenizer_given, errc::invalid_argument, "--model " + dir,
                      "a preset model has no tokenizer: give --tokenizer DIR");
  const auto cfg = preset ? *preset : models::LlamaConfig::from_file((d / "config.json").string());
  // Fields a request leaves out: the folder's generation_config.json (as vLLM), or OpenAI's
  // defaults (temperature 1, no top-k) when it has none.
  generate::GenerationConfig defaults = preset ? generate::GenerationConfig::from_model_config(cfg)
                                               : generate::GenerationConfig::from_folder(d, cfg);
  if (preset || !std::filesystem::exists(d / "generation_config.json")) {
    defaults.do_sample = true;
    defaults.top_k = 0;
  }
  const auto tok = tokenizer::Tokenizer::from_file(tok_dir);
  EDL_CHECK(tok.vocab_size() <= cfg.vocab_size, errc::invalid_argument, "--tokenizer " + tok_dir, "its vocabulary (",
            tok.vocab_size(), " tokens) is larger than the model's (", cfg.vocab_size, ")");
  gen_detail::stop_at_tokenizer_eos(defaults, tok);
  auto model = gen_detail::load_then_limit_threads(dir, 0, threads);
  apply_adapter(model, af);
  if (cache_bytes > 0) svc.engine.paged.budget_bytes = cache_bytes;
  return gen_detail::with_param_dtype(model, dtype, true, "serve", [&](const auto& m) {
    return serve_detail::run_server(m, svc, tok, defaults, so, grace);
  });
}

inline Command serve_command() {
  return {
      .name = "serve",
      .group = "serving",
      .summary = "an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /metrics)",
      .synopsis = "--model DIR [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--max-batch N] [flags]",
      .flags = flags(
          {{text_flag("--model", "DIR|tiny|small|gqa1b", "an HF folder, or a preset with random weights (needs --tokenizer)")
                .required()},
           declare_adapter_flags(),
           {text_flag("--tokenizer", "DIR", "the folder whose tokenizer.json encodes the requests").defaults("the --model folder"),
            text_flag("--host", "HOST", "the address listened on").defaults("127.0.0.1"),
            integer_flag("--port", "PORT", "the port listened on (0: a free port, printed)").defaults("8080"),
            text_flag("--api-key", "KEY", "requests must send Authorization: Bearer KEY").defaults("none needed"),
            text_flag("--served-model-name", "NAME", "the model id /v1/models lists").defaults("the folder's name"),
            integer_flag("--max-batch", "N", "requests decoded at once").defaults("8"),
            integer_flag("--max-queue", "N", "requests waiting beyond --max-batch (more get 429)").defaults("64"),
            integer_flag("--threads", "T", "threads of the kernels").defaults("all cores"),
            integer_flag("--max-model-len", "N", "the longest prompt + completion").defaults("max_position_embeddings"),
            integer_flag("--page-size", "N", "tokens per page of the KV cache").defaults("16"),
            integer_flag("--cache-bytes", "N", "memory the KV cache pages may use (each device's on a mesh)").defaults("256 MiB"),
            integer_flag("--prefill-chunk", "N", "prompt tokens per step, shared by the prefilling requests").defaults("256"),
            integer_flag("--max-body-bytes", "N", "larger request bodies get 413").defaults("4 MiB"),
            integer_flag("--timeout", "S", "seconds to read a request or write a response").defaults("30"),
            number_flag("--shutdown-grace", "S", "seconds in-flight requests get after SIGTERM/SIGINT").defaults("10"),
            number_flag("--burst-window", "MS", "an idle engine waits until no request came for MS (at most 4 x MS) before its first step").defaults("2"),
            gen_detail::declare_dtype_flag(),
            gen_detail::declare_kv_cache_flag(),
            declare_mesh_flag("the mesh the engine runs on (tp: heads, sp: cache positions, dp/fsdp/ep: request slots)")}}),
      .examples = {"edl serve --model Qwen3-0.6B --port 8080",
                   "edl serve --model run/checkpoint-400 --port 0 --api-key sekret --max-batch 4"},
      .run = cmd_serve};
}

}  // namespace edl::cli
