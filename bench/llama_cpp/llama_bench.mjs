// bench/llama_cpp/llama_bench.mjs: llama.cpp's prefill and decode rates on the shapes of
// `edl bench decode`, on this machine, for side-by-side figures (docs/benchmarks.md).
//
//   node llama_bench.mjs --model tiny|small|gqa1b --prompt-len P --gen-len G --threads T [--dir D] [--mmap 0|1]
//                        [--type f32|q8_0|q4_0]
//   node llama_bench.mjs --model F.gguf --prompt-len P --gen-len G --threads T [--vocab N]
//                        (a GGUF file as it is, e.g. one `edl convert` wrote; prompt ids below --vocab, 32000)
//
// llama.cpp comes from the npm package node-llama-cpp (prebuilt CPU libraries that pick the
// best kernels for the CPU at load time: AVX2 "haswell", AVX-512 "skylakex", ...). The model is
// a GGUF file written here (f32, random Normal(0, 0.02) weights, unit norms, the preset's
// shapes and a placeholder 32000-token vocabulary): speed does not depend on the values.
// --type q8_0 / q4_0 stores every 2-D weight (token_embd and output too, as a "pure" quantized
// file) in that block format, quantized here with ggml's reference rounding.
// Prints one JSON line with the field names of `edl bench decode`: prefill_tokens_per_s (pp)
// and decode_tokens_per_s (tg, greedy, after the prompt).
// --mmap 1 (the default, as llama-bench's) maps the GGUF file; --mmap 0 reads it into memory
// first. On a Zen 5 EPYC, decode ran 3-5x faster with --mmap 0 on gqa1b and 1.6x on small,
// so figures there use llama.cpp's faster setting (docs/benchmarks.md).
import fs from "node:fs";
import path from "node:path";
import { getLlama } from "node-llama-cpp";

const PRESETS = {  // ../shared ANCHORS.md's configs, as in edl's cli presets
  tiny: { hidden: 288, inter: 768, layers: 6, heads: 6, kv: 6, vocab: 32000, ctx: 256 },
  small: { hidden: 768, inter: 2048, layers: 12, heads: 12, kv: 12, vocab: 32000, ctx: 1024 },
  gqa1b: { hidden: 2048, inter: 5632, layers: 22, heads: 32, kv: 4, vocab: 32000, ctx: 2048 },
};

function args() {
  const a = process.argv.slice(2), o = {};
  for (let i = 0; i < a.length; i += 2) {
    if (!a[i].startsWith("--") || i + 1 >= a.length) throw new Error(`llama_bench: expected --flag value, found '${a[i]}'`);
    o[a[i].slice(2)] = a[i + 1];
  }
  for (const k of ["model", "prompt-len", "gen-len", "threads"])
    if (!(k in o)) throw new Error(`llama_bench: --${k} is required`);
  if (!(o.model in PRESETS) && !o.model.endsWith(".gguf"))
    throw new Error(`llama_bench: --model must be tiny, small, gqa1b or a .gguf file, found '${o.model}'`);
  return o;
}

// ---- GGUF v3 writer (the layout of ggml's gguf.h: header, key/values, tensor infos, aligned data)
const T = { U32: 4, I32: 5, F32: 6, STRING: 8, ARRAY: 9 };
class Buf {
  constructor() { this.parts = []; this.len = 0; }
  push(b) { this.parts.push(b); this.len += b.length; }
  u32(v) { const b = Buffer.alloc(4); b.writeUInt32LE(v); this.push(b); }
  i32(v) { const b = Buffer.alloc(4); b.writeInt32LE(v); this.push(b); }
  u64(v) { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); this.push(b); }
  f32(v) { const b = Buffer.alloc(4); b.writeFloatLE(v); this.push(b); }
  str(s) { const b = Buffer.from(s, "utf8"); this.u64(b.length); this.push(b); }
  concat() { return Buffer.concat(this.parts, this.len); }
}

