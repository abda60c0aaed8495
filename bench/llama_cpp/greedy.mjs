// bench/llama_cpp/greedy.mjs: llama.cpp's greedy continuation of a prompt of token ids, to
// check a GGUF file written by `edl convert` against `edl generate --greedy` (docs/gguf.md).
//
//   node greedy.mjs --model F.gguf --prompt 1,2,3 --n 16 [--threads T] [--ignore-eog] [--kv-type f16|f32]
//
// Prints one JSON line {"tokens": [new token ids], "finish_reason": "length" | "eos"}. As HF
// and edl generate do, an end-of-generation token (the file's eos, eot, ...) is included and
// ends the continuation; --ignore-eog continues past it. The prompt is evaluated as given (no
// BOS is added). --kv-type sets the KV cache's type: llama.cpp's default f16, or f32 (as edl's
// cache), which removes that rounding from a comparison. llama.cpp comes from the npm package
// node-llama-cpp (see run.sh).
import { getLlama } from "node-llama-cpp";

function args() {
  const a = process.argv.slice(2), o = {};
  for (let i = 0; i < a.length; ++i) {
    if (!a[i].startsWith("--")) throw new Error(`greedy: expected a --flag, found '${a[i]}'`);
    const key = a[i].slice(2);
    if (key === "ignore-eog") { o[key] = true; continue; }
    if (i + 1 >= a.length) throw new Error(`greedy: --${key} needs a value`);
    o[key] = a[++i];
  }
  for (const k of ["model", "prompt", "n"]) if (!(k in o)) throw new Error(`greedy: --${k} is required`);
  const prompt = o.prompt.split(",").map((s) => {
    if (!/^\d+$/.test(s.trim())) throw new Error(`greedy: --prompt expects token ids such as 1,2,3, found '${s}'`);
    return Number(s);
  });
  const n = Number(o.n);
  if (!Number.isInteger(n) || n < 1) throw new Error(`greedy: --n must be a positive integer, found '${o.n}'`);
  const kv = o["kv-type"] ?? "f16";
  if (kv !== "f16" && kv !== "f32") throw new Error(`greedy: --kv-type must be f16 or f32, found '${kv}'`);
  return { model: o.model, prompt, n, threads: o.threads ? Number(o.threads) : undefined, ignoreEog: !!o["ignore-eog"],
           kv: kv.toUpperCase() };
}

const o = args();
const llama = await getLlama({ gpu: false, build: "never", logLevel: process.env.LLAMA_LOG ?? "error" });
const model = await llama.loadModel({ modelPath: o.model, gpuLayers: 0 });
const context = await model.createContext({
  contextSize: Math.max(o.prompt.length + o.n, 32), batchSize: Math.max(o.prompt.length, 1), sequences: 1,
  experimentalKvCacheKeyType: o.kv, experimentalKvCacheValueType: o.kv,
  ...(o.threads ? { threads: o.threads } : {}),
});
const seq = context.getSequence();
const tokens = [];
let finish = "length";
// temperature 0: llama.cpp's greedy sampler (the arg-max of the logits); no penalties.
for await (const tok of seq.evaluate(o.prompt, { temperature: 0, yieldEogToken: true })) {
  tokens.push(tok);
  if (!o.ignoreEog && model.isEogToken(tok)) { finish = "eos"; break; }
  if (tokens.length >= o.n) break;
}
console.log(JSON.stringify({ tokens, finish_reason: finish }));
await context.dispose();
await model.dispose();
await llama.dispose();
