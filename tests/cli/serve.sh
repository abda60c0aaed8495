#!/usr/bin/env bash
# `edl serve` end to end: a model trained by `edl train` (with a chat template), served on a
# loopback port and driven by the official `openai` npm client (tests/cli/serve_client.mjs:
# greedy answers equal `edl generate`'s tokens, streaming, concurrency, seeds, logprobs, stop
# strings, errors, a soak), then curl: health, the API key, a slow half-sent request, the
# listening line, and SIGTERM during a streamed answer (exit 0, the answer ends); then a server
# on a mesh (dp x tp x sp), one with --dtype bf16 and one with --kv-cache int8 whose concurrent
# greedy answers are `edl generate`'s tokens; the mesh server also takes the load generator
# edl_serve_load's concurrent streams (every token counted).
#   usage: serve.sh EDL WORKDIR NODE_MODULES [EDL_SERVE_LOAD]
set -euo pipefail
EDL=$1
W=$2
NM=$3
LOAD=${4:-}
PY=/usr/bin/python3
command -v "$PY" >/dev/null || PY=python3
rm -rf "$W"
mkdir -p "$W"
fail() {
  echo "FAIL: $*" >&2
  if [ -f "$W/server.err" ]; then echo "--- the server's stderr (last lines):" >&2; tail -20 "$W/server.err" >&2; fi
  exit 1
}
# Any other command that fails says which one, where, and with what status (set -e alone exits
# silently, e.g. when curl cannot connect).
set -E
trap 'rc=$?; trap - ERR; fail "line $LINENO: \"$BASH_COMMAND\" exited with $rc"' ERR
[ -f "$NM/openai/package.json" ] || fail "$NM has no openai client: run scripts/fetch_hub_tokenizers.sh"
command -v curl >/dev/null || fail "curl is missing"

source "$(dirname "$0")/tiny_chat_model.sh"
make_tiny_chat_model "$EDL" "$W"
# What the server must answer: `edl generate` on the same prompts, greedy, 8 new tokens.
#   expect_from_generate OUT.json [generate flags]
expect_from_generate() {
  local out=$1
  shift
  "$EDL" generate --model "$C" --chat "$W/chat.json" --max-new-tokens 8 --greedy "$@" >"$W/chat_out.json"
  for k in 0 1 2; do
    text=("the user asks 1" "and the assistant" "answers 42 and")
    ids=$("$EDL" tokenize --tokenizer "$C" --text "${text[$k]}" --add-special-tokens |
          $PY -c 'import json,sys; print(",".join(map(str, json.load(sys.stdin)["ids"])))')
    "$EDL" generate --model "$C" --prompt-tokens "$ids" --max-new-tokens 8 --greedy "$@" >"$W/c$k.json"
    echo "$ids" >"$W/c$k.ids"
  done
  $PY - "$W" "$out" <<'PY'
import json, sys
w = sys.argv[1]
chat = json.load(open(w + "/chat_out.json"))
comps = []
for k in range(3):
    g = json.load(open(f"{w}/c{k}.json"))
    ids = [int(x) for x in open(f"{w}/c{k}.ids").read().strip().split(",")]
    comps.append({"prompt_ids": ids, "tokens": g["tokens"], "text": g["text"]})
json.dump({"model": "served", "max_tokens": 8,
           "chat": {"messages": json.load(open(w + "/chat.json")), "tokens": chat["tokens"], "text": chat["text"]},
           "completions": comps}, open(sys.argv[2], "w"))
PY
}
expect_from_generate "$W/expect.json"

# The server: a free port, a key, a small body limit, short timeouts.
start_server() {
  "$EDL" serve --model "$C" --served-model-name served --port 0 --api-key sekret --max-batch 4 --max-queue 16 \
    --max-body-bytes 200000 --timeout 2 --threads 1 --shutdown-grace 5 "$@" >"$W/server.out" 2>"$W/server.err" &
  PID=$!
  for _ in $(seq 1 200); do
    URL=$($PY -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["listening"])' "$W/server.out" 2>/dev/null) && break
    kill -0 $PID 2>/dev/null || fail "edl serve exited before listening"
    sleep 0.1
  done
  [ -n "${URL:-}" ] || fail "no listening line"
  case "$URL" in http://127.0.0.1:[0-9]*) ;; *) fail "listening line: $URL" ;; esac
}
URL=
start_server
trap 'kill $PID 2>/dev/null || true' EXIT

