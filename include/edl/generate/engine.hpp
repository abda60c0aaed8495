// edl/generate/engine.hpp
// Continuous batching over the paged KV cache (docs/generation.md, "Continuous batching").
//
//   generate::EngineOptions eo;  eo.max_batch = 8;  eo.prefill_chunk = 128;
//   generate::Engine engine(model, eo);
//   auto id = engine.submit({1, 2, 3}, g, [](std::int64_t id, std::int64_t tok) { ... });
//   engine.run();                                   // or engine.step() in your own loop
//   engine.result(id).tokens, .finish_reason, .time_to_first_token_s, .total_s
//
// A request is waiting, running (it owns one of max_batch slots of the decoder's batch and the
// pages of that slot) or done. submit() may be called at any time, also between steps.
// One step():
//   1. Page growth of the running requests, oldest first: a request that needs a page when
//      none is free preempts the newest running request (possibly itself): its pages go back
//      to the pool and it returns to the waiting queue with the tokens it has generated;
//      when it is admitted again, prompt + generated tokens are recomputed as a prefill (its
//      output does not change: the same tokens give the same logits and its sampler stream
//      depends on its seed and its own step counter only). Preempting the newest keeps the
//      oldest requests moving, so the oldest request always finishes.
//   2. Admission, oldest first (strictly in order: a waiting request that does not fit blocks
//      the newer ones, so long requests are not starved): into a free slot when the pool has
//      pages for the request's whole context (prompt, plus generated tokens after a
//      preemption) and one more token. The context's pages are reserved right away.
//   3. One forward over every running slot as one batch: a slot still prefilling feeds its
//      next chunk (the slots share a budget of prefill_chunk tokens per step, oldest first),
//      a decoding slot feeds its last token. Chunks append to what the slot already holds.
//   4. Every slot whose context is now fully cached samples its next token
//      (Sampler::next with sequence index 0 and step = tokens generated so far: the draw
//      depends on the request's seed and its own step only, whatever its id, slot or batch,
//      so a request gives exactly what generate() gives its prompt alone), streams it, and
//      finishes on a stop token (eos_token_id / stop_token_ids, included in the output, as
//      HF), after max_new_tokens, or when prompt + output reaches max_model_length; a
//      finished request frees its slot's pages at once.
// cancel(id) between steps ends a request at once (finish_reason "cancelled") and frees its
// pages; forget(id) drops a done request's token buffers (a server calls it once it has sent
// the answer, so memory does not grow with the number of requests served).
// A request submitted with want_logprobs gets, with each token, the log-softmax of the model's
// logits for that step (before penalties and warpers: the model's own distribution, as vLLM
// reports by default).
// On a mesh (EngineOptions::mesh) the slots are cut over the dp x fsdp x ep groups as
// ShardedDecoder cuts a batch, and each group's devices hold pages for its slots only: the
// engine keeps one pool of pages per group (one pool on one device), and a request is admitted
// into a free slot whose pool has room, preempting only requests of its own pool. A pool's page
// holds page_size tokens of every layer; on a device it is a page of page_size / sp local
// slots of that device's kv heads (tp splits them), so a device's page is 1/(tp x sp) of the
// one-device page and the same per-device budget holds tp x sp times the tokens. Device d
// never needs more pages than its pool's count: ceil(ceil(n / sp) / (page_size / sp)) =
// ceil(n / page_size). The tokens equal one device's to f32 rounding (the mesh's sums differ
// in order). A mesh needs page_size divisible by sp; under mpirun the engine does not run
// (every rank would have to step the same requests in lockstep).
// Errors (edl::Error, at submit, naming the request): an empty prompt, a token id outside the
// vocabulary, a prompt longer than max_model_length, and a request whose prompt +
// max_new_tokens - 1 tokens (the last token is never fed back) need more pages than the whole
// pool holds: it could never run, even alone.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/generate/decoder.hpp>
#include <edl/generate/generation_config.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/generate/sampling.hpp>
#include <edl/generate/sharded_decoder.hpp>
#include <edl/mesh/mesh.hpp>

