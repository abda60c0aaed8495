// edl/serve/metrics.hpp
// What a server counts, in Prometheus' text exposition format (GET /metrics):
//
//   edl_requests_total{endpoint="/v1/chat/completions",status="200"} 12
//   edl_prompt_tokens_total, edl_generation_tokens_total           counters
//   edl_requests_waiting, edl_requests_running, edl_kv_pages_used  gauges
//   edl_time_to_first_token_seconds, edl_inter_token_latency_seconds   histograms
//   process_resident_memory_bytes                                   gauge (Linux)
//
// Every method is thread-safe: HTTP threads count requests, the engine thread counts tokens.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unistd.h>
#include <utility>

namespace edl::serve {

/// A latency histogram with fixed buckets (seconds), as Prometheus' client libraries keep one.
class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};
  void observe(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t i = 0; i < kBounds.size(); ++i)
      if (seconds <= kBounds[i]) ++counts_[i];
    ++count_;
    sum_ += seconds;
  }
  void write(std::ostringstream& out, const char* name, const char* help) const {
    std::lock_guard<std::mutex> lock(mu_);
    out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
    for (std::size_t i = 0; i < kBounds.size(); ++i)
      out << name << "_bucket{le=\"" << kBounds[i] << "\"} " << counts_[i] << '\n';
    out << name << "_bucket{le=\"+Inf\"} " << count_ << '\n'
        << name << "_sum " << sum_ << '\n'
        << name << "_count " << count_ << '\n';
  }
  std::int64_t count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
  }

 private:
  mutable std::mutex mu_;
  std::array<std::int64_t, kBounds.size()> counts_{};  // cumulative: observations <= bound
  std::int64_t count_ = 0;
  double sum_ = 0;
};

/// The process's resident set in bytes (0 where /proc is not there).
inline std::int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  if (!(f >> size >> resident)) return 0;
  return resident * static_cast<std::int64_t>(::sysconf(_SC_PAGESIZE));
}

struct Metrics {
  std::atomic<std::int64_t> prompt_tokens{0}, generation_tokens{0};
  std::atomic<std::int64_t> waiting{0}, running{0}, kv_pages_used{0};
  Histogram time_to_first_token, inter_token_latency;

  void count_request(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_[{endpoint, status}];
  }
  std::int64_t requests(const std::string& endpoint, int status) const {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = requests_.find({endpoint, status});
    return it == requests_.end() ? 0 : it->second;
  }

  std::string prometheus() const {
    std::ostringstream out;
    out << "# HELP edl_requests_total HTTP requests answered, by endpoint and status.\n"
        << "# TYPE edl_requests_total counter\n";
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [k, v] : requests_)
        out << "edl_requests_total{endpoint=\"" << k.first << "\",status=\"" << k.second << "\"} " << v << '\n';
    }
    const auto scalar = [&](const char* name, const char* type, const char* help, std::int64_t v) {
      out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << ' ' << v << '\n';
    };
    scalar("edl_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", prompt_tokens.load());
    scalar("edl_generation_tokens_total", "counter", "Tokens generated.", generation_tokens.load());
    scalar("edl_requests_waiting", "gauge", "Requests queued for a batch slot.", waiting.load());
    scalar("edl_requests_running", "gauge", "Requests holding a batch slot.", running.load());
    scalar("edl_kv_pages_used", "gauge", "Pages of the paged KV cache in use.", kv_pages_used.load());
    time_to_first_token.write(out, "edl_time_to_first_token_seconds", "From a request's arrival to its first token.");
    inter_token_latency.write(out, "edl_inter_token_latency_seconds", "Between successive tokens of one choice.");
    scalar("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", resident_bytes());
    return out.str();
  }

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, std::int64_t> requests_;
};

}  // namespace edl::serve
