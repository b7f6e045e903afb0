// The tile a CTA computes and where its operands sit in shared memory: the host's tiling (WgmmaTile, computed by
// plugins/wgmma_tactics.py: WgmmaTactic.geometry), one tile's coordinates and pixels, and the shared-memory layout.
#pragma once
#include "conv_params.cuh"
#include "wgmma_config.cuh"

namespace trtfuse {

// Pixel-tile geometry, computed on the host (plugins/wgmma_tactics.py: WgmmaTactic.geometry).
struct WgmmaTile {
  int th;               // output rows per tile (= OH when nb > 1)
  int nb;               // images per tile
  int tiles_per_image;  // pixel tiles per image when nb == 1 (unused otherwise)
  int ch_tiles;         // channel tiles: ceil(Kpad / Tactic::bn)
  int kt;               // k32 steps of the GEMM-K: CB * R * S
  int box_bytes;        // bytes one activation box writes: nb * th * OW * 32 (Tactic::flat: a k32 step's boxes, Tactic::bm * 32)
  int tiles;            // CTA tiles: pixel tiles x channel tiles (a persistent CTA walks tile += gridDim.x)
  int groups_per_set; // Tactic::flat: 8-row groups per set of group_images images: OH * OW / 8, or (8 images) OH * OW
                        // rounded up to whole boxes
  int box_groups;       // Tactic::flat: groups per activation box (a power of two dividing groups_per_set and Tactic::bm / 8)
  int pitch;            // kWindows: window columns per image, W + max(pad_left, pad_right); the window is nb * pitch wide
  int group_images;     // Tactic::flat: 1 (a group is 8 pixels of an image) or 8 (one pixel of 8 images: OH * OW % 8 != 0, or stride 2)
  FastDivmod div_groups;  // by groups_per_set
};

// Tactic::flat: the 8-row groups of the whole batch, its sets of group_images images times groups_per_set.
__device__ __forceinline__ int flat_groups(const ConvParams& p, const WgmmaTile& t) {
  return p.N / t.group_images * t.groups_per_set;
}

// Where tile `tile` sits: channel tile fastest (CTAs sharing an activation tile run together, hit L2).
struct TileCoord {
  int n0, oh0, valid_px, m0, c0;
  __device__ __forceinline__ TileCoord(int tile, const ConvParams& p, const WgmmaTile& t, int ohw, int channels) {
    const int ch_tile = tile % t.ch_tiles, pix_tile = tile / t.ch_tiles;
    if (Tactic::flat) {  // Tactic::bm consecutive pixels of the linear output index (n0, oh0: unused)
      n0 = oh0 = 0;
      valid_px = min(Tactic::bm, flat_groups(p, t) * kFlatGroup - pix_tile * Tactic::bm);
    } else if (t.nb == 1) {
      n0 = pix_tile / t.tiles_per_image;
      oh0 = (pix_tile - n0 * t.tiles_per_image) * t.th;
      valid_px = (p.OH - oh0 < t.th ? p.OH - oh0 : t.th) * p.OW;
    } else {
      n0 = pix_tile * t.nb;
      oh0 = 0;
      valid_px = (p.N - n0 < t.nb ? p.N - n0 : t.nb) * ohw;
    }
    m0 = Tactic::flat ? pix_tile * Tactic::bm : n0 * ohw + oh0 * p.OW;  // the tile's pixels are m0 .. m0 + valid_px - 1 of the linear output
    c0 = ch_tile * channels;
  }
};

// Byte offset of (output pixel m, channel c) in a CHW32 tensor of `kpad` channels: one multiply-high
// for the image index (the host's FastDivmod numbers), no division.
__device__ __forceinline__ size_t chw32_offset(const ConvParams& p, int m, int c, int ohw, int kpad) {
  const int n = p.div_ohw.div(m), pix = m - n * ohw;
  return ((size_t)(n * (kpad / 32) + c / 32) * ohw + pix) * 32;
}

// Byte offset of (row m of the tiles' linear order, channel c), clearing `ok` where the row is not a pixel. Rows are
// the linear output index (chw32_offset); for flat tiles of 8-image groups (t.group_images 8) row 8q + i is pixel q % G
// of image 8 (q / G) + i, G = t.groups_per_set: OH * OW rounded up to whole boxes, the rows past OH * OW not pixels.
__device__ __forceinline__ size_t tile_row_offset(const ConvParams& p, const WgmmaTile& t, int m, int c, int ohw, int kpad,
                                                  bool& ok) {
  if (!Tactic::flat || t.group_images == 1) return chw32_offset(p, m, c, ohw, kpad);
  const int q = m >> 3, set = t.div_groups.div(q), pix = q - set * t.groups_per_set, n = set * 8 + (m & 7);
  ok = ok && pix < ohw;
  return ((size_t)(n * (kpad / 32) + c / 32) * ohw + pix) * 32;
}

// The pixel of tile position `pos` (its index in the tile's linear pixel range) and whether it is one of
// the tensor's: the same index, or with kWindows position oh * wh + i * pitch + ow = pixel i * OH * OW + oh * OW + ow
// (image i of the tile's), a pixel only where ow < OW (plugins/wgmma_tactics.py: WgmmaTactic._window_tiles); with Tactic::stride2_windows
// position (i * TH + oh) * pitch + ow (_stride2_window_tiles).
__device__ __forceinline__ int tile_pixel(int pos, const ConvParams& p, const TileCoord& tc, const WgmmaTile& t, int ohw,
                                          bool& ok) {
  if (!kWindows) {
    ok = pos < tc.valid_px;
    return pos;
  }
  if (kQuadWindows) {  // position e * BN / 2 + oh * pitch + t is pixel (oh, 2t + e)
    const int e = pos >= Tactic::bm / 2, q = pos - e * (Tactic::bm / 2), oh = q / t.pitch, tq = q - oh * t.pitch;
    const int pix = oh * p.OW + 2 * tq + e;
    ok = 2 * tq + e < p.OW && pix < tc.valid_px;
    return pix;
  }
  if (Tactic::stride2_windows) {  // positions (i * TH + oh) * pitch + ow: one image (i = 0), or NB stacked (TH = OH)
    const int row = pos / t.pitch, ow = pos - row * t.pitch, image = row / t.th, oh = row - image * t.th;
    const int pix = image * ohw + oh * p.OW + ow;
    ok = ow < p.OW && pix < tc.valid_px;
    return pix;
  }
  const int wh = t.nb * t.pitch, oh = pos / wh, x = pos - oh * wh, image = t.nb > 1 ? x / t.pitch : 0, ow = x - image * t.pitch;
  const int pix = image * ohw + oh * p.OW + ow;
  ok = ow < p.OW && oh < p.OH && pix < tc.valid_px;
  return pix;
}

// BN = output pixels per tile, CH = output channels per tile. First, with Tactic::resident_kt, the resident weights:
// Tactic::resident_kt / 4 chunks of CH rows x 128 bytes (128-byte swizzle). Then the ring: a slot is KS k32 steps of
// weights (CH rows; none with resident weights) then KS of activations (BN rows). After the ring: the
// channel-major tile's Tactic::staging staging tiles [pixel][CH + 16]; or the pixel-major tile's two residual
// buffers (one slice [block][16 pixels][32] per consumer warp in each) and each tile group's folded
// per-channel factors. Then the mbarriers: full[STAGES], empty[STAGES] and the resident weights' one.
template <int BN, int STAGES, int KS, int CH = 128, bool PIXM = false>
struct WgmmaSmem {
  static constexpr bool WRES = Tactic::resident_kt > 0;
  static constexpr bool HALO = kWindows != 0;
  static constexpr int A_STEP = CH * 32;            // weights of one k32 step
  static constexpr int B_STEP = BN * 32;            // activations of one k32 step
  static constexpr int WRES_CHUNK = CH * 128;       // resident weights of 4 k32 steps
  static constexpr int RING_OFFSET = WRES ? Tactic::resident_kt / 4 * WRES_CHUNK : 0;
  static constexpr int A_IN_SLOT = WRES ? 0 : KS * A_STEP;  // a slot's weight bytes, ahead of its activations
  static constexpr int STAGE = A_IN_SLOT + (HALO ? 0 : KS * B_STEP);
  static constexpr int HALO_OFFSET = RING_OFFSET + STAGES * STAGE;  // kWindows: the window ring
  static constexpr int HALO_ROW_BYTES = kQuadWindows ? 128 : Tactic::stride2_windows ? 64 : 32;  // a window row: one CHW32 vector, a pair or (Tactic::stride2_windows 2) a quad
  static constexpr int HALO_SLOT = HALO ? (Tactic::halo_rows * HALO_ROW_BYTES + 1023) / 1024 * 1024 : 0;
  static constexpr int HALO_STAGES = HALO ? Tactic::halo_stages : 1;  // (1 keeps the ring arithmetic defined)
  // staging row: 16-byte pad keeps 16-byte alignment, spreads banks; the TMA-storing tiles' staging is [block][BN][32]
  // (staging_offset), what their TMA store reads
  static constexpr int OUT_STRIDE = kTmaOut ? 32 : CH + 16;
  static constexpr int OUT_OFFSET = HALO_OFFSET + HALO_STAGES * HALO_SLOT;  // HALO_SLOT is 0 without windows
  static constexpr int OUT_BYTES = PIXM ? Tactic::consumers * 64 * CH : kTmaOut ? BN * CH : BN * OUT_STRIDE;  // one staging (or residual) buffer
  static constexpr int BUFFERS = PIXM ? Tactic::residual_buffers : Tactic::staging;
  static constexpr int GROUPS = PIXM ? Tactic::consumers / (BN / 64) : 1;  // tile groups (pixel-major): consumer warpgroups per CTA / per tile
  static constexpr int FACTOR_OFFSET = OUT_OFFSET + BUFFERS * OUT_BYTES;
  static constexpr int BAR_OFFSET = FACTOR_OFFSET + (PIXM ? GROUPS * 2 * CH * 4 : 0);
  // mbarriers: full[STAGES], empty[STAGES], resident weights, then the window ring's full / empty
  static constexpr int HALO_BARS = BAR_OFFSET + (2 * STAGES + 1) * 8;
  static constexpr int BYTES = HALO_BARS + (HALO ? 2 * HALO_STAGES * 8 : 0);
  static_assert(B_STEP % 256 == 0 && A_STEP % 256 == 0, "32-byte-swizzled tiles start 256-byte aligned");
  static_assert(!kWeightBox128 || (KS == 4 && STAGE % 1024 == 0), "128-byte weight boxes: 4 k32 steps per slot, 1024-byte aligned slots");
  static_assert(!WRES || (Tactic::resident_kt % 4 == 0 && WRES_CHUNK % 1024 == 0), "resident weights: whole 1024-byte-aligned chunks");
  static_assert(!HALO || (!PIXM && kWeightBox128 && !Tactic::multicast && BN <= Tactic::halo_rows), "halo windows: channel-major, 128-byte weight boxes, no multicast");
  static_assert(!Tactic::stride2_windows || HALO, "stride-2 windows are windows");
  static_assert(!Tactic::flat || PIXM, "flat tiles are pixel-major");
  static_assert(PIXM || !WRES || kChannelPingpong, "channel-major resident weights are the ping-pong tile's");
  static_assert(!kChannelPingpong || (CH == 64 && WRES && HALO && Tactic::staging == 2 && KS == 4),
                "channel-major ping-pong: 64-channel tiles, resident weights, windows, a staging tile per warpgroup");
  static_assert(!kTmaOut || (OUT_OFFSET % 256 == 0 && OUT_BYTES % 256 == 0), "32-byte-swizzled staging tiles start 256-byte aligned");
  static_assert(!Tactic::tma_store || (!PIXM && HALO && kWeightBox128 && CH == 128), "TMA-stored channel-major tiles: windows, 128-byte weight boxes");
};

// What one CTA works on, computed once by the kernel body and read by its roles: its thread and warpgroup, the output's
// pixels per image and padded channels, k-blocks (ring slots) and windows per tile, a window row's width, the tile
// stride.
struct CtaWork {
  int tid, wg, ohw, kpad, kblocks, windows, wh, tile_step;
};

}  // namespace trtfuse