namespace edl::generate {

/// What the engine's KV cache pages hold: f32 keys and values (PagedKVCache), or int8 with an
/// f32 scale per (token, kv head) (PagedInt8KVCache, Int8KVCache's values in pages).
enum class KVCacheDtype { f32, int8 };

struct EngineOptions {
  std::int64_t max_batch = 8;         // slots: requests running at once
  std::int64_t prefill_chunk = 256;   // prompt tokens per step, shared by the prefilling slots
  PagedKVCacheOptions paged;          // page_size, budget_bytes, utilization (max_model_length below)
  KVCacheDtype kv_cache = KVCacheDtype::f32;
  std::int64_t max_model_length = 0;  // 0: the model's max_position_embeddings
  /// The devices the engine runs on, {dp, fsdp, ep, tp, sp} (one device by default). On a
  /// larger mesh the batch runs on a generate::ShardedDecoder whose every device holds a paged
  /// cache of its shard; `paged.budget_bytes` is then each device's budget.
  MeshDims mesh = {1, 1, 1, 1, 1};
};

enum class RequestState { waiting, running, done };

struct RequestResult {
  std::int64_t id = -1;
  RequestState state = RequestState::waiting;
  std::vector<std::int64_t> tokens;   // new tokens
  std::string finish_reason;          // "stop" | "length" | "cancelled" once done
  double time_to_first_token_s = -1;  // from submit to the first new token (-1: none yet)
  double total_s = -1;                // from submit to done
  std::int64_t preemptions = 0;       // times the request was sent back to the queue
};

/// One generated token, as the per-request callback sees it.
struct TokenEvent {
  std::int64_t id = -1;     // request
  std::int64_t token = -1;  // the token just sampled
  std::int64_t index = 0;   // its position among the request's new tokens (0 for the first)
  /// log-softmax of the step's logits over the vocabulary (only with want_logprobs; valid
  /// during the callback only).
  std::span<const float> logprobs;
};

struct EngineStats {
  std::int64_t steps = 0;
  std::int64_t prefill_tokens = 0;     // context tokens fed as prefill (recomputation included)
  std::int64_t recomputed_tokens = 0;  // of which recomputed after a preemption
  std::int64_t decode_tokens = 0;      // tokens fed by decoding slots
  std::int64_t generated_tokens = 0;   // tokens sampled
  std::int64_t preemptions = 0;
  std::int64_t finished = 0;
  std::int64_t peak_pages = 0;         // most pages in use at once
  std::int64_t peak_running = 0;       // most requests running at once
  double busy_seconds = 0;             // time spent inside step()
  double tokens_per_s() const noexcept { return busy_seconds > 0 ? static_cast<double>(generated_tokens) / busy_seconds : 0; }
};

template <class Pol = DefaultPolicy>
class Engine {
 public:
  using Model = models::LlamaForCausalLM<Pol>;
  using Callback = std::function<void(std::int64_t id, std::int64_t token)>;
  using EventCallback = std::function<void(const TokenEvent&)>;
  using Clock = std::chrono::steady_clock;

