// edl/core/fixed_string.hpp
// A string usable as a template argument: Mesh<"dp", "tp">, P<"tp", none>.
// Names are short identifiers (mesh axes, activation names), so the capacity is fixed;
// a fixed capacity keeps every name the same type, which lets names sit side by side in
// arrays and be compared in constant expressions.
#pragma once

#include <cstddef>
#include <string_view>

namespace edl {

struct Name {
  static constexpr std::size_t capacity = 24;
  char chars[capacity] = {};
  std::size_t size = 0;

  constexpr Name() = default;
  template <std::size_t N>
  constexpr Name(const char (&s)[N]) {  // NOLINT: implicit on purpose, so "tp" is a Name
    static_assert(N - 1 < capacity, "edl::Name: names are at most 23 characters long");
    for (std::size_t i = 0; i + 1 < N; ++i) chars[i] = s[i];
    size = N - 1;
  }
  constexpr std::string_view view() const { return {chars, size}; }
  constexpr bool empty() const { return size == 0; }
  friend constexpr bool operator==(const Name& a, const Name& b) { return a.view() == b.view(); }
};

}  // namespace edl
