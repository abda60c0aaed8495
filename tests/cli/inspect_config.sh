#!/usr/bin/env bash
# cli.inspect_config: `edl inspect` validates the folder's config.json against edl's rules and
# the tensors beside it, and never reports a config it cannot check as valid.
#   tests/cli/inspect_config.sh EDL TINY_HF_DIR WORKDIR
set -euo pipefail
EDL=$1 TINY=$2 W=$3
rm -rf "$W" && mkdir -p "$W/ok"
cp "$TINY/model.safetensors" "$TINY/config.json" "$W/ok/"
fail() { echo "FAIL: $*" >&2; exit 1; }
check() {  # check NAME EXPECTED_OK PATTERN: config_check.ok and a part of its error
  local out
  out=$("$EDL" inspect --path "$W/$1")
  echo "$out" | grep -q "\"config_check\":{\"ok\":$2" || fail "$1: expected ok $2 in: ${out: -300}"
  [ -z "$3" ] || echo "$out" | grep -q "$3" || fail "$1: expected \"$3\" in: ${out: -300}"
}
variant() {  # variant NAME PYTHON_EXPR_ON_c: a copy of the folder with config.json edited
  mkdir -p "$W/$1" && cp "$TINY/model.safetensors" "$W/$1/"
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); exec(sys.argv[3]); json.dump(c, open(sys.argv[2], "w"))' \
    "$TINY/config.json" "$W/$1/config.json" "$2"
}
check ok true ""
variant wrong_type 'c["hidden_size"] = "16"';                         check wrong_type false "hidden_size"
variant zero 'c["num_hidden_layers"] = 0';                            check zero false "must be positive"
variant heads 'c["num_key_value_heads"] = 3';                         check heads false "divisible"
variant huge 'c["vocab_size"] = 10**12';                              check huge false "above the largest"
variant no_type 'del c["model_type"]';                                check no_type false "no model_type"
variant gpt2 'c["model_type"] = "gpt2"';                              check gpt2 false "not one edl reads"
variant shapes 'c["intermediate_size"] = c["intermediate_size"] * 2'; check shapes false "shape_mismatch\":\[{"
# A key given twice is no valid config.json at all: an error naming the file.
mkdir -p "$W/dup" && cp "$TINY/model.safetensors" "$W/dup/"
sed 's/{/{"hidden_size": 8, /' "$TINY/config.json" > "$W/dup/config.json"
if "$EDL" inspect --path "$W/dup" > /dev/null 2> "$W/dup.err"; then fail "duplicate key accepted"; fi
grep -q "duplicate key \"hidden_size\"" "$W/dup.err" || fail "dup: $(cat "$W/dup.err")"
# edl plan takes the same file as --config FILE.json: the plan of --model DIR, and a bad
# config.json is refused the same way.
plan() { "$EDL" plan "$@" --mesh fsdp=2 --batch 2 --seq 8 --train | python3 -c \
  'import json,sys; d=json.load(sys.stdin); d.pop("model"); print(json.dumps(d, sort_keys=True))'; }
[ "$(plan --model "$W/ok")" = "$(plan --config "$W/ok/config.json")" ] || fail "plan --config FILE.json differs from --model DIR"
if "$EDL" plan --config "$W/zero/config.json" > /dev/null 2> "$W/plan.err"; then fail "plan took a zero-layer config"; fi
grep -q "num_hidden_layers" "$W/plan.err" || fail "plan: $(cat "$W/plan.err")"
echo "inspect config checks: 11 passed, 0 failed"
