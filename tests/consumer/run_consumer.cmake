# Installs edl into a scratch prefix, then configures, builds and runs tests/consumer against it.
#   cmake -DEDL_SOURCE=... -DWORK=... -DGENERATOR=... -DCXX=... -P run_consumer.cmake
file(REMOVE_RECURSE "${WORK}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()
run(${CMAKE_COMMAND} -S "${EDL_SOURCE}" -B "${WORK}/edl-build" -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX}
    -DEDL_BUILD_TESTS=OFF -DEDL_BUILD_EXAMPLES=OFF -DEDL_BUILD_BENCH=OFF -DCMAKE_INSTALL_PREFIX=${WORK}/prefix)
run(${CMAKE_COMMAND} --install "${WORK}/edl-build")
run(${CMAKE_COMMAND} -S "${EDL_SOURCE}/tests/consumer" -B "${WORK}/app-build" -G "${GENERATOR}"
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build "${WORK}/app-build")
run("${WORK}/app-build/consumer")
message(STATUS "consumer built and ran against the installed edl")
