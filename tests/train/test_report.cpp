// Tests for edl/train/report.hpp: the SVG chart is well-formed XML and holds every data point
// (read back from the point titles), metrics.jsonl is read with restarts dropped, the report
// files are written (and nothing temporary is left), and the trainer writes them at the end.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <edl/train/all.hpp>
#include "../support/temp_dir.hpp"

namespace edl::train {
namespace {

namespace fs = std::filesystem;

struct TempDir : test_support::TempDir {
  explicit TempDir(const std::string& name) : test_support::TempDir("rep_" + name) {}
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A small XML checker: every tag closes in order, attributes are quoted, text has no raw '<'
// or stray '&'. Returns "" or what is wrong.
std::string xml_problem(const std::string& s) {
  std::vector<std::string> stack;
  std::size_t i = 0;
  while (i < s.size()) {
    if (s[i] == '&') {
      const auto semi = s.find(';', i);
      if (semi == std::string::npos || semi - i > 6) return "stray & at " + std::to_string(i);
      i = semi + 1;
      continue;
    }
    if (s[i] != '<') { ++i; continue; }
    const auto end = s.find('>', i);
    if (end == std::string::npos) return "unclosed tag at " + std::to_string(i);
    std::string tag = s.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.rfind("!", 0) == 0 || tag.rfind("?", 0) == 0) continue;
    if (std::count(tag.begin(), tag.end(), '"') % 2) return "unbalanced quotes in <" + tag + ">";
    if (tag.find('<') != std::string::npos) return "'<' inside <" + tag + ">";
    if (!tag.empty() && tag.back() == '/') continue;
    if (!tag.empty() && tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (stack.empty() || stack.back() != name) return "</" + name + "> closes " + (stack.empty() ? "nothing" : stack.back());
      stack.pop_back();
    } else {
      stack.push_back(tag.substr(0, tag.find_first_of(" \n\t")));
    }
  }
  return stack.empty() ? "" : "<" + stack.back() + "> never closed";
}

// (x, y) of every point title, in order, per series.
std::vector<std::vector<std::pair<double, double>>> points_of(const std::string& svg) {
  std::vector<std::vector<std::pair<double, double>>> out;
  std::istringstream in(svg);
  std::string line;
  const std::regex title(R"(<circle [^>]*><title>([^,<]+), ([^<]+)</title></circle>)");
  while (std::getline(in, line)) {
    if (line.rfind("<g class=\"series\"", 0) == 0) out.emplace_back();
    std::smatch m;
    if (std::regex_search(line, m, title)) out.back().emplace_back(std::stod(m[1]), std::stod(m[2]));
  }
  return out;
}

TEST(Report, SvgChartIsWellFormedAndHoldsEveryPoint) {
  ChartSeries a{"train <loss> & more", "#123456", {}}, b{"eval", "#d62728", {}};
  for (int i = 1; i <= 37; ++i) a.points.emplace_back(i * 10, 5.0 * std::exp(-0.05 * i) + 1e-7 * i);
  b.points = {{100, 3.25}, {200, 2.125}, {370, 1.0625}};
  ChartOptions o;
  o.title = "Loss & \"friends\"";
  o.y_label = "nats";
  const std::string svg = svg_line_chart({a, b}, o);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("train &lt;loss&gt; &amp; more"), std::string::npos);
  const auto pts = points_of(svg);
  ASSERT_EQ(pts.size(), 2u);
  ASSERT_EQ(pts[0].size(), a.points.size());
  ASSERT_EQ(pts[1].size(), b.points.size());
  for (std::size_t s = 0; s < 2; ++s) {
    const auto& want = s == 0 ? a.points : b.points;
    for (std::size_t i = 0; i < want.size(); ++i) {
      EXPECT_DOUBLE_EQ(pts[s][i].first, want[i].first);
      EXPECT_NEAR(pts[s][i].second, want[i].second, 1e-8 * std::abs(want[i].second));
    }
  }
  // Every drawn coordinate lies inside the canvas.
  const std::regex circle(R"re(<circle cx="([-0-9.]+)" cy="([-0-9.]+)")re");
  int n = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), circle); it != std::sregex_iterator(); ++it, ++n) {
    const double x = std::stod((*it)[1]), y = std::stod((*it)[2]);
    EXPECT_GE(x, 0);
    EXPECT_LE(x, o.width);
    EXPECT_GE(y, 0);
    EXPECT_LE(y, o.height);
  }
  EXPECT_EQ(n, 40);
}

TEST(Report, DegenerateChartsAreStillWellFormed) {
  EXPECT_EQ(xml_problem(svg_line_chart({}, {})), "");
  EXPECT_EQ(xml_problem(svg_line_chart({{"one", "#000", {{5, 2.0}}}}, {})), "");  // one point, flat axes
  const std::string s = svg_line_chart({{"nan", "#000", {{1, NAN}, {2, 1.0}, {3, INFINITY}}}}, {});
  EXPECT_EQ(xml_problem(s), "");
  EXPECT_EQ(points_of(s)[0].size(), 1u);  // non-finite points are skipped
}

