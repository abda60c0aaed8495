// bench/serve_http.mjs: `edl serve` under N concurrent streaming clients, through the official
// openai client, as `edl bench serve` measures the engine in process: each round, N requests
// of P random prompt tokens are sent at once, greedy, G new tokens each (ignore_eos), and the
// round is timed from the first send to the last [DONE].
//   node bench/serve_http.mjs NODE_MODULES URL MODEL VOCAB N P G ROUNDS
// Prints one JSON line: requests_per_s, tokens_per_s (medians over rounds), and the time to
// first token and inter-token latency (p50, p99) over every request of every round.
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [nm, url, model, vocab, n, P, G, rounds] = process.argv.slice(2);
const N = Number(n), PL = Number(P), GL = Number(G), R = Number(rounds), V = Number(vocab);
const { default: OpenAI } = await import(pathToFileURL(join(nm, "openai", "index.mjs")).href);
const client = new OpenAI({ baseURL: url + "/v1", apiKey: "none", maxRetries: 0, timeout: 600000 });

let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
const prompt = () => Array.from({ length: PL }, () => 3 + Math.floor(rand() * (V - 3)));

async function one() {
  const t0 = performance.now();
  let first = -1, last = 0, tokens = 0;
  const gaps = [];
  const stream = await client.completions.create({ model, prompt: prompt(), max_tokens: GL, temperature: 0,
    ignore_eos: true, stream: true, stream_options: { include_usage: true } });
  for await (const ch of stream) {
    if (ch.usage) tokens = ch.usage.completion_tokens;
    if (!ch.choices.length || !ch.choices[0].text) continue;
    const t = performance.now();
    if (first < 0) first = t - t0;
    else gaps.push(t - last);
    last = t;
  }
  return { ttft: first / 1000, gaps: gaps.map((g) => g / 1000), tokens };
}

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] : null;
};
await one();  // warm-up
const tps = [], rps = [], ttft = [], itl = [];
for (let r = 0; r < R; r++) {
  const t0 = performance.now();
  const res = await Promise.all(Array.from({ length: N }, one));
  const wall = (performance.now() - t0) / 1000;
  const tokens = res.reduce((s, x) => s + x.tokens, 0);
  tps.push(tokens / wall);
  rps.push(N / wall);
  for (const x of res) ttft.push(x.ttft), itl.push(...x.gaps);
}
console.log(JSON.stringify({ clients: N, prompt_len: PL, gen_len: GL, rounds: R,
  requests_per_s: pct(rps, 50), tokens_per_s: pct(tps, 50),
  ttft_p50_s: pct(ttft, 50), ttft_p99_s: pct(ttft, 99), itl_p50_s: pct(itl, 50), itl_p99_s: pct(itl, 99) }));
