// Tests of edl's Jinja2 engine and ChatTemplate against Python jinja2.
//
// The fixtures in tests/data/chat_templates/ are written by scripts/chat_template_reference.py,
// which renders every case with jinja2 in transformers' environment; here each case must come
// out byte for byte the same, or fail where jinja2 failed. A missing fixture fails the test.
#include <edl/chat/all.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>


namespace {

using json = nlohmann::ordered_json;
using edl::chat::ChatOptions;
using edl::chat::ChatTemplate;
using edl::chat::jinja::Template;

json load_fixture(const std::string& name) {
  const char* data = std::getenv("EDL_TEST_DATA");  // set by ctest (tests/CMakeLists.txt)
  const std::string path = std::string(data ? data : "tests/data") + "/chat_templates/" + name + ".json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing fixture " + path + " (run scripts/chat_template_reference.py)");
  return json::parse(in);
}

/// The first line where two renders differ, for a readable failure message.
std::string first_difference(const std::string& got, const std::string& want) {
  std::size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::size_t from = i < 40 ? 0 : i - 40;
  return "first difference at byte " + std::to_string(i) + ":\n  got:  ..." + json(got.substr(from, 80)).dump() +
         "\n  want: ..." + json(want.substr(from, 80)).dump();
}

std::string render_str(const std::string& source, const json& ctx = json::object()) {
  return Template(source).render(ctx);
}

// ---------------------------------------------------------------------------------------------
// (1) the language, case by case, against jinja2