  Engine(const Model& model, const EngineOptions& o)
      : model_(model), o_(o), V_(model.config().vocab_size),
        mml_(o.max_model_length > 0 ? o.max_model_length : model.config().max_position_embeddings) {
    const char* w = "generate.Engine";
    EDL_CHECK(o.max_batch > 0, errc::invalid_argument, w, "max_batch must be positive, found ", o.max_batch);
    EDL_CHECK(o.prefill_chunk > 0, errc::invalid_argument, w, "prefill_chunk must be positive, found ", o.prefill_chunk);
    slots_.assign(static_cast<std::size_t>(o.max_batch), -1);
    logits_.resize(static_cast<std::size_t>(o.max_batch * V_));
    build_decoder();
  }
  // The decoder holds a reference to the cache member.
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a request; returns its id (0, 1, 2, ... in submission order). See the header
  /// comment for the errors.
  std::int64_t submit(std::vector<std::int64_t> prompt, const GenerationConfig& g, Callback on_token = {}) {
    EventCallback ev;
    if (on_token) ev = [cb = std::move(on_token)](const TokenEvent& e) { cb(e.id, e.token); };
    return submit(std::move(prompt), g, std::move(ev), false);
  }
  /// As above, with the whole TokenEvent per token; want_logprobs fills its logprobs (the
  /// model's distribution); `processor` (the seeds' logits_processor, called with the
  /// request's id, its prompt and tokens so far, and the step's logits) runs before the
  /// config's own processors, as in generate().
  std::int64_t submit(std::vector<std::int64_t> prompt, const GenerationConfig& g, EventCallback on_token,
                      bool want_logprobs, LogitsProcessor processor = {}) {
    const std::int64_t id = static_cast<std::int64_t>(reqs_.size());
    const std::string w = "generate.Engine request " + std::to_string(id);
    g.validate(w + " GenerationConfig", V_);
    EDL_CHECK(g.num_beams == 1, errc::unsupported, w, "beam search (num_beams = ", g.num_beams,
              ") does not run in the engine; use generate()");
    EDL_CHECK(g.num_return_sequences == 1, errc::unsupported, w, "num_return_sequences = ", g.num_return_sequences,
              ": the engine runs one sequence per request; submit the prompt that many times");
    EDL_CHECK(!prompt.empty(), errc::invalid_argument, w, "the prompt is empty");
    for (std::size_t i = 0; i < prompt.size(); ++i)
      EDL_CHECK(prompt[i] >= 0 && prompt[i] < V_, errc::invalid_argument, w, "prompt token ", i, ": id ", prompt[i],
                " is outside the vocabulary [0, ", V_, ")");
    const std::int64_t P = static_cast<std::int64_t>(prompt.size());
    EDL_CHECK(P <= mml_, errc::invalid_argument, w, "the prompt has ", P, " tokens, more than max_model_length = ", mml_);
    const std::int64_t limit = std::min<std::int64_t>(g.max_new_tokens, mml_ - P);
    const std::int64_t most = P + std::max<std::int64_t>(0, limit - 1);
    EDL_CHECK(pages_for(most) <= pool_pages_, errc::invalid_argument, w, "can never fit: ", P, " prompt tokens + ",
              limit, " new tokens need ", pages_for(most), " pages of ", page_size_, " tokens, but the pool holds only ",
              pool_pages_, " (budget ", o_.paged.budget_bytes, " bytes x utilization ", o_.paged.utilization, ", ",
              device_page_bytes_, " bytes per page", on_mesh() ? " on each device" : "",
              "); raise the budget or shorten the request");
    Request r;
    r.res.id = id;
    r.g = g;
    r.cb = std::move(on_token);
    r.want_logprobs = want_logprobs;
    r.processor = std::move(processor);
    r.limit = limit;
    r.most = most;
    r.ctx = std::move(prompt);
    // Sized once: sampling appends without allocating.
    r.ctx.reserve(r.ctx.size() + static_cast<std::size_t>(std::max<std::int64_t>(0, limit)));
    r.res.tokens.reserve(static_cast<std::size_t>(std::max<std::int64_t>(0, limit)));
    r.t0 = Clock::now();
    reqs_.push_back(std::move(r));
    if (limit <= 0) {
      finish(reqs_.back(), "length");
    } else {
      waiting_.push_back(id);  // ids only grow: the queue stays in age order
    }
    return id;
  }

  /// One scheduling step (see the header comment). Returns true while requests remain.
  bool step() {
    if (idle()) return false;
    const auto t0 = Clock::now();
    grow_running();
    admit();
    forward_and_sample();
    ++stats_.steps;
    stats_.busy_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    return !idle();
  }

  /// Steps until every submitted request is done.
  void run() {
    while (step()) {
    }
  }

  /// Ends a waiting or running request now (finish_reason "cancelled"), freeing its pages;
  /// a done request is left as it is. Call between steps, not from a token callback.
  void cancel(std::int64_t id) {
    (void)result(id);  // checks the id
    Request& r = req(id);
    if (r.res.state == RequestState::done) return;
    if (r.res.state == RequestState::waiting) waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
    finish(r, "cancelled");
  }

  /// Drops a done request's buffers (its result keeps id, state, finish_reason and timings;
  /// tokens become empty).
  void forget(std::int64_t id) {
    (void)result(id);
    Request& r = req(id);
    EDL_CHECK(r.res.state == RequestState::done, errc::invalid_argument, "generate.Engine.forget", "request ", id,
              " is not done");
    std::vector<std::int64_t>().swap(r.res.tokens);
    std::vector<std::int64_t>().swap(r.ctx);
    r.g = GenerationConfig{};
    r.cb = nullptr;
  }

