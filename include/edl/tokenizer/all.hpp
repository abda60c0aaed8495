// edl/tokenizer/all.hpp: umbrella of the tokenizer layer (byte-level BPE, HF tokenizer.json).
#pragma once
#include <edl/tokenizer/tokenizer.hpp>