// ggml's block formats: q8_0 = f16 d + 32 int8 (d = amax / 127, q = round(x / d)); q4_0 =
// f16 d + 16 bytes of nibbles (d = max / -8, q = min(15, trunc(x / d + 8.5)), value j low, j + 16 high).
const GGML = { f32: { id: 0, file: 0 }, q8_0: { id: 8, file: 7, bytes: 34 }, q4_0: { id: 2, file: 2, bytes: 18 } };
function f16bits(v) {
  const f = new Float32Array([v]), u = new Uint32Array(f.buffer)[0];
  const sign = (u >>> 16) & 0x8000, a = u & 0x7fffffff;
  if (a >= 0x477ff000) return sign | 0x7c00;
  if (a >= 0x38800000) { let r = a - 0x38000000; r += 0x0fff + ((r >>> 13) & 1); return sign | (r >>> 13); }
  if (a < 0x33000000) return sign;
  const exp = a >>> 23, mant = (a & 0x7fffff) | 0x800000, shift = 126 - exp, half = 1 << (shift - 1);
  let m = mant >>> shift; const rem = mant & ((1 << shift) - 1);
  if (rem > half || (rem === half && (m & 1))) ++m;
  return sign | m;
}
function quantizeBlocks(type, a) {  // a: Float32Array, length a multiple of 32
  const nb = a.length / 32, out = Buffer.alloc(nb * GGML[type].bytes);
  for (let b = 0; b < nb; ++b) {
    const x = a.subarray(32 * b, 32 * b + 32), o = b * GGML[type].bytes;
    if (type === "q8_0") {
      let amax = 0; for (const v of x) amax = Math.max(amax, Math.abs(v));
      const d = Math.fround(amax / 127), id = d ? Math.fround(1 / d) : 0;
      out.writeUInt16LE(f16bits(d), o);
      for (let i = 0; i < 32; ++i) { const q = Math.fround(x[i] * id); out.writeInt8(Math.sign(q) * Math.round(Math.abs(q)), o + 2 + i); }
    } else {
      let amax = 0, max = 0; for (const v of x) if (amax < Math.abs(v)) { amax = Math.abs(v); max = v; }
      const d = Math.fround(max / -8), id = d ? Math.fround(1 / d) : 0;
      out.writeUInt16LE(f16bits(d), o);
      for (let j = 0; j < 16; ++j) {
        const lo = Math.min(15, Math.trunc(Math.fround(x[j] * id) + 8.5)), hi = Math.min(15, Math.trunc(Math.fround(x[j + 16] * id) + 8.5));
        out.writeUInt8(lo | (hi << 4), o + 2 + j);
      }
    }
  }
  return out;
}

function writeGguf(file, c, type) {
  const D = c.hidden / c.heads;
  const kv = [];
  const u32 = (k, v) => kv.push([k, T.U32, (b) => b.u32(v)]);
  const f32 = (k, v) => kv.push([k, T.F32, (b) => b.f32(v)]);
  const str = (k, v) => kv.push([k, T.STRING, (b) => b.str(v)]);
  str("general.architecture", "llama");
  str("general.name", path.basename(file, ".gguf"));
  u32("general.file_type", GGML[type].file);
  u32("general.alignment", 32);
  u32("llama.context_length", c.ctx);
  u32("llama.embedding_length", c.hidden);
  u32("llama.block_count", c.layers);
  u32("llama.feed_forward_length", c.inter);
  u32("llama.attention.head_count", c.heads);
  u32("llama.attention.head_count_kv", c.kv);
  u32("llama.rope.dimension_count", D);
  f32("llama.rope.freq_base", 10000);
  f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
  str("tokenizer.ggml.model", "llama");
  const tokens = [], scores = [], types = [];
  for (let i = 0; i < c.vocab; ++i) {
    if (i === 0) tokens.push("<unk>"), types.push(2);
    else if (i === 1) tokens.push("<s>"), types.push(3);
    else if (i === 2) tokens.push("</s>"), types.push(3);
    else if (i < 3 + 256) tokens.push(`<0x${(i - 3).toString(16).toUpperCase().padStart(2, "0")}>`), types.push(6);
    else tokens.push(`\u2581t${i}`), types.push(1);
    scores.push(-i);
  }
  kv.push(["tokenizer.ggml.tokens", T.ARRAY, (b) => { b.u32(T.STRING); b.u64(tokens.length); for (const t of tokens) b.str(t); }]);
  kv.push(["tokenizer.ggml.scores", T.ARRAY, (b) => { b.u32(T.F32); b.u64(scores.length); for (const s of scores) b.f32(s); }]);
  kv.push(["tokenizer.ggml.token_type", T.ARRAY, (b) => { b.u32(T.I32); b.u64(types.length); for (const t of types) b.i32(t); }]);
  u32("tokenizer.ggml.bos_token_id", 1);
  u32("tokenizer.ggml.eos_token_id", 2);
  u32("tokenizer.ggml.unknown_token_id", 0);

  // Tensors: dims in ggml order (fastest first): a [out, in] weight is {in, out}.
  const tensors = [];
  const add = (name, dims, norm = false) => tensors.push({ name, dims, norm });
  add("token_embd.weight", [c.hidden, c.vocab]);
  for (let l = 0; l < c.layers; ++l) {
    add(`blk.${l}.attn_norm.weight`, [c.hidden], true);
    add(`blk.${l}.attn_q.weight`, [c.hidden, c.heads * D]);
    add(`blk.${l}.attn_k.weight`, [c.hidden, c.kv * D]);
    add(`blk.${l}.attn_v.weight`, [c.hidden, c.kv * D]);
    add(`blk.${l}.attn_output.weight`, [c.heads * D, c.hidden]);
    add(`blk.${l}.ffn_norm.weight`, [c.hidden], true);
    add(`blk.${l}.ffn_gate.weight`, [c.hidden, c.inter]);
    add(`blk.${l}.ffn_up.weight`, [c.hidden, c.inter]);
    add(`blk.${l}.ffn_down.weight`, [c.inter, c.hidden]);
  }
  add("output_norm.weight", [c.hidden], true);
  add("output.weight", [c.hidden, c.vocab]);

  const head = new Buf();
  head.push(Buffer.from("GGUF"));
  head.u32(3);
  head.u64(tensors.length);
  head.u64(kv.length);
  for (const [k, type, write] of kv) { head.str(k); head.u32(type); write(head); }
  let offset = 0;
  for (const t of tensors) {
    t.count = t.dims.reduce((a, b) => a * b, 1);
    t.type = t.norm ? "f32" : type;
    t.bytes = t.type === "f32" ? t.count * 4 : (t.count / 32) * GGML[t.type].bytes;
    t.offset = offset;
    head.str(t.name); head.u32(t.dims.length); for (const d of t.dims) head.u64(d); head.u32(GGML[t.type].id); head.u64(offset);
    offset += Math.ceil(t.bytes / 32) * 32;
  }
  const h = head.concat();
  const pad = (32 - (h.length % 32)) % 32;
  const tmp = file + ".partial";
  const fd = fs.openSync(tmp, "w");
  fs.writeSync(fd, h);
  fs.writeSync(fd, Buffer.alloc(pad));
  // Normal(0, 0.02) by Box-Muller from a 32-bit LCG: fixed, fast, and values do not matter.
  let s = 12345;
  const unif = () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) + 0.5) / 4294967296;
  for (const t of tensors) {
    const chunk = 1 << 20;  // a multiple of 32: blocks never straddle chunks
    for (let i = 0; i < t.count; i += chunk) {
      const n = Math.min(chunk, t.count - i), a = new Float32Array(n);
      if (t.norm) a.fill(1);
      else for (let j = 0; j < n; j += 2) {
        const r = Math.sqrt(-2 * Math.log(unif())) * 0.02, th = 2 * Math.PI * unif();
        a[j] = r * Math.cos(th);
        if (j + 1 < n) a[j + 1] = r * Math.sin(th);
      }
      fs.writeSync(fd, t.type === "f32" ? Buffer.from(a.buffer) : quantizeBlocks(t.type, a));
    }
    const tail = Math.ceil(t.bytes / 32) * 32 - t.bytes;
    if (tail) fs.writeSync(fd, Buffer.alloc(tail));
  }
  fs.closeSync(fd);
  fs.renameSync(tmp, file);  // a run that dies midway leaves no half-written model behind
}

