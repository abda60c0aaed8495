// edl/chat/jinja/parser.hpp
// Tokens to a syntax tree, following jinja2's grammar and operator precedence.
//
// The precedence climb mirrors jinja2's parser function for function (condexpr, or, and, not,
// compare, + -, ~, * / // %, **, unary, postfix, filters and tests), because templates rely on
// its quirks: a filter binds tighter than any operator (`'a' + x|trim` trims only x), `-2 ** 2`
// is 4, and `for x in xs if cond` parses the `if` as a loop filter, not a conditional.
// Unknown tags, unclosed blocks and malformed expressions are errors here, at construction,
// naming the line; so are tags that need a loader (include, import, extends) or call blocks.
#pragma once

#include <edl/chat/jinja/lexer.hpp>
#include <edl/chat/jinja/value.hpp>
#include <edl/core/error.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace edl::chat::jinja::detail {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class K { Const, Name, List, Tuple, Dict, Getattr, Getitem, Slice, Call, Filter, Test,
                 Neg, Pos, Not, Binary, Compare, And, Or, Concat, Cond };
  K k;
  int line = 0;
  Value value;                  // Const
  std::string name;             // Name, Getattr, Filter, Test, Binary operator
  ExprPtr a, b, c;              // operands; Cond: a = then, b = condition, c = else
  std::vector<ExprPtr> args;    // items, call arguments, Concat parts, Compare operands,
                                // Dict keys and values interleaved, Slice start/stop/step
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // Compare: "==", "in", "notin", ...
};

/// An assignment target: `x`, `ns.attr` or a (nested) tuple of names.
struct Target {
  std::string name, attr;
  std::vector<Target> items;
  bool is_tuple = false;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class K { Text, Print, If, For, Set, SetBlock, Macro, FilterBlock, With, Break, Continue, Generation };
  K k;
  int line = 0;
  std::string text;                                   // Text; Macro name
  ExprPtr expr;                                       // Print, Set value, For iterable
  ExprPtr cond;                                       // For filter (`for x in xs if cond`)
  ExprPtr filter;                                     // SetBlock, FilterBlock: filter chain on the body
  std::vector<std::pair<ExprPtr, Body>> branches;     // If/elif
  Body body, else_body;
  Target target;                                      // For, Set, SetBlock
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro parameters (default or null); With
  bool recursive = false;
  bool uses_varargs = false, uses_kwargs = false;
};

/// A filter or test the template names, checked against the built-in tables after parsing.
struct NameRef {
  std::string name;
  int line;
  bool is_test;
};

struct Program {
  Body body;
  std::vector<NameRef> refs;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Program parse() {
    Program p;
    p.body = subparse({});
    p.refs = std::move(refs_);
    return p;
  }

 private:
  static constexpr int max_depth = 200;  // nested expressions or blocks; deeper is refused

