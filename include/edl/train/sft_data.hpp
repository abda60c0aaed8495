// edl/train/sft_data.hpp
// Supervised fine-tuning data: JSON-lines records as TRL's SFTTrainer reads them, each one
// sequence whose scored mask says which tokens the loss targets (TokenDataset::scored).
//
//   {"text": "..."}                                  language modelling: every token scored
//   {"prompt": "...", "completion": "..."}           text + EOS; the completion (and EOS) scored
//   {"prompt": [messages], "completion": [messages]} rendered with the chat template; the
//                                                    completion's tokens scored
//   {"messages": [...], "tools": ..., other keys}    rendered with the chat template; the
//                                                    assistant turns' tokens scored
//
// Which tokens a part owns: the whole record is tokenized once, and the text before a part
// (the prompt; a conversation up to an assistant turn, with the generation prompt) is tokenized
// too; the part starts where the two token lists stop agreeing and ends where the text through
// it (tokenized the same way) stops agreeing with the whole. So a BPE merge across a boundary
// never makes a token half prompt, half completion: it goes to the prompt, as in TRL (which
// masks the prompt's tokens where they are a prefix of the whole).
// With completion_only_loss false every token is scored. Records are not packed: one sequence
// per record, truncated at collate by max_sequence_length and truncation_mode.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <edl/chat/conversation.hpp>
#include <edl/core/error.hpp>
#include <edl/io/json.hpp>
#include <edl/tokenizer/tokenizer.hpp>
#include <edl/train/dataset.hpp>

namespace edl::train {

struct SftOptions {
  bool completion_only_loss = true;
  std::int64_t eos_id = -1;  // appended after a text completion (and a "text" record); < 0: nothing
};

/// One record's tokens and scored mask.
struct SftExample {
  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> scored;
};

namespace sft_detail {

inline std::vector<std::int64_t> encode(const tokenizer::Tokenizer& tok, const std::string& text) {
  return tok.encode(tokenizer::utf8_lossy(text));  // a stray non-UTF-8 byte becomes U+FFFD
}

/// How many leading tokens `part` shares with `whole`.
inline std::size_t agreeing(const std::vector<std::int64_t>& part, const std::vector<std::int64_t>& whole) {
  const std::size_t n = std::min(part.size(), whole.size());
  std::size_t i = 0;
  while (i < n && part[i] == whole[i]) ++i;
  return i;
}

/// `record` with its messages replaced by messages[0, n) (tools and other keys kept).
inline nlohmann::ordered_json first_messages(const nlohmann::ordered_json& record, const nlohmann::ordered_json& messages,
                                             std::size_t n) {
  nlohmann::ordered_json c = record.is_object() ? record : nlohmann::ordered_json::object();
  c.erase("prompt");
  c.erase("completion");
  c["messages"] = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < n; ++i) c["messages"].push_back(messages[i]);
  return c;
}

}  // namespace sft_detail

/// Tokens and scored mask of one record (see the header comment); `tmpl` renders messages
/// (null: a record with messages is an error naming `where`).
inline SftExample sft_example(const nlohmann::ordered_json& record, const tokenizer::Tokenizer& tok,
                              const chat::ChatTemplate* tmpl, const SftOptions& o, const std::string& where) {
  namespace d = sft_detail;
  EDL_CHECK(record.is_object(), errc::format, where, "expected a JSON object, found ", record.type_name());
  std::vector<std::int64_t> whole;
  std::vector<std::pair<std::size_t, std::size_t>> parts;  // scored token ranges
  const auto need_template = [&](const char* what) {
    EDL_CHECK(tmpl != nullptr, errc::invalid_argument, where, "a record with ", what,
              " is rendered with the tokenizer's chat template, and the tokenizer has none "
              "(tokenizer_config.json \"chat_template\")");
  };
  const auto render = [&](const nlohmann::ordered_json& conversation, bool generation_prompt) {
    return chat::render_conversation(*tmpl, tok, conversation, {.add_generation_prompt = generation_prompt}, where);
  };
  if (record.contains("messages")) {
    need_template("\"messages\"");
    const auto& msgs = record["messages"];
    EDL_CHECK(msgs.is_array() && !msgs.empty(), errc::format, where, "\"messages\" must be a non-empty array");
    whole = d::encode(tok, render(record, false));
    for (std::size_t i = 0; i < msgs.size(); ++i) {
      EDL_CHECK(msgs[i].is_object() && msgs[i].contains("role") && msgs[i]["role"].is_string(), errc::format,
                where + " messages[" + std::to_string(i) + "]", "expected an object with a string \"role\"");
      if (msgs[i]["role"] != "assistant") continue;
      const std::size_t a = d::agreeing(d::encode(tok, render(d::first_messages(record, msgs, i), true)), whole);
      const std::size_t b = d::agreeing(d::encode(tok, render(d::first_messages(record, msgs, i + 1), false)), whole);
      if (b > a) parts.push_back({a, b});
    }
  } else if (record.contains("prompt") || record.contains("completion")) {
    EDL_CHECK(record.contains("prompt") && record.contains("completion"), errc::format, where,
              "a prompt-completion record needs both \"prompt\" and \"completion\"");
    const auto& p = record["prompt"];
    const auto& c = record["completion"];
    std::vector<std::int64_t> prompt;
    if (p.is_string() && c.is_string()) {
      prompt = d::encode(tok, p.get<std::string>());
      whole = d::encode(tok, p.get<std::string>() + c.get<std::string>());
      if (o.eos_id >= 0) whole.push_back(o.eos_id);
    } else {
      EDL_CHECK(p.is_array() && c.is_array(), errc::format, where,
                "\"prompt\" and \"completion\" must both be strings or both be message lists");
      need_template("message lists");
      nlohmann::ordered_json all = p;
      for (const auto& m : c) all.push_back(m);
      prompt = d::encode(tok, render(d::first_messages(record, p, p.size()), true));
      whole = d::encode(tok, render(d::first_messages(record, all, all.size()), false));
    }
    parts.push_back({d::agreeing(prompt, whole), whole.size()});
  } else {
    EDL_CHECK(record.contains("text") && record["text"].is_string(), errc::format, where,
              "expected \"text\", \"prompt\" and \"completion\", or \"messages\"");
    whole = d::encode(tok, record["text"].get<std::string>());
    if (o.eos_id >= 0) whole.push_back(o.eos_id);
    parts.push_back({0, whole.size()});
  }
  SftExample ex;
  ex.ids.assign(whole.begin(), whole.end());
  ex.scored.assign(whole.size(), o.completion_only_loss ? 0 : 1);
  for (const auto& [a, b] : parts) std::fill(ex.scored.begin() + static_cast<std::ptrdiff_t>(a), ex.scored.begin() + static_cast<std::ptrdiff_t>(b), 1);
  return ex;
}