const o = args();
const given = o.model.endsWith(".gguf");
const c = given ? { vocab: Number(o.vocab ?? 32000), ctx: Infinity } : PRESETS[o.model];
const P = Number(o["prompt-len"]), G = Number(o["gen-len"]), threads = Number(o.threads);
if (P + G > c.ctx) throw new Error(`llama_bench: --prompt-len + --gen-len = ${P + G} exceeds ${o.model}'s ${c.ctx} positions`);
const dir = o.dir ?? path.join(path.dirname(new URL(import.meta.url).pathname), "models");
const type = given ? "file" : (o.type ?? "f32");
let file = o.model;
if (!given) {
  fs.mkdirSync(dir, { recursive: true });
  if (!(type in GGML)) throw new Error(`llama_bench: --type must be f32, q8_0 or q4_0, found '${type}'`);
  file = path.join(dir, `${o.model}-${type}.gguf`);
  if (!fs.existsSync(file)) writeGguf(file, c, type);
}

const llama = await getLlama({ gpu: false, build: "never", logLevel: process.env.LLAMA_LOG ?? "error", maxThreads: 0 });
const model = await llama.loadModel({ modelPath: file, gpuLayers: 0, useMmap: (o.mmap ?? "1") !== "0" });
const context = await model.createContext({ contextSize: Math.max(P + G, 32), batchSize: Math.max(P, 1), threads, sequences: 1 });
const seq = context.getSequence();
const prompt = [];
for (let i = 0; i < P; ++i) prompt.push(3 + 256 + ((i * 7919) % (c.vocab - 259)));  // fixed ids, as edl's are
const t0 = performance.now();
await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, P - 1));
const t1 = performance.now();
let n = 0;
const t2 = performance.now();
for await (const tok of seq.evaluate([prompt[P - 1]], { temperature: 0 })) {
  if (++n >= G) break;
}
const t3 = performance.now();
const out = {
  model: given ? path.basename(o.model) : o.model, quant: given ? "file" : type === "f32" ? "none" : type, engine: "llama.cpp", llama_cpp: "node-llama-cpp 3.22.1", threads, prompt_len: P, gen_len: G,
  prefill_seconds: (t1 - t0) / 1e3, decode_seconds: (t3 - t2) / 1e3,
  prefill_tokens_per_s: (P - 1) / ((t1 - t0) / 1e3), decode_tokens_per_s: n / ((t3 - t2) / 1e3),
};
console.log(JSON.stringify(out));
await context.dispose();
await model.dispose();
await llama.dispose();
