// edl/mesh/all.hpp: umbrella of the mesh layer (topology, devices, collectives, backends).
#pragma once
#include <edl/mesh/memory.hpp>
#include <edl/mesh/mesh.hpp>
#include <edl/mesh/mesh_shape.hpp>