# curl: health without a key, /v1 without a key is 401 with an OpenAI error object.
[ "$(curl -s "$URL/health")" = '{"status":"ok"}' ] || fail "/health"
code=$(curl -s -o "$W/401.json" -w '%{http_code}' "$URL/v1/models") || fail "curl $URL/v1/models failed ($?)"
[ "$code" = 401 ] && grep -q '"code":"invalid_api_key"' "$W/401.json" || fail "no key: $code $(cat "$W/401.json")"
# A slow client that never finishes its request is dropped after --timeout; others are served.
exec 3<>"/dev/tcp/127.0.0.1/${URL##*:}"
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"prompt": ' >&3
curl -s -H 'Authorization: Bearer sekret' "$URL/v1/models" | grep -q '"id":"served"' || fail "served while a request is half-sent"
sleep 3
exec 3>&-

# The client's output is kept whole; a client killed by a signal (not by a failed check) is
# reported and run once more, as long as the server is still up.
run_client() {
  local rc=0
  node "$(dirname "$0")/serve_client.mjs" "$NM" "$URL" sekret "$W/expect.json" >"$W/client.txt" 2>&1 || rc=$?
  cat "$W/client.txt"
  return $rc
}
rc=0
run_client || rc=$?
if [ "$rc" -gt 128 ] && kill -0 $PID 2>/dev/null; then
  echo "the client (node) died of signal $((rc - 128)); running it again" >&2
  rc=0
  run_client || rc=$?
fi
kill -0 $PID 2>/dev/null || fail "edl serve died during the client checks"
[ "$rc" = 0 ] || fail "the openai client checks failed (exit $rc)"

