// edl/optim/all.hpp: optimizers, learning-rate schedules, gradient clipping.
#pragma once
#include <edl/optim/clip.hpp>
#include <edl/optim/optimizer.hpp>
#include <edl/optim/schedule.hpp>
#include <edl/optim/sharded_optimizer.hpp>
