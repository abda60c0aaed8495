// edl/edl.hpp: the whole library. Include this, or single_include/edl/edl.hpp.
// Layers, each including only the ones before it, kernels only core (docs/architecture.md;
// the `layers` test): core -> mesh -> tensor -> kernels -> nn -> io -> tokenizer -> optim ->
// lora -> models -> generate | train
#pragma once
#include <edl/version.hpp>
#include <edl/core/all.hpp>
#include <edl/quant/all.hpp>
#include <edl/mesh/all.hpp>
#include <edl/tensor/all.hpp>
#include <edl/kernels/all.hpp>
#include <edl/nn/all.hpp>
#include <edl/io/all.hpp>
#include <edl/tokenizer/all.hpp>
#include <edl/chat/all.hpp>
#include <edl/optim/all.hpp>
#include <edl/lora/all.hpp>
#include <edl/models/all.hpp>
#include <edl/generate/all.hpp>
#include <edl/train/all.hpp>
