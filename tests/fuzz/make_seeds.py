#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<reader>/): small valid files
of each format and a few hand-written bad ones. Run from the project root:
    python3 tests/fuzz/make_seeds.py
Copies the project's own fixtures where they are small (configs, chat templates, training JSON).
corpus/tokenizer/byte_level_bpe.json (also the fixed tokenizer of the text inputs) is the
tokenizer.json that `edl train --config examples/train_fortunes.json` trains; text.txt is by hand."""
import json, os, shutil, struct, glob

ROOT = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(os.path.dirname(ROOT))


def out(reader, name, data):
    d = os.path.join(ROOT, "corpus", reader)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None, pad=0):
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode() + b" " * pad
    return struct.pack("<Q", len(h)) + h + data


f32 = lambda *v: struct.pack("<%df" % len(v), *v)
out("safetensors", "f32_bf16.safetensors", safetensors(
    [("a", "F32", [2, 2], f32(1, 2, 3, 4)), ("b", "BF16", [3], b"\x80\x3f\x00\x40\x40\x40"), ("c", "I64", [1], struct.pack("<q", 7))],
    {"format": "pt"}, pad=5))
out("safetensors", "f16_f64_empty.safetensors", safetensors(
    [("h", "F16", [2], b"\x00\x3c\x00\xc0"), ("d", "F64", [1], struct.pack("<d", 0.5)), ("e", "F32", [0, 3], b""),
     ("u", "U8", [4], b"\x01\x02\x03\x04")]))
out("safetensors", "bad_overlap.safetensors",
    struct.pack("<Q", 66) + b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'[:66] + b"\0" * 4)

out("index", "two_shards.json", json.dumps({"metadata": {"total_size": 20}, "weight_map": {
    "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
out("index", "bad_path.json", '{"weight_map": {"a": "../model-00001-of-00002.safetensors"}}')

for src in ["tests/data/tiny_hf/config.json", "tests/data/tiny_qwen2/config.json", "tests/data/tiny_qwen3/config.json"]:
    shutil.copy(os.path.join(PROJECT, src), os.path.join(ROOT, "corpus", "config", src.split("/")[2] + ".json")) \
        if os.makedirs(os.path.join(ROOT, "corpus", "config"), exist_ok=True) is None else None
out("config", "rope_llama3.json", json.dumps({"model_type": "llama", "vocab_size": 512, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}, "tie_word_embeddings": True}))

out("generation_config", "sampling.json", json.dumps({"do_sample": True, "temperature": 0.7, "top_p": 0.9,
    "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "max_new_tokens": 64, "eos_token_id": [2, 32000],
    "bos_token_id": 1, "pad_token_id": 0}))
out("generation_config", "greedy.json", '{"do_sample": false, "max_length": 128, "eos_token_id": 2}')


def npy(descr, shape, raw, major=1):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, "(%s)" % "".join("%d, " % s for s in shape) if len(shape) != 1 else "(%d,)" % shape[0])
    hl = 10 if major == 1 else 12
    d += " " * ((64 - (hl + len(d) + 1) % 64) % 64) + "\n"
    head = b"\x93NUMPY" + bytes([major, 0]) + (struct.pack("<H", len(d)) if major == 1 else struct.pack("<I", len(d)))
    return head + d.encode() + raw


out("npy", "i64_2x3.npy", npy("<i8", [2, 3], struct.pack("<6q", 1, 2, 3, 4, 5, 6)))
out("npy", "f4_scalar_v2.npy", npy("<f4", [], f32(1.5), major=2))
out("npy", "u2_vector.npy", npy("<u2", [4], struct.pack("<4H", 1, 2, 3, 65535)))
out("npy", "i4_empty.npy", npy("<i4", [0, 5], b""))

for src in ["examples/train_fortunes.json", "examples/lora_licenses.json"]:
    os.makedirs(os.path.join(ROOT, "corpus", "training_args"), exist_ok=True)
    shutil.copy(os.path.join(PROJECT, src), os.path.join(ROOT, "corpus", "training_args", os.path.basename(src)))


def gguf(kvs, tensors):
    s = lambda t: struct.pack("<Q", len(t)) + t.encode()
    b = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, (t, v) in kvs.items():
        b += s(k) + struct.pack("<I", t)
        if t == 8:
            b += s(v)
        elif t == 4:
            b += struct.pack("<I", v)
        elif t == 6:
            b += struct.pack("<f", v)
        elif t == 9:  # array of strings
            b += struct.pack("<IQ", 8, len(v)) + b"".join(s(x) for x in v)
    offset, data = 0, b""
    for name, ggml_type, dims, raw in tensors:
        b += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        b += struct.pack("<IQ", ggml_type, offset)
        data += raw + b"\0" * ((32 - len(raw) % 32) % 32)
        offset = len(data)
    b += b"\0" * ((32 - len(b) % 32) % 32)
    return b + data


q8_block = struct.pack("<e", 0.5) + bytes(range(32))
out("gguf", "llama_f32_q8_0.gguf", gguf(
    {"general.architecture": (8, "llama"), "general.alignment": (4, 32), "llama.block_count": (4, 1),
     "llama.embedding_length": (4, 32), "llama.attention.layer_norm_rms_epsilon": (6, 1e-5),
     "tokenizer.ggml.tokens": (9, ["<unk>", "<s>", "</s>", "a"])},
    [("token_embd.weight", 0, [32, 2], f32(*range(64))), ("blk.0.attn_q.weight", 8, [32, 1], q8_block)]))

os.makedirs(os.path.join(ROOT, "corpus", "chat_template"), exist_ok=True)
for p in sorted(glob.glob(os.path.join(PROJECT, "tests/data/chat_templates/*.json"))):
    with open(p) as f:
        doc = json.load(f)
    if "template" in doc:
        out("chat_template", os.path.basename(p).replace(".json", ".jinja"), doc["template"])

out("adapter", "peft.json", open(os.path.join(PROJECT, "tests/data/tiny_hf/lora/adapter/adapter_config.json")).read())
out("adapter", "rslora_regex.json", json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "lora_dropout": 0.05,
    "target_modules": ".*\\.(q_proj|v_proj)$", "use_rslora": True, "bias": "none", "task_type": "CAUSAL_LM"}))

out("http", "chat.json", json.dumps({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "stop": ["\n", "User:"],
    "n": 2, "logprobs": True, "top_logprobs": 3, "stream": True, "stream_options": {"include_usage": True}}))
out("http", "completion.json", json.dumps({"prompt": "Once upon", "max_tokens": 16, "seed": 1,
    "presence_penalty": 0.5, "frequency_penalty": 0.2, "repetition_penalty": 1.1, "min_p": 0.1, "top_k": 20}))
out("http", "bad_types.json", '{"prompt": 3, "max_tokens": -1, "n": "x"}')
