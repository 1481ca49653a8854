# Warnings as errors on the project's own targets (never on consumers: the INTERFACE target oomb
# carries no flags). Link `oomb_warnings` privately into every test, example and benchmark.
if(NOT TARGET oomb_warnings)
  add_library(oomb_warnings INTERFACE)
  target_compile_options(oomb_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Werror>)
endif()
