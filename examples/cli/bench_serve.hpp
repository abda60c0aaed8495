// examples/cli/bench_serve.hpp: `edl bench serve` times the continuous batching engine
// (docs/generation.md, "Continuous batching"; figures in docs/benchmarks.md).
//
//   edl bench serve (--model DIR|tiny|small|gqa1b | --config tiny|small|gqa1b|DIR)
//                   [--requests 1,4,16] [--prompt-len P] [--gen-len G] [--threads T]
//                   [--page-size N] [--cache-bytes N] [--prefill-chunk C] [--seed S]
//                   [--mesh dp=1,fsdp=1,ep=1,tp=1,sp=1] [--dtype f32|bf16|f16] [--kv-cache f32|int8]
//                   [--rounds R]
//
// For each concurrency N of --requests: a new Engine with N slots, N requests of P random
// prompt tokens (stream i of Key S for request i) submitted at once, greedy, G new tokens each
// (no stop token, so every request runs to G), engine.run() timed from the first submit. With
// --rounds R, N clients each send R requests one after another (the next as soon as the last
// is done, between two engine steps), as bench/serve_http.mjs's clients do over HTTP: the
// in-process twin of an HTTP run, arrivals staggered the same way.
// One JSON line per concurrency:
//   {"model", "dtype", "kv_cache", "threads", "requests", "prompt_len", "gen_len", "page_size", "prefill_chunk",
//    "generated_tokens", "wall_seconds", "tokens_per_s", "mean_time_to_first_token_s",
//    "steps", "preemptions", "kv_pool_bytes", "peak_kv_bytes", "peak_bytes", "peak_bytes_window", "rounds"}
// tokens_per_s = generated tokens / wall seconds (prefill time included). The page pool holds
// exactly N x (P + G) tokens (on a --mesh, in every device's pool) unless --cache-bytes sets
// the budget (then each device's) (then requests may wait or
// be preempted). peak_bytes is the process's peak resident set (VmHWM) during that
// concurrency's run where the kernel lets it be reset (/proc/self/clear_refs; peak_bytes_window
// says "this run", else "process"), so it includes the model's weights; peak_kv_bytes is the
// pages actually used.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/generate/engine.hpp>
#include <edl/core/process_memory.hpp>
#include "args.hpp"
#include "generate.hpp"
#include "mesh_flag.hpp"

