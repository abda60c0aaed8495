// tests/cli/serve_client.mjs: drives `edl serve` with the official `openai` client (and plain
// fetch for what a client library would never send), checking every answer.
//   node serve_client.mjs NODE_MODULES BASE_URL API_KEY EXPECT.json
// EXPECT.json (written by serve.sh from `edl generate` runs):
//   {"model", "max_tokens", "chat": {"messages", "tokens", "text"},
//    "completions": [{"prompt_ids", "tokens", "text"}, ...]}
// Exit code 0 when every check passes; each failure prints "FAIL: ..." and the run exits 1.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, baseURL, apiKey, expectFile] = process.argv.slice(2);
// Node exits with 13, silently (the exit event sees 0), when the event loop empties while the
// top level still awaits. That was seen, rarely, with no check failed and nothing printed: a
// request in flight held nothing that kept the loop alive. A timer held for the whole run keeps
// it alive, so such a request ends with its answer or the client's timeout; a step still
// waiting after 300 s is reported by name, as is a run that ends unfinished.
let step = "loading the openai client", request = "";
let finished = false;
process.on("exit", (code) => {  // an uncaught error exits with 1 and prints its own stack
  if (!finished && code === 0) console.log(`FAIL: nothing left to run while awaiting: ${step} (last request: ${request})`);
});
const started = Date.now();
setInterval(() => {
  if (Date.now() - started < 300000) return;
  console.log(`FAIL: still awaiting after 300 s: ${step} (last request: ${request})`);
  finished = true;
  process.exit(1);
}, 1000);
const at = (what) => { step = what; };
const { default: OpenAI } = await import(pathToFileURL(join(nodeModules, "openai", "index.mjs")).href);
const want = JSON.parse(readFileSync(expectFile, "utf8"));
const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey, maxRetries: 0, timeout: 60000 });
const M = want.max_tokens;
let failures = 0;
const check = (ok, what) => {
  if (!ok) {
    failures++;
    console.log("FAIL: " + what);
  }
};
const eq = (a, b) => JSON.stringify(a) === JSON.stringify(b);

async function chatOnce(extra = {}) {
  request = "chat " + JSON.stringify(extra);
  return client.chat.completions.create({ model: want.model, messages: want.chat.messages, max_tokens: M,
                                          temperature: 0, return_token_ids: true, ...extra });
}
async function completionOnce(i, extra = {}) {
  request = `completion ${i} ` + JSON.stringify(extra);
  return client.completions.create({ model: want.model, prompt: want.completions[i].prompt_ids, max_tokens: M,
                                     temperature: 0, return_token_ids: true, ...extra });
}
async function streamText(stream) {
  let text = "", finish = null, usage = null, roles = 0, chunks = 0;
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      const piece = c.delta ? c.delta.content : c.text;
      if (c.delta && c.delta.role) roles++;
      if (piece) text += piece;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage, roles, chunks };
}
/// fetch with the key; returns [status, parsed body or text].
async function raw(path, body, headers = {}) {
  request = `${path} with ${body === undefined ? "no body" : body.length + " bytes"}`;
  const r = await fetch(baseURL + path, { method: body === undefined ? "GET" : "POST", body,
    headers: { "Content-Type": "application/json", Authorization: "Bearer " + apiKey, ...headers } });
  const t = await r.text();
  try { return [r.status, JSON.parse(t)]; } catch { return [r.status, t]; }
}
const isError = (b, code) => b && b.error && typeof b.error.message === "string" && "type" in b.error &&
  "param" in b.error && "code" in b.error && (code === undefined || b.error.code === code);

// 1. Models, then greedy answers equal `edl generate`'s tokens.
at("1. Models, then greedy answers equal `edl generate`'s tokens");
const models = await client.models.list();
check(models.data.length === 1 && models.data[0].id === want.model, "models.list: " + JSON.stringify(models.data));
const chat = await chatOnce();
check(eq(chat.choices[0].token_ids, want.chat.tokens), `chat tokens ${JSON.stringify(chat.choices[0].token_ids)} != generate's ${JSON.stringify(want.chat.tokens)}`);
check(chat.choices[0].message.content === want.chat.text, `chat text ${JSON.stringify(chat.choices[0].message.content)} != ${JSON.stringify(want.chat.text)}`);
check(chat.object === "chat.completion" && chat.id.startsWith("chatcmpl-") && chat.model === want.model, "chat envelope");
check(chat.usage.completion_tokens === want.chat.tokens.length &&
      chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, "chat usage " + JSON.stringify(chat.usage));
check(["stop", "length"].includes(chat.choices[0].finish_reason), "chat finish_reason " + chat.choices[0].finish_reason);
for (let i = 0; i < want.completions.length; i++) {
  const c = await completionOnce(i);
  check(eq(c.choices[0].token_ids, want.completions[i].tokens), `completion ${i} tokens differ from generate's`);
  check(c.choices[0].text === want.completions[i].text, `completion ${i} text ${JSON.stringify(c.choices[0].text)}`);
  check(c.object === "text_completion" && c.usage.prompt_tokens === want.completions[i].prompt_ids.length, "completion envelope");
}

