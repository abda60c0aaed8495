// edl/kernels/all.hpp: the hot loops (raw spans in, xsimd inside, TBB across rows or tiles).
#pragma once
#include <edl/kernels/activations.hpp>
#include <edl/kernels/elementwise.hpp>
#include <edl/kernels/peak.hpp>
#include <edl/kernels/gemm.hpp>
#include <edl/kernels/quant_amx.hpp>
#include <edl/kernels/quant_dot.hpp>
#include <edl/kernels/quant_matvec.hpp>
#include <edl/kernels/rms_norm.hpp>
#include <edl/kernels/softmax.hpp>
