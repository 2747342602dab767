// Hot loops compiled for several ISAs and picked at load time, so a portable build still uses
// AVX-512 where the machine has it.
#pragma once

#define BKV_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