TEST(Report, ReadsMetricsAndDropsStepsARestartRepeated) {
  TempDir d("metrics");
  {
    std::ofstream f(d.p / "metrics.jsonl");
    f << R"({"step":1,"loss":5.0,"learning_rate":0.001,"tokens_per_s":100,"mfu":0.1,"elapsed_s":1,"tokens_seen":10})" << "\n";
    f << R"({"step":2,"loss":4.0,"learning_rate":0.002,"tokens_per_s":200,"mfu":0.2,"elapsed_s":2,"tokens_seen":20})" << "\n";
    f << R"({"step":2,"eval_loss":4.5,"eval_perplexity":90})" << "\n";
    f << R"({"step":3,"loss":3.9,"learning_rate":0.003,"tokens_per_s":300,"mfu":0.3,"elapsed_s":3,"tokens_seen":30})" << "\n";
    f << R"({"step":3,"eval_loss":4.4})" << "\n";
    // Resumed from checkpoint-2: step 3 again, different numbers.
    f << R"({"step":3,"loss":3.5,"learning_rate":0.003,"tokens_per_s":300,"mfu":0.3,"elapsed_s":3.5,"tokens_seen":30})" << "\n";
    f << R"({"step":4,"loss":3.0,"learning_rate":0.004,"tokens_per_s":400,"mfu":0.4,"elapsed_s":4.5,"tokens_seen":40})" << "\n";
    f << R"({"step":4,"eval_loss":3.25})" << "\n";
    f << R"({"step":5,"loss":)";  // a line cut by a crash
  }
  const RunReport r = report_from_metrics((d.p / "metrics.jsonl").string());
  const std::vector<std::pair<double, double>> train = {{1, 5.0}, {2, 4.0}, {3, 3.5}, {4, 3.0}};
  const std::vector<std::pair<double, double>> eval = {{2, 4.5}, {4, 3.25}};
  EXPECT_EQ(r.train_loss, train);
  EXPECT_EQ(r.eval_loss, eval);
  ASSERT_EQ(r.learning_rate.size(), 4u);
  EXPECT_EQ(r.summary.steps, 4);
  EXPECT_EQ(r.summary.tokens_seen, 40);
  EXPECT_DOUBLE_EQ(*r.summary.final_train_loss, 3.0);
  EXPECT_DOUBLE_EQ(*r.summary.final_eval_loss, 3.25);
  EXPECT_DOUBLE_EQ(*r.summary.tokens_per_s, 250.0);
  EXPECT_DOUBLE_EQ(*r.summary.mfu, 0.25);
  EXPECT_DOUBLE_EQ(*r.summary.wall_s, 4.5);
}

TEST(Report, WritesMarkdownHtmlAndSvgAtomically) {
  TempDir d("write");
  RunReport r;
  r.summary.model_name = "m";
  r.summary.parameters = 1234;
  r.summary.steps = 2;
  r.summary.final_train_loss = 2.5;
  r.train_loss = {{1, 3.0}, {2, 2.5}};
  r.eval_loss = {{2, 2.75}};
  r.learning_rate = {{1, 1e-3}, {2, 5e-4}};
  write_report(d.str(), r);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(d.p)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"learning_rate.svg", "loss.svg", "report.html", "report.md"}));
  const std::string md = slurp(d.p / "report.md"), html = slurp(d.p / "report.html");
  EXPECT_NE(md.find("| parameters | 1234 |"), std::string::npos);
  EXPECT_NE(md.find("| final train loss | 2.5000 |"), std::string::npos);
  EXPECT_NE(md.find("| tokens/s | n/a |"), std::string::npos);
  EXPECT_NE(md.find("![loss per step](loss.svg)"), std::string::npos);
  EXPECT_EQ(xml_problem(html.substr(html.find("<html"))), "");
  const auto pts = points_of(html);  // loss chart (train, eval) then learning-rate chart
  ASSERT_EQ(pts.size(), 3u);
  EXPECT_EQ(pts[0], r.train_loss);
  EXPECT_EQ(pts[1], r.eval_loss);
  EXPECT_EQ(pts[2], r.learning_rate);
  EXPECT_EQ(slurp(d.p / "loss.svg"), loss_chart(r));
}

TEST(Report, TrainerWritesTheReportAtTheEnd) {
  TempDir d("trainer");
  models::LlamaConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 16;
  models::LlamaForCausalLM<> m(c);
  m.init(Key::from_seed(3));
  TokenDataset data;
  for (int i = 0; i < 8; ++i) data.add(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, static_cast<std::int32_t>(i)});
  TrainingArguments a;
  a.save_directory = d.str();
  a.total_batch_size = 2;
  a.max_training_steps = 4;
  a.log_steps = 1;
  a.progress = false;
  a.peak_gflops = 10;
  a.max_sequence_length = 8;
  Trainer t(a, std::move(m), std::nullopt, data, data);
  t.train();
  const std::string md = slurp(d.p / "report.md");
  EXPECT_NE(md.find("| steps | 4 |"), std::string::npos);
  EXPECT_NE(md.find("| parameters | " + std::to_string(t.model().param_count()) + " |"), std::string::npos);
  EXPECT_EQ(points_of(slurp(d.p / "loss.svg"))[0].size(), 4u);

  TempDir off("off");
  a.save_directory = off.str();
  a.write_report = false;
  models::LlamaForCausalLM<> m2(c);
  m2.init(Key::from_seed(3));
  Trainer t2(a, std::move(m2), std::nullopt, data);
  t2.train();
  EXPECT_FALSE(fs::exists(off.p / "report.md"));
}

}  // namespace
}  // namespace edl::train
