// edl/serve/all.hpp: serving over HTTP with OpenAI's API. Not part of edl/edl.hpp: server.hpp
// needs cpp-httplib (CMake target edl::serve); openai.hpp, service.hpp, stop_strings.hpp and
// metrics.hpp need only edl.
#pragma once

#include <edl/serve/metrics.hpp>
#include <edl/serve/openai.hpp>
#include <edl/serve/server.hpp>
#include <edl/serve/service.hpp>
#include <edl/serve/stop_strings.hpp>
