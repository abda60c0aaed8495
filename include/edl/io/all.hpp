// edl/io/all.hpp: umbrella of the io layer (memory maps, safetensors, JSON configs, .npy).
#pragma once
#include <edl/io/atomic_file.hpp>
#include <edl/io/gguf.hpp>
#include <edl/io/json.hpp>
#include <edl/io/json_config.hpp>
#include <edl/io/mmap.hpp>
#include <edl/io/npy.hpp>
#include <edl/io/planned_safetensors.hpp>
#include <edl/io/safetensors.hpp>
#include <edl/io/tfevents.hpp>
