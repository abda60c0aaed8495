// edl/tokenizer/all.hpp: umbrella of the tokenizer layer (HF tokenizer.json, byte-level BPE training).
#pragma once
#include <edl/tokenizer/bpe_trainer.hpp>
#include <edl/tokenizer/tokenizer.hpp>
