# One INTERFACE target carries the project's warning flags; every trainyard target links it.
add_library(trainyard_flags INTERFACE)
target_compile_options(trainyard_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
if(TRAINYARD_WERROR)
  target_compile_options(trainyard_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
