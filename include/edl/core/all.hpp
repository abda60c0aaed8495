// edl/core/all.hpp: umbrella of the core layer (vocabulary types every other layer uses).
#pragma once
#include <edl/core/allocator.hpp>
#include <edl/core/block_rows.hpp>
#include <edl/core/dtype.hpp>
#include <edl/core/error.hpp>
#include <edl/core/exec.hpp>
#include <edl/core/fixed_string.hpp>
#include <edl/core/phased_region.hpp>
#include <edl/core/policy.hpp>
#include <edl/core/process_memory.hpp>
#include <edl/core/rng.hpp>
