// edl/generate/all.hpp: KV caches, the incremental decoder (one device and a mesh), sampling,
// beam search, generate(), a conversation's prefix cache, the continuous batching engine.
#pragma once

#include <edl/generate/beam_search.hpp>
#include <edl/generate/decoder.hpp>
#include <edl/generate/engine.hpp>
#include <edl/generate/generate.hpp>
#include <edl/generate/generation_config.hpp>
#include <edl/generate/kv_cache.hpp>
#include <edl/generate/prefix_cached_generator.hpp>
#include <edl/generate/rope_table.hpp>
#include <edl/generate/sampling.hpp>
#include <edl/generate/sharded_decoder.hpp>
#include <edl/generate/sharded_generate.hpp>
