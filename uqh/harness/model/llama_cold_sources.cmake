# Included by scripts/setup.sh and by `uqh setup local` (llama_build.py beside this file) into llama.cpp's
# top-level project (CMAKE_PROJECT_llama.cpp_INCLUDE), so that llama.cpp's own CMake files stay untouched.
# Package data: a wheel ships it.
#
# The sources below are compiled at -O1 instead of -O3. llama-server runs them once at start-up (argument
# parsing), once per request (chat template, output parsing), or never for a text model (the multimodal library
# it links, quantization). They are the heavy nlohmann-json and regex compiles: -O1 takes ~40% less CPU on them,
# and the build is CPU-bound. Everything that runs per token (ggml, llama's decode and sampling, common's
# sampling, server.cpp) keeps -O3. Measured in docs/model-client.md ("Setup and CI time").
function(uqh_cold_sources)
  set(cold_common arg.cpp chat.cpp chat-parser.cpp json-partial.cpp json-schema-to-grammar.cpp regex-partial.cpp)
  list(TRANSFORM cold_common PREPEND "${CMAKE_SOURCE_DIR}/common/")
  set_source_files_properties(${cold_common} TARGET_DIRECTORY common PROPERTIES COMPILE_OPTIONS -O1)
  get_target_property(mtmd_sources mtmd SOURCES)
  list(FILTER mtmd_sources INCLUDE REGEX "\\.cpp$")
  list(TRANSFORM mtmd_sources PREPEND "${CMAKE_SOURCE_DIR}/tools/mtmd/")
  set_source_files_properties(${mtmd_sources} TARGET_DIRECTORY mtmd PROPERTIES COMPILE_OPTIONS -O1)
  set_source_files_properties("${CMAKE_SOURCE_DIR}/src/llama-quant.cpp" TARGET_DIRECTORY llama
                              PROPERTIES COMPILE_OPTIONS -O1)
endfunction()
# Deferred to the end of the top-level directory: the targets exist only once llama.cpp has added them.
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL uqh_cold_sources)
