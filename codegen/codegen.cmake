# Code generation in the build.
#
#   fabric_codegen            custom target. With the checked-in generated/ it
#                             runs `generate.py --check` and fails the build when
#                             the outputs are stale; with any other
#                             FABRIC_GENERATED_DIR it renders into that directory
#                             (also once at configure time, so the sources exist).
#   fabric_drivers            static library: the generated drivers (fab_api over
#                             every exported version's table) plus a translation
#                             unit that compiles every ABI layout assert.
#   fabric_add_net_plugin(<target> [VERSIONS <v>...] [RMA_VERSIONS <v>...] [GIN_VERSIONS <v>...]
#                         [NEURON_VERSIONS <v>...] GENERATED_DIR <dir>)
#                             SHARED library lib<target>.so: fabric_engine plus
#                             the chosen versions' shims, exporting exactly their
#                             tables. VERSIONS are the net family's. Families
#                             of one library only (a spec's [family].library).
#   FABRIC_<FAMILY>_VERSIONS  "all" is replaced by every version abi/ exports.

get_filename_component(FABRIC_TOP ${CMAKE_CURRENT_LIST_DIR} DIRECTORY)
set(FABRIC_CODEGEN_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/generate.py)
set(FABRIC_CODEGEN_DEFAULT_DIR ${FABRIC_TOP}/generated)