namespace edl::cli {


inline int cmd_bench_serve(Args& args) {
  const std::string where = "edl bench serve";
  const bool has_model = args.has("--model"), has_config = args.has("--config");
  EDL_CLI_USAGE_CHECK(has_model != has_config, errc::invalid_argument, where,
                      "give exactly one of --model DIR|tiny|small|gqa1b and --config tiny|small|gqa1b|DIR");
  const AdapterFlags af = adapter_flags(args, has_model ? args.required("--model") : args.required("--config"),
                                        "bench serve");
  const std::string name = af.model;
  const auto requests = gen_detail::parse_int_list(args.str("--requests", "1,4,16"), "--requests", "request counts");
  const std::int64_t P = args.integer("--prompt-len", 64), G = args.integer("--gen-len", 64);
  const std::int64_t threads = args.integer("--threads", 0);
  const std::uint64_t seed = static_cast<std::uint64_t>(args.integer("--seed", 0));
  generate::EngineOptions eo;
  eo.paged.page_size = args.integer("--page-size", eo.paged.page_size);
  eo.prefill_chunk = args.integer("--prefill-chunk", eo.prefill_chunk);
  const std::int64_t cache_bytes = args.integer("--cache-bytes", 0);
  eo.mesh = mesh_flag(args);
  const std::string dtype = args.str("--dtype", "f32");
  eo.kv_cache = gen_detail::kv_cache_flag(args);
  const std::int64_t rounds = args.integer("--rounds", 1);
  args.finish();
  EDL_CLI_USAGE_CHECK(rounds >= 1, errc::invalid_argument, "--rounds", "must be >= 1, found ", rounds);
  for (auto n : requests)
    EDL_CLI_USAGE_CHECK(n >= 1, errc::invalid_argument, "--requests", "every request count must be >= 1, found ", n);
  EDL_CLI_USAGE_CHECK(P >= 1 && G >= 1, errc::invalid_argument, where, "--prompt-len and --gen-len must be >= 1, found ", P,
                      " and ", G);
  EDL_CLI_USAGE_CHECK(eo.paged.page_size >= 1, errc::invalid_argument, "--page-size", "must be >= 1, found ", eo.paged.page_size);
  EDL_CLI_USAGE_CHECK(cache_bytes >= 0, errc::invalid_argument, "--cache-bytes", "must be >= 0, found ", cache_bytes);
  models::LlamaForCausalLM<> loaded = gen_detail::load_then_limit_threads(name, seed, threads);
  apply_adapter(loaded, af);
  return gen_detail::with_param_dtype(loaded, dtype, true, "bench serve", [&](const auto& model) {
    using Pol = typename gen_detail::PolicyOf<std::decay_t<decltype(model)>>::type;
    const auto& cfg = model.config();
    const std::int64_t V = cfg.vocab_size, L = P + G;
    EDL_CHECK(L <= cfg.max_position_embeddings, errc::invalid_argument, where, "--prompt-len + --gen-len = ", L,
              " exceeds max_position_embeddings = ", cfg.max_position_embeddings);
    eo.max_model_length = L;
    // k and v of every layer for one page (f32; int8 values and an f32 scale per token and kv
    // head); on a mesh a device holds 1 / (tp x sp) of it.
    const std::int64_t token_bytes = eo.kv_cache == generate::KVCacheDtype::int8
                                         ? cfg.kv_size() + 4 * cfg.num_key_value_heads
                                         : cfg.kv_size() * static_cast<std::int64_t>(sizeof(float));
    const std::int64_t page_bytes = 2 * cfg.num_hidden_layers * eo.paged.page_size * token_bytes / (eo.mesh[3] * eo.mesh[4]);
    const std::int64_t pages_per_request = (L + eo.paged.page_size - 1) / eo.paged.page_size;

    generate::GenerationConfig g = generate::GenerationConfig::from_model_config(cfg);
    g.do_sample = false;
    g.eos_token_id.clear();  // random weights: run every request to --gen-len
    g.stop_token_ids.clear();
    g.max_new_tokens = G;

    const auto options_for = [&](std::int64_t n) {
      generate::EngineOptions o = eo;
      o.max_batch = n;
      o.paged.utilization = 1.0;
      o.paged.budget_bytes = cache_bytes > 0 ? cache_bytes : n * pages_per_request * page_bytes;
      return o;
    };
    {  // Warm-up: thread pool, first-touch of the scratch; not timed.
      generate::Engine<Pol> warm(model, options_for(1));
      auto gw = g;
      gw.max_new_tokens = std::min<std::int64_t>(G, 4);
      warm.submit(gen_detail::random_prompt(std::min<std::int64_t>(P, 16), V, seed, 0xffff), gw);
      warm.run();
    }

    for (const std::int64_t n : requests) {
      // Request r of client c is stream r * n + c (round 0: the requests of a run without rounds).
      std::vector<std::vector<std::int64_t>> prompts;
      for (std::int64_t i = 0; i < n * rounds; ++i)
        prompts.push_back(gen_detail::random_prompt(P, V, seed, static_cast<std::uint32_t>(i)));
      generate::Engine<Pol> engine(model, options_for(n));
      const bool window = reset_peak_resident();
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::int64_t> current(static_cast<std::size_t>(n)), sent(static_cast<std::size_t>(n), 1);
      for (std::int64_t c = 0; c < n; ++c)
        current[static_cast<std::size_t>(c)] = engine.submit(std::move(prompts[static_cast<std::size_t>(c)]), g);
      for (bool more = true; more;) {
        more = engine.step();
        for (std::int64_t c = 0; c < n; ++c) {  // a client whose request is done sends its next
          auto& k = sent[static_cast<std::size_t>(c)];
          if (k == rounds || engine.result(current[static_cast<std::size_t>(c)]).state != generate::RequestState::done)
            continue;
          current[static_cast<std::size_t>(c)] = engine.submit(std::move(prompts[static_cast<std::size_t>(k * n + c)]), g);
          ++k;
          more = true;
        }
      }
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::int64_t generated = 0;
      double ttft = 0;
      for (std::int64_t i = 0; i < n * rounds; ++i) {
        const auto& r = engine.result(i);
        generated += static_cast<std::int64_t>(r.tokens.size());
        ttft += r.time_to_first_token_s;
      }
      const auto& st = engine.stats();
      nlohmann::ordered_json j;
      j["model"] = name;
      j["dtype"] = dtype;
      j["kv_cache"] = eo.kv_cache == generate::KVCacheDtype::int8 ? "int8" : "f32";
      j["threads"] = exec::num_threads();
      j["mesh"] = mesh_str(eo.mesh);
      j["requests"] = n;
      j["prompt_len"] = P;
      j["gen_len"] = G;
      j["page_size"] = eo.paged.page_size;
      j["prefill_chunk"] = eo.prefill_chunk;
      j["generated_tokens"] = generated;
      j["wall_seconds"] = wall;
      j["tokens_per_s"] = static_cast<double>(generated) / wall;
      j["mean_time_to_first_token_s"] = ttft / static_cast<double>(n * rounds);
      j["steps"] = st.steps;
      j["preemptions"] = st.preemptions;
      j["kv_pool_bytes"] = engine.kv_pool_bytes();
      j["peak_kv_bytes"] = st.peak_pages * engine.page_bytes();
      j["peak_bytes"] = peak_resident_bytes();
      j["peak_bytes_window"] = window ? "this run" : "process";
      j["rounds"] = rounds;
      std::cout << j.dump() << std::endl;
    }
    return 0;
  });
}

inline Command bench_serve_command() {
  return {
      .name = "bench serve",
      .group = "measuring",
      .summary = "time the continuous batching engine at each concurrency (tokens/s, time to first token, memory)",
      .synopsis = "(--model DIR|tiny|small|gqa1b | --config tiny|small|gqa1b|DIR) [--requests 1,4,16] [flags]",
      .flags = flags({{text_flag("--model", "DIR|tiny|small|gqa1b", "an HF folder, or a preset with random weights (or --config)"),
                       text_flag("--config", "tiny|small|gqa1b|DIR", "another name for --model")},
                      declare_adapter_flags(),
                      {text_flag("--requests", "1,4,16", "the concurrencies, one JSON line each").defaults("1,4,16"),
                       integer_flag("--prompt-len", "P", "prompt tokens of each request (random ids)").defaults("64"),
                       integer_flag("--gen-len", "G", "tokens each request generates").defaults("64"),
                       integer_flag("--threads", "T", "threads of the engine measured").defaults("all cores"),
                       integer_flag("--seed", "S", "seed of the preset's weights and the prompts").defaults("0"),
                       integer_flag("--page-size", "N", "tokens per page of the KV cache").defaults("16"),
                       integer_flag("--prefill-chunk", "C", "prompt tokens per step").defaults("256"),
                       integer_flag("--rounds", "R", "requests each of the N clients sends one after another (the next when the last is done)").defaults("1"),
                       integer_flag("--cache-bytes", "N", "the page pool's budget, each device's on a mesh (requests may wait or be preempted)")
                           .defaults("exactly every request's pages"),
                       gen_detail::declare_dtype_flag(),
                       gen_detail::declare_kv_cache_flag(),
                       declare_mesh_flag("the mesh the engine runs on (tp: heads, sp: cache positions, dp/fsdp/ep: request slots)")}}),
      .examples = {"edl bench serve --config tiny --requests 1,4 --prompt-len 20 --gen-len 3 --threads 2",
                   "edl bench serve --model gqa1b --requests 1,8 --prompt-len 128 --gen-len 64"},
      .run = cmd_bench_serve};
}

}  // namespace edl::cli
