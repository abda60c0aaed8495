// edl/chat/jinja.hpp
// A Jinja2 template engine that renders chat templates exactly as Python jinja2 does inside
// Hugging Face transformers (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, and transformers' own tojson).
//
// Debian ships no C++ Jinja library, and a prompt that differs from the one the model was
// trained on by a single space changes its tokens, so this is our own implementation, checked
// byte for byte against Python jinja2 (tests/data/chat_templates/, written by
// scripts/chat_template_reference.py). Parsing happens once, in the constructor; every syntax
// error, unknown tag, filter or test is an edl::Error there, naming the line. Rendering errors
// (undefined misuse, type errors, sandbox violations, raise_exception) are edl::Errors too.
//
//   edl::chat::jinja::Template t("{% for m in messages %}{{ m.content }}{% endfor %}");
//   std::string s = t.render({{"messages", {{{"role", "user"}, {"content", "hi"}}}}});
#pragma once

#include <edl/chat/jinja/builtins.hpp>
#include <edl/chat/jinja/evaluator.hpp>
#include <edl/chat/jinja/lexer.hpp>
#include <edl/chat/jinja/parser.hpp>
#include <edl/chat/jinja/value.hpp>
#include <edl/core/error.hpp>

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace edl::chat::jinja {

/// Variables of one render, in the order they are bound (later ones win).
using Context = std::vector<std::pair<std::string, Value>>;

class Template {
 public:
  /// Parses `source`; throws edl::Error (errc::format, or errc::unsupported for constructs
  /// this engine refuses) naming the line of the first problem.
  explicit Template(std::string_view source) {
    detail::Lexer lexer(source);
    detail::Parser parser(lexer.run());
    auto prog = std::make_shared<detail::Program>(parser.parse());
    for (const auto& ref : prog->refs) {
      bool known = ref.is_test ? detail::test_table().count(ref.name) > 0 : detail::filter_table().count(ref.name) > 0;
      if (!known) syntax_error(ref.line, std::string("unknown ") + (ref.is_test ? "test '" : "filter '") + ref.name + "'");
    }
    prog_ = std::move(prog);
  }

  /// Renders with the variables of `context` (a JSON object) and the built-in globals.
  std::string render(const nlohmann::ordered_json& context) const {
    if (!context.is_object()) throw Error(errc::invalid_argument, "chat.jinja", "the render context must be a JSON object");
    Context vars;
    for (auto it = context.begin(); it != context.end(); ++it) vars.emplace_back(it.key(), from_json(it.value()));
    return render(vars);
  }

  /// Renders with template values; `globals` are bound below the variables (like jinja2's
  /// environment globals), e.g. functions such as raise_exception.
  std::string render(const Context& vars, const Context& globals = {}) const {
    auto global_scope = std::make_shared<detail::Scope>();
    // Namespaces are the only mutable values, so the only way to build a reference cycle
    // (`{% set ns.me = ns %}`); emptying them after the render frees any such cycle.
    auto namespaces = std::make_shared<std::vector<std::weak_ptr<Namespace>>>();
    struct ClearNamespaces {
      std::shared_ptr<std::vector<std::weak_ptr<Namespace>>> list;
      ~ClearNamespaces() {
        for (auto& w : *list)
          if (auto ns = w.lock()) ns->attrs.items.clear();
      }
    } clear_namespaces{namespaces};
    add_builtin_globals(*global_scope, namespaces);
    for (const auto& [k, v] : globals) global_scope->set(k, v);
    auto root = std::make_shared<detail::Scope>(global_scope);
    for (const auto& [k, v] : vars) root->set(k, v);
    Renderer r(*prog_, root);
    try {
      return r.render();
    } catch (const detail::RenderFailure& f) {
      const std::string where = "chat.jinja line " + std::to_string(r.line());
      static const char* names[] = {"TypeError: ", "UndefinedError: ", "SecurityError: ", "ValueError: ", "", "limit exceeded: "};
      throw Error(errc::invalid_argument, where, names[f.kind] + f.message);
    }
  }

 private:
  std::shared_ptr<const detail::Program> prog_;

  /// jinja2's default globals that chat templates use: range, dict, namespace.
  static void add_builtin_globals(detail::Scope& s, std::shared_ptr<std::vector<std::weak_ptr<Namespace>>> namespaces) {
    s.set("range", make_function("range", [](Args& a) -> Value {
      if (!a.kw.empty()) detail::type_error("range() takes no keyword arguments");
      if (a.pos.empty() || a.pos.size() > 3) detail::type_error("range expected 1 to 3 arguments");
      for (const auto& p : a.pos)
        if (!p.is_integral()) detail::type_error("'" + type_name(p) + "' object cannot be interpreted as an integer");
      std::int64_t start = 0, stop, step = 1;
      if (a.pos.size() == 1) stop = a.pos[0].as_int();
      else start = a.pos[0].as_int(), stop = a.pos[1].as_int();
      if (a.pos.size() == 3) step = a.pos[2].as_int();
      if (step == 0) detail::fail(detail::RenderFailure::value_error, "range() arg 3 must not be zero");
      std::vector<Value> items;
      for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (items.size() >= 100000)
          detail::fail(detail::RenderFailure::limit, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        items.push_back(Value(i));
      }
      return Value(std::move(items));
    }));
    s.set("dict", make_function("dict", [](Args& a) -> Value {
      auto d = std::make_shared<DictData>();
      if (a.pos.size() > 1) detail::type_error("dict expected at most 1 argument");
      if (!a.pos.empty()) {
        if (a.pos[0].is_dict()) *d = a.pos[0].dict();
        else detail::type_error("dict() from a sequence of pairs is not supported");
      }
      for (auto& [k, v] : a.kw) d->set(Value(k), v);
      return Value(d);
    }));
    s.set("namespace", make_function("namespace", [namespaces](Args& a) -> Value {
      auto ns = std::make_shared<Namespace>();
      namespaces->push_back(ns);
      if (a.pos.size() > 1) detail::type_error("namespace expected at most 1 positional argument");
      if (!a.pos.empty()) {
        if (!a.pos[0].is_dict()) detail::type_error("namespace() positional argument must be a mapping");
        ns->attrs = a.pos[0].dict();
      }
      for (auto& [k, v] : a.kw) ns->attrs.set(Value(k), v);
      return Value(std::static_pointer_cast<Object>(ns));
    }));
  }
};

}  // namespace edl::chat::jinja
