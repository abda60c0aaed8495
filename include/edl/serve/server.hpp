// edl/serve/server.hpp
// An OpenAI-compatible HTTP server over a Service (docs/serving.md). HTTP is cpp-httplib's
// (Debian libcpp-httplib-dev; link edl::serve): edl writes no HTTP parser.
//
//   serve::Metrics metrics;
//   serve::Service<> service(model, so, &metrics);
//   serve::Server<> server(service, tok, defaults, {.host = "127.0.0.1", .port = 0, .model_name = "m"}, metrics);
//   int port = server.bind();       // port 0: a free port
//   server.listen();                // until stop(); another thread may call shutdown(grace)
//
// Endpoints: POST /v1/chat/completions, POST /v1/completions (JSON, or server-sent events
// ending with `data: [DONE]` when "stream": true), GET /v1/models, GET /health, GET /metrics.
// Every error is OpenAI's {"error": {"message", "type", "param", "code"}} with its status:
// 400 bad request, 401 missing or wrong API key, 404 unknown model or route, 413 body over
// the limit, 429 queue full, 503 shutting down, 500 a bug.
// A client that goes away is noticed at the next write (a token, or a keep-alive byte every
// half second while it waits: an SSE comment when streaming, a space before the JSON body
// otherwise), and its request is cancelled.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/socket.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <edl/chat/chat_template.hpp>
#include <edl/chat/conversation.hpp>
#include <edl/core/error.hpp>
#include <edl/serve/metrics.hpp>
#include <edl/serve/openai.hpp>
#include <edl/serve/service.hpp>
#include <edl/serve/stop_strings.hpp>
#include <edl/tokenizer/tokenizer.hpp>

namespace edl::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                        // 0: any free port (bind() returns it)
  std::string api_key;                    // non-empty: /v1/* needs "Authorization: Bearer KEY"
  std::string model_name = "edl";         // the id /v1/models lists and requests may name
  std::size_t max_body_bytes = 4u << 20;  // larger bodies get 413
  int read_timeout_s = 30;                // a request not fully read by then is dropped
  int write_timeout_s = 30;
  int http_threads = 0;                   // 0: enough for every slot and queued request
  int listen_backlog = 1024;              // connections the kernel holds until they are accepted
};

namespace server_detail {

inline std::string random_hex(std::size_t n) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* digits = "0123456789abcdef";
  std::string s(n, '0');
  for (auto& c : s) c = digits[rng() & 15];
  return s;
}

inline std::uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

inline ojson bytes_of(const std::string& s) {
  ojson b = ojson::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

/// One choice as the client sees it: text decoded as tokens come, cut at stop strings.
struct Choice {
  Choice(const tokenizer::Tokenizer& tok, std::vector<std::string> stops)
      : dec(tok, /*skip_special_tokens=*/true), stop(std::move(stops)) {}
  tokenizer::StreamDecoder dec;
  StopStrings stop;
  std::vector<std::int64_t> tokens;
  std::string decoded;        // what dec gave so far (before stop strings)
  std::string text;
  std::string finish_reason;  // set once the choice is over (for the client)
  bool announced = false;     // streaming chat: the role chunk was sent
  ojson chat_logprobs = ojson::array();  // chat: logprobs.content entries
  ojson tokens_lp = ojson::array(), token_logprobs = ojson::array(), top_lp = ojson::array(),
        offsets = ojson::array();  // completions: the legacy logprobs object
};

}  // namespace server_detail

template <class Pol = DefaultPolicy>
class Server {
 public:
  Server(Service<Pol>& service, const tokenizer::Tokenizer& tok, generate::GenerationConfig defaults, ServerOptions o,
         Metrics& metrics)
      : service_(service), tok_(tok), defaults_(std::move(defaults)), o_(std::move(o)), metrics_(metrics),
        created_(static_cast<std::int64_t>(std::time(nullptr))) {
    if (tok.chat_template()) template_.emplace(*tok.chat_template());
    const std::size_t threads = o_.http_threads > 0 ? static_cast<std::size_t>(o_.http_threads) : 64;
    http_.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    http_.set_payload_max_length(o_.max_body_bytes);
    http_.set_read_timeout(o_.read_timeout_s, 0);
    http_.set_write_timeout(o_.write_timeout_s, 0);
    http_.set_keep_alive_timeout(5);
    http_.set_tcp_nodelay(true);
    // The listening socket is the last one cpp-httplib creates before it binds; bind() widens
    // its backlog (cpp-httplib's build listens with 5: a burst of clients lost their handshakes
    // and waited a second or more for retransmits, or failed).
    http_.set_socket_options([this](socket_t sock) {
      httplib::default_socket_options(sock);
      listen_socket_ = sock;
    });
    routes();
  }