  bool idle() const noexcept { return waiting_.empty() && running() == 0; }
  std::int64_t running() const noexcept {
    return std::count_if(slots_.begin(), slots_.end(), [](std::int64_t s) { return s >= 0; });
  }
  std::int64_t waiting() const noexcept { return static_cast<std::int64_t>(waiting_.size()); }
  std::int64_t num_requests() const noexcept { return static_cast<std::int64_t>(reqs_.size()); }

  const RequestResult& result(std::int64_t id) const {
    EDL_CHECK(id >= 0 && id < num_requests(), errc::invalid_argument, "generate.Engine.result", "no request ", id,
              " (", num_requests(), " submitted)");
    return reqs_[static_cast<std::size_t>(id)].res;
  }
  const EngineStats& stats() const noexcept { return stats_; }
  std::int64_t max_model_length() const noexcept { return mml_; }
  /// Tokens per page.
  std::int64_t page_size() const noexcept { return page_size_; }
  /// Pools of pages: one per dp x fsdp x ep group of the mesh (1 on one device).
  std::int64_t num_pools() const noexcept { return static_cast<std::int64_t>(pool_free_.size()); }
  /// Pages of one pool (what one device's cache holds).
  std::int64_t pages_per_pool() const noexcept { return pool_pages_; }
  /// Pages of all pools, and those in use by running requests.
  std::int64_t num_pages() const noexcept { return pool_pages_ * num_pools(); }
  std::int64_t pages_in_use() const noexcept {
    std::int64_t free = 0;
    for (auto f : pool_free_) free += f;
    return num_pages() - free;
  }
  /// Bytes of one page over all the devices that hold it (a one-device cache's page_bytes()).
  std::int64_t page_bytes() const noexcept { return page_bytes_; }
  /// Bytes of the KV caches of every device.
  std::int64_t kv_pool_bytes() const noexcept {
    return std::visit([](const auto& d) { return d.mesh ? d.mesh->cache_bytes() : d.cache->bytes(); }, dec_);
  }
  /// Whether the engine runs on a mesh of more than one device.
  bool on_mesh() const noexcept {
    return std::visit([](const auto& d) { return d.mesh != nullptr; }, dec_);
  }

 private:
  struct Request {
    RequestResult res;
    GenerationConfig g;
    EventCallback cb;
    bool want_logprobs = false;
    LogitsProcessor processor;      // may be empty
    std::int64_t limit = 0;         // most new tokens
    std::vector<std::int64_t> ctx;  // prompt + generated
    std::int64_t fed = 0;           // tokens of ctx in the cache
    std::int64_t recompute = 0;     // tokens to recompute after a preemption (counted once fed)
    std::int64_t most = 0;          // most tokens the request ever holds in the cache
    bool decoding = false;          // context cached but for the last sampled token
    std::int64_t slot = -1;
    Clock::time_point t0;
  };

  /// The decoder and its caches: one device's paged cache, or a ShardedDecoder whose devices
  /// each hold a paged cache of their shard (page_size / sp local slots per page); then the
  /// pools of the page accounting, one per group of slots.
  void build_decoder() {
    const char* w = "generate.Engine";
    std::int64_t devices = 1;
    for (auto d : o_.mesh) {
      EDL_CHECK(d >= 1, errc::invalid_argument, w, "mesh axis sizes must be >= 1, found ", d);
      devices *= d;
    }
    page_size_ = o_.paged.page_size;
    EDL_CHECK(page_size_ > 0, errc::invalid_argument, w, "page_size must be positive, found ", page_size_);
    const std::int64_t groups = o_.kv_cache == KVCacheDtype::int8 ? build_decoder<PagedInt8KVCache>(devices)
                                                                  : build_decoder<PagedKVCache>(devices);
    pool_free_.assign(static_cast<std::size_t>(groups), pool_pages_);
    held_.assign(static_cast<std::size_t>(o_.max_batch), 0);
  }