TEST(JinjaLanguage, EveryCaseMatchesPythonJinja2) {
  json fx = load_fixture("language");
  ASSERT_GE(fx["cases"].size(), 200u);
  int passed = 0;
  for (const auto& c : fx["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE("case " + name + ": " + c["template"].get<std::string>());
    json ctx = fx["base_context"];
    if (c.contains("context"))
      for (auto it = c["context"].begin(); it != c["context"].end(); ++it) ctx[it.key()] = it.value();
    if (c.value("expected_error", false)) {
      // jinja2's compile-time errors must be construction errors here, its render errors
      // render errors.
      const std::string err = c["error"].get<std::string>();
      const bool at_parse = err.rfind("TemplateSyntaxError", 0) == 0 || err.rfind("TemplateAssertionError", 0) == 0 ||
                            err.rfind("SyntaxError", 0) == 0;
      std::optional<Template> t;
      try {
        t.emplace(c["template"].get<std::string>());
      } catch (const edl::Error& e) {
        if (at_parse) ++passed;
        else ADD_FAILURE() << "jinja2 fails at render (" << err << ") but construction threw " << e.what();
        continue;
      }
      if (at_parse) {
        ADD_FAILURE() << "jinja2 fails at parse (" << err << ") but construction succeeded";
        continue;
      }
      try {
        std::string got = t->render(ctx);
        ADD_FAILURE() << "expected an error (" << err << "), rendered " << json(got).dump();
      } catch (const edl::Error&) {
        ++passed;
      }
      continue;
    }
    try {
      std::string got = render_str(c["template"].get<std::string>(), ctx);
      const std::string want = c["expected"].get<std::string>();
      if (got == want) {
        ++passed;
      } else {
        ADD_FAILURE() << first_difference(got, want);
      }
    } catch (const edl::Error& e) {
      ADD_FAILURE() << "threw " << e.what();
    }
  }
  EXPECT_EQ(passed, static_cast<int>(fx["cases"].size()));
}

// ---------------------------------------------------------------------------------------------
// (2) real chat templates, every fixture case

class ChatTemplateFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(ChatTemplateFixture, EveryCaseMatchesTransformers) {
  json fx = load_fixture(GetParam());
  ASSERT_FALSE(fx["cases"].empty());
  ChatTemplate tmpl(fx["template"].get<std::string>());
  int i = 0;
  for (const auto& c : fx["cases"]) {
    SCOPED_TRACE(std::string(GetParam()) + " case " + std::to_string(i++) + ": " + c["messages"].dump());
    ChatOptions opts;
    opts.add_generation_prompt = c["add_generation_prompt"].get<bool>();
    if (!c["tools"].is_null()) opts.tools = c["tools"];
    if (!fx["bos_token"].is_null()) opts.bos_token = fx["bos_token"].get<std::string>();
    if (!fx["eos_token"].is_null()) opts.eos_token = fx["eos_token"].get<std::string>();
    opts.extra = c["extra"];
    if (c.value("expected_error", false)) {
      const std::string err = c["error"].get<std::string>();
      try {
        std::string got = tmpl.apply(c["messages"], opts);
        ADD_FAILURE() << "expected an error (" << err << "), rendered " << json(got).dump();
      } catch (const edl::Error& e) {
        // raise_exception's message must come through unchanged.
        const std::string prefix = "TemplateError: ";
        if (err.rfind(prefix, 0) == 0) {
          EXPECT_NE(std::string(e.what()).find(err.substr(prefix.size())), std::string::npos) << e.what();
        }
      }
      continue;
    }
    try {
      std::string got = tmpl.apply(c["messages"], opts);
      const std::string want = c["expected"].get<std::string>();
      EXPECT_TRUE(got == want) << first_difference(got, want);
    } catch (const edl::Error& e) {
      ADD_FAILURE() << "threw " << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ChatTemplateFixture,
                         ::testing::Values("chatml", "phi3", "llama2", "llama3", "llama3_1", "llama3_1_tools", "qwen3",
                                           "gemma3", "mistral_v3"),
                         [](const auto& info) { return std::string(info.param); });

// ---------------------------------------------------------------------------------------------
// (3) errors: parse errors name the construct and line; render errors are edl::Errors

/// The edl::Error `fn` throws, or a failure.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const edl::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no edl::Error thrown";
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(JinjaErrors, ParseErrorsNameConstructAndLine) {
  std::string e = error_of([] { Template t("a\nb\n{% frobnicate %}"); });
  EXPECT_TRUE(has(e, "line 3") && has(e, "unknown tag 'frobnicate'")) << e;

  e = error_of([] { Template t("{{ x }}\n{{ x|frobnicate }}"); });
  EXPECT_TRUE(has(e, "line 2") && has(e, "unknown filter 'frobnicate'")) << e;

  e = error_of([] { Template t("\n\n\n{% if x is frobnicate %}{% endif %}"); });
  EXPECT_TRUE(has(e, "line 4") && has(e, "unknown test 'frobnicate'")) << e;

  e = error_of([] { Template t("{% for m in messages %}\n{{ m }}\n"); });
  EXPECT_TRUE(has(e, "'for' block opened on line 1 is not closed") && has(e, "'endfor'")) << e;

  e = error_of([] { Template t("{% if a %}\n{% endfor %}"); });
  EXPECT_TRUE(has(e, "line 2") && has(e, "unknown tag 'endfor'") && has(e, "'if'")) << e;

  e = error_of([] { Template t("\n{{ 1 + }}"); });
  EXPECT_TRUE(has(e, "line 2") && has(e, "unexpected")) << e;

  e = error_of([] { Template t("{{ 'abc }}"); });
  EXPECT_TRUE(has(e, "line 1") && has(e, "string")) << e;

  e = error_of([] { Template t("x\n{# never closed"); });
  EXPECT_TRUE(has(e, "line 2") && has(e, "comment")) << e;

  e = error_of([] { Template t("{% break %}"); });
  EXPECT_TRUE(has(e, "'break' outside loop")) << e;
}

TEST(JinjaErrors, RefusedConstructsAreUnsupported) {
  for (const char* src : {"{% include 'x' %}", "{% import 'x' as y %}", "{% extends 'base' %}", "{% block b %}{% endblock %}",
                          "{% call m() %}{% endcall %}", "{% for x in xs recursive %}{% endfor %}", "{{ f(*xs) }}"}) {
    try {
      Template t(src);
      ADD_FAILURE() << src << " was accepted";
    } catch (const edl::Error& e) {
      EXPECT_EQ(e.code(), edl::errc::unsupported) << src << ": " << e.what();
    }
  }
}

TEST(JinjaErrors, RenderErrorsNameLine) {
  std::string e = error_of([] { render_str("ok\n{{ missing.attr }}"); });
  EXPECT_TRUE(has(e, "line 2") && has(e, "'missing' is undefined")) << e;
  e = error_of([] { render_str("{% set xs = [1] %}\n\n{{ xs.append(2) }}"); });
  EXPECT_TRUE(has(e, "line 3") && has(e, "SecurityError") && has(e, "append")) << e;
  e = error_of([] { render_str("{{ 1 / 0 }}"); });
  EXPECT_TRUE(has(e, "division by zero")) << e;
}

TEST(JinjaErrors, RaiseExceptionCarriesItsMessage) {
  ChatTemplate t("{% if messages|length > 1 %}\n{{ raise_exception('Only one message, please: ' ~ messages|length) }}{% endif %}ok");
  EXPECT_EQ(t.apply(json::array({{{"role", "user"}, {"content", "x"}}})), "ok");
  try {
    t.apply(json::array({{{"role", "user"}}, {{"role", "user"}}}));
    FAIL() << "no error";
  } catch (const edl::Error& e) {
    EXPECT_TRUE(has(e.what(), "Only one message, please: 2")) << e.what();
    EXPECT_TRUE(has(e.where(), "line 2")) << e.where();
  }
}

TEST(JinjaErrors, DepthAndWorkAreBounded) {
  // Deeply nested expressions are refused at parse time instead of overflowing the stack.
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_THROW(Template t(deep), edl::Error);
  std::string deep_list = "{{ " + std::string(100000, '[') + " }}";
  EXPECT_THROW(Template t(deep_list), edl::Error);
  std::string deep_if;
  for (int i = 0; i < 1000; ++i) deep_if += "{% if true %}";
  EXPECT_THROW(Template t(deep_if), edl::Error);
  std::string nots;
  for (int i = 0; i < 5000; ++i) nots += "not ";
  EXPECT_THROW(Template t("{{ " + nots + "1 }}"), edl::Error);
  // Unbounded macro recursion, huge ranges and endless work are render errors.
  EXPECT_THROW(render_str("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), edl::Error);
  EXPECT_THROW(render_str("{{ range(1000000)|length }}"), edl::Error);
  EXPECT_THROW(render_str("{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}"), edl::Error);
  EXPECT_THROW(render_str("{{ 'x' * 1000000000 }}"), edl::Error);
  EXPECT_THROW(render_str("{{ 2 ** 100 }}"), edl::Error);
  // Deep input JSON is refused rather than recursed into without bound.
  json nested = json::array();
  for (int i = 0; i < 2000; ++i) nested = json::array({nested});
  EXPECT_THROW(render_str("{{ x }}", json{{"x", nested}}), edl::Error);
}

TEST(JinjaErrors, GarbageNeverCrashes) {
  // Truncations of a real template: each either parses or is an edl::Error.
  json fx = load_fixture("qwen3");
  const std::string src = fx["template"].get<std::string>();
  for (std::size_t n = 0; n < src.size(); n += 7) {
    try {
      Template t(src.substr(0, n));
      (void)t;
    } catch (const edl::Error&) {
    }
  }
  for (const char* s : {"{{", "{%", "{#", "{{}}", "{%%}", "{{ ) }}", "{{ ] }}", "{% if %}", "{% for %}", "{% set %}",
                        "{% macro %}", "{{ 'a' 'b }}", "{{ \"\\", "{{ 1..2 }}", "{{ x. }}", "{{ x[ }}", "{% endraw %}",
                        "{% raw %}never", "\xff\xfe{{ '\xc3' }}"}) {
    try {
      Template t(s);
      (void)t.render(json::object());
    } catch (const edl::Error&) {
    }
  }
}

TEST(JinjaErrors, RandomEditsOfRealTemplatesNeverCrash) {
  // Deterministic random edits of real templates, rendered on a tool-calling conversation:
  // every outcome is a render or an edl::Error (run under ASan/UBSan to catch the rest).
  const json msgs = json::parse(R"([{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "abcdefghi", "function": {"name": "f", "arguments": {"a": 1}}}]},
    {"role": "tool", "tool_call_id": "abcdefghi", "content": "r"}, {"role": "assistant", "content": "<think>x</think>y"}])");
  const std::string alphabet = "{}%#-+()[]'\":|.,~*/ \nifelsendforsetmacroloopnotandor0123456789";
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  auto rnd = [&](std::uint64_t n) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state % n;
  };
  int rendered = 0;
  for (const char* name : {"qwen3", "llama3_1_tools", "mistral_v3", "gemma3"}) {
    const std::string base = load_fixture(name)["template"].get<std::string>();
    for (int iter = 0; iter < 300; ++iter) {
      std::string src = base;
      for (int k = 0, edits = 1 + static_cast<int>(rnd(4)); k < edits; ++k) {
        std::size_t at = rnd(src.size());
        switch (rnd(3)) {
          case 0: src[at] = alphabet[rnd(alphabet.size())]; break;
          case 1: src.erase(at, 1 + rnd(8)); break;
          default: src.insert(at, 1, alphabet[rnd(alphabet.size())]);
        }
      }
      try {
        ChatTemplate t(src);
        ChatOptions opts;
        opts.add_generation_prompt = true;
        opts.tools = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}});
        (void)t.apply(msgs, opts);
        ++rendered;
      } catch (const edl::Error&) {
      }
    }
  }
  EXPECT_GT(rendered, 0);
}

