// Hot loops compiled for several ISAs and picked at load time, so a portable build still uses
// AVX-512 where the machine has it. Not under ThreadSanitizer: the ifunc resolvers run before
// its runtime starts and crash the process at load (scripts/test.sh's TSan build).
#pragma once

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BKV_NO_MULTIVERSION 1
#endif
#endif

#if defined(__SANITIZE_THREAD__) || defined(BKV_NO_MULTIVERSION)
#define BKV_MULTIVERSION
#else
#define BKV_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
