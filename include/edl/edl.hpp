// edl/edl.hpp: the whole library. Include this, or single_include/edl/edl.hpp.
// Layers, each including only the ones above it (docs/architecture.md):
//   core -> mesh -> tensor -> kernels -> (nn, io, models, optim, generate, train)
#pragma once
#include <edl/version.hpp>
#include <edl/core/all.hpp>
#include <edl/mesh/all.hpp>
#include <edl/tensor/all.hpp>
#include <edl/kernels/all.hpp>
#include <edl/nn/all.hpp>
#include <edl/io/all.hpp>
#include <edl/models/all.hpp>
#include <edl/optim/all.hpp>
#include <edl/generate/all.hpp>
#include <edl/train/all.hpp>