  /// build_decoder() for caches of type Cache; returns the number of pools.
  template <class Cache>
  std::int64_t build_decoder(std::int64_t devices) {
    auto& d = dec_.template emplace<Decoders<Cache>>();
    PagedKVCacheOptions po = o_.paged;
    if (devices == 1) {
      po.max_model_length = mml_;
      d.cache = std::make_unique<Cache>(kv_cache_shape(model_.config(), o_.max_batch, mml_), po);
      d.dec = std::make_unique<Decoder<Pol, Cache>>(model_, *d.cache);
      pool_pages_ = d.cache->num_pages();
      device_page_bytes_ = page_bytes_ = d.cache->page_bytes();
      pool_of_.assign(static_cast<std::size_t>(o_.max_batch), 0);
      return 1;
    }
    DefaultMesh mesh = create_mesh(o_.mesh);
    const char* w = "generate.Engine";
    EDL_CHECK(mesh.backend().processes() == 1, errc::unsupported, w,
              "the engine runs in one process: its mesh's devices cannot span MPI ranks");
    const std::int64_t sp = mesh.axis_size("sp"), tp = mesh.axis_size("tp");
    EDL_CHECK(page_size_ % sp == 0, errc::invalid_argument, w, "page_size = ", page_size_,
              " is not divisible by sp = ", sp, ": each device's page holds page_size / sp positions");
    po.page_size = page_size_ / sp;
    typename ShardedDecoder<Pol, Cache>::CacheFactory make = [po](const KVCacheShape& s) {
      PagedKVCacheOptions local = po;
      local.max_model_length = s.max_length;
      return std::make_unique<Cache>(s, local);
    };
    d.mesh = std::make_unique<ShardedDecoder<Pol, Cache>>(model_, std::move(mesh), o_.max_batch, mml_, make);
    pool_pages_ = d.mesh->cache(0).num_pages();  // every device's page has the same bytes
    device_page_bytes_ = d.mesh->cache(0).page_bytes();
    page_bytes_ = device_page_bytes_ * tp * sp;
    pool_of_.resize(static_cast<std::size_t>(o_.max_batch));
    for (std::int64_t b = 0; b < o_.max_batch; ++b) pool_of_[static_cast<std::size_t>(b)] = d.mesh->sequence_group(b);
    return d.mesh->sequence_groups();
  }

  std::int64_t pages_for(std::int64_t tokens) const noexcept { return (tokens + page_size_ - 1) / page_size_; }
  std::int64_t& pool_free(std::int64_t slot) { return pool_free_[static_cast<std::size_t>(pool_of_[static_cast<std::size_t>(slot)])]; }
  /// Accounts the pages slot needs for `tokens` (the caches take them as the forward writes).
  void reserve(std::int64_t slot, std::int64_t tokens) {
    std::int64_t& held = held_[static_cast<std::size_t>(slot)];
    const std::int64_t more = pages_for(tokens) - held;
    if (more <= 0) return;
    pool_free(slot) -= more;
    held += more;
  }
  /// Returns slot's pages to its pool and empties its caches.
  void release(std::int64_t slot) {
    pool_free(slot) += held_[static_cast<std::size_t>(slot)];
    held_[static_cast<std::size_t>(slot)] = 0;
    std::visit([slot](auto& d) { d.mesh ? d.mesh->reset(slot) : d.cache->reset(slot); }, dec_);
  }
  Request& req(std::int64_t id) { return reqs_[static_cast<std::size_t>(id)]; }

  /// Tokens slot's request feeds this step, before the shared prefill budget.
  static std::int64_t pending(const Request& r) noexcept { return static_cast<std::int64_t>(r.ctx.size()) - r.fed; }

  /// Running request ids, oldest first, into `ids` (kept between steps: no allocation per token).
  void running_ids(std::vector<std::int64_t>& ids) const {
    ids.clear();
    for (auto s : slots_)
      if (s >= 0) ids.push_back(s);
    std::sort(ids.begin(), ids.end());
  }
  /// The newest running request of slot's pool.
  std::int64_t newest_running(std::int64_t slot) const noexcept {
    std::int64_t newest = -1;
    const std::int64_t pool = pool_of_[static_cast<std::size_t>(slot)];
    for (std::size_t s = 0; s < slots_.size(); ++s)
      if (pool_of_[s] == pool) newest = std::max(newest, slots_[s]);
    return newest;
  }

  void preempt(std::int64_t id) {
    Request& r = req(id);
    release(r.slot);
    slots_[static_cast<std::size_t>(r.slot)] = -1;
    r.slot = -1;
    r.recompute = r.fed;  // computed once already: the work preemption throws away
    r.fed = 0;
    r.decoding = false;
    r.res.state = RequestState::waiting;
    ++r.res.preemptions;
    ++stats_.preemptions;
    // Back into the queue in age order, ahead of newer requests.
    waiting_.insert(std::lower_bound(waiting_.begin(), waiting_.end(), id), id);
  }

