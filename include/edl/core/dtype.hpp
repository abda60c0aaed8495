// edl/core/dtype.hpp
// Storage element types and the run-time dtype tag.
//
// f32 is the reference type. bf16 and f16 are storage types: values are converted to f32
// for arithmetic (accumulation is always f32) and rounded back with round-to-nearest-even.
// NaN stays NaN (quiet, sign kept), +-Inf stays Inf, f16 handles subnormals exactly.
// int8 is stored as std::int8_t; its scales live with the quantization scheme.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <edl/core/error.hpp>

namespace edl {

/// bfloat16: the upper 16 bits of an IEEE binary32.
struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  explicit bf16(float f) noexcept : bits(from_float(f)) {}
  static constexpr bf16 from_bits(std::uint16_t b) noexcept {
    bf16 r;
    r.bits = b;
    return r;
  }
  explicit operator float() const noexcept { return to_float(bits); }
  float to_float() const noexcept { return to_float(bits); }

  static std::uint16_t from_float(float f) noexcept {
    std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
    // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<std::uint16_t>(u >> 16);
  }
  static float to_float(std::uint16_t b) noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
  }
  friend bool operator==(bf16 a, bf16 b) noexcept { return a.bits == b.bits; }
};

/// IEEE binary16.
struct f16 {
  std::uint16_t bits = 0;

  f16() = default;
  explicit f16(float f) noexcept : bits(from_float(f)) {}
  static constexpr f16 from_bits(std::uint16_t b) noexcept {
    f16 r;
    r.bits = b;
    return r;
  }
  explicit operator float() const noexcept { return to_float(bits); }
  float to_float() const noexcept { return to_float(bits); }

  static std::uint16_t from_float(float f) noexcept {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
    if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: Inf
    if (a >= 0x38800000u) {  // normal in f16 (>= 2^-14)
      // Rebias exponent 127 -> 15 and round the 13 dropped mantissa bits to nearest even.
      std::uint32_t r = a - 0x38000000u;
      r += 0x0fffu + ((r >> 13) & 1u);
      return static_cast<std::uint16_t>(sign | (r >> 13));
    }
    if (a < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal
    // Subnormal in f16: value = m * 2^-24. Shift the full significand and round to nearest even.
    const std::uint32_t exp = a >> 23;
    const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exp;  // 14..24 for exp in 102..112
    const std::uint32_t half = 1u << (shift - 1);
    std::uint32_t m = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    if (rem > half || (rem == half && (m & 1u))) ++m;
    return static_cast<std::uint16_t>(sign | m);
  }
  static float to_float(std::uint16_t h) noexcept {
    // Without branches on the value, so loops over f16 arrays vectorise (the GEMM packs f16
    // weights with it). Exponent and mantissa move to binary32's places and the exponent is
    // rebiased by 127 - 15; Inf/NaN get the rest of the all-ones exponent (payload kept bit
    // for bit), and a subnormal, rebiased as if normal, loses its implicit 1 by an exact
    // subtraction of 2^-14.
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t bits = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
    const std::uint32_t exp = bits & 0x0f800000u;
    const std::uint32_t rebiased = bits + ((127u - 15u) << 23);
    const std::uint32_t special = exp == 0x0f800000u ? (128u - 16u) << 23 : 0u;
    const float normal = std::bit_cast<float>(rebiased + special);
    const float subnormal = std::bit_cast<float>(rebiased + (1u << 23)) - std::bit_cast<float>(113u << 23);
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(exp == 0 ? subnormal : normal) | sign);
  }
  friend bool operator==(f16 a, f16 b) noexcept { return a.bits == b.bits; }
};

static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);
static_assert(sizeof(f16) == 2 && std::is_trivially_copyable_v<f16>);

/// Widen any storage element to f32 for arithmetic.
template <class T>
inline float to_f32(T v) noexcept {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) return v.to_float();
  else return static_cast<float>(v);
}

/// Narrow an f32 to a storage element (round to nearest even for bf16/f16).
template <class T>
inline T from_f32(float v) noexcept {
  if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) return T(v);
  else return static_cast<T>(v);
}

/// Run-time element-type tag; names follow safetensors ("F32", "BF16", ...).
enum class DType : std::uint8_t { f32, f64, bf16, f16, i8, u8, i16, i32, i64, boolean };

constexpr std::size_t dtype_size(DType d) noexcept {
  switch (d) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::bf16: case DType::f16: case DType::i16: return 2;
    case DType::i8: case DType::u8: case DType::boolean: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType d) noexcept {
  switch (d) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i8: return "I8";
    case DType::u8: return "U8";
    case DType::i16: return "I16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::boolean: return "BOOL";
  }
  return "?";
}

/// Parses a safetensors dtype name; throws naming `where` for an unknown one.
inline DType dtype_from_name(std::string_view s, const std::string& where) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i8, DType::u8, DType::i16,
                  DType::i32, DType::i64, DType::boolean})
    if (dtype_name(d) == s) return d;
  detail::raise(errc::format, where,
                detail::concat("unknown dtype \"", s, "\", expected one of F32 F64 BF16 F16 I8 U8 I16 I32 I64 BOOL"));
}

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<std::int8_t> { static constexpr DType value = DType::i8; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::u8; };
template <> struct dtype_of<std::int16_t> { static constexpr DType value = DType::i16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::boolean; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

/// Element types a tensor may store.
template <class T>
concept StorageType = requires { dtype_of<T>::value; };

/// Element types the kernels compute on after widening (f32 compute, f32 accumulation).
template <class T>
concept FloatStorage = std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

}  // namespace edl
