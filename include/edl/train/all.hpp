// edl/train/all.hpp: the trainer, its arguments, data, tokenizers, checkpoints and metrics.
#pragma once

#include <edl/train/checkpoint.hpp>
#include <edl/train/dataset.hpp>
#include <edl/train/metrics.hpp>
#include <edl/train/tokenizer.hpp>
#include <edl/train/trainer.hpp>
#include <edl/train/training_arguments.hpp>
