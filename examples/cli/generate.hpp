// examples/cli/generate.hpp: `edl generate` and `edl bench decode` (docs/generation.md).
//
//   edl generate --model DIR|F.gguf (--prompt TEXT | --prompt-tokens 1,2,3) [--max-new-tokens N]
//                [--greedy | --temperature T --top-k K --top-p P --min-p M --seed S]
//                [--repetition-penalty R] [--presence-penalty A] [--num-beams B]
//                [--cache standard|int8|paged] [--page-size N] [--cache-bytes N]
//                [--cache-utilization F] [--threads T] [--mesh dp=1,fsdp=1,tp=1,sp=1]
//     prints {"tokens": [new tokens], "text": "...", "finish_reason": "..."}; "text" only when DIR
//     has a byte-level BPE tokenizer.json. Defaults: DIR/generation_config.json if present, else
//     greedy (HF); a sampling flag turns sampling on. --mesh other than one device runs
//     generate::ShardedDecoder (tp: heads, sp: cache positions, dp/fsdp: prompts), on simulated
//     devices or under mpirun (rank 0 prints); the mesh is checked before the weights are read.
//
//   edl bench decode --model DIR|tiny|small|gqa1b --prompt-len P --gen-len G [--threads T] [--bandwidth]
//                    [--paired-bandwidth] [--phase-times]
//                    [--repetitions N] [--cache standard|int8|paged] [--seed S] [--mesh tp=2,...]
//     a preset name builds that config with random weights; prints one JSON object with
//     prefill_tokens_per_s, decode_tokens_per_s (medians over N repetitions, as llama-bench's -r),
//     peak_bytes (VmHWM), the bytes a decode step reads and the bandwidth that implies.
//     --phase-times adds phase_seconds_per_token: where the one-device decode step's time goes
//     (q/k/v, attention, o_proj, gate/up, down, lm_head, barrier waits; per step and thread).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xsimd/xsimd.hpp>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/core/process_memory.hpp>
#include <edl/core/rng.hpp>
#include <edl/generate/all.hpp>
#include <edl/generate/sharded_decoder.hpp>
#include <edl/generate/sharded_generate.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/gguf.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/nn/module.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/chat/conversation.hpp>
#include <edl/tokenizer/tokenizer.hpp>
#include "adapter_flags.hpp"
#include "args.hpp"
#include "mesh_flag.hpp"

namespace edl::cli {

namespace gen_detail {

/// A comma-separated integer list; `what` names the items in the error ("token ids", ...).
inline std::vector<std::int64_t> parse_int_list(const std::string& s, const std::string& flag,
                                                const std::string& what = "token ids") {
  std::vector<std::int64_t> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const std::size_t comma = s.find(',', start);
    const std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    start = comma == std::string::npos ? s.size() + 1 : comma + 1;
    std::size_t pos = 0;
    long long v = 0;
    try { v = std::stoll(item, &pos); } catch (...) { pos = 0; }
    EDL_CLI_USAGE_CHECK(!item.empty() && pos == item.size(), errc::invalid_argument, flag,
                        "expected comma-separated integer ", what, " such as 1,2,3, found \"", item, "\" in \"", s, "\"");
    out.push_back(v);
  }
  return out;
}
inline std::vector<std::int64_t> parse_token_list(const std::string& s, const std::string& flag) {
  return parse_int_list(s, flag);
}

/// The model in HF folder `dir`; its weights on transparent huge pages unless `huge_pages` is
/// false (`edl bench decode --no-huge-pages`: the same run without them, for comparison).
inline models::LlamaForCausalLM<> load_model(const std::string& dir, bool huge_pages = true) {
  models::LoadOptions o;
  o.huge_pages = huge_pages;
  return models::from_pretrained<>(dir, o);
}

/// The config of preset `name` (tiny, small, gqa1b), or nothing when it names no preset.
inline std::optional<models::LlamaConfig> preset_config(const std::string& name) {
  for (const auto& n : models::LlamaConfig::preset_names())
    if (n == name) return models::LlamaConfig::preset(name);
  return std::nullopt;
}

/// A preset name (tiny, small, gqa1b: random weights from Key `seed`) or a HF folder; the
/// weights on huge pages as load_model's.
/// quant (not none) quantizes the decoder's Linears and lm_head (as llama.cpp's files of that
/// type do) before the weights are placed.
inline models::LlamaForCausalLM<> preset_or_load(const std::string& name, std::uint64_t seed, bool huge_pages = true,
                                                 quant::Format quant = quant::Format::none) {
  if (const auto cfg = preset_config(name)) {
    models::LlamaForCausalLM<> m(*cfg);
    m.init(Key::from_seed(seed));
    if (quant != quant::Format::none) nn::quantize(m, {quant, 0, nn::QuantizationConfig::kWithHeadPattern});
    if (huge_pages) nn::advise_huge_pages(m);
    return m;
  }
  if (quant == quant::Format::none) return load_model(name, huge_pages);
  auto m = load_model(name, false);
  nn::quantize(m, {quant, 0, nn::QuantizationConfig::kWithHeadPattern});
  if (huge_pages) nn::advise_huge_pages(m);
  return m;
}

/// preset_or_load before --threads applies, then `threads` (when > 0) for what follows: the
/// benchmarks draw or read their model on every core and limit only what they measure. A
/// preset's values do not depend on the thread count (nn::init_params), and gqa1b's 1.1 G draws
/// take over a minute on one thread.
inline models::LlamaForCausalLM<> load_then_limit_threads(const std::string& name, std::uint64_t seed,
                                                          std::int64_t threads, bool huge_pages = true,
                                                          quant::Format quant = quant::Format::none) {
  auto m = preset_or_load(name, seed, huge_pages, quant);
  if (threads > 0) exec::set_num_threads(static_cast<int>(threads));
  return m;
}

/// --dtype f32|bf16|f16: the storage of the parameters a command runs on.
inline Flag declare_dtype_flag() {
  return text_flag("--dtype", "", "storage of the parameters, converted after loading (round to nearest even); compute stays f32")
      .one_of({"f32", "bf16", "f16"})
      .defaults("f32");
}

/// --kv-cache of the commands that run the serving engine, and its value.
inline Flag declare_kv_cache_flag() {
  return text_flag("--kv-cache", "",
                   "what the KV cache pages hold: f32, or int8 values with a scale per token and kv head (a quarter of the bytes)")
      .one_of({"f32", "int8"})
      .defaults("f32");
}
inline generate::KVCacheDtype kv_cache_flag(Args& args) {
  return args.str("--kv-cache", "f32") == "int8" ? generate::KVCacheDtype::int8 : generate::KVCacheDtype::f32;
}

/// The policy of a LlamaForCausalLM<Pol>.
template <class M>
struct PolicyOf;
template <class Pol>
struct PolicyOf<models::LlamaForCausalLM<Pol>> {
  using type = Pol;
};

/// Calls f(m) with `model` itself (dtype "f32") or its parameters converted to bf16 / f16 (the
/// f32 model is released once converted, before f runs). Quantized
/// Linears and unmerged adapters are not converted: either with --dtype is a usage error.
template <class F>
decltype(auto) with_param_dtype(models::LlamaForCausalLM<>& model, const std::string& dtype, bool huge_pages,
                                const std::string& command, F&& f) {
  if (dtype == "f32") return f(model);
  bool quantized = false, adapters = false;
  model.visit_linears("", [&](const std::string&, auto& lin) {
    quantized = quantized || lin.is_quantized();
    adapters = adapters || static_cast<bool>(lin.lora);
  });
  EDL_CLI_USAGE_CHECK(!quantized, errc::unsupported, "edl " + command + " --dtype " + dtype,
                      "converts float weights, and the model's Linears are quantized: drop --dtype or the quantization");
  EDL_CLI_USAGE_CHECK(!adapters, errc::unsupported, "edl " + command + " --dtype " + dtype,
                      "converts the weights of the model alone: fold the adapter in with --merge-adapter");
  const auto run = [&]<class Pol>() -> decltype(auto) {
    auto m = models::to_dtype<Pol>(model);
    model = models::LlamaForCausalLM<>();
    if (huge_pages) nn::advise_huge_pages(m);
    return f(m);
  };
  if (dtype == "bf16") return run.template operator()<BF16ParamsPolicy>();
  return run.template operator()<F16ParamsPolicy>();
}

/// `len` uniform random token ids below V, stream `stream` of Key `seed`.
inline std::vector<std::int64_t> random_prompt(std::int64_t len, std::int64_t V, std::uint64_t seed, std::uint32_t stream) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(len));
  for (std::int64_t i = 0; i < len; ++i)
    p[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(random_bits_at(fold_in(Key::from_seed(seed), stream), i) % V);
  return p;
}

