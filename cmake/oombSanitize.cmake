# OOMB_SANITIZE=address,undefined (any list -fsanitize= takes) instruments oomb's own targets —
# tests, examples, benchmarks — never a consumer's: the flags are directory-scoped to oomb's tree.
# Errors are fatal (-fno-sanitize-recover=all), so a UBSan report fails the test that hit it.
# CPU builds only: the CUDA runtime and ASan's shadow memory do not mix without extra care.
if(NOT OOMB_SANITIZE)
  return()
endif()
if(OOMB_ENABLE_CUDA)
  message(FATAL_ERROR "OOMB_SANITIZE='${OOMB_SANITIZE}' needs a CPU-only build: configure with "
                      "-DOOMB_ENABLE_CUDA=OFF (sanitizers are not applied to CUDA code).")
endif()
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  message(FATAL_ERROR "OOMB_SANITIZE needs GCC or Clang, not ${CMAKE_CXX_COMPILER_ID}")
endif()
string(REPLACE ";" "," oomb_sanitizers "${OOMB_SANITIZE}")
add_compile_options(-fsanitize=${oomb_sanitizers} -fno-sanitize-recover=all -fno-omit-frame-pointer)
add_link_options(-fsanitize=${oomb_sanitizers})
