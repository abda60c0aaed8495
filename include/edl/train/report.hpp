// edl/train/report.hpp
// The end-of-training report: <save_directory>/report.md and report.html, made from the run's
// metrics.jsonl (the trainer writes them at the end of train() unless
// TrainingArguments::write_report is false; `edl report DIR` writes them for an existing run).
//
//   auto rep = train::report_from_metrics("run/metrics.jsonl");
//   rep.summary.parameters = model.param_count();
//   train::write_report("run", rep);   // report.md, report.html, loss.svg, learning_rate.svg
//
// report.html is self-contained: the charts are inline SVG (svg_line_chart, no dependency, no
// script). report.md holds the same table and refers to loss.svg and learning_rate.svg, written
// next to it, since markdown viewers differ in whether they render inline SVG. Every file is
// written atomically (io::write_file_atomic): a reader sees the old report or the new
// one, never half of one.
//
// Each data point is also a <circle> with a <title>x, y</title> (a hover tooltip in browsers),
// so the numbers can be read back from the SVG exactly (9 significant digits).
//
// metrics.jsonl of a run resumed from an older checkpoint holds the steps after that
// checkpoint twice; a line whose step is not after the previous line's starts over from
// there: the earlier lines at or after that step are dropped, so the curves show what the
// final model went through.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/core/error.hpp>
#include <edl/io/atomic_file.hpp>
#include <edl/train/metrics.hpp>