file(GLOB FABRIC_CODEGEN_INPUTS CONFIGURE_DEPENDS
     ${FABRIC_ABI_DIR}/*.toml ${FABRIC_TOP}/templates/*.j2 ${CMAKE_CURRENT_LIST_DIR}/*.py
     ${CMAKE_CURRENT_LIST_DIR}/fabgen/*.py ${FABRIC_TOP}/core/params.toml)

get_filename_component(_fabric_gen_real "${FABRIC_GENERATED_DIR}" REALPATH)
get_filename_component(_fabric_gen_default "${FABRIC_CODEGEN_DEFAULT_DIR}" REALPATH)
set(_fabric_gen_args --spec-dir ${FABRIC_ABI_DIR} --params ${FABRIC_TOP}/core/params.toml --quiet)

# Whether this Python can run the generator: 3.9+, Jinja2, and tomllib (3.11+) or tomli.
set(_fabric_py_ok FALSE)
if(Python3_FOUND)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c
                  "import sys, jinja2\ntry:\n import tomllib\nexcept ImportError:\n import tomli\nsys.exit(sys.version_info < (3, 9))"
                  RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    set(_fabric_py_ok TRUE)
  endif()
endif()
set(_fabric_py_needs "Python 3.9 or later with Jinja2, and tomllib (3.11+) or tomli")

if(_fabric_gen_real STREQUAL _fabric_gen_default AND (NOT _fabric_py_ok OR FABRIC_CODEGEN_CHECK STREQUAL "OFF"))
  if(FABRIC_CODEGEN_CHECK STREQUAL "ON")
    message(FATAL_ERROR "FABRIC_CODEGEN_CHECK=ON needs ${_fabric_py_needs} (found: ${Python3_EXECUTABLE})")
  endif()
  message(STATUS "codegen: building from the checked-in generated/ without checking it against abi/ (no "
          "${_fabric_py_needs}, or FABRIC_CODEGEN_CHECK=OFF)")
  add_custom_target(fabric_codegen)
elseif(_fabric_gen_real STREQUAL _fabric_gen_default)
  # The checked-in tree: verify it, never rewrite it behind the developer's back.
  file(GLOB_RECURSE _fabric_gen_outputs CONFIGURE_DEPENDS ${FABRIC_CODEGEN_DEFAULT_DIR}/*
       ${FABRIC_TOP}/docs/abi-matrix.md ${FABRIC_TOP}/docs/params.md)
  set(_stamp ${CMAKE_BINARY_DIR}/codegen-check.stamp)
  add_custom_command(
    OUTPUT ${_stamp}
    COMMAND ${Python3_EXECUTABLE} ${FABRIC_CODEGEN_SCRIPT} ${_fabric_gen_args} --check
    COMMAND ${CMAKE_COMMAND} -E touch ${_stamp}
    DEPENDS ${FABRIC_CODEGEN_INPUTS} ${_fabric_gen_outputs}
    COMMENT "Checking that generated/ matches abi/ (refresh: python3 codegen/generate.py)"
    VERBATIM)
else()
  if(NOT _fabric_py_ok)
    message(FATAL_ERROR "rendering into ${FABRIC_GENERATED_DIR} needs ${_fabric_py_needs}")
  endif()
  set(_fabric_gen_args ${_fabric_gen_args} --out-dir ${FABRIC_GENERATED_DIR})
  message(STATUS "Rendering the ABI layer from ${FABRIC_ABI_DIR} into ${FABRIC_GENERATED_DIR}")
  execute_process(COMMAND ${Python3_EXECUTABLE} ${FABRIC_CODEGEN_SCRIPT} ${_fabric_gen_args}
                  RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "codegen/generate.py failed for ${FABRIC_ABI_DIR} (see above)")
  endif()
  set(_stamp ${CMAKE_BINARY_DIR}/codegen-render.stamp)
  add_custom_command(
    OUTPUT ${_stamp}
    COMMAND ${Python3_EXECUTABLE} ${FABRIC_CODEGEN_SCRIPT} ${_fabric_gen_args}
    COMMAND ${CMAKE_COMMAND} -E touch ${_stamp}
    DEPENDS ${FABRIC_CODEGEN_INPUTS}
    COMMENT "Rendering the ABI layer into ${FABRIC_GENERATED_DIR}"
    VERBATIM)
endif()
if(_stamp)
  add_custom_target(fabric_codegen ALL DEPENDS ${_stamp})
endif()

include(${FABRIC_GENERATED_DIR}/exports/fabric_exports.cmake)

# FABRIC_<FAMILY>_VERSIONS=all: every version the specs export (a normal variable that shadows the cache
# entry here and in every subdirectory, so the tests see the list).
foreach(_fam NET RMA GIN NEURON)
  string(TOLOWER "${FABRIC_${_fam}_VERSIONS}" _wanted)
  if(_wanted STREQUAL "all")
    set(FABRIC_${_fam}_VERSIONS ${FABRIC_GEN_${_fam}_VERSIONS})
  endif()
endforeach()

# Warnings that catch a spec/core mismatch in generated code as an error.
set(FABRIC_GENERATED_C_FLAGS -Werror=incompatible-pointer-types -Werror=int-conversion -Werror=return-type)

# ---- drivers -------------------------------------------------------------------------

list(TRANSFORM FABRIC_GEN_DRIVER_SOURCES PREPEND ${FABRIC_GENERATED_DIR}/)
add_library(fabric_drivers STATIC ${FABRIC_GEN_DRIVER_SOURCES} ${FABRIC_GENERATED_DIR}/${FABRIC_GEN_LAYOUT_CHECK})
target_include_directories(fabric_drivers PUBLIC ${FABRIC_API_INCLUDE_DIRS} ${FABRIC_GENERATED_DIR}/abi
                           ${FABRIC_GENERATED_DIR}/drivers)
target_compile_options(fabric_drivers PRIVATE ${FABRIC_GENERATED_C_FLAGS})
add_dependencies(fabric_drivers fabric_codegen)

# ---- the plugin library -----------------------------------------------------------------

function(fabric_add_net_plugin target)
  cmake_parse_arguments(ARG "" "GENERATED_DIR" "VERSIONS;RMA_VERSIONS;GIN_VERSIONS;NEURON_VERSIONS" ${ARGN})
  if(NOT ARG_GENERATED_DIR)
    set(ARG_GENERATED_DIR ${FABRIC_GENERATED_DIR})
  endif()
  set(ARG_NET_VERSIONS ${ARG_VERSIONS})
  set(sources ${ARG_GENERATED_DIR}/${FABRIC_GEN_SHIM_COMMON})
  set(symbols "")
  set(library "")
  set(chosen "")
  # Each family: the versions asked for must be described; their shims are
  # linked and their tables exported. The families of one library must all
  # belong to it (the specs say which library exports a family).
  foreach(fam NET RMA GIN NEURON)
    set(wanted ${ARG_${fam}_VERSIONS})
    string(TOLOWER ${fam} fam_name)
    if(wanted)
      if(library AND NOT library STREQUAL FABRIC_GEN_${fam}_LIBRARY)
        message(FATAL_ERROR "fabric_add_net_plugin(${target}): ${fam_name} tables belong in "
                            "lib${FABRIC_GEN_${fam}_LIBRARY}.so, not lib${library}.so (abi/${fam_name}.toml)")
      endif()
      set(library ${FABRIC_GEN_${fam}_LIBRARY})
      list(APPEND chosen ${fam} ${wanted})
    endif()
    foreach(v IN LISTS wanted)
      if(NOT v IN_LIST FABRIC_GEN_${fam}_VERSIONS)
        message(FATAL_ERROR "fabric_add_net_plugin(${target}): ${fam_name} v${v} is not described in "
                            "${FABRIC_ABI_DIR} (have: ${FABRIC_GEN_${fam}_VERSIONS}). See docs/adding-an-abi-version.md")
      endif()
      list(APPEND sources ${ARG_GENERATED_DIR}/${FABRIC_GEN_${fam}_SHIM_${v}})
      string(APPEND symbols "    ${FABRIC_GEN_${fam}_SYMBOL_${v}};\n")
    endforeach()
  endforeach()
  if(NOT library)
    message(FATAL_ERROR "fabric_add_net_plugin(${target}): no versions of any family chosen")
  endif()

  # Exactly the chosen tables are global; everything else (core included) is
  # local. Every version of the library's families: the generated script; a
  # subset: the same shape here.
  set(map ${ARG_GENERATED_DIR}/exports/${library}.map)
  set(generated_all "")
  foreach(fam NET RMA GIN NEURON)
    if(FABRIC_GEN_${fam}_LIBRARY STREQUAL library)
      list(APPEND generated_all ${fam} ${FABRIC_GEN_${fam}_VERSIONS})
    endif()
  endforeach()
  if(NOT chosen STREQUAL generated_all)
    set(map ${CMAKE_CURRENT_BINARY_DIR}/${target}.map)
    file(CONFIGURE OUTPUT ${map} CONTENT "/* Written by codegen/codegen.cmake for ${target}: ${chosen}. */
{
  global:
@symbols@  local:
    *;
};
" @ONLY)
  endif()

  add_library(${target} SHARED ${sources})
  target_include_directories(${target} PRIVATE ${FABRIC_API_INCLUDE_DIRS} ${ARG_GENERATED_DIR}/abi)
  target_compile_options(${target} PRIVATE ${FABRIC_GENERATED_C_FLAGS})
  target_link_libraries(${target} PRIVATE fabric_engine)
  target_link_options(${target} PRIVATE "LINKER:--version-script=${map}" "LINKER:--no-undefined")
  set_target_properties(${target} PROPERTIES OUTPUT_NAME ${target} PREFIX lib C_VISIBILITY_PRESET hidden
                        LINK_DEPENDS ${map})
  foreach(fam NET RMA GIN NEURON)
    set_property(TARGET ${target} PROPERTY FABRIC_${fam}_VERSIONS "${ARG_${fam}_VERSIONS}")
  endforeach()
  add_dependencies(${target} fabric_codegen)
endfunction()