# A burst of connections while the server is busy (here: stopped) waits in the kernel's accept
# queue instead of being dropped: 64 connects all complete their handshake. cpp-httplib's own
# backlog (5) dropped the others' handshakes, and a burst of 16 clients waited for retransmits.
kill -STOP $PID
burst=$($PY - "${URL##*:}" <<'PY'
import select, socket, sys, time
port, socks = int(sys.argv[1]), []
for _ in range(64):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    socks.append(s)
done, deadline = set(), time.time() + 2
while len(done) < len(socks) and time.time() < deadline:
    _, w, _ = select.select([], [s for s in socks if s not in done], [], 0.1)
    done.update(s for s in w if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
print(len(done))
for s in socks: s.close()
PY
)
kill -CONT $PID
[ "$burst" = 64 ] || fail "only $burst of 64 connections made at once got through the server's listen queue"
curl -s "$URL/health" | grep -q ok || fail "/health after the burst of connections"

# SIGTERM while an answer streams: the stream ends (its last event is [DONE]) and edl serve
# exits 0 within the grace period.
curl -sN -H 'Authorization: Bearer sekret' -H 'Content-Type: application/json' "$URL/v1/completions" \
  -d '{"prompt": "the user", "max_tokens": 100, "temperature": 1.0, "stream": true}' >"$W/sigterm_stream.txt" &
CURL=$!
sleep 0.5
kill -TERM $PID
t0=$(date +%s)
wait $PID || fail "edl serve exited with $? after SIGTERM"
[ $(( $(date +%s) - t0 )) -le 10 ] || fail "shutdown took more than 10 s"
wait $CURL || true
tail -c 200 "$W/sigterm_stream.txt" | grep -q 'data: \[DONE\]' || fail "the stream in flight at SIGTERM did not end: $(tail -c 200 "$W/sigterm_stream.txt")"
trap - EXIT

# Concurrent greedy answers (a chat, three completions, one of them streamed) are those of
# EXPECT.json.   concurrent_answers_equal EXPECT.json WHAT
concurrent_answers_equal() {
  $PY - "$URL" "$1" <<'PY' || fail "$2"
import json, sys, threading, urllib.request
url, want = sys.argv[1], json.load(open(sys.argv[2]))
def post(path, body):
    r = urllib.request.Request(url + path, json.dumps(body).encode(),
                               {"Content-Type": "application/json", "Authorization": "Bearer sekret"})
    return urllib.request.urlopen(r, timeout=60).read().decode()
got, errors = {}, []
def chat():
    got["chat"] = json.loads(post("/v1/chat/completions", {"model": "served", "messages": want["chat"]["messages"],
        "max_tokens": want["max_tokens"], "temperature": 0, "return_token_ids": True}))["choices"][0]["token_ids"]
def comp(i, stream):
    body = {"model": "served", "prompt": want["completions"][i]["prompt_ids"], "max_tokens": want["max_tokens"],
            "temperature": 0, "return_token_ids": True, "stream": stream}
    text = post("/v1/completions", body)
    if not stream:
        got[i] = json.loads(text)["choices"][0]["token_ids"]
        return
    got[i] = "".join(c["text"] for line in text.splitlines() if line.startswith("data: {")
                     for c in json.loads(line[6:])["choices"])
    if not text.rstrip().endswith("data: [DONE]"): errors.append(f"stream {i} did not end with [DONE]")
ts = [threading.Thread(target=chat)] + [threading.Thread(target=comp, args=(i, i == 1)) for i in range(3)]
for t in ts: t.start()
for t in ts: t.join()
if got.get("chat") != want["chat"]["tokens"]: errors.append(f"chat {got.get('chat')} != {want['chat']['tokens']}")
for i in range(3):
    if got.get(i) != want["completions"][i]["text" if i == 1 else "tokens"]: errors.append(f"completion {i}: {got.get(i)} != {want['completions'][i]['tokens']}")
for e in errors: print("FAIL:", e)
sys.exit(1 if errors else 0)
PY
}

# On a mesh (tp = 2 heads x sp = 2 cache positions, dp = 2 slot groups: eight devices, threads of
# the one process): concurrent greedy answers are `edl generate`'s tokens (a streamed one its text).
URL=
start_server --mesh dp=2,tp=2,sp=2
trap 'kill $PID 2>/dev/null || true' EXIT
concurrent_answers_equal "$W/expect.json" "the mesh server's answers"
if [ -n "$LOAD" ]; then
  # 3 concurrent streams of 6 new tokens, two rounds: the usage of every stream adds up, and
  # each stream's text arrived in chunks that were timed.
  vocab=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$C/config.json")
  "$LOAD" "$URL" served "$vocab" 3 5 6 2 sekret >"$W/load.json" 2>"$W/load.err" || fail "edl_serve_load: $(cat "$W/load.err")"
  $PY - "$W/load.json" <<'PY' || fail "edl_serve_load's figures: $(cat "$W/load.json")"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["client"] == "cpp" and j["clients"] == 3 and j["rounds"] == 2, j
assert j["completion_tokens"] == 3 * 6 * 2, j
assert j["tokens_per_s"] > 0 and j["requests_per_s"] > 0, j
assert 0 < j["ttft_p50_s"] <= j["ttft_p99_s"] and 0 < j["itl_p50_s"] <= j["itl_p99_s"], j
PY
  "$LOAD" "$URL" served "$vocab" 1 5 6 1 wrong-key >/dev/null 2>"$W/load_401.err" && fail "edl_serve_load with a wrong key succeeded"
  grep -q "status 401" "$W/load_401.err" || fail "edl_serve_load with a wrong key: $(cat "$W/load_401.err")"
fi
kill -TERM $PID
wait $PID || fail "the mesh server exited with $? after SIGTERM"
trap - EXIT

# --dtype bf16: the weights converted after loading; the answers are `edl generate --dtype
# bf16`'s tokens.
expect_from_generate "$W/expect_bf16.json" --dtype bf16
URL=
start_server --dtype bf16
trap 'kill $PID 2>/dev/null || true' EXIT
concurrent_answers_equal "$W/expect_bf16.json" "the bf16 server's answers"
kill -TERM $PID
wait $PID || fail "the bf16 server exited with $? after SIGTERM"
trap - EXIT

# --kv-cache int8: int8 pages hold what generate's int8 cache holds; the answers are `edl
# generate --cache int8`'s tokens.
expect_from_generate "$W/expect_int8.json" --cache int8
URL=
start_server --kv-cache int8
trap 'kill $PID 2>/dev/null || true' EXIT
concurrent_answers_equal "$W/expect_int8.json" "the int8-cache server's answers"
kill -TERM $PID
wait $PID || fail "the int8-cache server exited with $? after SIGTERM"
trap - EXIT
echo "serve: all checks passed"