/// --cache and the paged cache's sizes, as cache_flags reads them.
inline std::vector<Flag> declare_cache_flags() {
  return {text_flag("--cache", "", "the decoder's KV cache: standard (f32), int8 (a quarter of the bytes) or paged")
              .one_of({"standard", "int8", "paged"})
              .defaults("standard"),
          integer_flag("--page-size", "N", "tokens per page of --cache paged").defaults("16"),
          integer_flag("--cache-bytes", "N", "memory the pages of --cache paged may use").defaults("256 MiB"),
          number_flag("--cache-utilization", "F", "the fraction of --cache-bytes the pages fill").defaults("0.9")};
}

inline void cache_flags(Args& args, generate::GenerateOptions& o) {
  o.cache = generate::parse_cache_kind(args.str("--cache", "standard"));
  o.paged.page_size = args.integer("--page-size", o.paged.page_size);
  o.paged.budget_bytes = args.integer("--cache-bytes", o.paged.budget_bytes);
  o.paged.utilization = args.number("--cache-utilization", o.paged.utilization);
}

/// A chat reply also ends at the tokenizer's eos token (a chat model's end-of-turn token, which
/// generation_config.json may not list).
inline void stop_at_tokenizer_eos(generate::GenerationConfig& g, const tokenizer::Tokenizer& tok) {
  if (tok.eos_id() && std::find(g.eos_token_id.begin(), g.eos_token_id.end(), *tok.eos_id()) == g.eos_token_id.end())
    g.eos_token_id.push_back(*tok.eos_id());
}

/// --max-new-tokens, --greedy, the sampling flags, penalties and --num-beams, as sampling_flags
/// reads them. Their defaults are the model folder's generation_config.json where it has one.
inline std::vector<Flag> declare_sampling_flags() {
  return {integer_flag("--max-new-tokens", "N", "the most tokens to generate").defaults("generation_config.json's, else 20"),
          switch_flag("--greedy", "always take the most likely token (no sampling)"),
          number_flag("--temperature", "T", "sample, dividing the logits by T").defaults("1 when sampling"),
          integer_flag("--top-k", "K", "sample among the K most likely tokens (0: all)").defaults("50 when sampling"),
          number_flag("--top-p", "P", "sample among the most likely tokens holding probability P").defaults("1 (off)"),
          number_flag("--min-p", "M", "drop tokens less likely than M times the most likely one").defaults("0 (off)"),
          number_flag("--typical-p", "P", "locally typical sampling: keep the tokens closest to the entropy holding P")
              .defaults("1 (off)"),
          integer_flag("--seed", "S", "seed of the sampler (turns sampling on, as the flags above)").defaults("0"),
          number_flag("--repetition-penalty", "R", "divide the logits of tokens seen so far by R (HF's CTRL penalty)")
              .defaults("1 (off)"),
          number_flag("--presence-penalty", "A", "subtract A from the logits of tokens generated so far")
              .defaults("0 (off)"),
          integer_flag("--no-repeat-ngram-size", "N", "never repeat an N-gram of the prompt and the output")
              .defaults("0 (off)"),
          integer_flag("--min-new-tokens", "N", "no stop token before N new tokens").defaults("0 (off)"),
          integer_flag("--num-beams", "B", "beam search with B beams (greedy unless a sampling flag is given)")
              .defaults("1")};
}

