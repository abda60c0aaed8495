// edl/quant/all.hpp: the quant layer (block formats of quantized weights).
#pragma once
#include <edl/quant/formats.hpp>
#include <edl/quant/matrix.hpp>
#include <edl/quant/quantize.hpp>
#include <edl/quant/row_groups.hpp>