// 2. Streaming gives the same text, a role chunk, the finish reason, usage on request, [DONE].
at("2. Streaming gives the same text, a role chunk, the finish reason, usage on request, [DONE]");
{
  const s = await streamText(await client.chat.completions.create({ model: want.model, messages: want.chat.messages,
    max_tokens: M, temperature: 0, stream: true, stream_options: { include_usage: true } }));
  check(s.text === want.chat.text, `streamed chat text ${JSON.stringify(s.text)}`);
  check(s.roles === 1 && s.finish === chat.choices[0].finish_reason, "streamed chat role/finish");
  check(s.usage && s.usage.completion_tokens === want.chat.tokens.length, "streamed usage " + JSON.stringify(s.usage));
  const c = await streamText(await client.completions.create({ model: want.model, prompt: want.completions[0].prompt_ids,
    max_tokens: M, temperature: 0, stream: true }));
  check(c.text === want.completions[0].text && c.usage === null, "streamed completion text " + JSON.stringify(c.text));
  const r = await fetch(baseURL + "/v1/completions", { method: "POST", headers: { Authorization: "Bearer " + apiKey },
    body: JSON.stringify({ prompt: want.completions[0].prompt_ids, max_tokens: 2, stream: true }) });
  const body = await r.text();
  check(r.headers.get("content-type").startsWith("text/event-stream") && body.trimEnd().endsWith("data: [DONE]"),
        "SSE framing: " + body.slice(-80));
}

// 3. Concurrent requests: each equals its answer alone.
at("3. Concurrent requests");
{
  const jobs = [];
  for (let k = 0; k < 12; k++) {
    const i = k % want.completions.length;
    jobs.push(k % 3 === 0 ? chatOnce().then((r) => eq(r.choices[0].token_ids, want.chat.tokens))
                          : completionOnce(i).then((r) => eq(r.choices[0].token_ids, want.completions[i].tokens)));
  }
  const ok = await Promise.all(jobs);
  check(ok.every((x) => x), "concurrent answers: " + JSON.stringify(ok));
}

// 4. Sampling: the same seed gives the same n choices; logprobs are a distribution's.
at("4. Sampling");
{
  const a = await chatOnce({ temperature: 1.0, seed: 123, n: 3, max_tokens: M });
  const b = await chatOnce({ temperature: 1.0, seed: 123, n: 3, max_tokens: M });
  check(a.choices.length === 3 && eq(a.choices.map((c) => c.token_ids), b.choices.map((c) => c.token_ids)),
        "seeded n=3 differs between runs");
  const lp = await chatOnce({ logprobs: true, top_logprobs: 3 });
  const content = lp.choices[0].logprobs.content;
  check(content.length === lp.usage.completion_tokens, "one logprob entry per token");
  for (const e of content) {
    check(e.logprob <= 0 && e.top_logprobs.length === 3, "logprob entry " + JSON.stringify(e));
    check(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, "greedy token is the most likely");
    check(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob, "top_logprobs sorted");
    const mass = e.top_logprobs.reduce((s, t) => s + Math.exp(t.logprob), 0);
    check(mass <= 1 + 1e-5, "top mass " + mass);
  }
  const cl = await completionOnce(0, { logprobs: 2 });
  check(cl.choices[0].logprobs.tokens.length === cl.usage.completion_tokens &&
        cl.choices[0].logprobs.top_logprobs.every((t) => Object.keys(t).length <= 2), "completion logprobs");
}

// 5. Stop strings: the text ends before the first occurrence and the stop string is not returned.
at("5. Stop strings");
{
  const text = want.completions[0].text;
  const stop = text.length >= 4 ? text.slice(2, 4) : null;
  if (stop && stop.trim().length) {
    const c = await completionOnce(0, { stop: [stop] });
    const s = await streamText(await client.completions.create({ model: want.model, prompt: want.completions[0].prompt_ids,
      max_tokens: M, temperature: 0, stream: true, stop }));
    check(c.choices[0].text === text.slice(0, text.indexOf(stop)) && c.choices[0].finish_reason === "stop",
          `stop ${JSON.stringify(stop)}: ${JSON.stringify(c.choices[0].text)} from ${JSON.stringify(text)}`);
    check(s.text === c.choices[0].text && s.finish === "stop", "streamed stop " + JSON.stringify(s));
  }
}

