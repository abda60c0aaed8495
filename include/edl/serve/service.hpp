// edl/serve/service.hpp
// The continuous batching engine (generate::Engine) on a thread of its own, for callers on
// other threads: an HTTP server's handlers, or any program that serves several users at once.
//
//   serve::Service<> service(model, {.engine = eo, .max_queue = 64});
//   auto ticket = service.submit(prompt_ids, {g}, /*top_logprobs=*/-1);   // one config per choice
//   for (;;) for (auto& e : ticket->wait(100ms)) { ... e.kind: accepted | token | finished | error }
//   ticket->cancel();            // the client went away: its slots and pages are freed
//   service.shutdown(10s);       // no new requests; in-flight ones finish or are cancelled
//
// One engine thread owns the Engine (which is not thread-safe): it moves submitted tickets
// into the engine, applies cancellations, steps, and forwards every generated token to its
// ticket as an event. Each choice of a ticket is one engine request with its own config (the
// caller gives choice i its own seed), so n choices decode side by side in one batch.
// A submit beyond max_batch running + max_queue waiting choices throws Busy (HTTP 429); an
// engine error for one request (a prompt that can never fit, say) is that ticket's `error`
// event, and the others go on.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <edl/core/error.hpp>
#include <edl/core/policy.hpp>
#include <edl/generate/engine.hpp>
#include <edl/generate/generation_config.hpp>
#include <edl/serve/metrics.hpp>

namespace edl::serve {

struct ServiceOptions {
  generate::EngineOptions engine;
  std::int64_t max_queue = 64;  // choices waiting for a slot, beyond the max_batch running
  // An idle engine that gets a request waits until none has come for this long (at most four
  // times it) before its first step, so that a burst of clients starts in one step: requests
  // over HTTP arrive spread over a millisecond or so, and the first step would otherwise
  // prefill the first alone. 0: start at once.
  std::chrono::microseconds burst_window{2000};
};

/// submit() when the queue is full (HTTP 429) or the service is shutting down (HTTP 503).
struct Busy : std::runtime_error {
  bool shutting_down = false;
  Busy(const std::string& what, bool down) : std::runtime_error(what), shutting_down(down) {}
};

struct ChoiceEvent {
  enum class Kind { accepted, token, finished, error };
  Kind kind = Kind::token;
  int choice = 0;
  std::int64_t token = -1;
  float logprob = 0;                                   // with top_logprobs >= 0
  std::vector<std::pair<std::int64_t, float>> top;     // the top_logprobs most likely, best first
  std::string finish_reason;                           // finished: "stop" | "length" | "cancelled"
  std::string error;                                   // error: the engine's message
};

/// One request's choices, shared by the caller and the engine thread.
class Ticket {
 public:
  Ticket(std::vector<std::int64_t> prompt, std::vector<generate::GenerationConfig> configs, int top_logprobs)
      : prompt_(std::move(prompt)), configs_(std::move(configs)), top_logprobs_(top_logprobs),
        stop_(std::make_unique<std::atomic<bool>[]>(configs_.size())), t0_(std::chrono::steady_clock::now()) {}

  int choices() const noexcept { return static_cast<int>(configs_.size()); }
  const std::vector<std::int64_t>& prompt() const noexcept { return prompt_; }

  /// The events since the last call, waiting up to `timeout` for the first one.
  std::vector<ChoiceEvent> wait(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    std::vector<ChoiceEvent> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
    events_.clear();
    return out;
  }

  /// Ends every choice (the client is gone); the engine thread frees them at its next step.
  void cancel() noexcept {
    for (int c = 0; c < choices(); ++c) stop_[static_cast<std::size_t>(c)] = true;
  }
  /// Ends one choice (a stop string matched in its text).
  void stop_choice(int c) noexcept {
    if (c >= 0 && c < choices()) stop_[static_cast<std::size_t>(c)] = true;
  }

