// edl/models/all.hpp: model families (each folder stands alone; models never include each other).
#pragma once
#include <edl/models/llama/auto_model.hpp>
#include <edl/models/llama/config.hpp>
#include <edl/models/llama/llama.hpp>
#include <edl/models/llama/plan.hpp>
#include <edl/models/llama/pretrained.hpp>
#include <edl/models/llama/sequence_classification.hpp>
#include <edl/models/llama/sharded.hpp>
#include <edl/models/llama/sharded_pretrained.hpp>
#include <edl/models/llama/sharded_sequence_classification.hpp>
#include <edl/models/llama/sharded_save.hpp>
