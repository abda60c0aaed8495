// edl_serve_load: a light load generator for `edl serve` (or any OpenAI-compatible server),
// the same measurement as bench/serve_http.mjs without a JavaScript runtime beside the server.
// On a machine whose cores the server uses, the openai client's event loop takes a share of
// them (about 4 % at 16 clients on two cores); a client on another machine takes none. This
// one costs a blocking thread per client that sleeps on its socket.
//
//   edl_serve_load URL MODEL VOCAB N P G ROUNDS [API_KEY]
//
// Each round, N streaming /v1/completions requests of P random prompt token ids (the same
// generator and seed as serve_http.mjs) are sent at once, greedy, G new tokens each
// (ignore_eos); the round is timed from the first send to the last [DONE]. Prints one JSON
// line: requests_per_s, tokens_per_s (medians over the rounds), time to first token and
// inter-token latency (p50, p99) over every request of every round, and completion_tokens,
// the usage's count summed over the rounds' requests.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Target {
  std::string host;
  int port = 80;
};

Target parse_url(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) throw std::runtime_error("URL: expected http://HOST:PORT, found " + url);
  const std::string rest = url.substr(scheme.size());
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) return {rest, 80};
  return {rest.substr(0, colon), std::stoi(rest.substr(colon + 1))};
}

/// serve_http.mjs's prompt generator, in JavaScript's doubles (its product rounds past 2^53),
/// so both clients send the same prompts in the same order.
struct PromptSource {
  double seed = 12345;
  double vocab;
  std::vector<std::int64_t> next(int length) {
    std::vector<std::int64_t> ids(static_cast<std::size_t>(length));
    for (auto& id : ids) {
      seed = std::fmod(seed * 1103515245 + 12345, 2147483648.0);
      id = 3 + static_cast<std::int64_t>(std::floor(seed / 2147483648.0 * (vocab - 3)));
    }
    return ids;
  }
};

struct Outcome {
  double ttft = -1;
  std::vector<double> gaps;
  std::int64_t tokens = 0;
  std::string error;
};

/// One streaming request: reads the server-sent events as they arrive, timing each chunk
/// that carries text, and the usage chunk's completion_tokens.
Outcome one_request(const Target& target, const std::string& key, const std::string& body) {
  Outcome out;
  httplib::Client client(target.host, target.port);
  client.set_read_timeout(600, 0);
  std::string pending;
  Clock::time_point last;
  const Clock::time_point t0 = Clock::now();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}, {"Authorization", "Bearer " + key}};
  req.body = body;
  req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
    pending.append(data, n);
    for (std::size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
      const std::string event = pending.substr(0, end);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") continue;
      const auto chunk = nlohmann::json::parse(payload, nullptr, false);
      if (chunk.is_discarded()) continue;
      if (chunk.contains("usage") && chunk["usage"].is_object()) out.tokens = chunk["usage"].value("completion_tokens", 0);
      if (!chunk.contains("choices") || chunk["choices"].empty() || chunk["choices"][0].value("text", "").empty()) continue;
      const Clock::time_point t = Clock::now();
      if (out.ttft < 0)
        out.ttft = std::chrono::duration<double>(t - t0).count();
      else
        out.gaps.push_back(std::chrono::duration<double>(t - last).count());
      last = t;
    }
    return true;
  };
  const httplib::Result res = client.send(req);
  if (!res) out.error = "request failed: " + httplib::to_string(res.error());
  else if (res->status != 200) out.error = "status " + std::to_string(res->status);
  return out;
}

double percentile(std::vector<double> xs, double p) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  return xs[std::min(xs.size() - 1, static_cast<std::size_t>(p / 100 * static_cast<double>(xs.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8 && argc != 9) {
    std::cerr << "usage: edl_serve_load URL MODEL VOCAB N P G ROUNDS [API_KEY]\n";
    return 2;
  }
  try {
    const Target target = parse_url(argv[1]);
    const std::string model = argv[2], key = argc == 9 ? argv[8] : "none";
    const int clients = std::stoi(argv[4]), prompt_len = std::stoi(argv[5]), gen_len = std::stoi(argv[6]),
              rounds = std::stoi(argv[7]);
    if (clients < 1 || prompt_len < 1 || gen_len < 1 || rounds < 1)
      throw std::runtime_error("N, P, G and ROUNDS must be at least 1");
    PromptSource prompts{12345, std::stod(argv[3])};
    const auto body = [&] {
      return nlohmann::json{{"model", model},
                            {"prompt", prompts.next(prompt_len)},
                            {"max_tokens", gen_len},
                            {"temperature", 0},
                            {"ignore_eos", true},
                            {"stream", true},
                            {"stream_options", {{"include_usage", true}}}}
          .dump();
    };
    if (const Outcome warm = one_request(target, key, body()); !warm.error.empty()) throw std::runtime_error(warm.error);
    std::vector<double> tps, rps, ttft, itl;
    std::int64_t completion_tokens = 0;
    for (int r = 0; r < rounds; ++r) {
      std::vector<std::string> bodies;
      for (int i = 0; i < clients; ++i) bodies.push_back(body());
      std::vector<Outcome> outcomes(static_cast<std::size_t>(clients));
      const Clock::time_point t0 = Clock::now();
      {
        std::vector<std::jthread> threads;
        for (int i = 0; i < clients; ++i)
          threads.emplace_back([&, i] { outcomes[static_cast<std::size_t>(i)] = one_request(target, key, bodies[static_cast<std::size_t>(i)]); });
      }
      const double wall = seconds_since(t0);
      std::int64_t tokens = 0;
      for (const Outcome& o : outcomes) {
        if (!o.error.empty()) throw std::runtime_error(o.error);
        tokens += o.tokens;
        ttft.push_back(o.ttft);
        itl.insert(itl.end(), o.gaps.begin(), o.gaps.end());
      }
      completion_tokens += tokens;
      tps.push_back(static_cast<double>(tokens) / wall);
      rps.push_back(clients / wall);
    }
    std::cout << nlohmann::json{{"client", "cpp"},
                                {"clients", clients},
                                {"prompt_len", prompt_len},
                                {"gen_len", gen_len},
                                {"rounds", rounds},
                                {"requests_per_s", percentile(rps, 50)},
                                {"tokens_per_s", percentile(tps, 50)},
                                {"ttft_p50_s", percentile(ttft, 50)},
                                {"ttft_p99_s", percentile(ttft, 99)},
                                {"itl_p50_s", percentile(itl, 50)},
                                {"itl_p99_s", percentile(itl, 99)},
                                {"completion_tokens", completion_tokens}}
                     .dump()
              << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "edl_serve_load: " << e.what() << "\n";
    return 1;
  }
}
