// Tests for edl/train/training_arguments.hpp: EasyDeL field names and defaults, durations,
// overrides, and errors that name the field (unknown fields, wrong types, unsupported values).
#include <gtest/gtest.h>

#include <edl/train/training_arguments.hpp>

#include "../support/scoped_env.hpp"

namespace edl::train {
namespace {

using ojson = nlohmann::ordered_json;

template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected an edl::Error";
  return Error(errc::invalid_argument, "", "");
}

TEST(TrainingArguments, ReadsEasyDeLNames) {
  auto a = TrainingArguments::from_json(ojson::parse(R"({
    "model_name": "m", "learning_rate": 3e-3, "learning_rate_end": 3e-4, "optimizer": "lion",
    "scheduler": "cosine", "warmup_steps": 5, "weight_decay": 0.1, "clip_grad": 1.0,
    "total_batch_size": 16, "gradient_accumulation_steps": 4, "max_sequence_length": 128,
    "num_train_epochs": 2, "max_training_steps": 100, "training_time_limit": "30m",
    "evaluation_steps": 50, "save_steps": 25, "save_total_limit": 2, "log_steps": 5,
    "save_directory": "out", "truncation_mode": "keep_start", "shuffle_train_dataset": false,
    "resume_if_possible": false, "b1": 0.8, "b2": 0.95, "epsilon": 1e-6, "seed": 7,
    "sharding_axis_dims": [1, 1, 1, 1], "dtype": "float32", "param_dtype": "float32",
    "model": {"hidden_size": 64}, "train_data": "a.txt", "eval_data": ["b.txt", "c.txt"],
    "tokenizer": {"train_bpe": 512}})"));
  a.validate();
  EXPECT_EQ(a.model_name, "m");
  EXPECT_DOUBLE_EQ(a.learning_rate, 3e-3);
  EXPECT_EQ(a.optimizer, "lion");
  EXPECT_EQ(a.micro_batch_size(), 4);
  EXPECT_EQ(a.max_training_steps, 100);
  EXPECT_DOUBLE_EQ(*a.training_time_limit, 1800.0);
  EXPECT_EQ(a.save_total_limit, 2);
  EXPECT_EQ(a.truncation_mode, "keep_start");
  EXPECT_FALSE(a.shuffle_train_dataset);
  EXPECT_EQ(a.seed, 7u);
  EXPECT_EQ(a.train_data, std::vector<std::string>{"a.txt"});
  EXPECT_EQ(a.eval_data.size(), 2u);
  EXPECT_EQ(a.tokenizer["train_bpe"], 512);
  // Round trip through to_json.
  auto b = TrainingArguments::from_json(a.to_json());
  EXPECT_EQ(b.to_json(), a.to_json());
}

TEST(TrainingArguments, Defaults) {
  auto a = TrainingArguments::from_json(ojson::parse(R"({"train_data": "x"})"));
  a.validate();
  EXPECT_EQ(a.optimizer, "adamw");
  EXPECT_EQ(a.scheduler, "none");
  EXPECT_EQ(a.total_batch_size, 32);
  EXPECT_EQ(a.gradient_accumulation_steps, 1);
  EXPECT_EQ(a.truncation_mode, "keep_end");
  EXPECT_FALSE(a.max_training_steps.has_value());
  EXPECT_EQ(a.tokenizer, "byte");
  EXPECT_TRUE(a.write_report);
  EXPECT_EQ(a.weight_distribution_log_steps, 0);
}

TEST(TrainingArguments, TokenizerSpecs) {
  auto a = TrainingArguments::from_json(ojson::parse(R"({"train_data": "x", "tokenizer": {"type": "bpe", "vocab_size": 512}})"));
  EXPECT_EQ(a.tokenizer, ojson::parse(R"({"train_bpe": 512})"));  // one spelling for the trainer
  a.apply_override(R"(tokenizer={"type": "byte"})");
  EXPECT_EQ(a.tokenizer, "byte");
  a.apply_override("weight_distribution_log_steps=5");
  a.apply_override("write_report=false");
  EXPECT_EQ(a.weight_distribution_log_steps, 5);
  EXPECT_FALSE(a.write_report);
  EXPECT_EQ(TrainingArguments::from_json(a.to_json()).weight_distribution_log_steps, 5);
  const Error e = error_of([&] { a.apply_override(R"(tokenizer={"type": "bpe"})"); });
  EXPECT_EQ(e.code(), errc::config);
  EXPECT_EQ(e.where(), "TrainingArguments field tokenizer");
  a.weight_distribution_log_steps = -1;
  EXPECT_EQ(error_of([&] { a.validate(); }).where(), "TrainingArguments field weight_distribution_log_steps");
}

TEST(TrainingArguments, Durations) {
  EXPECT_DOUBLE_EQ(parse_duration("90", "w"), 90);
  EXPECT_DOUBLE_EQ(parse_duration("90s", "w"), 90);
  EXPECT_DOUBLE_EQ(parse_duration("2h", "w"), 7200);
  EXPECT_DOUBLE_EQ(parse_duration("1h30m", "w"), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("1.5m", "w"), 90);
  EXPECT_EQ(error_of([] { parse_duration("soon", "args field training_time_limit"); }).code(), errc::config);
  auto a = TrainingArguments::from_json(ojson::parse(R"({"training_time_limit": 12.5})"));
  EXPECT_DOUBLE_EQ(*a.training_time_limit, 12.5);
}

TEST(TrainingArguments, UnknownFieldsAreNamed) {
  auto e = error_of([] {
    TrainingArguments::from_json(ojson::parse(R"({"learning_rate": 1, "lerning_rate": 2, "batch": 3})"), "a.json");
  });
  EXPECT_EQ(e.code(), errc::config);
  EXPECT_EQ(e.where(), "a.json");
  const std::string m = e.what();
  EXPECT_NE(m.find("\"lerning_rate\""), std::string::npos) << m;
  EXPECT_NE(m.find("\"batch\""), std::string::npos) << m;
}

TEST(TrainingArguments, WrongTypesNameFieldExpectedAndFound) {
  auto e = error_of([] { TrainingArguments::from_json(ojson::parse(R"({"total_batch_size": "32"})"), "a.json"); });
  EXPECT_EQ(e.code(), errc::config);
  EXPECT_EQ(e.where(), "a.json field total_batch_size");
  EXPECT_NE(std::string(e.what()).find("expected an integer, found \"32\" (string)"), std::string::npos) << e.what();
  auto e2 = error_of([] { TrainingArguments::from_json(ojson::parse(R"({"learning_rate": [1]})"), "a.json"); });
  EXPECT_EQ(e2.where(), "a.json field learning_rate");
  EXPECT_NE(std::string(e2.what()).find("expected a number"), std::string::npos);
  auto e3 = error_of([] { TrainingArguments::from_json(ojson::parse(R"({"train_data": [1, 2]})"), "a.json"); });
  EXPECT_EQ(e3.where(), "a.json field train_data[0]");
  auto e4 = error_of([] { TrainingArguments::from_json(ojson::parse(R"({"tokenizer": 5})"), "a.json"); });
  EXPECT_EQ(e4.where(), "a.json field tokenizer");
}

TEST(TrainingArguments, ValidationNamesTheField) {
  auto make = [](const char* extra) {
    auto j = ojson::parse(R"({"train_data": "x"})");
    j.update(ojson::parse(extra));
    return TrainingArguments::from_json(j, "a.json");
  };
  auto e = error_of([&] { make(R"({"optimizer": "adam"})").validate(); });
  EXPECT_EQ(e.where(), "a.json field optimizer");
  e = error_of([&] { make(R"({"scheduler": "step"})").validate(); });
  EXPECT_EQ(e.where(), "a.json field scheduler");
  e = error_of([&] { make(R"({"total_batch_size": 6, "gradient_accumulation_steps": 4})").validate(); });
  EXPECT_EQ(e.where(), "a.json field gradient_accumulation_steps");
  e = error_of([&] { make(R"({"truncation_mode": "middle"})").validate(); });
  EXPECT_EQ(e.where(), "a.json field truncation_mode");
  e = error_of([&] { make(R"({"total_batch_size": 4, "sharding_axis_dims": [3, 1, 1, 1]})").validate(); });
  EXPECT_EQ(e.where(), "a.json field total_batch_size");  // not divisible by the data-parallel size
  EXPECT_NE(std::string(e.what()).find("dp x fsdp x ep = 3"), std::string::npos) << e.what();
  e = error_of([&] { make(R"({"sharding_axis_names": ["dp", "fsdp", "tp", "pp"]})").validate(); });
  EXPECT_EQ(e.where(), "a.json field sharding_axis_names");
  e = error_of([&] { make(R"({"sharding_axis_dims": [1, 0, 1, 1]})").validate(); });
  EXPECT_EQ(e.where(), "a.json field sharding_axis_dims");
  {  // -1 takes the launch's devices left over (EDL_DEVICES, else one per process or rank)
    test_support::ScopedEnv devices("EDL_DEVICES", "8");
    EXPECT_EQ(make(R"({"total_batch_size": 4, "sharding_axis_dims": [2, -1, 2, 1]})").mesh_dims(),
              (MeshDims{2, 2, 1, 2, 1}));
    e = error_of([&] { make(R"({"sharding_axis_dims": [3, -1, 1, 1]})").validate(); });
    EXPECT_EQ(e.where(), "a.json field sharding_axis_dims");
    EXPECT_NE(std::string(e.what()).find("8 devices"), std::string::npos) << e.what();
    e = error_of([&] { make(R"({"sharding_axis_dims": [-1, -1, 1, 1]})").validate(); });
    EXPECT_EQ(e.where(), "a.json field sharding_axis_dims");
  }
  {
    test_support::ScopedEnv one("EDL_DEVICES", "1");
    EXPECT_EQ(make(R"({"sharding_axis_dims": [1, -1, 1, 1]})").mesh_dims(), (MeshDims{1, 1, 1, 1, 1}));
  }
  // EasyDeL's five axes, ep among them; the batch splits over dp x fsdp x ep.
  EXPECT_EQ(make(R"({"total_batch_size": 4, "sharding_axis_names": ["dp", "fsdp", "ep", "tp", "sp"],
                     "sharding_axis_dims": [1, 1, 2, 1, 1]})").mesh_dims(),
            (MeshDims{1, 1, 2, 1, 1}));
  e = error_of([&] {
    make(R"({"total_batch_size": 2, "sharding_axis_names": ["dp", "fsdp", "ep", "tp", "sp"],
             "sharding_axis_dims": [1, 1, 4, 1, 1]})").validate();
  });
  EXPECT_NE(std::string(e.what()).find("dp x fsdp x ep = 4"), std::string::npos) << e.what();
  EXPECT_NO_THROW(make(R"({"param_dtype": "bfloat16"})").validate());  // mixed precision
  EXPECT_EQ(make(R"({"param_dtype": "fp16"})").param_storage(), DType::f16);
  EXPECT_EQ(make(R"({"param_dtype": "bf16"})").param_storage(), DType::bf16);
  EXPECT_EQ(make(R"({})").param_storage(), DType::f32);
  e = error_of([&] { make(R"({"param_dtype": "float64"})").validate(); });
  EXPECT_EQ(e.code(), errc::unsupported);
  EXPECT_EQ(e.where(), "a.json field param_dtype");
  EXPECT_EQ(make(R"({"dtype": "bfloat16"})").compute_storage(), DType::bf16);  // bf16 activations
  EXPECT_EQ(make(R"({"dtype": "half"})").compute_storage(), DType::f16);
  EXPECT_EQ(make(R"({})").compute_storage(), DType::f32);
  e = error_of([&] { make(R"({"dtype": "int8"})").validate(); });
  EXPECT_EQ(e.code(), errc::unsupported);
  EXPECT_EQ(e.where(), "a.json field dtype");
  e = error_of([&] { TrainingArguments::from_json(ojson::object(), "a.json").validate(); });
  EXPECT_EQ(e.where(), "a.json field train_data");
}

TEST(TrainingArguments, GradientCheckpointingNamesTheRematPolicies) {
  auto make = [](ojson v) {
    auto j = ojson::parse(R"({"train_data": "x"})");
    j["gradient_checkpointing"] = std::move(v);
    return TrainingArguments::from_json(j, "a.json");
  };
  for (const char* ok : {"", "none", "nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
                         "everything_saveable", "checkpoint_dots", "checkpoint_dots_with_no_batch_dims"})
    EXPECT_NO_THROW(make(ok).validate()) << ok;
  // The policies that take names, spelled as their JAX calls (remat::parse's tests are in
  // tests/core/test_policy.cpp).
  for (const char* ok : {"save_only_these_names(attn_out, gate, up)", "save_any_names_but_these(act)",
                         "save_from_both_policies(dots_saveable, save_only_these_names(act))"})
    EXPECT_NO_THROW(make(ok).validate()) << ok;
  EXPECT_EQ(make(true).gradient_checkpointing, "nothing_saveable");  // HF: true recomputes each layer
  EXPECT_EQ(make(false).gradient_checkpointing, "");
  auto e = error_of([&] { make("save_only_these_names").validate(); });  // the call without its names
  EXPECT_EQ(e.code(), errc::config);
  EXPECT_EQ(e.where(), "a.json field gradient_checkpointing");
  e = error_of([&] { make("save_only_these_names(attn, gate)").validate(); });
  EXPECT_EQ(e.code(), errc::config);
  EXPECT_NE(std::string(e.what()).find("\"attn\" is not a checkpoint name"), std::string::npos) << e.what();
  {  // every policy runs on a mesh too
    auto a = make("save_only_these_names(gate)");
    a.sharding_axis_dims = {1, 2, 1, 1};
    a.total_batch_size = 2;
    EXPECT_NO_THROW(a.validate());
  }
  e = error_of([&] { make("checkpoint_everything").validate(); });
  EXPECT_EQ(e.code(), errc::config);
  EXPECT_NE(std::string(e.what()).find("dots_with_no_batch_dims_saveable"), std::string::npos) << e.what();
}

TEST(TrainingArguments, Overrides) {
  auto a = TrainingArguments::from_json(ojson::parse(R"({"train_data": "x"})"));
  a.apply_override("max_training_steps=10");
  a.apply_override("save_directory=/tmp/out");
  a.apply_override("training_time_limit=2h");
  a.apply_override("eval_data=[\"e1\",\"e2\"]");
  EXPECT_EQ(a.max_training_steps, 10);
  EXPECT_EQ(a.save_directory, "/tmp/out");
  EXPECT_DOUBLE_EQ(*a.training_time_limit, 7200);
  EXPECT_EQ(a.eval_data.size(), 2u);
  EXPECT_EQ(error_of([&] { a.apply_override("nope=1"); }).code(), errc::config);
  EXPECT_EQ(error_of([&] { a.apply_override("noequals"); }).code(), errc::config);
  EXPECT_EQ(error_of([&] { a.apply_override("log_steps=abc"); }).where(), "TrainingArguments field log_steps");
}

}  // namespace
}  // namespace edl::train
