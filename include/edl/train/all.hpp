// edl/train/all.hpp: the trainer, its arguments, data, checkpoints, metrics,
// evaluation, the end-of-training report and weight statistics.
#pragma once

#include <edl/train/checkpoint.hpp>
#include <edl/train/dataset.hpp>
#include <edl/train/evaluation.hpp>
#include <edl/train/metrics.hpp>
#include <edl/train/report.hpp>
#include <edl/train/sft_data.hpp>
#include <edl/train/sharded_load.hpp>
#include <edl/train/sharded_save.hpp>
#include <edl/train/state.hpp>
#include <edl/train/trainer.hpp>
#include <edl/train/training_arguments.hpp>
#include <edl/train/weight_stats.hpp>