  /// Step 1: pages for the tokens each running request feeds this step (a decoding slot needs
  /// a new page every page_size tokens; a prefilling slot's context pages were reserved at
  /// admission, so only decoding can run out).
  void grow_running() {
    running_ids(grow_ids_);
    for (std::int64_t id : grow_ids_) {
      Request& r = req(id);
      if (r.slot < 0) continue;  // preempted by an older request of this loop
      const std::int64_t want = static_cast<std::int64_t>(r.ctx.size());
      for (;;) {
        const std::int64_t have = held_[static_cast<std::size_t>(r.slot)];
        if (pages_for(want) - have <= pool_free(r.slot)) {
          reserve(r.slot, want);
          break;
        }
        const std::int64_t victim = newest_running(r.slot);
        preempt(victim);
        if (victim == id) break;
      }
    }
  }

  /// Step 2: waiting requests into free slots, oldest first, while the pool holds their context.
  void admit() {
    while (!waiting_.empty()) {
      Request& r = req(waiting_.front());
      const std::int64_t ctx = static_cast<std::int64_t>(r.ctx.size());
      // A free slot whose pool has room for the whole context plus the first decoded token,
      // so that a request admitted now is not the first to be preempted at its next step.
      const std::int64_t need = pages_for(std::min(ctx + 1, r.most));
      std::int64_t slot = -1;
      for (std::int64_t s = 0; s < o_.max_batch && slot < 0; ++s)
        if (slots_[static_cast<std::size_t>(s)] < 0 && need <= pool_free(s)) slot = s;
      if (slot < 0) break;
      slots_[static_cast<std::size_t>(slot)] = r.res.id;
      r.slot = slot;
      r.fed = 0;
      r.res.state = RequestState::running;
      release(slot);
      reserve(slot, ctx);
      waiting_.pop_front();
    }
    stats_.peak_running = std::max(stats_.peak_running, running());
    stats_.peak_pages = std::max(stats_.peak_pages, pages_in_use());
  }

  /// Steps 3 and 4.
  void forward_and_sample() {
    const std::int64_t B = o_.max_batch;
    std::vector<std::int64_t>& ids_run = run_ids_;
    running_ids(ids_run);
    if (ids_run.empty()) return;
    // Tokens per slot: 1 for decoding slots; prefill chunks from the shared budget, oldest first.
    std::vector<std::int64_t>& n = take_;
    n.assign(static_cast<std::size_t>(B), 0);
    std::int64_t budget = o_.prefill_chunk, S = 0;
    for (std::int64_t id : ids_run) {
      const Request& r = req(id);
      std::int64_t take = 1;
      if (!r.decoding) {
        take = std::min(pending(r), budget);
        budget -= take;
      }
      n[static_cast<std::size_t>(r.slot)] = take;
      S = std::max(S, take);
    }
    if (S == 0) return;
    // ids [B, S], right-aligned (left padding): every slot appends its own tokens.
    ids_.assign(static_cast<std::size_t>(B * S), 0);
    mask_.assign(static_cast<std::size_t>(B * S), 0);
    for (std::int64_t id : ids_run) {
      Request& r = req(id);
      const std::int64_t k = n[static_cast<std::size_t>(r.slot)];
      for (std::int64_t i = 0; i < k; ++i) {
        const std::size_t at = static_cast<std::size_t>(r.slot * S + S - k + i);
        ids_[at] = r.ctx[static_cast<std::size_t>(r.fed + i)];
        mask_[at] = 1;
      }
    }
    std::visit([&](auto& d) {
      if (d.mesh) d.mesh->prefill(ids_.data(), S, mask_.data(), logits_.data());
      else d.dec->prefill(ids_.data(), S, mask_.data(), logits_.data());
    }, dec_);
    stats_.peak_pages = std::max(stats_.peak_pages, pages_in_use());

    for (std::int64_t id : ids_run) {
      Request& r = req(id);
      const std::int64_t k = n[static_cast<std::size_t>(r.slot)];
      if (k == 0) continue;
      if (r.decoding) {
        stats_.decode_tokens += 1;
      } else {
        stats_.prefill_tokens += k;
        const std::int64_t re = std::min(k, r.recompute);
        stats_.recomputed_tokens += re;
        r.recompute -= re;
      }
      r.fed += k;
      if (pending(r) != 0) continue;  // still prefilling
      float* row = logits_.data() + r.slot * V_;
      if (r.want_logprobs) log_softmax(row);  // before the sampler's penalties change the row
      const std::int64_t t = static_cast<std::int64_t>(r.res.tokens.size());
      const std::int64_t P = static_cast<std::int64_t>(r.ctx.size()) - t;
      if (r.processor) r.processor(r.res.id, r.ctx, std::span<float>(row, static_cast<std::size_t>(V_)));
      const std::int64_t tok = sampler_.next(row, V_, r.g, r.ctx,
                                             std::span<const std::int64_t>(r.ctx.data() + P, static_cast<std::size_t>(t)),
                                             0u, static_cast<std::uint32_t>(t));
      r.res.tokens.push_back(tok);
      r.ctx.push_back(tok);
      r.decoding = true;
      ++stats_.generated_tokens;
      if (t == 0) r.res.time_to_first_token_s = std::chrono::duration<double>(Clock::now() - r.t0).count();
      if (r.cb) {
        TokenEvent e;
        e.id = r.res.id;
        e.token = tok;
        e.index = t;
        if (r.want_logprobs) e.logprobs = std::span<const float>(logprobs_.data(), static_cast<std::size_t>(V_));
        r.cb(e);
      }
      if (r.g.is_stop(tok)) {
        finish(r, "stop");
      } else if (static_cast<std::int64_t>(r.res.tokens.size()) >= r.limit) {
        finish(r, "length");
      }
    }
  }