TEST(JinjaErrors, SelfReferencingNamespaceIsSafe) {
  // A namespace holding itself is the one reference cycle a template can build; printing it
  // is refused past the nesting limit rather than recursing forever, and nothing leaks.
  EXPECT_EQ(render_str("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me.me is defined }}"), "True");
  EXPECT_THROW(render_str("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), edl::Error);
}

// ---------------------------------------------------------------------------------------------
// ChatTemplate's variables, as transformers passes them

TEST(ChatTemplateApi, VariablesLikeTransformers) {
  ChatTemplate t(
      "{{ tools is defined }},{{ tools is none }},{{ documents is none }},{{ bos_token is defined }},"
      "{{ eos_token }},{{ add_generation_prompt }},{{ enable_thinking }},{{ messages|length }}");
  ChatOptions opts;
  opts.eos_token = "</s>";
  opts.extra = {{"enable_thinking", false}};
  EXPECT_EQ(t.apply(json::array(), opts), "True,True,True,False,</s>,False,False,0");
  opts.tools = json::array({{{"type", "function"}}});
  opts.bos_token = "<s>";
  opts.add_generation_prompt = true;
  opts.extra = {{"add_generation_prompt", "overridden"}};
  EXPECT_EQ(t.apply(json::array({json::object()}), opts), "True,False,True,True,</s>,overridden,,1");
  EXPECT_EQ(ChatTemplate("{{ strftime_now('%Y')|length }}").apply(json::array()), "4");
  EXPECT_THROW(t.apply(json::object()), edl::Error);
}

TEST(ChatTemplateApi, ParsesOnceRendersMany) {
  ChatTemplate t("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}");
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(t.apply(json::array({{{"role", "user"}, {"content", std::to_string(i)}}})), "<user>" + std::to_string(i));
}

}  // namespace
