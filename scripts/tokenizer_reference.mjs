// Expected token ids for edl's tokenizer tests, from @lenml/tokenizers (a port of
// transformers.js's tokenizers) on the real tokenizer files of the @lenml/tokenizer-* packages.
//
//   node scripts/tokenizer_reference.mjs NODE_MODULES_DIR OUT_DIR
//
// Writes OUT_DIR/<name>.json: {"package", "cases": [{"text", "ids", "ids_special",
// "decoded", "decoded_skip"}]} for llama2, llama3, qwen3 and gemma3.
import { createRequire } from "module";
import fs from "fs";
import path from "path";

const [modules, out] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "x.js"));
const { TokenizerLoader } = require("@lenml/tokenizers");

const texts = [
  "Hello world",
  "Hello, world! How are you doing today?",
  " leading space",
  "  two leading spaces and trailing  ",
  "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
  "multiple     spaces    between   words",
  "digits 1234567890 and 3.14159 and 1,000,000",
  "It's we'll they're I've I'm he'd don't IT'S WE'LL",
  "café naïve résumé coöperate façade",
  "日本語のテキストです。東京は大きい都市です。",
  "中文文本测试，包括标点符号！",
  "한국어 텍스트입니다",
  "مرحبا بالعالم، هذا نص عربي",
  "Привет, мир! Это тест.",
  "emoji 😀🎉👍🏽 and 👨‍👩‍👧‍👦 family",
  "combining: e\u0301 a\u0308 n\u0303 (decomposed) vs é ä ñ",
  "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
  "math ∑ ∫ √ ∞ ≠ ≤ ≥ and arrows → ← ↑",
  "code: def f(x):\n    return x ** 2  # square\n",
  "<s>special in text</s> and <|im_start|>user\nhi<|im_end|>",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
  "<bos><start_of_turn>user\nhello<end_of_turn>\n",
  "<unk> <pad> <eos>",
  "",
  " ",
  "\n",
  "a",
  "URL https://example.com/path?query=1&b=2#frag",
  "email someone@example.org, @handle #hashtag",
  "ALLCAPS lowercase MiXeD CamelCaseWords snake_case_words",
  "Repeated!!!!!! ???? .... ---- ====",
  "\u00a0non-breaking\u2009thin\u3000ideographic space",
  "zero\u200bwidth\u200djoiner",
  "Ελληνικά κείμενο και עברית טקסט",
  "हिन्दी पाठ और தமிழ் உரை",
  "ไทย ภาษา ทดสอบ",
  "x".repeat(300),
  "The quick brown fox jumps over the lazy dog. ".repeat(8),
];

const packages = { llama2: "tokenizer-llama2", llama3: "tokenizer-llama3", qwen3: "tokenizer-qwen3", gemma3: "tokenizer-gemma3" };
fs.mkdirSync(out, { recursive: true });
for (const [name, pkg] of Object.entries(packages)) {
  const dir = path.join(modules, "@lenml", pkg, "models");
  const tok = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
  });
  const cases = texts.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: false });
    const ids_special = tok.encode(text, { add_special_tokens: true });
    return {
      text, ids, ids_special,
      // (@lenml/tokenizers refuses to decode an empty list; the answer is "".)
      decoded: ids_special.length ? tok.decode(ids_special, { skip_special_tokens: false }) : "",
      decoded_skip: ids_special.length ? tok.decode(ids_special, { skip_special_tokens: true }) : "",
    };
  });
  fs.writeFileSync(path.join(out, `${name}.json`), JSON.stringify({ package: `@lenml/${pkg}`, cases }, null, 0) + "\n");
  console.log(name, cases.length, "cases");
}