/// --max-new-tokens, --greedy or the sampling flags, penalties and --num-beams.
inline void sampling_flags(Args& args, generate::GenerationConfig& g, const std::string& command) {
  g.max_new_tokens = args.integer("--max-new-tokens", g.max_new_tokens);
  const bool greedy = args.has("--greedy");
  bool sampling = false;
  for (const char* f : {"--temperature", "--top-k", "--top-p", "--min-p", "--typical-p", "--seed"})
    sampling = args.has(f) || sampling;
  EDL_CLI_USAGE_CHECK(!(greedy && sampling), errc::invalid_argument, command,
                      "--greedy cannot be combined with --temperature, --top-k, --top-p, --min-p, --typical-p or --seed");
  if (greedy) g.do_sample = false;
  if (sampling) {
    g.do_sample = true;
    g.temperature = static_cast<float>(args.number("--temperature", g.temperature));
    g.top_k = args.integer("--top-k", g.top_k);
    g.top_p = static_cast<float>(args.number("--top-p", g.top_p));
    g.min_p = static_cast<float>(args.number("--min-p", g.min_p));
    g.typical_p = static_cast<float>(args.number("--typical-p", g.typical_p));
    g.seed = static_cast<std::uint64_t>(args.integer("--seed", static_cast<std::int64_t>(g.seed)));
  }
  g.repetition_penalty = static_cast<float>(args.number("--repetition-penalty", g.repetition_penalty));
  g.presence_penalty = static_cast<float>(args.number("--presence-penalty", g.presence_penalty));
  g.no_repeat_ngram_size = args.integer("--no-repeat-ngram-size", g.no_repeat_ngram_size);
  g.min_new_tokens = args.integer("--min-new-tokens", g.min_new_tokens);
  g.num_beams = args.integer("--num-beams", g.num_beams);
  if (g.num_beams > 1 && !sampling) g.do_sample = false;
}

}  // namespace gen_detail

inline int cmd_generate(Args& args) {
  const AdapterFlags af = adapter_flags(args, args.required("--model"), "generate");
  const std::string dir = af.model;
  const bool has_text = args.has("--prompt"), has_ids = args.has("--prompt-tokens"), has_chat = args.has("--chat");
  EDL_CLI_USAGE_CHECK(int(has_text) + int(has_ids) + int(has_chat) == 1, errc::invalid_argument, "edl generate",
                      "give exactly one of --prompt TEXT, --prompt-tokens 1,2,3 and --chat MESSAGES.json");
  const std::string chat_file = args.str("--chat", "");
  const MeshDims dims = mesh_flag(args);
  const std::int64_t threads = args.integer("--threads", 0);
  generate::GenerateOptions o;
  gen_detail::cache_flags(args, o);
  const std::string prompt_text = args.str("--prompt", "");
  const std::string prompt_ids = args.str("--prompt-tokens", "");
  const std::string dtype = args.str("--dtype", "f32");

  const std::filesystem::path d(dir);
  const bool gguf = d.extension() == ".gguf";  // a llama.cpp file: its config, no tokenizer here
  EDL_CHECK(gguf || std::filesystem::is_directory(d), errc::io, "--model " + dir, "not a directory or a .gguf file");
  const auto cfg = gguf ? models::gguf_config(d) : models::LlamaConfig::from_file((d / "config.json").string());
  generate::GenerationConfig g = generate::GenerationConfig::from_folder(d, cfg);
  gen_detail::sampling_flags(args, g, "edl generate");
  args.finish();
  g.validate("edl generate");
  if (threads > 0) exec::set_num_threads(static_cast<int>(threads));

  // The folder's tokenizer when present: --prompt and --chat need it, and "text" comes from it.
  const bool has_tok_file = std::filesystem::exists(d / "tokenizer.json");
  std::optional<tokenizer::Tokenizer> tok;
  if (has_tok_file) tok = tokenizer::Tokenizer::from_file(dir);
  std::vector<std::int64_t> prompt;
  if (has_text || has_chat) {
    EDL_CHECK(tok.has_value(), errc::invalid_argument, "edl generate",
              has_text ? "--prompt TEXT" : "--chat", " needs a tokenizer, and ", dir,
              " has no tokenizer.json; use --prompt-tokens 1,2,3");
  }
  if (has_text) {
    prompt = tok->encode(prompt_text);
  } else if (has_chat) {
    // As transformers' apply_chat_template(add_generation_prompt=True): the template writes any
    // BOS itself, so the prompt is encoded without adding special tokens; the reply ends at the
    // tokenizer's eos (the end-of-turn token of chat models) as well as the model's.
    const auto conversation = chat::read_conversation(chat_file);
    prompt = tok->encode(chat::render_conversation(*tok, conversation, {.add_generation_prompt = true}, "--chat " + chat_file));
    gen_detail::stop_at_tokenizer_eos(g, *tok);
  } else {
    prompt = gen_detail::parse_token_list(prompt_ids, "--prompt-tokens");
  }

  // The mesh first: a mesh the launch cannot run (under mpirun: not ranks x local devices, or
  // kv heads not divisible by tp) fails before the weights are read.
  const DefaultMesh mesh = launch_mesh(dims, "--mesh");
  (void)generate::sharded_decoder_local_config(cfg, mesh.axis_size("tp"));
  auto model = gen_detail::load_model(dir);
  apply_adapter(model, af);
  const auto r = gen_detail::with_param_dtype(model, dtype, true, "generate",
                                              [&](const auto& m) { return generate::generate(m, mesh, {prompt}, g, o); });
  nlohmann::ordered_json j;
  j["tokens"] = r.tokens[0];
  if (tok) j["text"] = tok->decode(r.tokens[0], /*skip_special_tokens=*/true);
  j["finish_reason"] = r.finish_reason[0];
  // Tokens may split a UTF-8 character: invalid bytes print as U+FFFD.
  std::cout << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  return 0;
}

inline Command generate_command() {
  return {
      .name = "generate",
      .group = "models",
      .summary = "generate tokens from a prompt, token ids or a chat; prints {\"tokens\", \"text\", \"finish_reason\"}",
      .synopsis = "--model DIR|F.gguf (--prompt TEXT | --prompt-tokens 1,2,3 | --chat M.json) [flags]",
      .flags = flags(
          {{text_flag("--model", "DIR|F.gguf", "the model: an HF folder, a LoRA run's adapter folder or a llama.cpp .gguf file")
                .required()},
           declare_adapter_flags(),
           {text_flag("--prompt", "TEXT", "the prompt, encoded with the folder's tokenizer.json"),
            text_flag("--prompt-tokens", "1,2,3", "the prompt as token ids (a .gguf model needs these)"),
            text_flag("--chat", "M.json", "a conversation rendered with the folder's chat template (generation prompt on)")},
           gen_detail::declare_sampling_flags(),
           gen_detail::declare_cache_flags(),
           {gen_detail::declare_dtype_flag(),
            integer_flag("--threads", "T", "threads of the kernels").defaults("all cores"),
            declare_mesh_flag("the mesh the decoder runs on (tp: heads and expert widths, sp: cache positions, dp/fsdp/ep: prompts)")}}),
      .examples = {"edl generate --model run/checkpoint-400 --prompt \"Once upon a time\" --max-new-tokens 32",
                   "edl generate --model m.gguf --prompt-tokens 1,2,3 --temperature 0.8 --top-p 0.95 --seed 1"},
      .run = cmd_generate};
}

