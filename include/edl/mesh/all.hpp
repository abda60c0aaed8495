// edl/mesh/all.hpp: umbrella of the mesh layer (topology, devices, collectives, backends).
#pragma once
#include <edl/mesh/memory.hpp>
#include <edl/mesh/mesh_shape.hpp>
#include <edl/mesh/backend.hpp>
#include <edl/mesh/device.hpp>
#include <edl/mesh/device_count.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/mesh/backends/simulated.hpp>
#include <edl/mesh/collectives.hpp>
#include <edl/mesh/process_group.hpp>
#include <edl/mesh/launch.hpp>