 private:
  template <class>
  friend class Service;
  void push(ChoiceEvent e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(e));
    }
    cv_.notify_all();
  }
  bool stop_requested(int c) const noexcept { return stop_[static_cast<std::size_t>(c)]; }

  std::vector<std::int64_t> prompt_;
  std::vector<generate::GenerationConfig> configs_;
  int top_logprobs_ = -1;
  std::unique_ptr<std::atomic<bool>[]> stop_;
  std::chrono::steady_clock::time_point t0_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChoiceEvent> events_;
};

template <class Pol = DefaultPolicy>
class Service {
 public:
  using Model = models::LlamaForCausalLM<Pol>;
  using Clock = std::chrono::steady_clock;

  Service(const Model& model, const ServiceOptions& o, Metrics* metrics = nullptr)
      : o_(o), engine_(model, o.engine), metrics_(metrics ? metrics : &own_metrics_) {
    EDL_CHECK(o.max_queue >= 0, errc::invalid_argument, "serve.Service", "max_queue must be >= 0, found ", o.max_queue);
    thread_ = std::thread([this] { loop(); });
  }
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;
  ~Service() { shutdown(std::chrono::milliseconds(0)); }

  /// Queues a request of configs.size() choices (see the header comment).
  std::shared_ptr<Ticket> submit(std::vector<std::int64_t> prompt, std::vector<generate::GenerationConfig> configs,
                                 int top_logprobs = -1) {
    EDL_CHECK(!configs.empty(), errc::invalid_argument, "serve.Service.submit", "a request needs at least one choice");
    auto t = std::make_shared<Ticket>(std::move(prompt), std::move(configs), top_logprobs);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (draining_) throw Busy("the server is shutting down", true);
      const std::int64_t limit = o_.engine.max_batch + o_.max_queue;
      if (in_flight_ + t->choices() > limit)
        throw Busy("the server is busy: " + std::to_string(in_flight_) + " choices in flight, the limit is " +
                       std::to_string(limit) + "; retry later",
                   false);
      in_flight_ += t->choices();
      incoming_.push_back(t);
    }
    cv_.notify_all();
    return t;
  }

  /// Stops taking requests, lets in-flight ones run for up to `grace`, cancels the rest and
  /// stops the engine thread. Idempotent.
  template <class Rep, class Period>
  void shutdown(std::chrono::duration<Rep, Period> grace) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      draining_ = true;
      deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace);
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  /// Choices submitted and not yet finished.
  std::int64_t in_flight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_;
  }
  std::int64_t max_model_length() const noexcept { return engine_.max_model_length(); }
  const Metrics& metrics() const noexcept { return *metrics_; }

 private:
  struct Active {
    std::shared_ptr<Ticket> ticket;
    int choice = 0;
    Clock::time_point last;  // the previous token (inter-token latency)
    bool any = false;        // a token came
  };

  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (engine_.idle() && !incoming_.empty() && o_.burst_window.count() > 0) {
        const Clock::time_point until = Clock::now() + 4 * o_.burst_window;
        for (std::size_t n = incoming_.size(); !draining_ && Clock::now() < until; n = incoming_.size())
          if (!cv_.wait_for(lock, o_.burst_window, [&] { return incoming_.size() != n || draining_; })) break;
      }
      std::deque<std::shared_ptr<Ticket>> fresh;
      fresh.swap(incoming_);
      const bool draining = draining_, hard = draining_ && Clock::now() >= deadline_;
      lock.unlock();
      for (auto& t : fresh) admit(t);
      for (auto& [id, a] : active_)
        if (hard || a.ticket->stop_requested(a.choice)) engine_.cancel(id);
      if (!engine_.idle()) {
        try {
          engine_.step();
        } catch (const std::exception& e) {  // not expected: fail what runs, keep serving
          for (auto& [id, a] : active_) {
            a.ticket->push({ChoiceEvent::Kind::error, a.choice, -1, 0, {}, {}, e.what()});
            engine_.cancel(id);
          }
        }
      }
      retire_done();
      lock.lock();
      if (draining && active_.empty() && incoming_.empty()) break;
      if (engine_.idle() && incoming_.empty())
        cv_.wait_for(lock, std::chrono::milliseconds(draining ? 10 : 200),
                     [&] { return !incoming_.empty() || draining_ != draining; });
    }
  }

  void admit(const std::shared_ptr<Ticket>& t) {
    for (int c = 0; c < t->choices(); ++c) {
      try {
        const std::int64_t id = engine_.submit(
            t->prompt(), t->configs_[static_cast<std::size_t>(c)],
            [this](const generate::TokenEvent& e) { on_token(e); }, t->top_logprobs_ >= 0);
        active_.emplace(id, Active{t, c, t->t0_, false});
        if (c == 0) metrics_->prompt_tokens += static_cast<std::int64_t>(t->prompt().size());
        t->push({ChoiceEvent::Kind::accepted, c, -1, 0, {}, {}, {}});
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          --in_flight_;
        }
        t->push({ChoiceEvent::Kind::error, c, -1, 0, {}, {}, e.what()});
      }
    }
  }

  void on_token(const generate::TokenEvent& e) {
    Active& a = active_.at(e.id);
    const auto now = Clock::now();
    const double dt = std::chrono::duration<double>(now - a.last).count();
    (a.any ? metrics_->inter_token_latency : metrics_->time_to_first_token).observe(dt);
    a.last = now;
    a.any = true;
    ++metrics_->generation_tokens;
    ChoiceEvent ev;
    ev.kind = ChoiceEvent::Kind::token;
    ev.choice = a.choice;
    ev.token = e.token;
    const int k = a.ticket->top_logprobs_;
    if (k >= 0 && !e.logprobs.empty()) {
      ev.logprob = e.logprobs[static_cast<std::size_t>(e.token)];
      top_.resize(e.logprobs.size());
      for (std::size_t i = 0; i < top_.size(); ++i) top_[i] = static_cast<std::int64_t>(i);
      const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(k), top_.size());
      std::partial_sort(top_.begin(), top_.begin() + static_cast<std::ptrdiff_t>(n), top_.end(),
                        [&](std::int64_t x, std::int64_t y) {
                          const float lx = e.logprobs[static_cast<std::size_t>(x)], ly = e.logprobs[static_cast<std::size_t>(y)];
                          return lx > ly || (lx == ly && x < y);
                        });
      for (std::size_t i = 0; i < n; ++i) ev.top.emplace_back(top_[i], e.logprobs[static_cast<std::size_t>(top_[i])]);
    }
    a.ticket->push(std::move(ev));
  }

  /// Finished requests: their buffers dropped and the counters updated first, so that a client
  /// woken by the last event already sees its slot and cache pages free; then the last event.
  void retire_done() {
    finished_.clear();
    for (auto it = active_.begin(); it != active_.end();) {
      const auto& r = engine_.result(it->first);
      if (r.state != generate::RequestState::done) {
        ++it;
        continue;
      }
      finished_.emplace_back(it->second.ticket, ChoiceEvent{ChoiceEvent::Kind::finished, it->second.choice, -1, 0, {}, r.finish_reason, {}});
      engine_.forget(it->first);
      it = active_.erase(it);
    }
    metrics_->waiting = engine_.waiting();
    metrics_->running = engine_.running();
    metrics_->kv_pages_used = engine_.pages_in_use();
    if (finished_.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_ -= static_cast<std::int64_t>(finished_.size());
    }
    for (auto& [ticket, ev] : finished_) ticket->push(std::move(ev));
    finished_.clear();
  }

  ServiceOptions o_;
  generate::Engine<Pol> engine_;
  Metrics own_metrics_;
  Metrics* metrics_;
  std::unordered_map<std::int64_t, Active> active_;  // engine request id -> its ticket and choice
  std::vector<std::int64_t> top_;
  std::vector<std::pair<std::shared_ptr<Ticket>, ChoiceEvent>> finished_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Ticket>> incoming_;
  std::int64_t in_flight_ = 0;
  bool draining_ = false;
  Clock::time_point deadline_;
  std::thread thread_;
};

}  // namespace edl::serve
