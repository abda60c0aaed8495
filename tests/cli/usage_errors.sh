#!/usr/bin/env bash
# Errors that help: a misspelt flag or command gets the closest names suggested, a missing
# required flag is named with a pointer to --help, a bad value names the flag, the value and
# what is allowed; all of these exit with 2, a runtime error with 1, help and version with 0.
# None of these runs a model: every check fails before any file is read.
#   usage: usage_errors.sh EDL WORKDIR
set -euo pipefail
EDL=$1
W=$2
rm -rf "$W"
mkdir -p "$W"
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect CODE PATTERN command...: exits with CODE and stderr (or stdout for 0) holds PATTERN.
expect() {
  local code=$1 pattern=$2 rc=0
  shift 2
  "$@" >"$W/out" 2>"$W/err" || rc=$?
  [ "$rc" -eq "$code" ] || fail "'$*' exited with $rc, expected $code: $(cat "$W/err")"
  cat "$W/out" "$W/err" | grep -q -- "$pattern" || fail "'$*' does not say '$pattern': $(cat "$W/out" "$W/err")"
}

# Suggestions for misspelt flags and commands.
expect 2 "unknown flag --max-new-token; did you mean --max-new-tokens" "$EDL" generate --model m --max-new-token 5
expect 2 "did you mean --model?" "$EDL" generate --modle m
expect 2 "did you mean --model?" "$EDL" logits -model m
expect 2 "did you mean --temperature" "$EDL" chat --model m --temp 0.5
expect 2 "did you mean --max-new-tokens" "$EDL" generate --model m --max-new-tokens=3 --max-new-token=5
expect 2 'unknown command "genrate"; did you mean generate?' "$EDL" genrate --model m
expect 2 'unknown command "bench gnem"; did you mean bench gemm?' "$EDL" bench gnem
expect 2 'did you mean merge-lora?' "$EDL" merge-lroa
expect 2 "edl --help lists the commands" "$EDL" nonsense
expect 2 "expected one of its commands" "$EDL" bench
expect 2 "usage: edl <command>" "$EDL"

# A missing required flag is named, and --help is pointed to.
expect 2 "missing required flag --model" "$EDL" generate --prompt hi
expect 2 "edl generate --help" "$EDL" generate --prompt hi
expect 2 "missing required flag --tokens" "$EDL" logits --model m --out o.npy
expect 2 "missing required flag --method" "$EDL" quantize --model m --out o

# Bad values: the flag, the value and what is allowed.
expect 2 '--cache expects one of standard, int8, paged; found "pagd"; did you mean paged?' \
  "$EDL" generate --model m --prompt-tokens 1 --cache pagd
expect 2 '--max-new-tokens expects an integer, found "ten"' "$EDL" generate --model m --prompt-tokens 1 --max-new-tokens ten
expect 2 '--temperature expects a number, found "hot"' "$EDL" generate --model m --prompt-tokens 1 --temperature hot
expect 2 '--impl expects one of edl, openblas, both' "$EDL" bench gemm --impl mkl
expect 2 '--dtype expects one of f32, bf16, f16; found "f8"' "$EDL" bench decode --model tiny --dtype f8
expect 2 'drop --dtype or --quant' "$EDL" bench decode --model tiny --quant q8_0 --dtype bf16
expect 2 'unknown mesh axis "pp"' "$EDL" plan --config tiny --mesh pp=2
expect 2 '"bogus" is not a checkpoint name' "$EDL" bench train --config tiny --remat "save_only_these_names(attn_out, bogus)"
expect 2 'expected one of "", none, everything_saveable' "$EDL" bench train --config tiny --remat dots
expect 2 '-1 takes the devices left over' env EDL_DEVICES=3 "$EDL" plan --config tiny --mesh fsdp=2,tp=-1
expect 2 '--repetitions must be >= 1, found 0' "$EDL" bench decode --model tiny --repetitions 0
expect 2 'comma-separated integer token ids' "$EDL" detokenize --tokenizer t --ids 1,x

# Other usage errors: a flag twice, a value after a switch, flags that do not go together.
expect 2 "flag --batch is given 2 times" "$EDL" eval --model m --data d --batch 2 --batch 4
expect 2 'expected a flag starting with --, found "yes"' "$EDL" chat-template --tokenizer t --messages m --add-generation-prompt yes
expect 2 "disallowed flag override" "$EDL" chat-template --tokenizer t --messages m --add-generation-prompt=no
expect 2 "give exactly one of --prompt TEXT" "$EDL" generate --model m --prompt hi --prompt-tokens 1
expect 2 "--merge-adapter: needs --adapter DIR" "$EDL" logits --model m --tokens t --out o --merge-adapter
expect 2 "exactly one of --model" "$EDL" plan --mesh tp=1
expect 2 "expected one run folder" "$EDL" report
expect 2 "only bash is supported" "$EDL" completion zsh

# A runtime error exits with 1.
expect 1 "no such file or folder" "$EDL" inspect "$W/missing.safetensors"

# Help and version exit with 0, before any required flag is checked.
expect 0 "usage: edl generate --model" "$EDL" generate --help
expect 0 "usage: edl generate --model" "$EDL" generate -h
expect 0 "usage: edl generate --model" "$EDL" help generate
expect 0 "usage: edl generate --model" "$EDL" generate --max-new-token 5 --help
expect 0 "--max-new-tokens N" "$EDL" generate --help
expect 0 "bench decode" "$EDL" bench --help
expect 0 "measuring:" "$EDL" --help
expect 0 "^edl [0-9][0-9.]*$" "$EDL" --version
expect 0 "^instruction set: " "$EDL" --version
expect 0 "^MPI: \(yes\|no\)" "$EDL" --version
echo "usage errors: ok"
