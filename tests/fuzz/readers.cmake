# The readers with a fuzz target (tests/fuzz/fuzz_<reader>.cpp -> edl_fuzz_<reader>), shared by
# the fuzz build (tests/fuzz/CMakeLists.txt) and the main build's ctest (tests/CMakeLists.txt).
set(EDL_FUZZ_READERS safetensors index config generation_config npy training_args gguf tokenizer chat_template
    adapter)
if(EDL_HAVE_SERVE)  # the request-body target needs edl::serve
  list(APPEND EDL_FUZZ_READERS http)
endif()

# edl_fuzz_command(out reader exe_dir corpus_dir seconds): the command line of one bounded run
# (run_fuzz.sh: new inputs go to corpus_dir, the committed seeds are read after it).
function(edl_fuzz_command out reader exe_dir corpus_dir seconds)
  set(src ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  set(cmd bash ${src}/run_fuzz.sh ${exe_dir}/edl_fuzz_${reader} ${corpus_dir} ${src}/corpus/${reader}
      -max_total_time=${seconds} -rss_limit_mb=2048 -timeout=20 -print_final_stats=1
      -artifact_prefix=${corpus_dir}-crash-)
  if(reader STREQUAL "gguf")
    list(APPEND cmd -dict=${src}/dict/gguf.dict)
  elseif(reader STREQUAL "chat_template")
    list(APPEND cmd -dict=${src}/dict/jinja.dict)
  elseif(NOT reader STREQUAL "npy")
    list(APPEND cmd -dict=${src}/dict/json.dict)
  endif()
  set(${out} ${cmd} PARENT_SCOPE)
endfunction()