namespace gen_detail {

/// This machine's memory read bandwidth on the current threads, in GB/s, by read pattern.
struct ReadBandwidth {
  double sequential = 0;  // one streaming sum per thread
  double prefetched = 0;  // the same with a software prefetch 1 KiB ahead
  double streams8 = 0;    // each thread's part read as 8 far-apart streams in lockstep
  double rows8 = 0;       // blocks of 8 rows of 8 KiB read in lockstep
  double rows8_32k = 0;     // blocks of 8 rows of 32 KiB in lockstep
  double rows8_stream = 0;  // blocks of 8 rows of kStreamBytes in lockstep (matvec_rows' streams)
  double best() const { return std::max({sequential, prefetched, streams8, rows8, rows8_32k, rows8_stream}); }
};

/// The read patterns of ReadBandwidth, in its field order.
inline constexpr int kReadPatterns = 6;
inline constexpr const char* kReadPatternNames[kReadPatterns] = {"sequential", "prefetched",   "streams8",
                                                                  "rows8",      "rows8_32k",    "rows8_stream"};

/// Bytes of the buffer the read patterns read: far larger than any cache.
inline constexpr std::size_t kReadBufferBytes = std::size_t{1} << 30;

/// Floats a thread's part of a read is a multiple of: a whole number of eight-row blocks of
/// any of the patterns' row lengths.
inline constexpr std::size_t kReadQuantum =
    static_cast<std::size_t>(kernels::detail::kStreams * kernels::detail::kStreamBytes) / sizeof(float);

/// The sum of `per` floats at x read in pattern `pattern` (ReadBandwidth's field order): 0
/// sequential, 1 prefetched (four accumulators hide the add latency); 2 eight streams, 3 eight
/// rows of 8 KiB, 4 of 32 KiB, 5 of kStreamBytes (lockstep_read_sum, which prefetches as the
/// decode kernel does). per: a multiple of kReadQuantum.
inline float read_pattern(int pattern, const float* x, std::size_t per) {
  using B = xsimd::batch<float>;
  constexpr std::size_t W = B::size, S = static_cast<std::size_t>(kernels::detail::kStreams);
  // rows8_stream follows the decode kernel's stream length, whatever it is set to.
  constexpr std::size_t kShort = 2048, kMid = 8192,
                        kLong = static_cast<std::size_t>(kernels::detail::kStreamBytes) / sizeof(float);
  static_assert(kLong % kMid == 0 && kLong % (2 * W) == 0, "the kernel's streams must be whole 32 KiB rows");
  static_assert(kReadQuantum == S * kLong && kLong % kShort == 0);
  if (pattern >= 2) {
    const std::size_t len = pattern == 2 ? per / S : pattern == 3 ? kShort : pattern == 4 ? kMid : kLong;
    return kernels::detail::lockstep_read_sum(x, per / (S * len), len);
  }
  B a0(0.f), a1(0.f), a2(0.f), a3(0.f);
  for (std::size_t i = 0; i < per; i += 4 * W) {
    if (pattern == 1) {
      __builtin_prefetch(reinterpret_cast<const char*>(x + i) + 1024, 0, 3);
      __builtin_prefetch(reinterpret_cast<const char*>(x + i) + 1024 + 64, 0, 3);
    }
    a0 += B::load_unaligned(x + i);
    a1 += B::load_unaligned(x + i + W);
    a2 += B::load_unaligned(x + i + 2 * W);
    a3 += B::load_unaligned(x + i + 3 * W);
  }
  return xsimd::hadd((a0 + a1) + (a2 + a3));
}

/// A read buffer far larger than the caches, written once (its pages exist before any timing)
/// and on huge pages as the served model's weights are.
inline void ensure_read_buffer(aligned_vector<float>& buf, std::size_t bytes) {
  if (!buf.empty()) return;
  buf.assign(bytes / sizeof(float) / kReadQuantum * kReadQuantum, 1.0f);
  edl::advise_huge_pages(buf.data(), buf.size() * sizeof(float));
}

/// Seconds to read `floats` floats of buf in `pattern`, split in equal parts over the threads,
/// from float `offset` on (wrapping to the start where the buffer ends; offset moves past what
/// was read, so consecutive calls never read what the caches still hold). Returns the floats
/// read (floats rounded to whole kReadQuantum parts, at least one per thread) in `done`.
inline double timed_read(aligned_vector<float>& buf, int pattern, std::size_t floats, std::size_t& offset,
                         std::size_t& done) {
  const std::size_t parts = static_cast<std::size_t>(std::max(1, exec::num_threads()));
  const std::size_t slice = parts * kReadQuantum;                     // the least one call reads
  const std::size_t max_per = buf.size() / parts / kReadQuantum * kReadQuantum;  // a part's most in one pass
  std::vector<float> sums(parts);
  std::size_t left = std::max<std::size_t>(1, (floats + slice / 2) / slice) * kReadQuantum;  // per part
  done = left * parts;
  double seconds = 0;
  while (left > 0) {
    const std::size_t per = std::min(left, max_per);
    if (offset + per * parts > buf.size()) offset = 0;
    const auto t0 = std::chrono::steady_clock::now();
    exec::parallel_parts(static_cast<std::ptrdiff_t>(parts), [&](std::ptrdiff_t p) {
      sums[static_cast<std::size_t>(p)] = read_pattern(pattern, buf.data() + offset + static_cast<std::size_t>(p) * per, per);
    });
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    offset += per * parts;
    left -= per;
  }
  volatile float sink = sums[0];  // keeps the sums observable
  (void)sink;
  return seconds;
}

/// Measures ReadBandwidth over a `bytes` buffer (far larger than the caches) split in equal
/// parts over the threads, the best of 3 passes per pattern. No single pattern is this
/// machine's peak (on a Zen 1 EPYC the best one changes with the thread count, and gqa1b's
/// decode, eight long rows at a time, outran all the others on one thread; docs/benchmarks.md).
/// The decode roofline is the best pattern over the bytes a step reads, so that decode cannot
/// beat it by reading in an order the measurement did not try.
/// `buf` is the buffer read: empty, it is allocated (`bytes`) and written once, so that
/// repeated measurements reuse its pages.
inline ReadBandwidth measure_read_bandwidth(aligned_vector<float>& buf, std::size_t bytes = kReadBufferBytes) {
  ensure_read_buffer(buf, bytes);
  const std::size_t parts = static_cast<std::size_t>(std::max(1, exec::num_threads()));
  const std::size_t per = buf.size() / parts / kReadQuantum * kReadQuantum;
  double best[kReadPatterns] = {};
  for (int rep = 0; rep < 3; ++rep)
    for (int pattern = 0; pattern < kReadPatterns; ++pattern) {
      std::size_t offset = 0, done = 0;
      const double s = timed_read(buf, pattern, per * parts, offset, done);
      best[pattern] = std::max(best[pattern], static_cast<double>(done * sizeof(float)) / s / 1e9);
    }
  return {best[0], best[1], best[2], best[3], best[4], best[5]};
}

/// The weights a decode step reads, as (first byte, bytes) in visit order: every parameter but
/// the embedding table (the step reads one row of it), which is read whole when it is the tied
/// lm_head (LlamaForCausalLM visits it once, under the embedding's name).
template <class M>
std::vector<std::pair<const char*, std::size_t>> decode_weight_spans(M& m) {
  std::vector<std::pair<const char*, std::size_t>> spans;
  m.visit_params("", [&](std::string_view path, auto& p) {
    if (!m.tied() && path.find("embed_tokens") != std::string_view::npos) return;
    spans.emplace_back(reinterpret_cast<const char*>(p.data()), p.value.size() * sizeof(*p.data()));
  });
  return spans;
}

/// Floats of the buffer read after a read of the weights so that the next decode step finds no
/// weights in the caches (or a decode step's bytes, when fewer): 256 MiB, beyond any L3 here.
inline constexpr std::size_t kFlushFloats = (std::size_t{256} << 20) / sizeof(float);

/// Number of the weights-read patterns: 0 a prefetched streaming sum, 1 the decode kernel's
/// order (lockstep_read_sum over whole blocks of kStreams streams of kStreamBytes, the rest as 0).
inline constexpr int kWeightsReadPatterns = 2;
inline constexpr const char* kWeightsReadPatternNames[kWeightsReadPatterns] = {"sequential", "rows8_stream"};

/// The sum of n floats at x: a streaming sum prefetching 1 KiB ahead (four accumulators hide
/// the add latency), then the tail.
inline float prefetched_sum(const float* x, std::size_t n) noexcept {
  using B = xsimd::batch<float>;
  constexpr std::size_t W = B::size;
  B a0(0.f), a1(0.f), a2(0.f), a3(0.f);
  std::size_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    __builtin_prefetch(reinterpret_cast<const char*>(x + i) + 1024, 0, 2);
    __builtin_prefetch(reinterpret_cast<const char*>(x + i + 2 * W) + 1024, 0, 2);
    a0 += B::load_unaligned(x + i);
    a1 += B::load_unaligned(x + i + W);
    a2 += B::load_unaligned(x + i + 2 * W);
    a3 += B::load_unaligned(x + i + 3 * W);
  }
  float s = xsimd::hadd((a0 + a1) + (a2 + a3));
  for (; i < n; ++i) s += x[i];
  return s;
}

