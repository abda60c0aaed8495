// edl/train/metrics.hpp
// What the trainer reports while it runs:
//   - MetricsWriter: one JSON object per line appended to <save_directory>/metrics.jsonl
//     (flushed per line, so `tail -f` and a crash both see complete lines);
//   - ProgressLine: "step 120/400 | loss 2.314 | lr 2.9e-03 | 31.2k tok/s | MFU 21.3% | ETA 1m32s"
//     on stderr; on a terminal it is preceded by a bar ("[######--------------]  30%") and
//     redrawn in place (\r), otherwise it is one plain line per update (logs stay readable);
//   - measure_peak_gflops(): the machine's f32 FMA peak (the MFU denominator).
//
// MFU = (3 x model.flops_forward(batch, seq) per step, i.e. forward + backward ~ 6 x params per
// token plus attention) x steps/s / peak. The peak is measured, unless
// TrainingArguments::peak_gflops gives it, by kernels::measure_peak (kernels/peak.hpp): register-
// only chains of f32 fused multiply-adds on every kernel thread, best of several trials. So the
// MFU reads "fraction of the f32 multiply-adds this machine can issue", not of a datasheet, and
// not of a GEMM's rate either (a GEMM is itself a workload below that peak).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/io/mmap.hpp>
#include <edl/kernels/peak.hpp>

namespace edl::train {

/// The f32 FMA peak (GFLOP/s) of every kernel thread: kernels::measure_peak, about a second.
inline double measure_peak_gflops() { return kernels::measure_peak(exec::num_threads()).f32_gflops; }

/// Appends JSON lines to a file.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  explicit MetricsWriter(const std::string& path) : path_(path) {
    const auto dir = std::filesystem::path(path).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir);
    out_.open(path, std::ios::app | std::ios::binary);
    EDL_CHECK(out_.good(), errc::io, path, "cannot open for appending: ", io::detail::errno_text());
  }
  void write(const nlohmann::ordered_json& j) {
    if (!out_.is_open()) return;
    out_ << j.dump() << '\n';
    out_.flush();
    EDL_CHECK(out_.good(), errc::io, path_, "write failed: ", io::detail::errno_text());
  }
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
};

inline std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, (t / 60) % 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}

/// The progress line on stderr.
/// How training progress is shown (TrainingArguments::progress_bar_type): a bar redrawn on a
/// terminal ("tqdm", "rich"; plain lines when stderr is not one), JSON lines ("json": one
/// object per logged step, {"message": ...} for the rest), or nothing ("none").
enum class ProgressStyle { bar, json, none };

inline ProgressStyle progress_style_from_name(const std::string& name, const std::string& where) {
  if (name == "tqdm" || name == "rich") return ProgressStyle::bar;
  if (name == "json") return ProgressStyle::json;
  if (name == "none") return ProgressStyle::none;
  ::edl::detail::raise(errc::config, where, ::edl::detail::concat("expected tqdm, rich, json or none; found \"", name, "\""));
}

class ProgressLine {
 public:
  explicit ProgressLine(bool enabled = true) : ProgressLine(enabled ? ProgressStyle::bar : ProgressStyle::none) {}
  explicit ProgressLine(ProgressStyle style, std::FILE* out = stderr)
      : style_(style), out_(out), tty_(style == ProgressStyle::bar && out == stderr && ::isatty(2) == 1) {}
  void update(std::int64_t step, std::int64_t total, double loss, double lr, double tok_s, double mfu, double eta_s) {
    if (style_ == ProgressStyle::none) return;
    if (style_ == ProgressStyle::json) {
      nlohmann::ordered_json j = {{"step", step}, {"total_steps", total},     {"loss", loss}, {"learning_rate", lr},
                                  {"tokens_per_s", tok_s}, {"mfu", mfu}, {"eta_s", eta_s}};
      std::fprintf(out_, "%s\n", j.dump().c_str());
      std::fflush(out_);
      return;
    }
    char buf[256];
    std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | lr %.2e | %.1fk tok/s | MFU %.1f%% | ETA %s",
                  static_cast<long long>(step), static_cast<long long>(total), loss, lr, tok_s / 1000.0, 100.0 * mfu,
                  format_duration(eta_s).c_str());
    if (tty_) std::fprintf(out_, "\r%s %s\033[K", bar(step, total).c_str(), buf);
    else std::fprintf(out_, "%s\n", buf);
    std::fflush(out_);
    dirty_ = tty_;
  }
  /// "[########------------]  40%": the bar drawn in front of the line on a terminal (a log
  /// file gets the figures only, which stay greppable).
  static std::string bar(std::int64_t step, std::int64_t total, int width = 20) {
    const double f = total > 0 ? std::clamp(static_cast<double>(step) / static_cast<double>(total), 0.0, 1.0) : 0.0;
    const int full = static_cast<int>(f * width + 0.5);
    char pct[8];
    std::snprintf(pct, sizeof pct, "%3d%%", static_cast<int>(f * 100.0 + 0.5));
    return "[" + std::string(static_cast<std::size_t>(full), '#') + std::string(static_cast<std::size_t>(width - full), '-') +
           "] " + pct;
  }
  /// True when updates redraw one line in place (a bar on a terminal).
  bool in_place() const noexcept { return tty_; }
  /// A line of its own (evaluation, checkpoint); ends an in-place line first.
  void message(const std::string& s) {
    if (style_ == ProgressStyle::none) return;
    finish();
    if (style_ == ProgressStyle::json) std::fprintf(out_, "%s\n", nlohmann::ordered_json{{"message", s}}.dump().c_str());
    else std::fprintf(out_, "%s\n", s.c_str());
    std::fflush(out_);
  }
  void finish() {
    if (dirty_) std::fprintf(out_, "\n");
    dirty_ = false;
  }

 private:
  ProgressStyle style_;
  std::FILE* out_;
  bool tty_, dirty_ = false;
};

}  // namespace edl::train