  /// Binds host:port; returns the port (the chosen one for port 0). Throws edl::Error when the
  /// address cannot be bound.
  int bind() {
    port_ = o_.port == 0 ? http_.bind_to_any_port(o_.host) : (http_.bind_to_port(o_.host, o_.port) ? o_.port : -1);
    EDL_CHECK(port_ > 0, errc::io, "serve.Server", "cannot listen on ", o_.host, ":", o_.port,
              " (in use, or not an address of this machine)");
    // listen() again on a listening socket sets its backlog (the kernel caps it at somaxconn).
    EDL_CHECK(::listen(listen_socket_, std::max(1, o_.listen_backlog)) == 0, errc::io, "serve.Server",
              "cannot set the listen backlog of ", o_.host, ":", port_, " to ", o_.listen_backlog, ": ",
              std::strerror(errno));
    return port_;
  }
  /// Serves until stop() (from another thread). bind() first.
  void listen() { http_.listen_after_bind(); }

  /// New requests get 503; in-flight ones run for up to `grace`, then are cancelled; returns
  /// once their answers are written (or a few seconds more), and stops listening.
  template <class Rep, class Period>
  void shutdown(std::chrono::duration<Rep, Period> grace) {
    service_.shutdown(grace);
    for (int i = 0; i < 500 && handlers_ > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    http_.stop();
  }
  void stop() { http_.stop(); }
  int port() const noexcept { return port_; }

 private:
  using Clock = std::chrono::steady_clock;

  static void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(e.body().dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
  }

  void routes() {
    http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (o_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + o_.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      send_error(res, ApiError(401, "a valid API key is needed: send \"Authorization: Bearer KEY\"",
                               "invalid_request_error", {}, "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    });
    // Statuses httplib sets itself (no route, body too large, a request it cannot read) get
    // OpenAI's error object too.
    http_.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty() || res.content_length_ > 0) return httplib::Server::HandlerResponse::Unhandled;
      std::string what = "bad request", code = "bad_request";
      if (res.status == 404) what = "no such route", code = "not_found";
      else if (res.status == 405) what = "method not allowed", code = "method_not_allowed";
      else if (res.status == 413)
        what = "the body is larger than " + std::to_string(o_.max_body_bytes) + " bytes", code = "payload_too_large";
      else if (res.status == 414) what = "the URI is too long", code = "uri_too_long";
      else if (res.status >= 500) what = "internal error", code = "internal_error";
      res.set_content(ApiError::error_body(what, res.status >= 500 ? "server_error" : "invalid_request_error", {}, code)
                          .dump(),
                      "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }));
    http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, ApiError(500, what, "server_error", {}, "internal_error"));
    });
    http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"};
      std::string ep = "other";
      for (const char* k : known)
        if (req.path == k) ep = k;
      metrics_.count_request(ep, res.status);
    });

