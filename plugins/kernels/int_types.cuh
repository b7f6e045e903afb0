// Fixed-width integers without libc headers: NVRTC compiles with no system include path.
#pragma once
#ifdef __CUDACC_RTC__
typedef signed char int8_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif
