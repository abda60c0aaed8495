// A small training run built from its arguments, as a user writes it: a corpus of 40 short
// fortunes in `dir`/corpus and the JSON of a 2-layer model (hidden 32, vocabulary 300, byte
// tokenizer) trained on it. Tests that check runs built straight from arguments (on meshes,
// with LoRA) start from it and add their own fields.
#pragma once

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace edl::test_support {

inline nlohmann::ordered_json fortune_run(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "corpus");
    for (int i = 0; i < 40; ++i) f << "fortune number " << i << " says hello\n%\n";
  }
  return {{"model", {{"vocab_size", 300}, {"hidden_size", 32}, {"intermediate_size", 64}, {"num_hidden_layers", 2},
                     {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"max_position_embeddings", 64}}},
          {"tokenizer", "byte"},
          {"train_data", (dir / "corpus").string()},
          {"max_sequence_length", 32},
          {"total_batch_size", 4},
          {"progress", false}};
}

}  // namespace edl::test_support