  std::vector<Token> t_;
  std::size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<NameRef> refs_;
  std::vector<std::string> names_seen_;
  struct Open { std::string tag; int line; std::vector<std::string> ends; };
  std::vector<Open> open_;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& pp, int line) : p(pp) {
      if (++p.depth_ > max_depth) syntax_error(line, "template nested too deeply (more than 200 levels)");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& look(std::size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool skip_op(std::string_view o) {
    if (cur().is_op(o)) { next(); return true; }
    return false;
  }
  bool skip_name(std::string_view n) {
    if (cur().is_name(n)) { next(); return true; }
    return false;
  }
  [[noreturn]] void fail(const std::string& what) const { syntax_error(cur().line, what); }
  void expect_op(std::string_view o) {
    if (!skip_op(o)) fail("expected '" + std::string(o) + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Token::name) fail("expected a name, got " + describe(cur()));
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Token::block_end) fail("expected end of statement block '%}', got " + describe(cur()));
    next();
  }

  static ExprPtr make(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }
  static std::unique_ptr<Node> node(Node::K k, int line) {
    auto n = std::make_unique<Node>();
    n->k = k;
    n->line = line;
    return n;
  }

  // -------------------------------------------------------------------------------------------
  // Statements

  /// Parses until a block tag whose name is in `ends` (left as the current token) or the end.
  Body subparse(const std::vector<std::string>& ends) {
    Body body;
    while (true) {
      const Token& tok = cur();
      if (tok.type == Token::data) {
        auto n = node(Node::K::Text, tok.line);
        n->text = tok.text;
        next();
        body.push_back(std::move(n));
      } else if (tok.type == Token::var_begin) {
        int line = next().line;
        auto n = node(Node::K::Print, line);
        n->expr = parse_tuple(false, true, {}, false);
        if (cur().type != Token::var_end) fail("expected end of print statement '}}', got " + describe(cur()));
        next();
        body.push_back(std::move(n));
      } else if (tok.type == Token::block_begin) {
        next();
        if (cur().type == Token::name)
          for (const auto& e : ends)
            if (cur().text == e) return body;
        body.push_back(parse_statement());
        expect_block_end();
      } else {
        if (!ends.empty()) {
          const Open& o = open_.back();
          syntax_error(tok.line, "unexpected end of template: the '" + o.tag + "' block opened on line " +
                                     std::to_string(o.line) + " is not closed (expected " + list_ends(o.ends) + ")");
        }
        return body;
      }
    }
  }

  static std::string list_ends(const std::vector<std::string>& ends) {
    std::string s;
    for (std::size_t k = 0; k < ends.size(); ++k) s += (k ? " or '" : "'") + ends[k] + "'";
    return s;
  }

  /// Parses a block body after its opening tag's header; the closing name stays current.
  Body parse_statements(const std::string& tag, int line, std::vector<std::string> ends, bool drop_needle) {
    expect_block_end();
    DepthGuard g(*this, line);
    open_.push_back(Open{tag, line, ends});
    Body b = subparse(ends);
    open_.pop_back();
    if (drop_needle) next();
    return b;
  }

  std::unique_ptr<Node> parse_statement() {
    const Token& tok = cur();
    if (tok.type != Token::name) fail("tag name expected, got " + describe(tok));
    const std::string tag = tok.text;
    int line = tok.line;
    if (tag == "if") return parse_if();
    if (tag == "for") return parse_for();
    if (tag == "set") return parse_set();
    if (tag == "macro") return parse_macro();
    if (tag == "filter") return parse_filter_block();
    if (tag == "with") return parse_with();
    if (tag == "generation") {  // transformers' AssistantTracker: renders its body unchanged
      next();
      auto n = node(Node::K::Generation, line);
      n->body = parse_statements(tag, line, {"endgeneration"}, true);
      return n;
    }
    if (tag == "print") {
      next();
      auto n = node(Node::K::Print, line);
      n->expr = parse_tuple(false, true, {}, false);
      return n;
    }
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) syntax_error(line, "'" + tag + "' outside loop");
      next();
      return node(tag == "break" ? Node::K::Break : Node::K::Continue, line);
    }
    if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" || tag == "block" ||
        tag == "call" || tag == "autoescape")
      syntax_error(line, "tag '" + tag + "' is not supported by edl's chat template engine", errc::unsupported);
    std::string msg = "unknown tag '" + tag + "'";
    if (!open_.empty())
      msg += " (the innermost open block is '" + open_.back().tag + "' from line " +
             std::to_string(open_.back().line) + ", closed by " + list_ends(open_.back().ends) + ")";
    syntax_error(line, msg);
  }

  std::unique_ptr<Node> parse_if() {
    auto n = node(Node::K::If, next().line);
    int line = n->line;
    while (true) {
      ExprPtr test = parse_tuple(false, false, {}, false);
      Body b = parse_statements("if", line, {"elif", "else", "endif"}, false);
      n->branches.emplace_back(std::move(test), std::move(b));
      const Token& t = next();
      if (t.text == "elif") {
        line = t.line;
        continue;
      }
      if (t.text == "else") n->else_body = parse_statements("if", line, {"endif"}, true);
      break;
    }
    return n;
  }

  std::unique_ptr<Node> parse_for() {
    auto n = node(Node::K::For, next().line);
    n->target = parse_assign_target(true, false, {"in"}, false);
    if (!skip_name("in")) fail("expected 'in' in for loop, got " + describe(cur()));
    n->expr = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) n->cond = parse_expression(true);
    if (cur().is_name("recursive"))
      syntax_error(cur().line, "recursive for loops are not supported", errc::unsupported);
    ++loop_depth_;
    n->body = parse_statements("for", n->line, {"endfor", "else"}, false);
    --loop_depth_;
    if (next().text == "else") n->else_body = parse_statements("for", n->line, {"endfor"}, true);
    return n;
  }

  std::unique_ptr<Node> parse_set() {
    int line = next().line;
    Target target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto n = node(Node::K::Set, line);
      n->target = std::move(target);
      n->expr = parse_tuple(false, true, {}, false);
      return n;
    }
    auto n = node(Node::K::SetBlock, line);
    if (!target.attr.empty() || target.is_tuple) syntax_error(line, "a block set needs a single name as its target");
    n->target = std::move(target);
    if (cur().is_op("|")) n->filter = parse_filter(nullptr, false);
    n->body = parse_statements("set", line, {"endset"}, true);
    return n;
  }

  std::unique_ptr<Node> parse_macro() {
    auto n = node(Node::K::Macro, next().line);
    n->text = expect_name();
    expect_op("(");
    bool defaults = false;
    while (!cur().is_op(")")) {
      if (!n->params.empty()) expect_op(",");
      std::string p = expect_name();
      ExprPtr def;
      if (skip_op("=")) {
        def = parse_expression(true);
        defaults = true;
      } else if (defaults) {
        fail("non-default argument follows default argument");
      }
      n->params.emplace_back(std::move(p), std::move(def));
    }
    expect_op(")");
    std::size_t mark = names_seen_.size();
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    n->body = parse_statements("macro", n->line, {"endmacro"}, true);
    loop_depth_ = saved_loops;
    for (std::size_t k = mark; k < names_seen_.size(); ++k) {
      if (names_seen_[k] == "varargs") n->uses_varargs = true;
      if (names_seen_[k] == "kwargs") n->uses_kwargs = true;
      if (names_seen_[k] == "caller") syntax_error(n->line, "macros using 'caller' need call blocks, which are not supported", errc::unsupported);
    }
    return n;
  }

  std::unique_ptr<Node> parse_filter_block() {
    auto n = node(Node::K::FilterBlock, next().line);
    n->filter = parse_filter(nullptr, true);
    n->body = parse_statements("filter", n->line, {"endfilter"}, true);
    return n;
  }

  std::unique_ptr<Node> parse_with() {
    auto n = node(Node::K::With, next().line);
    while (cur().type != Token::block_end) {
      if (!n->params.empty()) expect_op(",");
      std::string name = expect_name();
      expect_op("=");
      n->params.emplace_back(std::move(name), parse_expression(true));
    }
    n->body = parse_statements("with", n->line, {"endwith"}, true);
    return n;
  }

  Target parse_assign_target(bool with_tuple, bool name_only, const std::vector<std::string>& extra_end,
                             bool with_namespace) {
    Target t;
    if (with_namespace && cur().type == Token::name && look().is_op(".")) {
      t.name = next().text;
      next();
      t.attr = expect_name();
      return t;
    }
    if (name_only) {
      t.name = expect_name();
      return t;
    }
    int line = cur().line;
    ExprPtr e = with_tuple ? parse_tuple(true, false, extra_end, false) : parse_primary();
    return to_target(*e, line);
  }

  static Target to_target(const Expr& e, int line) {
    Target t;
    if (e.k == Expr::K::Name) {
      t.name = e.name;
      return t;
    }
    if (e.k == Expr::K::Tuple) {
      t.is_tuple = true;
      for (const auto& item : e.args) t.items.push_back(to_target(*item, line));
      return t;
    }
    syntax_error(line, "can't assign to this expression (expected a name or a tuple of names)");
  }

  // -------------------------------------------------------------------------------------------
  // Expressions

  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    const Token& t = cur();
    if (t.type == Token::var_end || t.type == Token::block_end || t.is_op(")")) return true;
    if (t.type == Token::name)
      for (const auto& e : extra_end)
        if (t.text == e) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                      bool explicit_parens) {
    int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary() : with_condexpr ? parse_expression(true) : parse_or());
      if (cur().is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail("expected an expression, got " + describe(cur()));
    }
    auto e = make(Expr::K::Tuple, line);
    e->args = std::move(args);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard g(*this, cur().line);
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (cur().is_name("if")) {
      int line = next().line;
      auto c = make(Expr::K::Cond, line);
      c->b = parse_or();
      if (skip_name("else")) c->c = parse_expression(true);
      c->a = std::move(e);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (cur().is_name("or")) {
      auto e = make(Expr::K::Or, next().line);
      e->a = std::move(l);
      e->b = parse_and();
      l = std::move(e);
    }
    return l;
  }

  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (cur().is_name("and")) {
      auto e = make(Expr::K::And, next().line);
      e->a = std::move(l);
      e->b = parse_not();
      l = std::move(e);
    }
    return l;
  }

  ExprPtr parse_not() {
    if (cur().is_name("not")) {
      DepthGuard g(*this, cur().line);
      auto e = make(Expr::K::Not, next().line);
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr first = parse_math1();
    std::vector<std::string> ops;
    std::vector<ExprPtr> rest;
    while (true) {
      const Token& t = cur();
      if (t.type == Token::op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" ||
                                  t.text == "<=" || t.text == ">=")) {
        ops.push_back(next().text);
      } else if (t.is_name("in")) {
        next();
        ops.push_back("in");
      } else if (t.is_name("not") && look().is_name("in")) {
        next();
        next();
        ops.push_back("notin");
      } else {
        break;
      }
      rest.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(Expr::K::Compare, line);
    e->args.push_back(std::move(first));
    for (auto& r : rest) e->args.push_back(std::move(r));
    e->ops = std::move(ops);
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr l, ExprPtr r, int line) {
    auto e = make(Expr::K::Binary, line);
    e->name = std::move(op);
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (cur().is_op("+") || cur().is_op("-")) {
      const Token& t = next();
      std::string op = t.text;
      l = binary(op, std::move(l), parse_concat(), t.line);
    }
    return l;
  }

  ExprPtr parse_concat() {
    int line = cur().line;
    ExprPtr first = parse_math2();
    if (!cur().is_op("~")) return first;
    auto e = make(Expr::K::Concat, line);
    e->args.push_back(std::move(first));
    while (skip_op("~")) e->args.push_back(parse_math2());
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (cur().is_op("*") || cur().is_op("/") || cur().is_op("//") || cur().is_op("%")) {
      const Token& t = next();
      std::string op = t.text;
      l = binary(op, std::move(l), parse_pow(), t.line);
    }
    return l;
  }

  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (cur().is_op("**")) {
      int line = next().line;
      l = binary("**", std::move(l), parse_unary(true), line);
    }
    return l;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard g(*this, cur().line);
    ExprPtr n;
    if (cur().is_op("-") || cur().is_op("+")) {
      const Token& t = next();
      n = make(t.text == "-" ? Expr::K::Neg : Expr::K::Pos, t.line);
      n->a = parse_unary(false);
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  ExprPtr parse_primary() {
    DepthGuard g(*this, cur().line);
    const Token& t = cur();
    int line = t.line;
    if (t.type == Token::name) {
      next();
      auto e = make(Expr::K::Const, line);
      if (t.text == "true" || t.text == "True") e->value = Value(true);
      else if (t.text == "false" || t.text == "False") e->value = Value(false);
      else if (t.text == "none" || t.text == "None") e->value = Value(nullptr);
      else {
        e->k = Expr::K::Name;
        e->name = t.text;
        names_seen_.push_back(t.text);
      }
      return e;
    }
    if (t.type == Token::string) {
      std::string s;
      while (cur().type == Token::string) s += next().text;
      auto e = make(Expr::K::Const, line);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.type == Token::integer || t.type == Token::floating) {
      next();
      auto e = make(Expr::K::Const, line);
      e->value = t.type == Token::integer ? Value(t.ival) : Value(t.fval);
      return e;
    }
    if (t.is_op("(")) {
      next();
      ExprPtr e = parse_tuple(false, true, {}, true);
      expect_op(")");
      return e;
    }
    if (t.is_op("[")) {
      next();
      auto e = make(Expr::K::List, line);
      while (!cur().is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (cur().is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      expect_op("]");
      return e;
    }
    if (t.is_op("{")) {
      next();
      auto e = make(Expr::K::Dict, line);
      while (!cur().is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (cur().is_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      expect_op("}");
      return e;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr n) {
    while (true) {
      if (cur().is_op(".") || cur().is_op("[")) n = parse_subscript(std::move(n));
      else if (cur().is_op("(")) n = parse_call(std::move(n));
      else return n;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr n) {
    while (true) {
      if (cur().is_op("|")) n = parse_filter(std::move(n), false);
      else if (cur().is_name("is")) n = parse_test(std::move(n));
      else if (cur().is_op("(")) n = parse_call(std::move(n));
      else return n;
    }
  }

  ExprPtr parse_subscript(ExprPtr n) {
    const Token& t = next();
    int line = t.line;
    if (t.text == ".") {
      const Token& a = next();
      if (a.type == Token::name) {
        auto e = make(Expr::K::Getattr, line);
        e->a = std::move(n);
        e->name = a.text;
        return e;
      }
      if (a.type != Token::integer) syntax_error(a.line, "expected name or number after '.'");
      auto e = make(Expr::K::Getitem, line);
      e->a = std::move(n);
      e->b = make(Expr::K::Const, line);
      e->b->value = Value(a.ival);
      return e;
    }
    std::vector<ExprPtr> args;
    while (!cur().is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    if (args.size() == 1 && args[0]->k == Expr::K::Slice) {
      args[0]->a = std::move(n);
      return std::move(args[0]);
    }
    auto e = make(Expr::K::Getitem, line);
    e->a = std::move(n);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      for (auto& x : args)
        if (x->k == Expr::K::Slice) syntax_error(line, "multi-dimensional slices are not supported", errc::unsupported);
      e->b = make(Expr::K::Tuple, line);
      e->b->args = std::move(args);
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    int line = cur().line;
    std::vector<ExprPtr> args;
    if (cur().is_op(":")) {
      next();
      args.push_back(nullptr);
    } else {
      ExprPtr e = parse_expression(true);
      if (!cur().is_op(":")) return e;
      next();
      args.push_back(std::move(e));
    }
    if (cur().is_op(":") || cur().is_op("]") || cur().is_op(",")) args.push_back(nullptr);
    else args.push_back(parse_expression(true));
    if (cur().is_op(":")) {
      next();
      if (cur().is_op("]") || cur().is_op(",")) args.push_back(nullptr);
      else args.push_back(parse_expression(true));
    } else {
      args.push_back(nullptr);
    }
    auto s = make(Expr::K::Slice, line);
    s->args = std::move(args);
    return s;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!cur().is_op(")")) {
      if (!e.args.empty() || !e.kwargs.empty()) {
        expect_op(",");
        if (cur().is_op(")")) break;
      }
      if (cur().is_op("*") || cur().is_op("**"))
        syntax_error(cur().line, "*args and **kwargs in calls are not supported", errc::unsupported);
      if (cur().type == Token::name && look().is_op("=")) {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("positional argument follows keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr n) {
    auto e = make(Expr::K::Call, cur().line);
    e->a = std::move(n);
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string name = expect_name();
    while (cur().is_op(".")) {
      next();
      name += "." + expect_name();
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr n, bool start_inline) {
    while (cur().is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      auto e = make(Expr::K::Filter, cur().line);
      e->name = dotted_name();
      refs_.push_back(NameRef{e->name, e->line, false});
      e->a = std::move(n);
      if (cur().is_op("(")) parse_call_args(*e);
      n = std::move(e);
    }
    return n;
  }

  ExprPtr parse_test(ExprPtr n) {
    int line = next().line;
    bool negated = skip_name("not");
    auto e = make(Expr::K::Test, line);
    e->name = dotted_name();
    refs_.push_back(NameRef{e->name, line, true});
    e->a = std::move(n);
    const Token& t = cur();
    if (t.is_op("(")) {
      parse_call_args(*e);
    } else if ((t.type == Token::name || t.type == Token::string || t.type == Token::integer ||
                t.type == Token::floating || t.is_op("[") || t.is_op("{")) &&
               !t.is_name("else") && !t.is_name("or") && !t.is_name("and")) {
      if (t.is_name("is")) fail("you cannot chain multiple tests with 'is'");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto nn = make(Expr::K::Not, line);
    nn->a = std::move(e);
    return nn;
  }
};

}  // namespace edl::chat::jinja::detail
