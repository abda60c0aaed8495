// Tests for edl/core/policy.hpp's run-time spelling of remat policies: remat::parse gives the
// layers' drop mask of the same policy type (remat::dropped_by), for every name and call, and
// errors that name what was expected; drops<N> reads one name's bit of a mask. That every policy trains bit-identically is tested with
// the layers (tests/nn/test_decoder_layer.cpp) and the trainer (tests/train/test_trainer.cpp).
#include <gtest/gtest.h>

#include <string>

#include <edl/core/policy.hpp>

namespace edl::remat {
namespace {

TEST(RematParse, SpellingsGiveTheDropMaskOfTheirPolicyType) {
  EXPECT_EQ(parse(""), dropped_by<everything_saveable>());
  EXPECT_EQ(parse("none"), dropped_by<everything_saveable>());
  EXPECT_EQ(parse("everything_saveable"), 0u);
  EXPECT_EQ(parse("nothing_saveable"), dropped_by<nothing_saveable>());
  EXPECT_EQ(parse("dots_saveable"), dropped_by<dots_saveable>());
  EXPECT_EQ(parse("checkpoint_dots"), dropped_by<dots_saveable>());
  EXPECT_EQ(parse("dots_with_no_batch_dims_saveable"), dropped_by<dots_with_no_batch_dims_saveable>());
  EXPECT_EQ(parse("checkpoint_dots_with_no_batch_dims"), dropped_by<dots_with_no_batch_dims_saveable>());
  EXPECT_EQ(parse("save_only_these_names(attn_out, gate, up)"),
            (dropped_by<save_only_these_names<"attn_out", "gate", "up">>()));
  EXPECT_EQ(parse(" save_only_these_names( 'ctx' ,\"act\" ) "), (dropped_by<save_only_these_names<"ctx", "act">>()));
  EXPECT_EQ(parse("save_anything_except_these_names(gate, up)"),
            (dropped_by<save_anything_except_these_names<"gate", "up">>()));
  EXPECT_EQ(parse("save_any_names_but_these(q)"), (dropped_by<save_any_names_but_these<"q">>()));
  using both = save_from_both_policies<dots_with_no_batch_dims_saveable, save_only_these_names<"act">>;
  EXPECT_EQ(parse("save_from_both_policies(dots_with_no_batch_dims_saveable, save_only_these_names(act))"),
            dropped_by<both>());
  using nested = save_from_both_policies<save_only_these_names<"q">,
                                         save_from_both_policies<save_only_these_names<"k">, save_only_these_names<"v">>>;
  EXPECT_EQ(parse("save_from_both_policies(save_only_these_names(q), "
                  "save_from_both_policies(save_only_these_names(k), save_only_these_names(v)))"),
            dropped_by<nested>());
  // Every name once: nothing kept, the mask of nothing_saveable.
  EXPECT_EQ(parse("save_any_names_but_these(norm1, q, k, v, ctx, attn_out, norm2, gate, up, act)"),
            dropped_by<nothing_saveable>());
}

// drops<N>(mask) reads the bit of name N: each name is dropped by the policy that keeps every
// other name, and kept by the policy that keeps it alone.
TEST(RematParse, DropsReadsTheNamedBit) {
  const auto check = [](auto name, bool (*drops_it)(DropMask)) {
    const std::string n = name;
    EXPECT_TRUE(drops_it(parse("save_anything_except_these_names(" + n + ")"))) << n;
    EXPECT_FALSE(drops_it(parse("save_only_these_names(" + n + ")"))) << n;
    EXPECT_TRUE(drops_it(parse("nothing_saveable"))) << n;
    EXPECT_FALSE(drops_it(parse("everything_saveable"))) << n;
  };
  check("norm1", [](DropMask d) { return drops<"norm1">(d); });
  check("q", [](DropMask d) { return drops<"q">(d); });
  check("k", [](DropMask d) { return drops<"k">(d); });
  check("v", [](DropMask d) { return drops<"v">(d); });
  check("ctx", [](DropMask d) { return drops<"ctx">(d); });
  check("attn_out", [](DropMask d) { return drops<"attn_out">(d); });
  check("norm2", [](DropMask d) { return drops<"norm2">(d); });
  check("gate", [](DropMask d) { return drops<"gate">(d); });
  check("up", [](DropMask d) { return drops<"up">(d); });
  check("act", [](DropMask d) { return drops<"act">(d); });
  EXPECT_FALSE(drops<"gate">(parse("save_only_these_names(attn_out, gate, up)")));
  EXPECT_TRUE(drops<"act">(parse("save_only_these_names(attn_out, gate, up)")));
}

TEST(RematParse, ErrorsSayWhatWasExpected) {
  const auto message = [](const std::string& text) {
    try {
      parse(text, "a.json field gradient_checkpointing", errc::config);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), errc::config) << text;
      EXPECT_EQ(e.where(), "a.json field gradient_checkpointing") << text;
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error for " << text;
    return std::string();
  };
  EXPECT_NE(message("dots").find("save_only_these_names(NAME, ...)"), std::string::npos);
  EXPECT_NE(message("save_only_these_names").find("expected one of"), std::string::npos);  // the call's names are missing
  EXPECT_NE(message("save_only_these_names(gate, attn)").find("\"attn\" is not a checkpoint name (norm1, q,"),
            std::string::npos);
  EXPECT_NE(message("save_only_these_names()").find("is not a checkpoint name"), std::string::npos);
  EXPECT_NE(message("save_from_both_policies(dots_saveable)").find("takes two policies"), std::string::npos);
  EXPECT_NE(message("save_from_both_policies(dots_saveable, bogus)").find("\"bogus\""), std::string::npos);
  EXPECT_NE(message("keep_some_names(q)").find("expected one of"), std::string::npos);
}

}  // namespace
}  // namespace edl::remat
