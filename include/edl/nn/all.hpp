// edl/nn/all.hpp: modules (Linear, Embedding, RMSNorm, rotary, attention, MLP, decoder layer)
// and the chunked causal-LM loss. Protocol: docs/modules.md.
#pragma once
#include <edl/nn/attention.hpp>
#include <edl/nn/decoder_layer.hpp>
#include <edl/nn/embedding.hpp>
#include <edl/nn/expert_parallel.hpp>
#include <edl/nn/linear.hpp>
#include <edl/nn/loss.hpp>
#include <edl/nn/low_rank_adapter.hpp>
#include <edl/nn/mlp.hpp>
#include <edl/nn/moe.hpp>
#include <edl/nn/module.hpp>
#include <edl/nn/module_tree.hpp>
#include <edl/nn/param.hpp>
#include <edl/nn/quantize.hpp>
#include <edl/nn/rms_norm.hpp>
#include <edl/nn/rotary.hpp>
