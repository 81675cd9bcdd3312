// AMX tile state shared by radixlm's AMX kernels (the bf16 linear, bf16_amx.h; the attention engine,
// attention/cpu/amx_attention.h): whether this process may use the tiles, the palette-1 configuration
// block, and loading a kernel's configuration where the thread does not hold it already.
//
// The tile configuration is per thread (LDTILECFG) and every kernel that uses tiles needs its own
// (the linear's tiles have as many rows as its row block, the attention's as many as its query
// vectors; oneDNN's brgemm, which torch runs for some bf16 ops, loads its own and may release the
// tiles): so a kernel reads the thread's configuration back (STTILECFG, a 64-byte store) and loads
// its own only where they differ. A remembered "what I loaded last" would be wrong after any other
// code used the tiles in between, and a TDPBF16PS on mismatched tile shapes faults (#UD).
#pragma once

#ifdef CPU_CAPABILITY_AVX512
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace radixlm_amx {

// Whether this process can use AMX-BF16 tiles: the CPU has them and Linux grants the tile state
// (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; oneDNN asks the same). Fixed per process.
inline bool bf16_usable() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = d & (1u << 24), bf16 = d & (1u << 22);
    if (!tile || !bf16) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0;
  }();
  return ok;
}

// LDTILECFG's 64-byte block, palette 1: per tile its bytes per row (colsb) and rows.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Makes cfg this thread's tile configuration (LDTILECFG) unless it already is (read back with STTILECFG).
__attribute__((target("amx-tile"))) inline void configure(const TileConfig& cfg) {
  TileConfig cur;
  _tile_storeconfig(&cur);
  asm volatile("" : : "r"(&cur) : "memory");  // GCC does not see STTILECFG write cur
  if (std::memcmp(&cur, &cfg, sizeof cfg) == 0) return;
  asm volatile("" : : "r"(&cfg) : "memory");  // nor LDTILECFG read cfg: keep the stores
  _tile_loadconfig(&cfg);
}

}  // namespace radixlm_amx
#endif
