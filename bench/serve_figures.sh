#!/usr/bin/env bash
# HTTP serving figures (docs/benchmarks.md, "Serving over HTTP"): `edl bench serve` (the engine
# in process) and `edl serve` driven by bench/serve_http.mjs (openai client, streaming) and by
# edl_serve_load (the same requests from a C++ client that sleeps on its sockets: next to no CPU
# beside the server's, as a client on another machine) at 1, 4 and 16 concurrent clients, same
# prompts' length, same new tokens, same threads, one after the other on this machine. Prints
# one JSON line per measurement ("http" holds the client's line; edl_serve_load's says
# "client": "cpp").
#   bench/serve_figures.sh MODEL TOKENIZER_DIR [EDL] [HUB_DIR]
#     MODEL: an HF folder, or a preset (small) with TOKENIZER_DIR giving its vocabulary
set -euo pipefail
MODEL=$1
TOK=$2
EDL=${3:-build/examples/edl}
HUB=${4:-build/hub_tokenizers}
HERE=$(cd "$(dirname "$0")" && pwd)
LOAD=${LOAD:-$(dirname "$EDL")/edl_serve_load}
P=${P:-64}
G=${G:-64}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-$(nproc)}
# CLIENT_NICE: the load generator's niceness (0: as the server). On a machine where the client
# shares the server's cores, 19 lets the engine's threads run first, as a client on another
# machine would; the client then reads what the server already sent.
CLIENT_NICE=${CLIENT_NICE:-0}
# SERVE_ARGS: more flags of edl serve (say --burst-window 0).
bash "$HERE/../scripts/fetch_hub_tokenizers.sh" "$HUB"
VOCAB=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$MODEL/config.json" 2>/dev/null || echo 32000)
"$EDL" bench serve --model "$MODEL" --requests 1,4,16 --prompt-len "$P" --gen-len "$G" --threads "$THREADS" --rounds "$ROUNDS" |
  sed 's/^/{"in_process": /; s/$/}/'
out=$(mktemp)
"$EDL" serve --model "$MODEL" --tokenizer "$TOK" --port 0 --max-batch 16 --threads "$THREADS" ${SERVE_ARGS:-} >"$out" 2>/dev/null &
PID=$!
trap 'kill $PID 2>/dev/null; rm -f "$out"' EXIT
for _ in $(seq 1 600); do grep -q listening "$out" && break; sleep 0.1; done
URL=$(/usr/bin/python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["listening"])' "$out")
NAME=$(basename "$MODEL")
for n in 1 4 16; do
  nice -n "$CLIENT_NICE" node "$HERE/serve_http.mjs" "$HUB/node_modules" "$URL" "$NAME" "$VOCAB" "$n" "$P" "$G" "$ROUNDS" | sed "s/^/{\"client_nice\": $CLIENT_NICE, \"http\": /; s/\$/}/"
  if [[ -x $LOAD ]]; then
    nice -n "$CLIENT_NICE" "$LOAD" "$URL" "$NAME" "$VOCAB" "$n" "$P" "$G" "$ROUNDS" | sed "s/^/{\"client_nice\": $CLIENT_NICE, \"http\": /; s/\$/}/"
  fi
done