  /// logprobs_ = log-softmax of one row of logits (f64 sum, as the sampler's softmax).
  void log_softmax(const float* row) {
    logprobs_.resize(static_cast<std::size_t>(V_));
    const float mx = *std::max_element(row, row + V_);
    double sum = 0;
    for (std::int64_t i = 0; i < V_; ++i) sum += std::exp(static_cast<double>(row[i] - mx));
    const double lse = static_cast<double>(mx) + std::log(sum);
    for (std::int64_t i = 0; i < V_; ++i)
      logprobs_[static_cast<std::size_t>(i)] = static_cast<float>(static_cast<double>(row[i]) - lse);
  }

  void finish(Request& r, const char* reason) {
    if (r.slot >= 0) {
      release(r.slot);
      slots_[static_cast<std::size_t>(r.slot)] = -1;
      r.slot = -1;
    }
    r.res.state = RequestState::done;
    r.res.finish_reason = reason;
    r.res.total_s = std::chrono::duration<double>(Clock::now() - r.t0).count();
    ++stats_.finished;
  }

  const Model& model_;
  EngineOptions o_;
  std::int64_t V_ = 0, mml_ = 0;
  /// The decoder over caches of type Cache: one device's, or a ShardedDecoder's on a mesh.
  template <class Cache>
  struct Decoders {
    std::unique_ptr<Cache> cache;  // one device
    std::unique_ptr<Decoder<Pol, Cache>> dec;
    std::unique_ptr<ShardedDecoder<Pol, Cache>> mesh;  // a larger mesh
  };
  std::variant<Decoders<PagedKVCache>, Decoders<PagedInt8KVCache>> dec_;  // by o_.kv_cache
  // Page accounting: pages per pool, free pages of each pool, each slot's pool and pages held.
  std::int64_t page_size_ = 0, pool_pages_ = 0, page_bytes_ = 0, device_page_bytes_ = 0;
  std::vector<std::int64_t> pool_free_, pool_of_, held_;
  Sampler sampler_;
  std::vector<Request> reqs_;
  std::deque<std::int64_t> waiting_;
  std::vector<std::int64_t> slots_;  // request id per slot, -1 when free
  std::vector<float> logits_, logprobs_;
  std::vector<std::int64_t> ids_, mask_;              // the step's batch [max_batch, S]
  std::vector<std::int64_t> grow_ids_, run_ids_, take_;  // per-step scratch
  EngineStats stats_;
};

}  // namespace edl::generate