namespace edl::train {

struct ChartSeries {
  std::string name;
  std::string color = "#1f77b4";
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in the given order
};

struct ChartOptions {
  std::string title;
  std::string x_label = "step";
  std::string y_label;
  int width = 720, height = 320;
};

namespace detail {

inline std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

inline std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

/// Tick values covering [lo, hi] at a 1, 2 or 5 x 10^k spacing, about `n` of them.
inline std::vector<double> nice_ticks(double lo, double hi, int n = 5) {
  std::vector<double> t;
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag, step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

}  // namespace detail

/// A line chart as a standalone <svg> element: axes with ticks, one polyline and one circle per
/// point for each series, a legend. Non-finite points are skipped. Empty input gives an empty
/// chart with its title.
inline std::string svg_line_chart(const std::vector<ChartSeries>& series, const ChartOptions& o) {
  using detail::fmt;
  const double left = 70, right = 20, top = 30, bottom = 45;
  const double pw = o.width - left - right, ph = o.height - top - bottom;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const auto& s : series)
    for (auto [x, y] : s.points)
      if (std::isfinite(x) && std::isfinite(y)) {
        x0 = std::min(x0, x); x1 = std::max(x1, x);
        y0 = std::min(y0, y); y1 = std::max(y1, y);
      }
  const bool any = std::isfinite(x0);
  if (!any) { x0 = 0; x1 = 1; y0 = 0; y1 = 1; }
  if (x1 == x0) { x0 -= 0.5; x1 += 0.5; }
  if (y1 == y0) { const double d = y0 == 0 ? 1 : std::abs(y0) * 0.05; y0 -= d; y1 += d; }
  const double pad = (y1 - y0) * 0.05;  // keep points off the frame
  y0 -= pad; y1 += pad;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return top + (1 - (y - y0) / (y1 - y0)) * ph; };

  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(o.width) + "\" height=\"" +
       std::to_string(o.height) + "\" viewBox=\"0 0 " + std::to_string(o.width) + " " + std::to_string(o.height) +
       "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  s += "<title>" + detail::xml_escape(o.title) + "</title>\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + std::to_string(o.width) + "\" height=\"" + std::to_string(o.height) +
       "\" fill=\"white\"/>\n";
  s += "<text x=\"" + fmt("%.1f", left + pw / 2) + "\" y=\"18\" text-anchor=\"middle\" font-size=\"13\">" +
       detail::xml_escape(o.title) + "</text>\n";
  s += "<rect x=\"" + fmt("%.1f", left) + "\" y=\"" + fmt("%.1f", top) + "\" width=\"" + fmt("%.1f", pw) +
       "\" height=\"" + fmt("%.1f", ph) + "\" fill=\"none\" stroke=\"#888\"/>\n";
  for (double t : detail::nice_ticks(x0, x1)) {
    s += "<line x1=\"" + fmt("%.2f", px(t)) + "\" y1=\"" + fmt("%.2f", top + ph) + "\" x2=\"" + fmt("%.2f", px(t)) +
         "\" y2=\"" + fmt("%.2f", top + ph + 4) + "\" stroke=\"#888\"/>\n";
    s += "<text x=\"" + fmt("%.2f", px(t)) + "\" y=\"" + fmt("%.2f", top + ph + 16) + "\" text-anchor=\"middle\">" +
         fmt("%g", t) + "</text>\n";
  }
  for (double t : detail::nice_ticks(y0, y1)) {
    s += "<line x1=\"" + fmt("%.2f", left) + "\" y1=\"" + fmt("%.2f", py(t)) + "\" x2=\"" + fmt("%.2f", left + pw) +
         "\" y2=\"" + fmt("%.2f", py(t)) + "\" stroke=\"#eee\"/>\n";
    s += "<text x=\"" + fmt("%.2f", left - 6) + "\" y=\"" + fmt("%.2f", py(t) + 4) + "\" text-anchor=\"end\">" +
         fmt("%.3g", t) + "</text>\n";
  }
  s += "<text x=\"" + fmt("%.1f", left + pw / 2) + "\" y=\"" + std::to_string(o.height - 8) +
       "\" text-anchor=\"middle\">" + detail::xml_escape(o.x_label) + "</text>\n";
  s += "<text transform=\"translate(14 " + fmt("%.1f", top + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       detail::xml_escape(o.y_label) + "</text>\n";
  double legend_y = top + 14;
  for (const auto& ser : series) {
    const std::string c = detail::xml_escape(ser.color);
    s += "<g class=\"series\" data-name=\"" + detail::xml_escape(ser.name) + "\">\n";
    std::string pts;
    for (auto [x, y] : ser.points)
      if (std::isfinite(x) && std::isfinite(y)) pts += (pts.empty() ? "" : " ") + fmt("%.2f", px(x)) + "," + fmt("%.2f", py(y));
    if (!pts.empty())
      s += "<polyline fill=\"none\" stroke=\"" + c + "\" stroke-width=\"1.5\" points=\"" + pts + "\"/>\n";
    for (auto [x, y] : ser.points)
      if (std::isfinite(x) && std::isfinite(y))
        s += "<circle cx=\"" + fmt("%.2f", px(x)) + "\" cy=\"" + fmt("%.2f", py(y)) + "\" r=\"2\" fill=\"" + c +
             "\"><title>" + fmt("%.9g", x) + ", " + fmt("%.9g", y) + "</title></circle>\n";
    s += "</g>\n";
    s += "<line x1=\"" + fmt("%.1f", left + pw - 110) + "\" y1=\"" + fmt("%.1f", legend_y - 4) + "\" x2=\"" +
         fmt("%.1f", left + pw - 92) + "\" y2=\"" + fmt("%.1f", legend_y - 4) + "\" stroke=\"" + c +
         "\" stroke-width=\"2\"/>\n";
    s += "<text x=\"" + fmt("%.1f", left + pw - 88) + "\" y=\"" + fmt("%.1f", legend_y) + "\">" +
         detail::xml_escape(ser.name) + "</text>\n";
    legend_y += 14;
  }
  s += "</svg>\n";
  return s;
}

/// The run's figures for the table.
struct RunSummary {
  std::string model_name;
  std::optional<std::int64_t> parameters;
  std::int64_t steps = 0;
  std::int64_t tokens_seen = 0;          // target tokens trained on
  std::optional<double> final_train_loss;  // last logged window
  std::optional<double> final_eval_loss;
  std::optional<double> tokens_per_s;    // mean over the logged windows
  std::optional<double> mfu;             // mean over the logged windows
  std::optional<double> wall_s;          // training time, all sessions
};

struct RunReport {
  RunSummary summary;
  std::vector<std::pair<double, double>> train_loss, eval_loss, learning_rate;  // (step, value)
};

/// Reads metrics.jsonl (see the header comment for restarts). Blank or unparsable lines (a
/// line cut by a crash) are skipped.
inline RunReport report_from_metrics(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EDL_CHECK(in.good(), errc::io, path, "cannot open for reading: ", io::detail::errno_text());
  RunReport r;
  std::vector<nlohmann::json> train, eval;
  std::string line;
  auto drop_from = [](std::vector<nlohmann::json>& v, std::int64_t step) {
    v.erase(std::remove_if(v.begin(), v.end(), [&](const nlohmann::json& j) { return j["step"].get<std::int64_t>() >= step; }),
            v.end());
  };
  while (std::getline(in, line)) {
    nlohmann::json j;
    try { j = nlohmann::json::parse(line); } catch (...) { continue; }
    if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;
    const std::int64_t step = j["step"].get<std::int64_t>();
    if (j.contains("loss")) {
      if (!train.empty() && step <= train.back()["step"].get<std::int64_t>()) {
        drop_from(train, step);
        drop_from(eval, step);
      }
      train.push_back(std::move(j));
    } else if (j.contains("eval_loss")) {
      if (!eval.empty() && step <= eval.back()["step"].get<std::int64_t>()) drop_from(eval, step);
      eval.push_back(std::move(j));
    }
  }
  auto num = [](const nlohmann::json& j, const char* k) -> std::optional<double> {
    if (j.contains(k) && j[k].is_number()) return j[k].get<double>();
    return std::nullopt;
  };
  double tps = 0, mfu = 0;
  std::int64_t n_tps = 0, n_mfu = 0;
  for (const auto& j : train) {
    const double s = static_cast<double>(j["step"].get<std::int64_t>());
    if (auto v = num(j, "loss")) r.train_loss.emplace_back(s, *v);
    if (auto v = num(j, "learning_rate")) r.learning_rate.emplace_back(s, *v);
    if (auto v = num(j, "tokens_per_s")) { tps += *v; ++n_tps; }
    if (auto v = num(j, "mfu")) { mfu += *v; ++n_mfu; }
  }
  for (const auto& j : eval)
    if (auto v = num(j, "eval_loss")) r.eval_loss.emplace_back(static_cast<double>(j["step"].get<std::int64_t>()), *v);
  RunSummary& s = r.summary;
  if (!train.empty()) {
    const auto& last = train.back();
    s.steps = last["step"].get<std::int64_t>();
    if (auto v = num(last, "tokens_seen")) s.tokens_seen = static_cast<std::int64_t>(*v);
    s.final_train_loss = num(last, "loss");
    s.wall_s = num(last, "elapsed_s");
  }
  if (!r.eval_loss.empty()) s.final_eval_loss = r.eval_loss.back().second;
  if (n_tps) s.tokens_per_s = tps / static_cast<double>(n_tps);
  if (n_mfu) s.mfu = mfu / static_cast<double>(n_mfu);
  return r;
}

/// The table rows: (quantity, value as text).
inline std::vector<std::pair<std::string, std::string>> report_rows(const RunSummary& s) {
  auto opt = [](const std::optional<double>& v, const char* f, double scale = 1.0) {
    return v ? detail::fmt(f, *v * scale) : std::string("n/a");
  };
  std::vector<std::pair<std::string, std::string>> rows;
  if (!s.model_name.empty()) rows.emplace_back("model", s.model_name);
  rows.emplace_back("parameters", s.parameters ? std::to_string(*s.parameters) : "n/a");
  rows.emplace_back("steps", std::to_string(s.steps));
  rows.emplace_back("tokens seen", std::to_string(s.tokens_seen));
  rows.emplace_back("final train loss", opt(s.final_train_loss, "%.4f"));
  rows.emplace_back("final eval loss", opt(s.final_eval_loss, "%.4f"));
  rows.emplace_back("tokens/s", opt(s.tokens_per_s, "%.0f"));
  rows.emplace_back("MFU", opt(s.mfu, "%.1f%%", 100.0));
  rows.emplace_back("wall time", !s.wall_s ? std::string("n/a")
                                 : *s.wall_s < 60 ? detail::fmt("%.1f s", *s.wall_s)
                                                  : format_duration(*s.wall_s) + detail::fmt(" (%.0f s)", *s.wall_s));
  return rows;
}

inline std::string loss_chart(const RunReport& r) {
  ChartOptions o;
  o.title = "Loss";
  o.y_label = "loss (nats/token)";
  return svg_line_chart({{"train", "#1f77b4", r.train_loss}, {"eval", "#d62728", r.eval_loss}}, o);
}
inline std::string learning_rate_chart(const RunReport& r) {
  ChartOptions o;
  o.title = "Learning rate";
  o.y_label = "learning rate";
  return svg_line_chart({{"learning rate", "#2ca02c", r.learning_rate}}, o);
}

inline std::string report_markdown(const RunReport& r) {
  std::string m = "# Training report" + (r.summary.model_name.empty() ? "" : ": " + r.summary.model_name) + "\n\n";
  m += "| quantity | value |\n|---|---|\n";
  for (const auto& [k, v] : report_rows(r.summary)) m += "| " + k + " | " + v + " |\n";
  m += "\nTrain loss is the mean over each logging window; eval loss is the mean over the eval data's target "
       "tokens; tokens/s and MFU are means over the logging windows.\n\n";
  m += "![loss per step](loss.svg)\n\n![learning rate per step](learning_rate.svg)\n";
  return m;
}

inline std::string report_html(const RunReport& r) {
  const std::string title = "Training report" + (r.summary.model_name.empty() ? "" : ": " + r.summary.model_name);
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>" +
                  detail::xml_escape(title) + "</title>\n<style>body{font-family:sans-serif;margin:2em}"
                  "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 10px;text-align:left}"
                  "</style>\n</head>\n<body>\n<h1>" + detail::xml_escape(title) + "</h1>\n<table>\n<tr><th>quantity</th><th>value</th></tr>\n";
  for (const auto& [k, v] : report_rows(r.summary))
    h += "<tr><td>" + detail::xml_escape(k) + "</td><td>" + detail::xml_escape(v) + "</td></tr>\n";
  h += "</table>\n<h2>Loss</h2>\n" + loss_chart(r) + "<h2>Learning rate</h2>\n" + learning_rate_chart(r) +
       "</body>\n</html>\n";
  return h;
}

/// Writes report.md, report.html, loss.svg and learning_rate.svg into `dir`, each atomically.
inline void write_report(const std::string& dir, const RunReport& r) {
  std::filesystem::create_directories(dir);
  auto put = [&](const char* name, const std::string& text) {
    io::write_file_atomic((std::filesystem::path(dir) / name).string(), text);
  };
  put("loss.svg", loss_chart(r));
  put("learning_rate.svg", learning_rate_chart(r));
  put("report.html", report_html(r));
  put("report.md", report_markdown(r));
}

}  // namespace edl::train
