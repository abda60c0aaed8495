// edl/tensor/all.hpp: PartitionSpec, sharded tensors, partition rules.
#pragma once
#include <edl/tensor/partition_spec.hpp>
#include <edl/tensor/partition_rules.hpp>
#include <edl/tensor/shard_layout.hpp>
#include <edl/tensor/sharded_tensor.hpp>
#include <edl/tensor/shard_map.hpp>