namespace sft_detail {

/// f(record, where) for every record of the JSON-lines `files` (blank lines skipped), where =
/// "<file> line <n>"; `tok`'s chat template (or null) is parsed once for all.
template <class F>
void for_each_record(const std::vector<std::string>& files, const tokenizer::Tokenizer& tok, F&& f) {
  std::optional<chat::ChatTemplate> tmpl;
  if (tok.chat_template()) tmpl = chat::chat_template_of(tok);
  for (const auto& file : files) {
    EDL_CHECK(std::filesystem::is_regular_file(file), errc::io, file, "no such file");
    EDL_CHECK(file.size() >= 6 && file.compare(file.size() - 6, 6, ".jsonl") == 0, errc::invalid_argument, file,
              "fine-tuning reads JSON-lines records (a .jsonl file)");
    std::ifstream in(file, std::ios::binary);
    EDL_CHECK(in.good(), errc::io, file, "cannot open for reading: ", io::detail::errno_text());
    std::string line;
    std::int64_t n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = file + " line " + std::to_string(n);
      f(io::parse_json<nlohmann::ordered_json>(line, where), tmpl ? &*tmpl : nullptr, where);
    }
  }
}

/// Adds `ex` to `ds` after checking its ids against the vocabulary (vocab_size > 0).
inline void add_example(TokenDataset& ds, const SftExample& ex, std::int64_t vocab_size, const std::string& where) {
  if (vocab_size > 0)
    for (auto t : ex.ids)
      EDL_CHECK(t < vocab_size, errc::invalid_argument, where, "token ", t, " is outside the model's vocabulary (vocab_size ",
                vocab_size, ")");
  ds.add(std::span<const std::int32_t>(ex.ids), std::span<const std::uint8_t>(ex.scored));
}

}  // namespace sft_detail

/// Every record of the JSON-lines `files` (blank lines skipped), one sequence each; errors name
/// the file and line. Token ids must be below vocab_size (when > 0).
inline TokenDataset load_sft_dataset(const std::vector<std::string>& files, const tokenizer::Tokenizer& tok,
                                     const SftOptions& o, std::int64_t vocab_size = 0) {
  TokenDataset ds;
  sft_detail::for_each_record(files, tok, [&](const nlohmann::ordered_json& r, const chat::ChatTemplate* tmpl,
                                              const std::string& where) {
    sft_detail::add_example(ds, sft_example(r, tok, tmpl, o, where), vocab_size, where);
  });
  return ds;
}

/// Preference pairs for DPO: each record {"prompt", "chosen", "rejected"} (strings, or message
/// lists rendered with the chat template) becomes two sequences, prompt + chosen at 2i and
/// prompt + rejected at 2i + 1, each scoring its completion only (as sft_example's
/// prompt-completion records; completion_only_loss is ignored). Errors name the file and line.
inline TokenDataset load_preference_dataset(const std::vector<std::string>& files, const tokenizer::Tokenizer& tok,
                                            SftOptions o, std::int64_t vocab_size = 0) {
  o.completion_only_loss = true;
  TokenDataset ds;
  sft_detail::for_each_record(files, tok, [&](const nlohmann::ordered_json& j, const chat::ChatTemplate* tmpl,
                                              const std::string& where) {
    EDL_CHECK(j.is_object() && j.contains("prompt") && j.contains("chosen") && j.contains("rejected"), errc::format,
              where, "a preference record needs \"prompt\", \"chosen\" and \"rejected\"");
    for (const char* side : {"chosen", "rejected"}) {
      nlohmann::ordered_json r = j;
      r.erase("chosen");
      r.erase("rejected");
      r["completion"] = j[side];
      sft_detail::add_example(ds, sft_example(r, tok, tmpl, o, where + " (" + side + ")"), vocab_size, where);
    }
  });
  return ds;
}

}  // namespace edl::train