/// The sum of thread `p`'s part (of `parts`) of every span (decode_weight_spans) in
/// weights-read pattern `pattern`: each span cut in equal parts of whole floats, the part read
/// as one prefetched streaming sum (0) or as whole blocks of the decode kernel's lockstep
/// streams then the rest as 0 (1).
inline float weights_read_sum(const std::vector<std::pair<const char*, std::size_t>>& spans, int pattern,
                              std::size_t p, std::size_t parts) noexcept {
  constexpr std::size_t S = static_cast<std::size_t>(kernels::detail::kStreams),
                        len = static_cast<std::size_t>(kernels::detail::kStreamBytes) / sizeof(float);
  float s = 0;
  for (const auto& [data, bytes] : spans) {
    const std::size_t n = bytes / sizeof(float), lo = n * p / parts, hi = n * (p + 1) / parts;
    const float* x = reinterpret_cast<const float*>(data) + lo;
    std::size_t done = 0;
    if (pattern == 1) {
      const std::size_t blocks = (hi - lo) / (S * len);
      if (blocks > 0) s += kernels::detail::lockstep_read_sum(x, blocks, len);
      done = blocks * S * len;
    }
    s += prefetched_sum(x + done, hi - lo - done);
  }
  return s;
}

/// Seconds to read the decode step's weights once (decode_weight_spans) in weights-read
/// pattern `pattern`, every thread reading its part of each span in turn (weights_read_sum)
/// with no barrier between spans. The read of the very bytes decode reads, in the memory they
/// are in: on a VM whose memory reads at different speeds from one allocation to the next, a
/// fresh buffer can read faster or slower than the weights (docs/benchmarks.md).
inline double timed_weights_read(const std::vector<std::pair<const char*, std::size_t>>& spans, int pattern) {
  const std::size_t parts = static_cast<std::size_t>(std::max(1, exec::num_threads()));
  std::vector<float> sums(parts);
  const auto t0 = std::chrono::steady_clock::now();
  exec::parallel_parts(static_cast<std::ptrdiff_t>(parts), [&](std::ptrdiff_t p) {
    sums[static_cast<std::size_t>(p)] = weights_read_sum(spans, pattern, static_cast<std::size_t>(p), parts);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  volatile float sink = sums[0];  // keeps the sums observable
  (void)sink;
  return seconds;
}

}  // namespace gen_detail

inline int cmd_bench_decode(Args& args) {
  const AdapterFlags af = adapter_flags(args, args.required("--model"), "bench decode");
  const std::string name = af.model;
  const std::int64_t P = args.integer("--prompt-len", 128), G = args.integer("--gen-len", 128);
  const std::int64_t threads = args.integer("--threads", 0);
  const std::uint64_t seed = static_cast<std::uint64_t>(args.integer("--seed", 0));
  generate::GenerateOptions o;
  gen_detail::cache_flags(args, o);
  const MeshDims dims = mesh_flag(args);
  // --paired-bandwidth: after every decode step, a read of the step's bytes, the read patterns
  // in turn (docs/benchmarks.md, "Paired with a read after every step").
  const bool paired = args.has("--paired-bandwidth");
  const bool bandwidth = args.has("--bandwidth") || paired;
  const bool phase_times = args.has("--phase-times");
  const bool huge_pages = !args.has("--no-huge-pages");
  const std::int64_t reps = args.integer("--repetitions", 1);
  const quant::Format quant = quant::parse_format(args.str("--quant", "none"), "edl bench decode --quant");
  const std::string dtype = args.str("--dtype", "f32");
  args.finish();
  EDL_CLI_USAGE_CHECK(dtype == "f32" || quant == quant::Format::none, errc::unsupported, "edl bench decode --dtype " + dtype,
                      "converts float weights and --quant ", quant::format_name(quant),
                      " quantizes them: drop --dtype or --quant");
  EDL_CLI_USAGE_CHECK(dtype == "f32" || af.adapter.empty() || af.merge, errc::unsupported,
                      "edl bench decode --dtype " + dtype,
                      "converts the weights of the model alone: fold the adapter in with --merge-adapter");
  EDL_CLI_USAGE_CHECK(reps >= 1, errc::invalid_argument, "edl bench decode", "--repetitions must be >= 1, found ", reps);
  EDL_CLI_USAGE_CHECK(P >= 1 && G >= 1, errc::invalid_argument, "edl bench decode",
                      "--prompt-len and --gen-len must be >= 1, found ", P, " and ", G);
  EDL_CLI_USAGE_CHECK(!paired || G >= gen_detail::kReadPatterns, errc::invalid_argument, "edl bench decode",
                      "--paired-bandwidth pairs the steps with the ", gen_detail::kReadPatterns,
                      " read patterns in turn: --gen-len must be >= ", gen_detail::kReadPatterns, ", found ", G);
  const DefaultMesh mesh = launch_mesh(dims, "--mesh");
  EDL_CLI_USAGE_CHECK(!phase_times || mesh.size() == 1, errc::unsupported, "edl bench decode",
                      "--phase-times times the one-device decoder's steps: drop --mesh ", mesh_str(dims));

  const std::int64_t L = P + G;
  const auto check_length = [&](const models::LlamaConfig& c) {
    EDL_CHECK(L <= c.max_position_embeddings, errc::invalid_argument, "edl bench decode", "--prompt-len + --gen-len = ", L,
              " exceeds max_position_embeddings = ", c.max_position_embeddings);
  };
  // A preset's length is checked before its random weights are drawn (seconds for gqa1b).
  if (const auto preset = gen_detail::preset_config(name)) check_length(*preset);
  models::LlamaForCausalLM<> loaded = gen_detail::load_then_limit_threads(name, seed, threads, huge_pages, quant);
  apply_adapter(loaded, af);
  return gen_detail::with_param_dtype(loaded, dtype, huge_pages, "bench decode", [&](auto& model) {
    using Pol = typename gen_detail::PolicyOf<std::decay_t<decltype(model)>>::type;
    const auto& cfg = model.config();
    const std::int64_t V = cfg.vocab_size;
    check_length(cfg);
    const std::vector<std::int64_t> prompt = gen_detail::random_prompt(P, V, seed, 1);

    const auto shape = generate::kv_cache_shape(cfg, 1, L);
    nlohmann::ordered_json j;
    // dec: a Decoder or a ShardedDecoder; forget(): empties its cache. Each repetition prefills
    // and decodes from an empty cache; with --bandwidth the roofline is measured right after each
    // decode pass, so every repetition's fraction compares two measurements a second apart (the
    // machine's bandwidth drifts by more than the kernel's gaps over a minute). The figures are
    // medians over the repetitions.
    const auto run = [&](auto& dec, auto&& forget, std::int64_t cache_bytes) {
      std::vector<float> logits(static_cast<std::size_t>(V));
      // Warm-up: a short prefill and a few steps, then forget them.
      dec.prefill(prompt.data(), std::min<std::int64_t>(P, 16), nullptr, logits.data());
      for (std::int64_t i = 0; i < std::min<std::int64_t>(3, G); ++i) {  // the cache holds P + G tokens
        const std::int64_t t = generate::argmax(logits.data(), V);
        dec.decode(&t, logits.data());
      }
      // Bytes one decode step reads: every weight once (lm_head too) plus the cache so far (mean).
      // (the embedding table is not read, one row aside, unless it is also the tied lm_head).
      const double emb = model.tied() ? 0.0 : static_cast<double>(cfg.vocab_size * cfg.hidden_size);
      double wbytes = static_cast<double>(nn::storage_bytes(model)) - emb * sizeof(typename Pol::param_t);
      // A mixture-of-experts layer reads its router and k of its E experts per token.
      for (auto& layer : model.model.layers)
        if (layer.is_sparse()) {
          double experts = 0;
          for (auto& e : layer.block_sparse_moe.experts) experts += static_cast<double>(nn::storage_bytes(e));
          wbytes -= experts * static_cast<double>(cfg.num_local_experts - cfg.num_experts_per_tok) /
                    static_cast<double>(cfg.num_local_experts);
        }
      const double kv_per_tok = o.cache == generate::CacheKind::int8
                                    ? 2.0 * static_cast<double>(cfg.num_hidden_layers * (cfg.kv_size() + 4 * cfg.num_key_value_heads))
                                    : 2.0 * static_cast<double>(cfg.num_hidden_layers * cfg.kv_size()) * sizeof(float);
      const double mean_ctx = static_cast<double>(P) + static_cast<double>(G) / 2;
      const double step_bytes = wbytes + kv_per_tok * mean_ctx;
      std::vector<double> tp(static_cast<std::size_t>(reps)), td(tp), pp_rate(tp), tg_rate(tp), bw(tp), fraction(tp);
      std::vector<gen_detail::ReadBandwidth> rb(tp.size());
      aligned_vector<float> bw_buf;  // on cache lines, as the weights (nn::ParamTensor)
      // Paired: step i is followed by a read of step_bytes in pattern i % kReadPatterns, and
      // fraction = (step_bytes / step seconds) / (read bytes / read seconds). Per pattern, the
      // median over the steps it followed; the figure is the least of them (the pattern that
      // read fastest against decode), so the roofline is still the best pattern.
      constexpr int NP = gen_detail::kReadPatterns;
      std::size_t read_offset = 0;
      std::vector<std::vector<double>> step_fraction(NP), step_read_gbps(NP);
      std::vector<double> rep_fraction(tp.size());
      if (paired) gen_detail::ensure_read_buffer(bw_buf, gen_detail::kReadBufferBytes);
      // Paired on one device, step i's buffer read is followed by a read of the weights
      // themselves in weights-read pattern i % kWeightsReadPatterns (the roofline of the memory
      // the weights are in), then by an untimed read of other bytes.
      constexpr int NW = gen_detail::kWeightsReadPatterns;
      const bool weights_paired = paired && mesh.size() == 1;
      const auto spans = weights_paired ? gen_detail::decode_weight_spans(model)
                                        : std::vector<std::pair<const char*, std::size_t>>{};
      double span_bytes = 0;
      for (const auto& sp : spans) span_bytes += static_cast<double>(sp.second);
      std::vector<std::vector<double>> wstep_fraction(NW), wstep_read_gbps(NW);
      std::vector<double> wrep_fraction(tp.size());
      const auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        const std::size_t m = v.size() / 2;
        return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
      };
      // Per pattern, the median of its fractions (infinity for a pattern no step followed), and
      // the pattern whose median is least.
      const auto pattern_medians = [&](const std::vector<std::vector<double>>& by) {
        std::vector<double> m(by.size(), std::numeric_limits<double>::infinity());
        for (std::size_t q = 0; q < by.size(); ++q)
          if (!by[q].empty()) m[q] = median(by[q]);
        return m;
      };
      const auto least = [](const std::vector<double>& m) {
        return static_cast<std::size_t>(std::min_element(m.begin(), m.end()) - m.begin());
      };
      const std::size_t step_floats = static_cast<std::size_t>(step_bytes / sizeof(float));
      for (std::size_t r = 0; r < tp.size(); ++r) {
        forget();
        const auto t0 = std::chrono::steady_clock::now();
        dec.prefill(prompt.data(), P, nullptr, logits.data());
        tp[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const auto t1 = std::chrono::steady_clock::now();
        std::vector<std::vector<double>> fr(NP), wfr(NW);  // this repetition's paired fractions by pattern
        td[r] = 0;
        if constexpr (requires { dec.time_phases(true); }) dec.time_phases(phase_times);  // decode steps only
        for (std::int64_t i = 0; i < G; ++i) {
          const auto s0 = std::chrono::steady_clock::now();
          const std::int64_t t = generate::argmax(logits.data(), V);
          dec.decode(&t, logits.data());
          if (!paired) continue;
          const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
          td[r] += step_s;
          const int pattern = static_cast<int>(i % NP);
          std::size_t done = 0;
          const double read_s = gen_detail::timed_read(bw_buf, pattern, step_floats, read_offset, done);
          const double read_gbps = static_cast<double>(done * sizeof(float)) / read_s / 1e9;
          fr[static_cast<std::size_t>(pattern)].push_back(step_bytes / step_s / 1e9 / read_gbps);
          step_read_gbps[static_cast<std::size_t>(pattern)].push_back(read_gbps);
          if (weights_paired) {
            // After the buffer's read, so that the step's weights have left the caches (tiny's
            // 60 MB are not far beyond an L3); then an untimed read of as many other bytes, so
            // that the next step does not find this read's weights there either.
            const int wp = static_cast<int>(i % NW);
            const double w_gbps = span_bytes / gen_detail::timed_weights_read(spans, wp) / 1e9;
            wfr[static_cast<std::size_t>(wp)].push_back(step_bytes / step_s / 1e9 / w_gbps);
            wstep_read_gbps[static_cast<std::size_t>(wp)].push_back(w_gbps);
            gen_detail::timed_read(bw_buf, 0, std::min(step_floats, gen_detail::kFlushFloats), read_offset, done);
          }
        }
        if constexpr (requires { dec.time_phases(false); }) dec.time_phases(false);
        if (paired) {
          const std::vector<double> m = pattern_medians(fr);
          rep_fraction[r] = m[least(m)];
          for (int q = 0; q < NP; ++q) step_fraction[q].insert(step_fraction[q].end(), fr[q].begin(), fr[q].end());
          if (weights_paired) {
            const std::vector<double> wm = pattern_medians(wfr);
            wrep_fraction[r] = wm[least(wm)];
            for (int q = 0; q < NW; ++q) wstep_fraction[q].insert(wstep_fraction[q].end(), wfr[q].begin(), wfr[q].end());
          }
        } else {
          td[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
        }
        pp_rate[r] = static_cast<double>(P) / tp[r];
        tg_rate[r] = static_cast<double>(G) / td[r];
        if (bandwidth) {  // the roofline, measured in the same run on the same threads
          rb[r] = gen_detail::measure_read_bandwidth(bw_buf);
          bw[r] = rb[r].best();
          fraction[r] = tg_rate[r] / (bw[r] * 1e9 / step_bytes);
        }
      }
      const auto pattern_median = [&](double gen_detail::ReadBandwidth::*f) {
        std::vector<double> v;
        for (const auto& x : rb) v.push_back(x.*f);
        return median(v);
      };
      j["model"] = name;
      j["cache"] = args.str("--cache", "standard");
      j["quant"] = quant::format_name(quant);
      j["dtype"] = dtype;
      j["adapter"] = af.adapter.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(af.adapter);
      j["adapter_merged"] = af.merge;
      j["threads"] = exec::num_threads();
      j["huge_pages"] = huge_pages;
      j["prompt_len"] = P;
      j["gen_len"] = G;
      j["repetitions"] = reps;
      j["prefill_seconds"] = median(tp);
      j["decode_seconds"] = median(td);
      j["prefill_tokens_per_s"] = median(pp_rate);
      j["decode_tokens_per_s"] = median(tg_rate);
      j["ms_per_token"] = 1e3 * median(td) / static_cast<double>(G);
      if (reps > 1) {
        j["prefill_tokens_per_s_by_repetition"] = pp_rate;
        j["decode_tokens_per_s_by_repetition"] = tg_rate;
      }
      j["params"] = model.param_count();
      j["decode_bytes_per_token"] = step_bytes;
      j["decode_gb_per_s"] = step_bytes * median(tg_rate) / 1e9;
      j["mesh"] = mesh_str(dims);
      j["cache_bytes"] = cache_bytes;
      j["scratch_bytes"] = dec.scratch_bytes();
      if constexpr (requires { dec.phase_seconds(); }) {
        if (phase_times) {
          const auto ps = dec.phase_seconds();
          j["phase_seconds_per_token"] = {{"qkv", ps.qkv},         {"attention", ps.attention},
                                          {"o_proj", ps.o_proj},   {"gate_up", ps.gate_up},
                                          {"down", ps.down},       {"lm_head", ps.lm_head},
                                          {"barrier_wait", ps.barrier_wait}};
          j["phase_steps"] = ps.steps;
        }
      }
      if (bandwidth) {
        using RB = gen_detail::ReadBandwidth;
        j["memory_read_gb_per_s"] = median(bw);
        j["memory_read_gb_per_s_by_pattern"] = {{"sequential", pattern_median(&RB::sequential)},
                                                {"prefetched", pattern_median(&RB::prefetched)},
                                                {"streams8", pattern_median(&RB::streams8)},
                                                {"rows8", pattern_median(&RB::rows8)},
                                                {"rows8_32k", pattern_median(&RB::rows8_32k)},
                                                {"rows8_stream", pattern_median(&RB::rows8_stream)}};
        j["roofline_tokens_per_s"] = median(bw) * 1e9 / step_bytes;
        j["roofline_fraction"] = median(fraction);  // the median of the paired fractions
        if (reps > 1) {
          j["memory_read_gb_per_s_by_repetition"] = bw;
          j["roofline_fraction_by_repetition"] = fraction;
        }
        // A paired read's fields: its least pattern (name, median read, median fraction), the
        // fraction by pattern and, with N > 1, by repetition.
        const auto put_paired = [&](const std::vector<std::vector<double>>& fractions,
                                    const std::vector<std::vector<double>>& gbps, const char* const* names,
                                    const std::vector<double>& by_rep, const std::string& read, const std::string& fraction) {
          const std::vector<double> m = pattern_medians(fractions);
          const std::size_t best = least(m);
          nlohmann::ordered_json by_pattern;
          for (std::size_t q = 0; q < m.size(); ++q)
            if (!fractions[q].empty()) by_pattern[names[q]] = m[q];
          j[read + "_pattern"] = names[best];
          j[read + "_gb_per_s"] = median(gbps[best]);
          j[fraction] = m[best];
          j[fraction + "_by_pattern"] = by_pattern;
          if (reps > 1) j[fraction + "_by_repetition"] = by_rep;
        };
        if (paired)
          put_paired(step_fraction, step_read_gbps, gen_detail::kReadPatternNames, rep_fraction, "paired_read",
                     "roofline_fraction_paired");
        if (weights_paired)
          put_paired(wstep_fraction, wstep_read_gbps, gen_detail::kWeightsReadPatternNames, wrep_fraction, "weights_read",
                     "roofline_fraction_weights_read");
      }
    };
    const auto one = [&](auto& c) {
      generate::Decoder dec(model, c);
      run(dec, [&] { c.reset(0); }, c.bytes());
    };
    const auto on_mesh = [&](auto& dec) { run(dec, [&] { dec.reset(); }, dec.cache_bytes()); };
    if (mesh.size() > 1) {
      EDL_CLI_USAGE_CHECK(o.cache != generate::CacheKind::paged, errc::unsupported, "edl bench decode",
                          "--cache paged with --mesh: use standard or int8");
      if (o.cache == generate::CacheKind::standard) {
        generate::ShardedDecoder<Pol, generate::StandardKVCache> dec(model, mesh, 1, L);
        on_mesh(dec);
      } else {
        generate::ShardedDecoder<Pol, generate::Int8KVCache> dec(model, mesh, 1, L);
        on_mesh(dec);
      }
    } else {
      switch (o.cache) {
        case generate::CacheKind::standard: { generate::StandardKVCache c(shape); one(c); break; }
        case generate::CacheKind::int8: { generate::Int8KVCache c(shape); one(c); break; }
        case generate::CacheKind::paged: {
          auto po = o.paged;
          po.max_model_length = L;
          generate::PagedKVCache c(shape, po);
          one(c);
          break;
        }
      }
    }
    j["peak_bytes"] = peak_resident_bytes();
    std::cout << j.dump() << "\n";
    return 0;
  });
}

inline Command bench_decode_command() {
  return {
      .name = "bench decode",
      .group = "measuring",
      .summary = "time prefill and decode (tokens/s, bytes per step, optional roofline against memory bandwidth)",
      .synopsis = "--model DIR|tiny|small|gqa1b [--prompt-len P] [--gen-len G] [--threads T] [flags]",
      .flags = flags(
          {{text_flag("--model", "DIR|tiny|small|gqa1b", "an HF folder, or a preset drawn with random weights").required()},
           declare_adapter_flags(),
           {integer_flag("--prompt-len", "P", "prompt tokens (random ids)").defaults("128"),
            integer_flag("--gen-len", "G", "tokens decoded after the prompt").defaults("128"),
            integer_flag("--threads", "T", "threads of the prefill and decode measured").defaults("all cores"),
            integer_flag("--seed", "S", "seed of the preset's weights and the prompt").defaults("0")},
           gen_detail::declare_cache_flags(),
           {declare_mesh_flag("the mesh the decoder runs on (tp, sp; simulated devices)"),
            switch_flag("--bandwidth", "also measure this machine's read bandwidth after each decode pass (roofline)"),
            switch_flag("--paired-bandwidth", "follow every decode step with a read of its bytes (implies --bandwidth)"),
            switch_flag("--phase-times", "add where a one-device decode step's time goes (phase_seconds_per_token)"),
            switch_flag("--no-huge-pages", "leave the weights on the pages the allocator gave (no transparent huge pages)"),
            integer_flag("--repetitions", "N", "prefill and decode N times; the figures are medians").defaults("1"),
            text_flag("--quant", "", "quantize the decoder's Linears and lm_head first")
                .one_of({"none", "q8_0", "q4_0", "nf4"})
                .defaults("none"),
            gen_detail::declare_dtype_flag()}}),
      .examples = {"edl bench decode --model tiny --prompt-len 128 --gen-len 64 --threads 2",
                   "edl bench decode --model gqa1b --cache int8 --repetitions 3 --bandwidth"},
      .run = cmd_bench_decode};
}

}  // namespace edl::cli
