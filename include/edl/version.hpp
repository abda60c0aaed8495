// edl/version.hpp: the library version (kept equal to project(VERSION) in CMakeLists.txt).
#pragma once
#define EDL_VERSION_MAJOR 0
#define EDL_VERSION_MINOR 1
#define EDL_VERSION_PATCH 0
#define EDL_VERSION_STRING "0.1.0"