// 6. Errors: OpenAI error objects with the right status, through the client and raw.
at("6. Errors");
async function status(p) {
  try { await p; return 200; } catch (e) { return e.status; }
}
check(await status(client.chat.completions.create({ model: "no-such-model", messages: want.chat.messages })) === 404, "unknown model 404");
check(await status(chatOnce({ max_tokens: -1 })) === 400, "negative max_tokens 400");
check(await status(chatOnce({ max_tokens: 1e9 })) === 400, "huge max_tokens 400");
check(await status(new OpenAI({ baseURL: baseURL + "/v1", apiKey: "wrong", maxRetries: 0 }).models.list()) === 401, "wrong key 401");
{
  let [s, b] = await raw("/v1/chat/completions", "{not json");
  check(s === 400 && isError(b, "invalid_json"), "malformed JSON: " + s + " " + JSON.stringify(b));
  [s, b] = await raw("/v1/chat/completions", JSON.stringify({ messages: "hi" }));
  check(s === 400 && isError(b) && b.error.param === "messages", "wrong type: " + JSON.stringify(b));
  [s, b] = await raw("/v1/completions", Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]));
  check(s === 400 && isError(b), "invalid UTF-8: " + s);
  [s, b] = await raw("/v1/completions", JSON.stringify({ prompt: "x ".repeat(5000), max_tokens: 2 }));
  check(s === 400 && isError(b, "context_length_exceeded"), "prompt over the context: " + JSON.stringify(b));
  [s, b] = await raw("/v1/completions", JSON.stringify({ prompt: [1, 2, 1 << 30] }));
  check(s === 400 && isError(b) && b.error.param === "prompt", "token id outside the vocabulary");
  [s, b] = await raw("/v1/nothing", "{}");
  check(s === 404 && isError(b), "unknown route: " + s);
  [s, b] = await raw("/v1/completions", JSON.stringify({ prompt: "y".repeat(300000) }));
  check(s === 413 && isError(b, "payload_too_large"), "body over the limit: " + s + " " + JSON.stringify(b).slice(0, 200));
}

// 7. A client that leaves mid-stream: its request is cancelled (the server keeps serving).
at("7. A client that leaves mid-stream");
{
  const ac = new AbortController();
  const stream = await client.completions.create({ model: want.model, prompt: want.completions[0].prompt_ids,
    max_tokens: 100, temperature: 1.0, stream: true }, { signal: ac.signal });
  try {
    for await (const _ of stream) { ac.abort(); }
  } catch { /* aborted */ }
  const c = await completionOnce(0);
  check(eq(c.choices[0].token_ids, want.completions[0].tokens), "answer after an abandoned stream");
}

// 8. Soak: several clients, a few hundred mixed good and bad requests; every good answer is
at("8. Soak");
// checked, and the resident memory after a second round is where the first round left it.
async function metric(name) {
  const [, text] = await raw("/metrics");
  const m = text.match(new RegExp("^" + name + " (\\d+)", "m"));
  return m ? Number(m[1]) : NaN;
}
async function soak(perClient, clients) {
  let bad = 0;
  const worker = async (w) => {
    for (let k = 0; k < perClient; k++) {
      const kind = (k + w) % 6, i = (k + w) % want.completions.length;
      if (kind === 0) bad += !eq((await chatOnce()).choices[0].token_ids, want.chat.tokens);
      else if (kind === 1) bad += !eq((await completionOnce(i)).choices[0].token_ids, want.completions[i].tokens);
      else if (kind === 2) bad += (await streamText(await client.completions.create({ model: want.model,
        prompt: want.completions[i].prompt_ids, max_tokens: M, temperature: 0, stream: true }))).text !== want.completions[i].text;
      else if (kind === 3) bad += (await raw("/v1/chat/completions", "[1, 2"))[0] !== 400;
      else if (kind === 4) bad += (await raw("/v1/completions", JSON.stringify({ prompt: "a", max_tokens: "x" })))[0] !== 400;
      else bad += (await status(client.chat.completions.create({ model: "other", messages: want.chat.messages }))) !== 404;
    }
  };
  await Promise.all(Array.from({ length: clients }, (_, w) => worker(w)));
  return bad;
}
{
  check((await soak(20, 6)) === 0, "soak round 1: wrong answers");
  const idle = await metric("process_resident_memory_bytes");
  check((await soak(50, 6)) === 0, "soak round 2: wrong answers");
  const after = await metric("process_resident_memory_bytes");
  console.log(JSON.stringify({ soak_requests: 420, rss_after_round1: idle, rss_after_round2: after }));
  check(after - idle < 8 * 1024 * 1024, `resident memory grew by ${after - idle} bytes over 300 requests`);
  check((await metric("edl_requests_waiting")) === 0 && (await metric("edl_requests_running")) === 0 &&
        (await metric("edl_kv_pages_used")) === 0, "the engine is idle after the soak");
  const [, text] = await raw("/metrics");
  check(/edl_requests_total\{endpoint="\/v1\/chat\/completions",status="200"\} \d+/.test(text) &&
        /edl_time_to_first_token_seconds_bucket\{le="\+Inf"\} [1-9]/.test(text) &&
        /edl_inter_token_latency_seconds_count [1-9]/.test(text), "metrics exposition");
}

console.log(failures ? `${failures} checks failed` : "all checks passed");
finished = true;
process.exit(failures ? 1 : 0);