    http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_.prometheus(), "text/plain; version=0.0.4");
    });
    http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      ojson m{{"id", o_.model_name}, {"object", "model"}, {"created", created_}, {"owned_by", "edl"},
              {"max_model_len", service_.max_model_length()}};
      res.set_content(ojson{{"object", "list"}, {"data", ojson::array({m})}}.dump(), "application/json");
    });
    http_.Post("/v1/chat/completions",
               [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, Endpoint::chat); });
    http_.Post("/v1/completions",
               [this](const httplib::Request& req, httplib::Response& res) { complete(req, res, Endpoint::completion); });
  }

  /// The prompt's token ids, checked against the vocabulary and the context length.
  std::vector<std::int64_t> prompt_ids(const CompletionRequest& r) const {
    std::vector<std::int64_t> ids;
    if (r.endpoint == Endpoint::chat) {
      if (!template_) throw ApiError(400, "the model has no chat template (tokenizer_config.json has no chat_template); "
                                          "use /v1/completions", "invalid_request_error", "messages", "no_chat_template");
      ojson conv = r.chat_extra;
      conv["messages"] = r.messages;
      std::string text;
      try {
        text = chat::render_conversation(*template_, tok_, conv, {.add_generation_prompt = true}, "chat template");
      } catch (const Error& e) {
        throw ApiError(400, std::string("the chat template cannot render these messages: ") + e.what(),
                       "invalid_request_error", "messages", "template_error");
      }
      // The template writes BOS itself (transformers' apply_chat_template).
      ids = tok_.encode(text, /*add_special_tokens=*/false);
    } else if (r.prompt_text) {
      ids = tok_.encode(*r.prompt_text, /*add_special_tokens=*/true);
    } else {
      ids = *r.prompt_ids;
      for (std::size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || ids[i] >= tok_.vocab_size())
          throw ApiError(400, "'prompt': token " + std::to_string(i) + " is " + std::to_string(ids[i]) +
                                  ", outside the vocabulary [0, " + std::to_string(tok_.vocab_size()) + ")",
                         "invalid_request_error", "prompt", "invalid_value");
    }
    if (ids.empty()) throw ApiError(400, "the prompt is empty", "invalid_request_error", "prompt", "invalid_value");
    const std::int64_t P = static_cast<std::int64_t>(ids.size()), mml = service_.max_model_length();
    if (P >= mml || (r.max_tokens && P + *r.max_tokens > mml))
      throw ApiError(400, "this model's maximum context length is " + std::to_string(mml) + " tokens; the prompt has " +
                              std::to_string(P) + (r.max_tokens ? " and max_tokens asks for " + std::to_string(*r.max_tokens) : std::string()) +
                              " (prompt + max_tokens must fit, and leave room for one new token)",
                     "invalid_request_error", r.max_tokens ? "max_tokens" : "messages", "context_length_exceeded");
    return ids;
  }

  void complete(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    struct Count {  // handlers in flight, for shutdown
      std::atomic<int>& n;
      explicit Count(std::atomic<int>& c) : n(c) { ++n; }
      ~Count() { --n; }
    };
    auto count = std::make_shared<Count>(handlers_);
    try {
      const CompletionRequest r = parse_completion_request(req.body, endpoint, defaults_);
      if (r.model && *r.model != o_.model_name)
        throw ApiError(404, "the model '" + *r.model + "' does not exist; this server serves '" + o_.model_name + "'",
                       "invalid_request_error", "model", "model_not_found");
      auto ids = prompt_ids(r);
      const std::int64_t P = static_cast<std::int64_t>(ids.size());
      std::vector<generate::GenerationConfig> configs;
      const std::uint64_t seed = r.seed_given ? r.g.seed : server_detail::random_seed();
      for (std::int64_t c = 0; c < r.n; ++c) {
        generate::GenerationConfig g = r.g;
        g.max_new_tokens = r.max_tokens ? *r.max_tokens : service_.max_model_length() - P;
        g.seed = seed + static_cast<std::uint64_t>(c);  // n choices: n streams
        configs.push_back(std::move(g));
      }
      std::shared_ptr<Ticket> ticket;
      try {
        ticket = service_.submit(std::move(ids), std::move(configs), r.logprobs);
      } catch (const Busy& b) {
        throw ApiError(b.shutting_down ? 503 : 429, b.what(), b.shutting_down ? "server_error" : "rate_limit_error", {},
                       b.shutting_down ? "shutting_down" : "queue_full");
      }
      // Every choice accepted by the engine (or the request's error) before the answer starts.
      auto state = std::make_shared<Stream>(*this, r, ticket);
      state->wait_accepted();
      const char* type = r.stream ? "text/event-stream" : "application/json";
      if (r.stream) res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(type, [state, count](std::size_t, httplib::DataSink& sink) {
        return state->pump(sink);
      }, [state](bool ok) {
        if (!ok) state->ticket->cancel();  // the client went away, or the write failed
      });
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      send_error(res, ApiError(400, e.what(), "invalid_request_error"));
    }
  }

  /// One request's answer, written as its events come (both the streamed and the whole form).
  struct Stream {
    Stream(Server& s, CompletionRequest req, std::shared_ptr<Ticket> t)
        : server(s), r(std::move(req)), ticket(std::move(t)),
          id((r.endpoint == Endpoint::chat ? "chatcmpl-" : "cmpl-") + server_detail::random_hex(24)),
          created(static_cast<std::int64_t>(std::time(nullptr))) {
      for (int c = 0; c < ticket->choices(); ++c) choices.emplace_back(s.tok_, r.stop);
    }

    void wait_accepted() {
      int accepted = 0;
      while (accepted < ticket->choices()) {
        for (auto& e : ticket->wait(std::chrono::milliseconds(100))) {
          if (e.kind == ChoiceEvent::Kind::accepted) ++accepted;
          else if (e.kind == ChoiceEvent::Kind::error) {
            ticket->cancel();
            throw ApiError(400, e.error, "invalid_request_error", {}, "invalid_value");
          } else {
            early.push_back(std::move(e));  // a short prefill: tokens may come already
          }
        }
      }
    }

    /// Called by httplib until it returns false or sink.done(): waits for events, writes.
    bool pump(httplib::DataSink& sink) {
      std::vector<ChoiceEvent> events;
      events.swap(early);
      if (events.empty()) events = ticket->wait(std::chrono::milliseconds(500));
      if (events.empty()) {  // a keep-alive byte: a client that left makes this write fail
        const char* ping = r.stream ? ": keep-alive\n\n" : " ";
        return sink.write(ping, std::strlen(ping));
      }
      for (auto& e : events) {
        std::string out = apply(e);
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          ticket->cancel();
          return false;
        }
      }
      if (open() > 0) return true;
      std::string tail = r.stream ? stream_tail() : "\n" + whole().dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n";
      if (!sink.write(tail.data(), tail.size())) return false;
      sink.done();
      return true;
    }

    int open() const {
      int n = 0;
      for (const auto& c : choices) n += c.finish_reason.empty();
      return n;
    }

    /// Applies one event to its choice; when streaming, returns the SSE text to send.
    std::string apply(const ChoiceEvent& e) {
      auto& c = choices[static_cast<std::size_t>(e.choice)];
      if (!c.finish_reason.empty()) return {};  // already over (a stop string matched)
      std::string sse;
      if (r.stream && r.endpoint == Endpoint::chat && !c.announced) {
        c.announced = true;
        sse += chunk(e.choice, ojson{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr);
      }
      if (e.kind == ChoiceEvent::Kind::token) {
        c.tokens.push_back(e.token);
        const std::string piece = c.dec.step(e.token);
        c.decoded += piece;
        const auto d = c.stop.feed(piece);
        const std::size_t offset = c.text.size();
        c.text += d.text;
        ojson lp = nullptr;
        if (r.logprobs >= 0) lp = add_logprobs(c, e, offset);
        if (d.stopped) {
          c.finish_reason = "stop";
          ticket->stop_choice(e.choice);
        }
        if (r.stream && (!d.text.empty() || !lp.is_null()))
          sse += chunk(e.choice, r.endpoint == Endpoint::chat ? ojson{{"content", d.text}} : ojson(d.text), lp, nullptr);
        if (r.stream && d.stopped) sse += chunk(e.choice, end_delta(), nullptr, "stop");
      } else if (e.kind == ChoiceEvent::Kind::finished || e.kind == ChoiceEvent::Kind::error) {
        // Bytes the stream decoder still holds (an unfinished UTF-8 sequence: U+FFFD, as a
        // whole decode gives them), then what the stop strings held back.
        const std::string full = server.tok_.decode(c.tokens, /*skip_special_tokens=*/true);
        auto d = c.stop.feed(full.compare(0, c.decoded.size(), c.decoded) == 0 ? full.substr(c.decoded.size()) : std::string());
        std::string rest = d.text + (d.stopped ? std::string() : c.stop.flush());
        c.text += rest;
        c.finish_reason = e.kind == ChoiceEvent::Kind::error ? "error"
                          : d.stopped                          ? "stop"
                          : e.finish_reason == "cancelled"     ? "abort"
                                                               : e.finish_reason;
        if (r.stream && !rest.empty())
          sse += chunk(e.choice, r.endpoint == Endpoint::chat ? ojson{{"content", rest}} : ojson(rest), nullptr, nullptr);
        if (r.stream) sse += chunk(e.choice, end_delta(), nullptr, c.finish_reason);
      }
      return sse;
    }

    /// The delta of a chunk that only ends a choice.
    ojson end_delta() const { return r.endpoint == Endpoint::chat ? ojson::object() : ojson(""); }

    /// The logprobs of one token, recorded on its choice; returns the stream chunk's form.
    ojson add_logprobs(server_detail::Choice& c, const ChoiceEvent& e, std::size_t offset) {
      const auto text_of = [&](std::int64_t id) { return server.tok_.decode(std::vector<std::int64_t>{id}); };
      const std::string t = text_of(e.token);
      if (r.endpoint == Endpoint::chat) {
        ojson top = ojson::array();
        for (const auto& [id, lp] : e.top) {
          const std::string s = text_of(id);
          top.push_back({{"token", s}, {"logprob", lp}, {"bytes", server_detail::bytes_of(s)}});
        }
        ojson entry{{"token", t}, {"logprob", e.logprob}, {"bytes", server_detail::bytes_of(t)}, {"top_logprobs", top}};
        c.chat_logprobs.push_back(entry);
        return ojson{{"content", ojson::array({entry})}};
      }
      ojson top = ojson::object();
      for (const auto& [id, lp] : e.top) top[text_of(id)] = lp;
      c.tokens_lp.push_back(t);
      c.token_logprobs.push_back(e.logprob);
      c.top_lp.push_back(top);
      c.offsets.push_back(offset);
      return ojson{{"tokens", ojson::array({t})}, {"token_logprobs", ojson::array({e.logprob})},
                   {"top_logprobs", ojson::array({top})}, {"text_offset", ojson::array({offset})}};
    }

    std::string chunk(int index, const ojson& delta, const ojson& logprobs, const ojson& finish) const {
      ojson ch{{"index", index}};
      if (r.endpoint == Endpoint::chat) ch["delta"] = delta;
      else ch["text"] = delta;
      ch["logprobs"] = logprobs;
      ch["finish_reason"] = finish;
      ojson j{{"id", id}, {"object", r.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created}, {"model", server.o_.model_name}, {"choices", ojson::array({ch})}};
      return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
    }

    ojson usage() const {
      std::int64_t completion = 0;
      for (const auto& c : choices) completion += static_cast<std::int64_t>(c.tokens.size());
      const std::int64_t prompt = static_cast<std::int64_t>(ticket->prompt().size());
      return ojson{{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
    }

    std::string stream_tail() const {
      std::string s;
      if (r.include_usage) {
        ojson j{{"id", id}, {"object", r.endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created}, {"model", server.o_.model_name}, {"choices", ojson::array()}, {"usage", usage()}};
        s += "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
      }
      return s + "data: [DONE]\n\n";
    }

    ojson whole() const {
      ojson cs = ojson::array();
      for (std::size_t i = 0; i < choices.size(); ++i) {
        const auto& c = choices[i];
        ojson ch{{"index", i}};
        ojson lp = nullptr;
        if (r.logprobs >= 0)
          lp = r.endpoint == Endpoint::chat ? ojson{{"content", c.chat_logprobs}}
                                            : ojson{{"tokens", c.tokens_lp}, {"token_logprobs", c.token_logprobs},
                                                    {"top_logprobs", c.top_lp}, {"text_offset", c.offsets}};
        if (r.endpoint == Endpoint::chat) ch["message"] = ojson{{"role", "assistant"}, {"content", c.text}};
        else ch["text"] = c.text;
        ch["logprobs"] = lp;
        ch["finish_reason"] = c.finish_reason;
        if (r.return_token_ids) ch["token_ids"] = c.tokens;
        cs.push_back(ch);
      }
      ojson j{{"id", id}, {"object", r.endpoint == Endpoint::chat ? "chat.completion" : "text_completion"},
              {"created", created}, {"model", server.o_.model_name}, {"choices", cs}, {"usage", usage()}};
      if (r.return_token_ids) j["prompt_token_ids"] = ticket->prompt();
      return j;
    }

    Server& server;
    CompletionRequest r;
    std::shared_ptr<Ticket> ticket;
    std::string id;
    std::int64_t created;
    std::vector<server_detail::Choice> choices;
    std::vector<ChoiceEvent> early;
  };

  Service<Pol>& service_;
  const tokenizer::Tokenizer& tok_;
  generate::GenerationConfig defaults_;
  ServerOptions o_;
  Metrics& metrics_;
  std::int64_t created_;
  std::optional<chat::ChatTemplate> template_;
  httplib::Server http_;
  int port_ = -1;
  socket_t listen_socket_ = -1;
  std::atomic<int> handlers_{0};
};

}  // namespace edl::serve
