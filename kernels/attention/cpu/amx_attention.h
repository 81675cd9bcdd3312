// AMX engine of the pair tile path (pair_tile_attention.h), included by paged_attention.cpp inside its
// anonymous namespace after that header.
//
// On CPUs with AMX-BF16 (Intel Sapphire Rapids and later) both products of a bf16 pool's attention run
// on the tile unit: S = Q K^T with TDPBF16PS over the pair-transposed K block (a B tile is 16 pairs of
// dims x 16 keys), O += P V over V re-laid as pairs of keys (a B tile is 16 key pairs x 16 dims).
// One TDPBF16PS is 16 x 16 x 32 multiply-adds; the AVX-512 engine does 16 per instruction.

#ifdef CPU_CAPABILITY_AVX512
// amx_tiles.h (the process's AMX permission, the configuration handshake) is included by
// paged_attention.cpp ahead of its anonymous namespace.

// Whether a bf16 pool with head_dim d takes the AMX path here (d a multiple of 32: whole A tiles).
inline bool amx_attention(int64_t d) { return radixlm_amx::bf16_usable() && d % 32 == 0 && d <= 256; }

constexpr int64_t AMX_ROWS = 16;  // rows of every tile (query vectors per Q / P / O tile)

// Every tile 16 rows x 64 bytes (palette 1): tiles 0-3 accumulators, 4 the A operand, 6-7 B operands.
// Tiles for `rows` (1..16) query vectors per Q / P / output tile (B tiles always 16 rows). A decode
// item has G (a few) query vectors: its tiles are that many rows, so loads and TDPBF16PS do not run
// over 16. The rows of a tile are independent, so the row count never changes a result. The
// configuration is per thread, and other kernels (the AMX linear, oneDNN) load theirs between two
// attention calls: amx_configure checks it on every call (radixlm_amx::configure).
inline thread_local int64_t amx_rows = 0;
__attribute__((target("amx-tile"))) inline void amx_configure(int64_t rows) {
  amx_rows = rows;
  radixlm_amx::TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = (t == 6 || t == 7) ? 16 : static_cast<uint8_t>(rows);
  }
  radixlm_amx::configure(cfg);
}

__attribute__((target("amx-tile"))) inline void amx_release() {
  _tile_release();
  amx_rows = 0;
}

// Tiles 0-3 from / to four 16-column groups at p, p + 16, p + 32, p + 48 (row stride `stride` bytes).
__attribute__((target("amx-tile"))) inline void load4(const float* p, int64_t stride) {
  _tile_loadd(0, p, stride);
  _tile_loadd(1, p + 16, stride);
  _tile_loadd(2, p + 32, stride);
  _tile_loadd(3, p + 48, stride);
}
__attribute__((target("amx-tile"))) inline void store4(float* p, int64_t stride) {
  _tile_stored(0, p, stride);
  _tile_stored(1, p + 16, stride);
  _tile_stored(2, p + 32, stride);
  _tile_stored(3, p + 48, stride);
}
// Tiles 0-3 += A (tile 4) x the B tiles at b, b + 16, b + 32, b + 48 (uint32 pairs, row stride `stride`
// bytes), loaded into tiles 6 and 7 in turn.
__attribute__((target("amx-tile,amx-bf16"))) inline void dp4(const uint32_t* b, int64_t stride) {
  _tile_loadd(6, b, stride);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, b + 16, stride);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(6, b + 32, stride);
  _tile_dpbf16ps(2, 4, 6);
  _tile_loadd(7, b + 48, stride);
  _tile_dpbf16ps(3, 4, 7);
}

// S (mpad, BLOCK) = Q (mpad, d) K^T over the block's keys [0, ncols) (16-key steps; a 64-key group
// is computed whole, within the BLOCK columns). Tiles 0-3 accumulate four 16-key groups at once, so
// four TDPBF16PS chains are in flight instead of one.
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_scores(const at::BFloat16* q, const uint32_t* kp,
                                                                  int64_t mpad, int64_t ncols, int64_t d, float* s) {
  for (int64_t mt = 0; mt < mpad; mt += amx_rows) {
    for (int64_t c0 = 0; c0 < ncols; c0 += 64) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t ks = 0; ks < d; ks += 32) {
        _tile_loadd(4, q + mt * d + ks, d * 2);
        dp4(kp + (ks / 2) * BLOCK + c0, BLOCK * 4);
      }
      store4(s + mt * BLOCK + c0, BLOCK * 4);
    }
  }
}

// acc (mpad, d) += P (mpad, BLOCK) V over the block's keys [0, npad) (whole 32-key steps); tiles 0-3
// hold 64 output dims at once (d a multiple of 64), else 32 at a time.
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_accumulate(const at::BFloat16* p, const uint32_t* vp,
                                                                      int64_t mpad, int64_t npad, int64_t d,
                                                                      float* acc) {
  for (int64_t mt = 0; mt < mpad; mt += amx_rows) {
    int64_t c0 = 0;
    for (; c0 + 64 <= d; c0 += 64) {
      float* o = acc + mt * d + c0;
      load4(o, d * 4);
      for (int64_t k = 0; k < npad; k += 32) {
        _tile_loadd(4, p + mt * BLOCK + k, BLOCK * 2);
        dp4(vp + (k / 2) * d + c0, d * 4);
      }
      store4(o, d * 4);
    }
    for (; c0 < d; c0 += 32) {  // d % 64 == 32: the last 32 dims
      float* o = acc + mt * d + c0;
      _tile_loadd(0, o, d * 4);
      _tile_loadd(1, o + 16, d * 4);
      for (int64_t k = 0; k < npad; k += 32) {
        const uint32_t* b = vp + (k / 2) * d + c0;
        _tile_loadd(4, p + mt * BLOCK + k, BLOCK * 2);
        _tile_loadd(6, b, d * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b + 16, d * 4);
        _tile_dpbf16ps(1, 4, 7);
      }
      _tile_stored(0, o, d * 4);
      _tile_stored(1, o + 16, d * 4);
    }
  }
}

// The AMX engine for attend_rows_tiles: Q / P / S / acc rows padded to whole 16-row tiles past one tile.
struct AmxTiles {
  static constexpr int64_t kRowMultiple = AMX_ROWS;
  static int64_t padded(int64_t nq) { return nq < AMX_ROWS ? nq : (nq + AMX_ROWS - 1) / AMX_ROWS * AMX_ROWS; }
  static void begin(int64_t nq) { amx_configure(std::min(nq, AMX_ROWS)); }
  static void scores(const at::BFloat16* q, const uint32_t* kp, int64_t mpad, int64_t ncols, int64_t d, float* s) {
    amx_scores(q, kp, mpad, ncols, d, s);
  }
  static bool reads_value_rows(int64_t) { return false; }  // B tiles need V as pairs of keys in memory
  static void accumulate(const at::BFloat16* p, const uint32_t* vp, const at::BFloat16* const*, int64_t, int64_t mpad,
                         int64_t npad, int64_t d, float* acc) {
    amx_accumulate(p, vp, mpad, npad, d, acc);
  }
  static void release() { amx_release(); }
};
#endif

// Whether a bf16 pool with head_dim d runs on the AMX path in this build and process.
inline bool use_amx_attention(int64_t d) {
#ifdef CPU_CAPABILITY_AVX512
  return amx_attention(d);
#else
  (void)d;
  return false;
#endif
}
