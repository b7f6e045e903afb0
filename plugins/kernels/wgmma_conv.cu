// Hopper (sm_90a) implicit-GEMM INT8 convolution: warpgroup wgmma fed by the bulk tensor copy engine
// (TMA) through an mbarrier ring, producer/consumer warp-specialised, with the fused epilogue of
// docs/ops.md (the same requantize_s32 as fused_conv.cu) and CHW32 in and out.
//
// The GEMM is laid out transposed against fused_conv.cu: wgmma's M is the output channels and its N
// the output pixels, so the weights are operand A and the activations operand B, both K-major:
//
//   A (weights)      128 output channels x 32 bytes of GEMM-K per k32 step: one TMA box of the packed
//                    weight [Kpad][KGpad] (2-D tensor map, box 32 x 128, rows past Kpad zero-filled).
//   B (activations)  P output pixels x 32 bytes per k32 step. One k32 step of the GEMM-K order
//                    (cb, r, s, cv) is one filter tap (r, s) of one 32-channel block cb, i.e. one 32-byte
//                    CHW32 vector per pixel, so the whole im2col row block is ONE TMA box of the 5-D
//                    view (32 channels, W, H, CB, N) of the activation: box (32, OW*stride_w,
//                    TH*stride_h, 1, NB) at (0, s - pad_left, oh0*stride_h + r - pad_top, cb, n0), with
//                    elementStrides (1, stride_w, stride_h, 1, 1) doing the convolution stride and the
//                    copy engine's out-of-bounds zero fill doing the padding. A pixel tile is TH full
//                    output rows of one image (NB = 1) or NB whole images (TH = OH), so its pixels are
//                    consecutive in the linear output index m and the box lands as P dense 32-byte rows.
//   Both boxes use CU_TENSOR_MAP_SWIZZLE_32B, which is exactly wgmma's K-major 32-byte-swizzle layout
//   (8-row groups 256 bytes apart), so no thread touches the operands between global memory and the
//   tensor cores.
//
// CTA: 3 warpgroups. Warpgroup 2 is the producer (one thread issues the TMA boxes of STAGES-deep ring
// slots of KS k32 steps, each slot guarded by a "full" mbarrier, completed by the copy engine's byte
// count, and an "empty" mbarrier that the 8 consumer warps arrive on once their wgmmas have read it);
// warpgroups 0 and 1 each own 64 of the 128 output channels and issue wgmma.m64n{BN}k32.s32.s8.s8,
// one batch of KS per slot, keeping one batch in flight (wait_group 1) before releasing the previous
// slot. setmaxnreg moves registers from the producer (40) to the consumers (232).
//
// Epilogue (consumers): the residual tile is cp.async-prefetched into a staging tile (its own group),
// every accumulator is requantized in docs/ops.md's order by requantize_s32 into the staging tile
// [pixel][128 + 16], and the tile goes back as coalesced 16-byte CHW32 vectors during the NEXT tile's
// first wgmma batch (WG_STAGING below says where the residual goes meanwhile). Pixels of the wgmma N
// past the tile (BN > P) read zero rows and are never stored.
//
// Compile-time configuration (one NVRTC compile per tactic, sm_90a only): WG_BN (wgmma N = pixel
// capacity of a tile), WG_STAGES (ring depth), WG_KS (k32 steps per ring slot), WG_PERSISTENT (1: a grid
// of at most one CTA per SM walks the tiles; the producer runs ahead into the next tile's slots while
// the consumers are in the epilogue).
#include "conv_epilogue.cuh"
#include "sm90_primitives.cuh"
#include "wgmma_s8.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma_conv.cu needs the sm_90a target (wgmma, setmaxnreg)"
#endif

#ifndef WG_BN
#define WG_BN 256
#define WG_STAGES 4
#define WG_KS 2
#endif
#ifndef WG_PERSISTENT
#define WG_PERSISTENT 0
#endif
// 1: the weights of a ring slot's 4 k32 steps arrive as ONE 128-byte-wide box (128 rows x 128 bytes,
// 128-byte swizzle) instead of 4 boxes of 32-byte rows. The copy engine's cost goes with the number of
// box rows it moves (bench/wgmma_diag.py: ~0.4 rows of 32 bytes per clock per SM), so this cuts the
// weight traffic's cost 4x. Needs WG_KS == 4.
#ifndef WG_A128
#define WG_A128 0
#endif
// 1: CTAs run in clusters of 2 on the two channel tiles of one pixel tile (the host guarantees an even
// number of channel tiles). The pair needs the same activation boxes: each CTA's copy engine loads half
// of a slot's k32 steps (rank r: steps j with j % 2 == r) and multicasts them into both CTAs, so each
// engine moves half the activation rows. A slot is refilled only when the consumers of BOTH CTAs
// released it (each consumer warp arrives on both CTAs' "empty" barriers).
#ifndef WG_MCAST
#define WG_MCAST 0
#endif
// Staging tiles (residual in, output out): 1, or 2 so that the next tile's residual streams into one
// while the other still holds the previous tile's output waiting to be stored (short-K residual layers,
// where a tile's main loop is too short to hide the residual's latency; costs shared memory, so those
// tactics run a shallower ring).
#ifndef WG_STAGING
#define WG_STAGING 1
#endif
// 1: pixels on wgmma's M, channels on its N (the "pixel-major" tile; needs WG_A128 and WG_PERSISTENT, no
// WG_MCAST): each consumer warpgroup owns 64 output pixels x all WG_CH channels of the tile, so the weight
// slot is operand B (shared by both warpgroups) and the activation rows operand A. The weight rows land
// permuted by the weight tensor map (plugins/wgmma.py) so that a thread's accumulators hold 8 consecutive
// channels of a pixel: the epilogue reads its residual (each warp cp.asyncs its own slice a tile ahead) and writes
// its output as 8-byte CHW32 pieces straight from registers, a warp covering 256 contiguous bytes, with
// no staging tile and no CTA-wide barrier per tile (the two warpgroups drift apart freely, one's epilogue
// under the other's wgmmas).
#ifndef WG_PIXM
#define WG_PIXM 0
#endif
// Output channels per CTA tile: 128 (two warpgroups x m64) for the channel-major tile; the wgmma N (128
// or 256) for the pixel-major one.
#ifndef WG_CH
#define WG_CH 128
#endif
// Consumer warpgroups (pixel-major only; the channel-major tile has 2): 2, or 4 so that each scheduler
// has 4 warps to interleave in the epilogue-bound short-K layers (register split: kConsumerRegs). The
// pixel-major tile is WG_BN / 64 warpgroups: with 64-pixel tiles each consumer warpgroup owns a tile of
// its own and the warpgroups take a CTA's tiles in turn, so one's epilogue runs under the others' wgmmas.
#ifndef WG_CONSUMERS
#define WG_CONSUMERS 2
#endif
// > 0 (pixel-major only): the whole weight of the CTA's channel tile, up to WG_WRES_KT k32 steps, is loaded
// once into shared memory and stays there (a persistent CTA keeps one channel tile: plugins/wgmma.py rounds
// the grid to whole channel tiles), so the ring slots carry activations only and the copy engine no longer
// reloads the same weights for every tile. Tiles whose GEMM-K is longer cannot take such a tactic.
#ifndef WG_WRES_KT
#define WG_WRES_KT 0
#endif
// 1 (pixel-major, two tile groups only): the groups take the tensor cores in turn ("ping-pong", as CUTLASS's
// KernelTmaWarpSpecializedPingpong): a group issues its tile's wgmmas only after the other group has issued
// its previous tile's (in the CTA's tile order, the producer's), then hands the turn on, so one group's
// epilogue runs under the other's main loop instead of the two drifting in step. Measured 2-4% on the
// residual 1x1 layers: their bound is the epilogue's ALU work itself (docs/PERF.md), not the overlap.
// Channel-major (WG_CH 64, resident weights, windows; consume_channel_pingpong): each consumer warpgroup takes
// a whole tile of its own, 64 channels x BN positions, the two on alternate tiles of the CTA's channel tile and
// taking the tensor cores in turn the same way. The channel-major epilogue then runs under the other warpgroup's
// main loop instead of idling the tensor cores, and the tile's drain (wait_group 0) and the ring's per-slot
// handshakes go (bench/wgmma_diag.py builds 12, 13: 30 % of res3 conv2's main loop); the channel tile's whole
// weight stays in shared memory, so the copy engine moves windows only; the output leaves by TMA store (the threads'
// own 16-byte stores had made the epilogue outlast the other warpgroup's main loop).
#ifndef WG_PINGPONG
#define WG_PINGPONG 0
#endif
// Channel-major ping-pong: wgmma batches a warpgroup leaves in flight while it prepares the next. One warpgroup
// issues at a time, so one batch in flight (4 k32 steps, ~420 clocks of tensor work at N 208) is less than the
// window waits and descriptor arithmetic take before the next batch issues: res3 conv2 w70 0.0717 ms with 1,
// 0.0660 with 2, 0.0640 with 3 (bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/33-inflight-*.json). With 3, a
// batch's windows and the two batches' before it may still be read: up to 4 windows held (R * S >= 4 taps), so the
// window ring needs 4 slots (WgmmaTactic asserts it).
#ifndef WG_PP_INFLIGHT
#define WG_PP_INFLIGHT 3
#endif
// 1 (channel-major, 128-byte weight boxes, stride-1 convs with R*S > 1): "halo" activation tiles. Without it,
// every k32 step loads its own activation box, so one 32-channel block of a 3x3 conv costs the copy engine 9
// boxes of P rows each: the engine's rows, not the tensor cores, bound the 3x3 layers (docs/wgmma.md, ~0.4
// rows per clock per SM). With it, a channel block's input window (TH + R - 1 rows x WH columns, zero-filled
// padding) lands once, as dense 32-byte rows, in a ring of its own, and the operand of tap (r, s) is a shifted
// view of it: tile position n = oh * WH + ow reads window row n + r * WH + s, which is one descriptor whose start
// moves by (r * WH + s) * 32 bytes. A window row is NB images side by side, each W + max(pad_left, pad_right)
// columns (the pitch), so one padding column serves as an image's left and its neighbour's right padding and
// small maps put several images in one tile (WgmmaTile::pitch; plugins/tactics.py: _window_tiles). The 32-byte
// swizzle is applied by TMA and wgmma alike to the absolute shared-memory address (as for any K offset inside
// a swizzle atom), so a view may start at any row. Positions with ow >= OW are computed and never stored;
// the window ring's slots hold WG_HALO_ROWS rows (>= the tile's positions + (R - 1) * WH + S - 1), the rows
// past the window zeroed once. Weight slots carry weights only.
#ifndef WG_HALO
#define WG_HALO 0
#endif
// 1 (pixel-major, 1x1 stride-1 unpadded convs, OH * OW a multiple of 8): "flat" pixel tiles. A row tile holds
// whole output rows, so a map whose rows do not fill the tile's 64 or 128 wgmma rows computes rows that are never
// stored (28-pixel rows: 112 of 128, 56-pixel rows: 56 of 64), and the epilogue, which bounds these layers
// (docs/PERF.md), pays for every computed row. A flat tile is WG_BN consecutive pixels of the linear output
// index: WG_BN / 8 groups of 8 pixels, group q = pixels 8(q % G) .. of image q / G (G = OH * OW / 8 groups per
// image), so only the batch's last tile has rows that are not pixels. The activation is viewed as (32, 8, CB, G,
// N) and one box (32, 8, KS, GB, 1) brings GB groups x a slot's KS channel blocks; GB divides G, so no box
// crosses an image. A box lands [group][block][8 pixels][32], so a slot is [group][k32 step][8][32]: k32 step s
// of the tile is the 32-byte-swizzled K-major operand from s * 256 with 8-row groups KS * 256 bytes apart (the
// descriptor's stride byte offset). Bigger boxes than one group per k32 step matter: the copy engine takes
// ~150 clocks per 512-byte box, so one box per group and k32 step left res3 conv3 bound by the copies
// (bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/17-flat-per-group-boxes-not-kept.json).
#ifndef WG_FLAT
#define WG_FLAT 0
#endif
// 1 (with WG_HALO, 3x3 stride-2 convs padded by 1 on even maps): "stride-2" windows. A strided conv's taps are not
// shifts of one window of input columns, but they are of a window of column PAIRS: output column ow's taps s = 0, 1, 2
// read input columns 2ow - 1 + s, i.e. bytes (1 + s) * 32 of the 64-byte pair row ow (pairs from -1), and its rows
// 2oh - 1 + r are phase-1 row oh - 1 (r = 0), phase-0 row oh (r = 1) and phase-1 row oh (r = 2) of the input split by
// row parity. One box (64, pitch, TH + 1, 2, 1) of the view (64, W / 2, H / 2, 2, N * CB) brings a channel block's
// window [phase][TH + 1 rows][pitch pairs][64] (64-byte swizzle), and tap (r, s)'s operand is the descriptor of 64-byte
// rows (wgmma's 64-byte-swizzle K-major layout, 8-row groups 512 bytes apart) from byte phase(r) + row(r) + (1 + s) * 32:
// the K offset inside a 64-byte row, as for any K step inside a swizzle atom (plugins/tactics.py:
// _stride2_window_tiles). The copy engine then moves 2 (TH + 1) pitch rows per channel block instead of 9 boxes of
// TH * OW rows; WG_HALO_ROWS counts 64-byte rows. Small maps stack NB whole images instead (7 x 7 outputs: 4 in N 224),
// positions (i * OH + oh) * pitch + ow: there each tap row r has a window of its own, one box (64, pitch, 2 OH, NB, 1)
// with element strides (1, 1, 2, 1, 1) of the view (64, W / 2, H, N, CB) bringing rows 2oh + r - 1 of the NB images,
// the three box_bytes / 3 apart (an image's phase-1 rows with the padding row above are OH + 1, one more than its rows
// of positions). (Not kept: the two channel tiles' CTAs of a cluster sharing the
// windows, each copy engine loading one phase and multicasting it: res3 first conv2 0.0587 ms against 0.0555,
// bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/47-stride2-multicast-not-kept.json.)
// WG_S2WIN 2 (one image per tile, window batches): 128-byte window rows of column quads (128-byte swizzle), half the
// pairs' rows. A quad row holds two output columns' taps, so the tile's positions split by output column parity e into
// two wgmmas of N / 2 per tap: position e * N / 2 + oh * pitch + t is pixel (oh0 + oh, 2t + e), and tap (r, s) of half e
// reads 32 bytes at phase(r) + row(r) + (3 + s + 2e) * 32 (plugins/tactics.py: _stride2_window_tiles). The output leaves by
// one TMA store per channel block and parity, of the view (32, OW / 2, 2, OH, N * KB).
#ifndef WG_S2WIN
#define WG_S2WIN 0
#endif
constexpr bool kQuadWindows = WG_S2WIN == 2;
// 1 (channel-major window tiles without ping-pong): the output leaves by TMA store, as the channel-major ping-pong
// tile's does: the weight rows permuted (plugins/wgmma.py) so a thread's two accumulator rows are adjacent channels,
// requantized in pairs into a [block][position][32] staging tile (32-byte swizzle), and one thread hands each channel
// block to the copy engine. The consumer threads' own 16-byte stores, issued under the next tile's first wgmma batch,
// outlasted it: res4 first conv2 w65 0.0545 ms, 0.0469 without them (main loop alone 0.0437; bench/results/
// wgmma-diag-NVIDIA_H200-2026-11-22/54-channel-major-stores.json).
#ifndef WG_TMA_OUT
#define WG_TMA_OUT 0
#endif
// 1 (window tiles that stream weights through the ring): a second producer thread, in the producer warpgroup's second
// warp, issues the windows, each as soon as its ring slot is free, instead of the weight thread issuing each window with
// the weight slot it is first used with, which bounds a window's lead by the weight ring's: w67's consumers spent 10 % of
// their ncu stall samples waiting on its 28.8 KB stride-2 windows, and with this thread res4 first conv2 went from 0.0507
// to 0.0482 ms (bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/63-window-warp*.json; the small stride-1 windows gained
// nothing).
#ifndef WG_WINDOW_WARP
#define WG_WINDOW_WARP 0
#endif
#ifndef WG_HALO_ROWS
#define WG_HALO_ROWS 288
#endif
#ifndef WG_HALO_STAGES
#define WG_HALO_STAGES 3
#endif
// Profiling builds only (bench/wgmma_diag.py), never a tactic: 1 = no epilogue (main loop alone),
// 2 = no wgmma (the copy engine's feed rate alone), 3 = no copies (wgmma and the ring's barriers on
// stale shared memory), 4 / 5 = as 2 with only the weight / only the activation boxes; pixel-major only: 6 = no
// residual loads (the epilogue reads stale slices); any tile: 7 = no output stores (the results folded and kept live
// (pixel-major) or left in the staging tile); pixel-major and channel-major ping-pong: 8 = the epilogue alone (no copies,
// no wgmma: opaque accumulators), 9 = as 8 without residual loads or stores (the epilogue's instructions alone); 10 / 11 = no weight copies (the wgmmas read stale weight slots: what
// resident weights would leave) without / with the epilogue; channel-major only: 12 = no copies and no epilogue (wgmma
// and the ring's barriers), 13 = as 12 without the ring (no barrier waits or arrives: the consumers' wgmma issue
// alone, the tile loop's own overheads). Each isolates one stage of the pipeline to say which one
// bounds it.
#ifndef WG_DIAG
#define WG_DIAG 0
#endif
constexpr bool kChannelPingpong = WG_PINGPONG && !WG_PIXM;
// Channel-major tiles whose weight rows are permuted in pairs and whose output leaves by TMA store
constexpr bool kTmaOut = kChannelPingpong || (WG_TMA_OUT && !WG_PIXM);
constexpr bool kDiagNoRing = WG_DIAG == 13;
// WG_WIN_BATCH (channel-major ping-pong on 3x3 windows): a wgmma batch per window (consume_channel_pingpong)
#ifndef WG_WIN_BATCH
#define WG_WIN_BATCH 0
#endif
// WG_EARLY_RELEASE (stride-2 window batches): a batch issues that many of its 9 taps, waits for the previous batch
// and gives its window back, then issues the rest (0: the whole batch, then the wait)
#ifndef WG_EARLY_RELEASE
#define WG_EARLY_RELEASE 0
#endif
static_assert(!WG_EARLY_RELEASE || (WG_S2WIN && WG_WIN_BATCH && WG_EARLY_RELEASE < 9), "early release: taps of a stride-2 window batch");
// WG_TIMELINE (channel-major ping-pong, profiling only; with any WG_DIAG): each warpgroup's thread 0 writes the SM
// clock at six points of each of its tiles into trtfuse_timeline, and the window ring's issue / sighting clocks go into
// trtfuse_windows, and each CTA's first clock into trtfuse_entry (bench/wgmma_timeline.py reads them back).
#ifndef WG_TIMELINE
#define WG_TIMELINE 0
#endif
// WG_PDL (persistent tiles; the host launches them with programmatic stream serialization): the CTA's setup and its
// resident weight, a constant of the layer, overlap the previous grid's last tiles; the first read of an activation
// or the residual and the first store wait for that grid (sm90::wait_for_prerequisites).
#ifndef WG_PDL
#define WG_PDL 0
#endif
constexpr bool kTimeline = WG_TIMELINE != 0;
constexpr int kTimelineCtas = 160, kTimelineTiles = 16, kTimelinePoints = 6, kTimelineUses = 64, kWindowPoints = 4;
#if WG_TIMELINE
extern "C" {
__device__ unsigned long long trtfuse_timeline[kTimelineCtas * 2 * kTimelineTiles * kTimelinePoints];
__device__ unsigned long long trtfuse_windows[kTimelineCtas * kTimelineUses * kWindowPoints];  // per window use: see stamp_window
__device__ unsigned long long trtfuse_entry[kTimelineCtas];  // the CTA's first clock (its start, before the barriers' init)
}
#endif
// (WG_TIMELINE) window ring use `use` of this CTA: point 0 issued by the producer, 1 seen landed by a consumer, 2 given
// back by the consumer (its warp 0), 3 the producer starts waiting for its slot
__device__ __forceinline__ void stamp_window(int use, int point) {
#if WG_TIMELINE
  if (blockIdx.x < kTimelineCtas && use < kTimelineUses)
    trtfuse_windows[(blockIdx.x * kTimelineUses + use) * kWindowPoints + point] = clock64();
#endif
}
constexpr bool kDiagNoCopies = WG_DIAG == 3 || WG_DIAG == 8 || WG_DIAG == 9 || WG_DIAG == 12 || kDiagNoRing;
constexpr bool kDiagNoResidualLoads = WG_DIAG == 6 || WG_DIAG == 9;
constexpr bool kDiagNoStores = WG_DIAG == 7 || WG_DIAG == 9;
constexpr bool kDiagEpilogueAlone = WG_DIAG == 8 || WG_DIAG == 9;
constexpr bool kDiagNoWeightCopies = WG_DIAG == 10 || WG_DIAG == 11;
constexpr bool kDiagNoWgmma = WG_DIAG == 2 || WG_DIAG == 4 || WG_DIAG == 5 || kDiagEpilogueAlone;

namespace trtfuse {

// Pixel-tile geometry, computed on the host (plugins/tactics.py: WgmmaTactic.geometry).
struct WgmmaTile {
  int th;               // output rows per tile (= OH when nb > 1)
  int nb;               // images per tile
  int tiles_per_image;  // pixel tiles per image when nb == 1 (unused otherwise)
  int ch_tiles;         // channel tiles: ceil(Kpad / WG_CH)
  int kt;               // k32 steps of the GEMM-K: CB * R * S
  int box_bytes;        // bytes one activation box writes: nb * th * OW * 32 (WG_FLAT: a k32 step's boxes, WG_BN * 32)
  int tiles;            // CTA tiles: pixel tiles x channel tiles (a persistent CTA walks tile += gridDim.x)
  int groups_per_image; // WG_FLAT: 8-pixel groups per image, OH * OW / 8 (unused otherwise)
  int box_groups;       // WG_FLAT: groups per activation box (a power of two dividing groups_per_image and WG_BN / 8)
  int pitch;            // WG_HALO: window columns per image, W + max(pad_left, pad_right); the window is nb * pitch wide
  FastDivmod div_groups;  // by groups_per_image
};
constexpr int kFlatGroup = 8;  // pixels per group: one 8-row core-matrix group of the operand
constexpr int kFlatGroupsPerTile = WG_FLAT ? WG_BN / kFlatGroup : 0;

// Where tile `tile` sits: channel tile fastest (CTAs sharing an activation tile run together, hit L2).
struct TileCoord {
  int n0, oh0, valid_px, m0, c0;
  __device__ __forceinline__ TileCoord(int tile, const ConvParams& p, const WgmmaTile& t, int ohw, int channels) {
    const int ch_tile = tile % t.ch_tiles, pix_tile = tile / t.ch_tiles;
    if (WG_FLAT) {  // WG_BN consecutive pixels of the linear output index (n0, oh0: unused)
      n0 = oh0 = 0;
      valid_px = min(WG_BN, p.N * ohw - pix_tile * WG_BN);
    } else if (t.nb == 1) {
      n0 = pix_tile / t.tiles_per_image;
      oh0 = (pix_tile - n0 * t.tiles_per_image) * t.th;
      valid_px = (p.OH - oh0 < t.th ? p.OH - oh0 : t.th) * p.OW;
    } else {
      n0 = pix_tile * t.nb;
      oh0 = 0;
      valid_px = (p.N - n0 < t.nb ? p.N - n0 : t.nb) * ohw;
    }
    m0 = WG_FLAT ? pix_tile * WG_BN : n0 * ohw + oh0 * p.OW;  // the tile's pixels are m0 .. m0 + valid_px - 1 of the linear output
    c0 = ch_tile * channels;
  }
};

// Byte offset of (output pixel m, channel c) in a CHW32 tensor of `kpad` channels: one multiply-high
// for the image index (the host's FastDivmod numbers), no division.
__device__ __forceinline__ size_t chw32_offset(const ConvParams& p, int m, int c, int ohw, int kpad) {
  const int n = p.div_ohw.div(m), pix = m - n * ohw;
  return ((size_t)(n * (kpad / 32) + c / 32) * ohw + pix) * 32;
}

// The pixel of tile position `pos` (its index in the tile's linear pixel range) and whether it is one of
// the tensor's: the same index, or with WG_HALO position oh * wh + i * pitch + ow = pixel i * OH * OW + oh * OW + ow
// (image i of the tile's), a pixel only where ow < OW (plugins/tactics.py: WgmmaTactic._window_tiles); with WG_S2WIN
// position (i * TH + oh) * pitch + ow (_stride2_window_tiles).
__device__ __forceinline__ int tile_pixel(int pos, const ConvParams& p, const TileCoord& tc, const WgmmaTile& t, int ohw,
                                          bool& ok) {
  if (!WG_HALO) {
    ok = pos < tc.valid_px;
    return pos;
  }
  if (kQuadWindows) {  // position e * BN / 2 + oh * pitch + t is pixel (oh, 2t + e)
    const int e = pos >= WG_BN / 2, q = pos - e * (WG_BN / 2), oh = q / t.pitch, tq = q - oh * t.pitch;
    const int pix = oh * p.OW + 2 * tq + e;
    ok = 2 * tq + e < p.OW && pix < tc.valid_px;
    return pix;
  }
  if (WG_S2WIN) {  // positions (i * TH + oh) * pitch + ow: one image (i = 0), or NB stacked (TH = OH)
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

// Visit the 16-byte vectors of a tile's staging tile [pixel][CH + 16] with their global CHW32 offsets:
// consumer thread ct (of THREADS) takes half ct % 2 of pixel rows ct / 2 + (THREADS / 2) j and the tile's CH / 32
// channel blocks of each, so a row's address costs one multiply-high (chw32_offset) and the blocks step by
// OH*OW*32 bytes. f(staging offset, in the tensor?, global byte offset); consecutive threads cover consecutive
// 16-byte halves of consecutive pixels, i.e. a warp moves 512 contiguous bytes per channel block. With WG_HALO
// staging row n is window position n (tile_pixel).
// Staging byte of (tile position px, channel block b, 16-byte half): [px][OUT_STRIDE] rows of the tile's channels, or
// (OUT_STRIDE == 32, the channel-major ping-pong's) [b][px][32] blocks of BN 32-byte rows, 32-byte swizzled (the half
// flips in rows 4-7 of each 8: the layout its TMA store reads, conflict-free for its 2-byte requantize stores).
template <int BN, int OUT_STRIDE>
__device__ __forceinline__ int staging_offset(int px, int b, int half) {
  if (OUT_STRIDE == 32) return b * BN * 32 + px * 32 + 16 * (half ^ ((px >> 2) & 1));
  return px * OUT_STRIDE + b * 32 + half * 16;
}
template <int BN, int CH, int THREADS, int OUT_STRIDE, typename F>
__device__ __forceinline__ void for_each_tile_vector(const ConvParams& p, const TileCoord& tc, int ohw, int kpad, int ct,
                                                     const WgmmaTile& t, F&& f) {
  constexpr int kRows = THREADS / 2;  // pixel rows per pass
  const int half = ct % 2;
  const int blocks = (kpad - tc.c0) / 32;  // channel blocks of this tile inside Kpad (< CH / 32 only on the last tile)
  const size_t block_bytes = (size_t)ohw * 32;
#pragma unroll
  for (int j = 0; j < (BN + kRows - 1) / kRows; ++j) {
    const int px = ct / 2 + kRows * j;
    if (BN % kRows != 0 && px >= BN) break;
    bool row_ok;
    const int pix = tile_pixel(px, p, tc, t, ohw, row_ok);
    const size_t row = row_ok ? chw32_offset(p, tc.m0 + pix, tc.c0, ohw, kpad) + half * 16 : 0;
#pragma unroll
    for (int b = 0; b < CH / 32; ++b) f(staging_offset<BN, OUT_STRIDE>(px, b, half), row_ok && b < blocks, row + b * block_bytes);
  }
}

// docs/ops.md's per-launch epilogue scalars, folded once per consumer thread: the output scale and its
// reciprocal (fold_scale divides by it), the residual scale over the output scale (0 without one), and
// the ReLU floor.
struct EpilogueScalars {
  float out_scale, out_scale_inv, rs, relu_min;
  __device__ __forceinline__ EpilogueScalars(const ConvParams& p, bool has_res)
      : out_scale(*p.out_scale), out_scale_inv(__frcp_rn(out_scale)),
        rs(has_res ? fold_scale(*p.residual_scale, out_scale, out_scale_inv) : 0.0f), relu_min(relu_floor(p.relu != 0)) {}
  __device__ __forceinline__ float fold(float s) const { return fold_scale(s, out_scale, out_scale_inv); }
};

// setmaxnreg split of the 64K registers: 128 producer threads + 128 * WG_CONSUMERS consumer threads.
// The pool is what the CTA got at launch: 65536 / threads per thread, in units of 8.
constexpr int kLaunchRegs = 65536 / (128 * (WG_CONSUMERS + 1)) / 8 * 8;
constexpr int kProducerRegs = WG_CONSUMERS == 2 ? 40 : 32;
constexpr int kConsumerRegs = WG_CONSUMERS == 2 ? 232 : 112;
static_assert(WG_CONSUMERS == 2 || WG_CONSUMERS == 4, "2 or 4 consumer warpgroups");
static_assert(kProducerRegs + WG_CONSUMERS * kConsumerRegs <= (WG_CONSUMERS + 1) * kLaunchRegs, "register pool");
static_assert(WG_CONSUMERS == 2 || WG_PIXM, "the channel-major tile has two consumer warpgroups");

// Profiling builds that leave the epilogue out (WG_DIAG 1, 2, 4, 5) keep the accumulators live instead,
// so the compiler cannot drop the wgmmas that produce them.
constexpr bool kDiagSkipsEpilogue =
    WG_DIAG == 1 || WG_DIAG == 2 || WG_DIAG == 4 || WG_DIAG == 5 || WG_DIAG == 10 || WG_DIAG == 12 || WG_DIAG == 13;
template <int NACC>
__device__ __forceinline__ void keep_accumulators_live(const int (&acc)[NACC], const ConvParams& p, int tid) {
  int folded = 0;
#pragma unroll
  for (int i = 0; i < NACC; ++i) folded ^= acc[i];
  if (folded == 0x7fffffff) p.y[tid] = 1;
}

// One thread's accumulators -> int8 in the staging tile [pixel][STRIDE] by requantize_s32 (conv_epilogue.cuh). Accumulator 4j + 2e + h (wgmma's m64nN layout) is
// pixel 8j + 2(lane % 4) + e, channel c_lo + 8h: `cells` points at pixel 2(lane % 4), channel c_lo.
// Every row is computed, also the pixels past the tile (their residual reads as zero or stale bytes,
// their results are never stored): no per-element predicate, and the offsets are constants. With RES,
// a group of J pixel blocks' residual bytes is read before any of its results is written: a read after
// a write to the same buffer cannot be hoisted by the compiler (it may alias), which would make every
// element one serial shared-load -> convert -> FMA -> convert -> shared-store chain. Conversions are the
// full-rate I2FP (an int8 widened to int32 first; int8_t -> float directly compiles to the quarter-rate
// I2F.S16) and one cvt.rni.sat.s8.f32 per element.
template <int BN, int STRIDE, bool RES>
__device__ __forceinline__ void requantize_to_staging(const int (&acc)[BN / 2], int8_t* cells, const float (&sc)[2],
                                                      const float (&bi)[2], float rs, float relu_min) {
  constexpr int J = (BN / 8) % 4 == 0 ? 4 : 2;
  static_assert((BN / 8) % J == 0, "pixel blocks split into groups of J");
#pragma unroll
  for (int j0 = 0; j0 < BN / 8; j0 += J) {
    // element i of the group: pixel block j0 + i / 4, pixel e = (i / 2) % 2, channel half h = i % 2
    auto cell = [&](int i) -> int8_t* { return cells + (8 * (j0 + i / 4) + (i / 2) % 2) * STRIDE + 8 * (i % 2); };
    int res[4 * J];
    if (RES) {
#pragma unroll
      for (int i = 0; i < 4 * J; ++i) res[i] = *cell(i);
    }
#pragma unroll
    for (int i = 0; i < 4 * J; ++i)
      *cell(i) = static_cast<int8_t>(requantize_s32<RES>(acc[4 * (j0 + i / 4) + 2 * (i % 2) + (i / 2) % 2], sc[i % 2],
                                                         bi[i % 2], [&] { return s32_to_float(res[i]); }, rs, relu_min));
  }
}

// Without a residual: the staging tile's 16-channel groups hold their channels paired, channel g + 8h of group w
// at byte 16w + 2g + h, so a thread's two channels (c_lo and c_lo + 8: g = c_lo % 8) of a pixel are adjacent bytes.
// Both are rounded and packed by one paired conversion (F2IP.S8, ALU pipe) and stored by one 2-byte STS, where the
// natural order costs two F2I.S8 (the quarter-rate XU pipe) and two byte stores; unpair_16_channels puts the order
// back on the way out (4 PRMT per 16-byte vector). `cells` points at pixel 2(lane % 4) of the thread's pair.
// The residual path keeps the natural order: there each thread overwrites its own residual bytes in place.
template <int BN, int STRIDE>
__device__ __forceinline__ void requantize_to_paired_staging(const int (&acc)[BN / 2], int8_t* cells, const float (&sc)[2],
                                                             const float (&bi)[2], float relu_min) {
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float v[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        v[h] = requantize_f32<false>(acc[4 * j + 2 * h + e], sc[h], bi[h], [] { return 0.0f; }, 0.0f, relu_min);
      *reinterpret_cast<unsigned short*>(cells + (8 * j + e) * STRIDE) = static_cast<unsigned short>(round_pack_s8x2(v[0], v[1]));
    }
  }
}

// The channel-major ping-pong tile's epilogue: its weight rows are permuted (plugins/wgmma.py) so that a thread's two
// accumulator rows are adjacent channels, which one paired conversion (F2IP.S8) rounds and packs into the natural byte
// order, stored by one 2-byte STS (in place over the residual's two bytes, read first; a group of J pixel blocks' reads
// come before any of its writes, as in requantize_to_staging). `cells` points at the thread's pixel 2(lane % 4), channel
// pair; STRIDE is the staging row.
template <int BN, int STRIDE, bool RES>
__device__ __forceinline__ void requantize_pairs(const int (&acc)[BN / 2], int8_t* cells, const float (&sc)[2], const float (&bi)[2],
                                                 float rs, float relu_min) {
  constexpr int J = (BN / 8) % 4 == 0 ? 4 : 2;
  static_assert((BN / 8) % J == 0, "pixel blocks split into groups of J");
#pragma unroll
  for (int j0 = 0; j0 < BN / 8; j0 += J) {
    int res[2 * J];  // pixel block j0 + i / 2, pixel e = i % 2: the two residual bytes
    if (RES) {
#pragma unroll
      for (int i = 0; i < 2 * J; ++i) res[i] = *reinterpret_cast<const short*>(cells + (8 * (j0 + i / 2) + i % 2) * STRIDE);
    }
#pragma unroll
    for (int i = 0; i < 2 * J; ++i) {
      const int j = j0 + i / 2, e = i % 2;
      float v[2];
#pragma unroll
      for (int h = 0; h < 2; ++h)
        v[h] = requantize_f32<RES>(acc[4 * j + 2 * h + e], sc[h], bi[h],
                                   [&] { return s32_to_float(h == 0 ? (int)(int8_t)res[i] : res[i] >> 8); }, rs, relu_min);
      *reinterpret_cast<unsigned short*>(cells + (8 * j + e) * STRIDE) = static_cast<unsigned short>(round_pack_s8x2(v[0], v[1]));
    }
  }
}

// A channel-major consumer thread's two output channels, c_lo and c_lo + 8 of the tile (c and c + 1 with the ping-pong
// tile's permuted weight rows): their docs/ops.md scale and
// bias, loaded before the tile's main loop (the latency hides under it), folded in the epilogue, which requantizes
// the thread's accumulators into the staging tile: in the natural order with a residual (in place over it), else
// paired. `cells` is the staging tile's pixel 2(lane % 4), channel c_lo.
struct ChannelPairFactors {
  float sc_raw[2], bi_raw[2];
  // channels c and c + step: the thread's accumulator rows (step 8), or with permuted weight rows (the ping-pong tile) 1
  __device__ __forceinline__ ChannelPairFactors(const ConvParams& p, int c, int kpad, int step = 8) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int cc = min(c + step * h, kpad - 1);  // channels past Kpad: computed, never stored
      sc_raw[h] = p.scale[cc];
      bi_raw[h] = p.bias[cc];
    }
  }
  // the folded factors scale / out_scale, bias / out_scale
  __device__ __forceinline__ void fold(const EpilogueScalars& es, float (&sc)[2], float (&bi)[2]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[h] = es.fold(sc_raw[h]);
      bi[h] = es.fold(bi_raw[h]);
    }
  }
  template <int BN, int STRIDE>
  __device__ __forceinline__ void requantize(const int (&acc)[BN / 2], int8_t* cells, int lane, const EpilogueScalars& es,
                                             bool has_res) const {
    float sc[2], bi[2];
    fold(es, sc, bi);
    if (has_res) {
      requantize_to_staging<BN, STRIDE, true>(acc, cells, sc, bi, es.rs, es.relu_min);
    } else {  // paired order: channel c_lo = 16w + g at byte 16w + 2g, c_lo + 8 next to it
      requantize_to_paired_staging<BN, STRIDE>(acc, cells + lane / 4, sc, bi, es.relu_min);
    }
  }
  // The TMA-storing tiles (kTmaOut, permuted weight rows): the thread's channel pair into `cells` of the
  // [block][position][32] staging tile, made visible to the copy engine's store.
  template <int BN>
  __device__ __forceinline__ void requantize_for_tma(const int (&acc)[BN / 2], int8_t* cells, const EpilogueScalars& es,
                                                     bool has_res) const {
    float sc[2], bi[2];
    fold(es, sc, bi);
    if (has_res)
      requantize_pairs<BN, 32, true>(acc, cells, sc, bi, es.rs, es.relu_min);
    else
      requantize_pairs<BN, 32, false>(acc, cells, sc, bi, 0.0f, es.relu_min);
    sm90::fence_proxy_async_shared();  // the staging writes, visible to the TMA store
  }
};

// 16 staged bytes in paired order (byte 2g + h = channel g + 8h) -> channel order.
__device__ __forceinline__ int4 unpair_16_channels(int4 v) {
  auto prmt = [](int a, int b, uint32_t sel) {
    int d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
  };
  return make_int4(prmt(v.x, v.y, 0x6420), prmt(v.z, v.w, 0x6420), prmt(v.x, v.y, 0x7531), prmt(v.z, v.w, 0x7531));
}

// The channel-major epilogue's two memory streams through the staging tile, THREADS consumer threads (ct their
// index among them): the residual in (cp.async, one group), the output out as 16-byte CHW32 vectors, from the
// paired order (requantize_to_paired_staging, no residual) or the natural one (requantize_to_staging).
template <int BN, int CH, int THREADS, int OUT_STRIDE>
__device__ __forceinline__ void residual_to_staging(const ConvParams& p, const TileCoord& tc, int ohw, int kpad, int ct,
                                                    const WgmmaTile& t, int8_t* staging) {
  for_each_tile_vector<BN, CH, THREADS, OUT_STRIDE>(p, tc, ohw, kpad, ct, t, [&](int s, bool ok, size_t g) {
    cp_async_16(smem_u32(staging + s), ok ? p.residual + g : p.residual, ok);
  });
}
template <int BN, int CH, int THREADS, int OUT_STRIDE>
__device__ __forceinline__ void store_staging(const ConvParams& p, const TileCoord& tc, int ohw, int kpad, int ct,
                                              const WgmmaTile& t, const int8_t* staging, bool paired) {
  if (!paired) {  // one branch per tile, not per vector
    for_each_tile_vector<BN, CH, THREADS, OUT_STRIDE>(p, tc, ohw, kpad, ct, t, [&](int s, bool ok, size_t g) {
      if (ok) *reinterpret_cast<int4*>(p.y + g) = *reinterpret_cast<const int4*>(staging + s);
    });
  } else {
    for_each_tile_vector<BN, CH, THREADS, OUT_STRIDE>(p, tc, ohw, kpad, ct, t, [&](int s, bool ok, size_t g) {
      if (ok) *reinterpret_cast<int4*>(p.y + g) = unpair_16_channels(*reinterpret_cast<const int4*>(staging + s));
    });
  }
}
// The TMA-storing tiles' output, issued by one thread: one box per channel block of the output's view, (32, pitch, NB, TH)
// of (32, OW, N, OH, KB), or with stacked stride-2 windows (32, pitch, TH, NB) of (32, OW, OH, N, KB) (plugins/wgmma.py);
// the copy engine drops the positions past a row (ow >= OW), the images past the batch and the blocks past Kpad.
template <int BN, int CH>
__device__ __forceinline__ void store_staging_by_tma(const sm90::TensorMap* tmap_y, const int8_t* staging, const TileCoord& tc,
                                                     const WgmmaTile& t, int kpad) {
  for (int b = 0; b < CH / 32 && tc.c0 + 32 * b < kpad; ++b) {
    const uint32_t src = smem_u32(staging + b * BN * 32);
    if (kQuadWindows) {  // one store per column parity e (positions e * BN / 2 ..)
      for (int e = 0; e < 2; ++e)
        sm90::tma_store_5d(tmap_y, src + e * (BN / 2) * 32, 0, 0, e, tc.oh0, tc.n0 * (kpad / 32) + tc.c0 / 32 + b);
    } else if (WG_S2WIN && t.nb > 1)
      sm90::tma_store_5d(tmap_y, src, 0, 0, tc.oh0, tc.n0, tc.c0 / 32 + b);
    else
      sm90::tma_store_5d(tmap_y, src, 0, 0, tc.n0, tc.oh0, tc.c0 / 32 + b);
  }
  sm90::bulk_commit_group();
}

// BN = output pixels per tile, CH = output channels per tile. First, with WG_WRES_KT, the resident weights:
// WG_WRES_KT / 4 chunks of CH rows x 128 bytes (128-byte swizzle). Then the ring: a slot is KS k32 steps of
// weights (CH rows; none with resident weights) then KS of activations (BN rows). After the ring: the
// channel-major tile's WG_STAGING staging tiles [pixel][CH + 16]; or the pixel-major tile's two residual
// buffers (one slice [block][16 pixels][32] per consumer warp in each) and each tile group's folded
// per-channel factors. Then the mbarriers: full[STAGES], empty[STAGES] and the resident weights' one.
template <int BN, int STAGES, int KS, int CH = 128, bool PIXM = false>
struct WgmmaSmem {
  static constexpr bool WRES = WG_WRES_KT > 0;
  static constexpr bool HALO = WG_HALO != 0;
  static constexpr int A_STEP = CH * 32;            // weights of one k32 step
  static constexpr int B_STEP = BN * 32;            // activations of one k32 step
  static constexpr int WRES_CHUNK = CH * 128;       // resident weights of 4 k32 steps
  static constexpr int RING_OFFSET = WRES ? WG_WRES_KT / 4 * WRES_CHUNK : 0;
  static constexpr int A_IN_SLOT = WRES ? 0 : KS * A_STEP;  // a slot's weight bytes, ahead of its activations
  static constexpr int STAGE = A_IN_SLOT + (HALO ? 0 : KS * B_STEP);
  static constexpr int HALO_OFFSET = RING_OFFSET + STAGES * STAGE;  // WG_HALO: the window ring
  static constexpr int HALO_ROW_BYTES = kQuadWindows ? 128 : WG_S2WIN ? 64 : 32;  // a window row: one CHW32 vector, a pair or (WG_S2WIN 2) a quad
  static constexpr int HALO_SLOT = HALO ? (WG_HALO_ROWS * HALO_ROW_BYTES + 1023) / 1024 * 1024 : 0;
  static constexpr int HALO_STAGES = HALO ? WG_HALO_STAGES : 1;  // (1 keeps the ring arithmetic defined)
  // staging row: 16-byte pad keeps 16-byte alignment, spreads banks; the TMA-storing tiles' staging is [block][BN][32]
  // (staging_offset), what their TMA store reads
  static constexpr int OUT_STRIDE = kTmaOut ? 32 : CH + 16;
  static constexpr int OUT_OFFSET = HALO_OFFSET + HALO_STAGES * HALO_SLOT;  // HALO_SLOT is 0 without windows
  static constexpr int OUT_BYTES = PIXM ? WG_CONSUMERS * 64 * CH : kTmaOut ? BN * CH : BN * OUT_STRIDE;  // one staging (or residual) buffer
  static constexpr int BUFFERS = PIXM ? 2 : WG_STAGING;
  static constexpr int GROUPS = PIXM ? WG_CONSUMERS / (BN / 64) : 1;  // tile groups (pixel-major): consumer warpgroups per CTA / per tile
  static constexpr int FACTOR_OFFSET = OUT_OFFSET + BUFFERS * OUT_BYTES;
  static constexpr int BAR_OFFSET = FACTOR_OFFSET + (PIXM ? GROUPS * 2 * CH * 4 : 0);
  // mbarriers: full[STAGES], empty[STAGES], resident weights, then the window ring's full / empty
  static constexpr int HALO_BARS = BAR_OFFSET + (2 * STAGES + 1) * 8;
  static constexpr int BYTES = HALO_BARS + (HALO ? 2 * HALO_STAGES * 8 : 0);
  static_assert(B_STEP % 256 == 0 && A_STEP % 256 == 0, "32-byte-swizzled tiles start 256-byte aligned");
  static_assert(!WG_A128 || (KS == 4 && STAGE % 1024 == 0), "128-byte weight boxes: 4 k32 steps per slot, 1024-byte aligned slots");
  static_assert(!WRES || (WG_WRES_KT % 4 == 0 && WRES_CHUNK % 1024 == 0), "resident weights: whole 1024-byte-aligned chunks");
  static_assert(!HALO || (!PIXM && WG_A128 && !WG_MCAST && BN <= WG_HALO_ROWS), "halo windows: channel-major, 128-byte weight boxes, no multicast");
  static_assert(!WG_S2WIN || HALO, "stride-2 windows are windows");
  static_assert(!WG_FLAT || PIXM, "flat tiles are pixel-major");
  static_assert(PIXM || !WRES || kChannelPingpong, "channel-major resident weights are the ping-pong tile's");
  static_assert(!kChannelPingpong || (CH == 64 && WRES && HALO && WG_STAGING == 2 && KS == 4),
                "channel-major ping-pong: 64-channel tiles, resident weights, windows, a staging tile per warpgroup");
  static_assert(!kTmaOut || (OUT_OFFSET % 256 == 0 && OUT_BYTES % 256 == 0), "32-byte-swizzled staging tiles start 256-byte aligned");
  static_assert(!WG_TMA_OUT || (!PIXM && HALO && WG_A128 && CH == 128), "TMA-stored channel-major tiles: windows, 128-byte weight boxes");
};

template <int BN, int STAGES, int KS, int CH, bool PERSISTENT>
__device__ __forceinline__ void consume_pixel_major(const ConvParams& p, const WgmmaTile& t, int8_t* smem, uint32_t base);
template <int BN, int STAGES, int KS, int CH>
__device__ __forceinline__ void consume_channel_pingpong(const ConvParams& p, const WgmmaTile& t, int8_t* smem, uint32_t base,
                                                         const sm90::TensorMap* tmap_y);

// WG_HALO, consumer side, one tile: its windows are uses first .. first + windows - 1 of the window ring (the
// producer issues them in the CTA's tile order). A batch waits for every window it reads before its first
// wgmma (no spin between wgmmas), and a window goes back once every wgmma that reads it is done. `view` is
// the operand of the next k32 step: the current channel block's window (ring slot `slot`) from row r * wh + s.
// `advance` selects rather than branches: a branch between two wgmmas of a batch makes ptxas fence each one
// (WARPGROUP.ARRIVE), and with one warpgroup issuing at a time (WG_PINGPONG) the issue then falls behind the
// tensor cores.
// With WG_S2WIN, tap (r, s)'s view starts at byte row_view(r) + (1 + s) * 32 of the window (see WG_S2WIN): `offset`
// is kept as those bytes, the stride-1 windows' as (r * wh + s) * 32.
template <class L>
struct WindowCursor {
  // row_view0..2: where tap row r's view starts in a stride-2 window. One image: phase 1 from pair row oh - 1, phase 0
  // from oh, phase 1 from oh (phases TH + 1 rows of `pitch` pairs apart); stacked images: window r of three, each
  // box_bytes / 3 (plugins/tactics.py: _stride2_window_tiles).
  int first, waited = 0, released = 0, slot, r = 0, s = 0, row_view0, row_view1, row_view2, offset;
  __device__ __forceinline__ WindowCursor(int first_use, const WgmmaTile& t)
      : first(first_use), slot(first_use % L::HALO_STAGES) {
    const int phase_bytes = (t.th + 1) * t.pitch * L::HALO_ROW_BYTES, row_bytes = t.pitch * L::HALO_ROW_BYTES;
    const int stacked = t.box_bytes / 3;
    row_view0 = t.nb > 1 ? 0 : phase_bytes;
    row_view1 = t.nb > 1 ? stacked : row_bytes;
    row_view2 = t.nb > 1 ? 2 * stacked : phase_bytes + row_bytes;
    offset = WG_S2WIN ? s2_offset() : 0;
  }
  // the current tap (r, s) of a stride-2 window (quads: of its even half; the odd half's is 64 bytes on)
  static constexpr int kFirstTap = kQuadWindows ? 96 : 32;  // column 2ow - 1's bytes in the first window row
  __device__ __forceinline__ int s2_offset() const {
    return (r == 0 ? row_view0 : r == 1 ? row_view1 : row_view2) + kFirstTap + 32 * s;
  }
  __device__ __forceinline__ void wait_for_steps_before(int k_end, const ConvParams& p, uint32_t hfull0) {
    for (; waited * p.R * p.S < k_end; ++waited) {
      const int use = first + waited;
      sm90::mbar_wait(hfull0 + 8 * (use % L::HALO_STAGES), (use / L::HALO_STAGES) & 1);
      if (kTimeline && threadIdx.x % 128 == 0) stamp_window(use, 1);
    }
  }
  // Whether the next window to wait for has landed (no waiting)
  __device__ __forceinline__ bool next_landed(uint32_t hfull0) const {
    const int use = first + waited;
    return sm90::mbar_test(hfull0 + 8 * (use % L::HALO_STAGES), (use / L::HALO_STAGES) & 1);
  }
  // Every window whose k32 steps all lie before step k: one arrive per consumer warp.
  __device__ __forceinline__ void release_before(int k, int windows, const ConvParams& p, uint32_t hempty0, int lane) {
    for (; released < windows && (released + 1) * p.R * p.S <= k; ++released) {
      if (lane == 0) sm90::mbar_arrive(hempty0 + 8 * ((first + released) % L::HALO_STAGES));
      if (kTimeline && threadIdx.x % 128 == 0) stamp_window(first + released, 2);
    }
  }
  __device__ __forceinline__ uint32_t view(uint32_t base) const {
    return base + L::HALO_OFFSET + slot * L::HALO_SLOT + offset;
  }
  // WG_S2WIN, a batch of one whole 3x3 window: the descriptor of the window's slot, computed once per batch; tap j's
  // (r = j / 3, s = j % 3, compile-time constants once the batch is unrolled) is it plus s2_tap_quads(j), so no cursor
  // arithmetic runs between the wgmmas (the address field, bits 0-13, cannot carry: shared memory is under 256 KB).
  __device__ __forceinline__ uint64_t s2_window_desc(uint32_t base) const {
    const uint32_t slot_addr = base + L::HALO_OFFSET + slot * L::HALO_SLOT;
    return kQuadWindows ? sm90::desc_kmajor_sw128(slot_addr) : sm90::desc_kmajor_sw64(slot_addr);
  }
  __device__ __forceinline__ uint32_t s2_tap_quads(int j) const {
    return (uint32_t)((j / 3 == 0 ? row_view0 : j / 3 == 1 ? row_view1 : row_view2) + kFirstTap + 32 * (j % 3)) >> 4;
  }
  // past the current window: the next slot's tap (0, 0)
  __device__ __forceinline__ void next_window() {
    slot = slot + 1 == L::HALO_STAGES ? 0 : slot + 1;
    r = 0;
    s = 0;
    offset = s2_offset();
  }
  // The wgmma operand B of the current tap
  __device__ __forceinline__ uint64_t desc(uint32_t base) const {
    return WG_S2WIN ? sm90::desc_kmajor_sw64(view(base)) : sm90::desc_kmajor_sw32(view(base));
  }
  // The next tap: (r, s + 1), (r + 1, 0), or the next channel block's (0, 0). Past the tile's last window the
  // views point into the ring's next slot: only steps past the GEMM-K read them, against zero weights. wh: the
  // window's width (stride 1).
  __device__ __forceinline__ void advance(const ConvParams& p, int wh) {
    const bool next_row = s + 1 == p.S, next_window = next_row && r + 1 == p.R;
    s = next_row ? 0 : s + 1;
    r = next_window ? 0 : (next_row ? r + 1 : r);
    if (WG_S2WIN)
      offset = s2_offset();
    else
      offset = next_window ? 0 : offset + 32 * (next_row ? wh - p.S + 1 : 1);
    slot = next_window ? (slot + 1 == L::HALO_STAGES ? 0 : slot + 1) : slot;
  }
};

// Taps J0 .. J1 - 1 of the cursor's stride-2 3x3 window (its first k32 step k0), the views from one descriptor.
template <int J0, int J1, int BN, class L>
__device__ __forceinline__ void issue_window_taps(int (&acc)[BN / 2], uint32_t base, const WindowCursor<L>& win, int k0) {
  const uint64_t window = win.s2_window_desc(base);
#pragma unroll
  for (int j = J0; j < J1; ++j) {
    const int k = k0 + j;
    const uint64_t weight = sm90::desc_kmajor_sw128(base + (k >> 2) * L::WRES_CHUNK + 32 * (k & 3));
    if (kDiagNoWgmma) {
    } else if constexpr (kQuadWindows) {  // the even columns' positions, then the odd ones' 64 bytes on (4 x 16)
      sm90::WgmmaS8<BN / 2>::template mma<0>(acc, weight, window + win.s2_tap_quads(j), k > 0);
      sm90::WgmmaS8<BN / 2>::template mma<BN / 4>(acc, weight, window + win.s2_tap_quads(j) + 4, k > 0);
    } else {
      sm90::WgmmaS8<BN>::mma(acc, weight, window + win.s2_tap_quads(j), k > 0);
    }
  }
}

// The channel-major ping-pong's batch body: N wgmmas of k32 steps k0 .. k0 + N - 1, operand A the resident weight (chunk
// k / 4 of 4 steps in 128-byte rows, step k % 4 in it), operand B the window cursor's taps, with no branch between them (a
// branch makes ptxas fence each wgmma). A tile's first step overwrites the accumulators. ONE_CHUNK: k0 is a multiple of 4
// and N <= 4, so the batch reads one chunk, its address computed once (the per-step k / 4, k % 4 cost w70 and w71 2 %:
// res3 conv2 0.0486 -> 0.0496 ms, res4 conv2 0.0458 -> 0.0466 in one A/B call).
template <int N, bool ONE_CHUNK, int BN, class L>
__device__ __forceinline__ void issue_resident_steps(int (&acc)[BN / 2], uint32_t base, WindowCursor<L>& win, int k0,
                                                     const ConvParams& p, int wh) {
  static_assert(!ONE_CHUNK || N <= 4, "one chunk holds 4 k32 steps");
  static_assert(!kQuadWindows || WG_WIN_BATCH, "quad windows: a batch per window");
  if constexpr (WG_S2WIN && N == 9) {  // one stride-2 3x3 window (WG_WIN_BATCH)
    issue_window_taps<0, 9, BN>(acc, base, win, k0);
    win.next_window();
    return;
  }
  const uint32_t chunk = base + (k0 >> 2) * L::WRES_CHUNK;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int k = k0 + j;
    const uint32_t a = ONE_CHUNK ? chunk + 32 * j : base + (k >> 2) * L::WRES_CHUNK + 32 * (k & 3);
    if (!kDiagNoWgmma) sm90::WgmmaS8<BN>::mma(acc, sm90::desc_kmajor_sw128(a), win.desc(base), k > 0);
    win.advance(p, wh);
  }
}

template <int BN, int STAGES, int KS, bool PERSISTENT, int CH = 128, bool PIXM = false>
__device__ __forceinline__ void wgmma_conv_body(const sm90::TensorMap* tmap_w, const sm90::TensorMap* tmap_x, const sm90::TensorMap* tmap_y,
                                                const ConvParams& p, const WgmmaTile& t) {
  using L = WgmmaSmem<BN, STAGES, KS, CH, PIXM>;
  static_assert(!PIXM || (WG_A128 && PERSISTENT && !WG_MCAST && KS == 4), "pixel-major: 128-byte weight boxes, persistent, no multicast");
  static_assert(!kTimeline || kChannelPingpong, "the timeline build is the channel-major ping-pong's");
  static_assert(PIXM || WG_DIAG < 6 || WG_DIAG >= 10 || WG_DIAG == 7 || (kChannelPingpong && WG_DIAG >= 7),
                "profiling builds 6-9 take the pixel-major epilogue apart (7-9 also the channel-major ping-pong's, 7 any tile's)");
  constexpr int CONSUMERS = 128 * WG_CONSUMERS;
  if (WG_DIAG == 15) return;  // profiling: a launch of this shape doing nothing (what a launch costs in a CUDA graph)
  if (WG_PDL == 1) sm90::launch_dependents();
#if WG_TIMELINE
  if (threadIdx.x == 0 && blockIdx.x < kTimelineCtas) trtfuse_entry[blockIdx.x] = clock64();
#endif
  extern __shared__ __align__(1024) int8_t smem_raw[];
  // Align the operand ring to 1024 bytes of shared-memory address (the host asks for 1024 more).
  const uint32_t raw = sm90::smem_addr(smem_raw);
  int8_t* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const uint32_t base = sm90::smem_addr(smem);
  int8_t* s_out = smem + L::OUT_OFFSET;
  const uint32_t full0 = base + L::BAR_OFFSET, empty0 = full0 + STAGES * 8, wres_full = empty0 + STAGES * 8;
  const uint32_t hfull0 = base + L::HALO_BARS, hempty0 = hfull0 + L::HALO_STAGES * 8;  // WG_HALO's window ring

  const int tid = threadIdx.x, wg = tid / 128;
  const int ohw = p.OH * p.OW, kpad = (p.K + 31) / 32 * 32;
  const int kblocks = (t.kt + KS - 1) / KS;
  // WG_HALO: a tile's windows (one per 32-channel block, R * S k32 steps each) and their width
  const int windows = L::HALO ? t.kt / (p.R * p.S) : 0, wh = t.nb * t.pitch;
  // One tile per CTA, or (PERSISTENT) tiles blockIdx.x, + gridDim.x, ...: the ring and its phases run on
  // across tiles, so the producer fills the next tile's slots while the consumers store this one.
  const int tile_step = PERSISTENT ? gridDim.x : t.tiles;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      sm90::mbar_init(full0 + 8 * s, 1);       // the producer's arrive + the copy engine's bytes
      // one arrive per consumer warp that reads the slot: of both CTAs (multicast), of one tile group (pixel-major)
      sm90::mbar_init(empty0 + 8 * s, PIXM ? 4 * BN / 64 : (WG_MCAST ? 2 : 1) * CONSUMERS / 32);
    }
    sm90::mbar_init(wres_full, 1);
#pragma unroll
    for (int s = 0; s < (L::HALO ? L::HALO_STAGES : 0); ++s) {
      sm90::mbar_init(hfull0 + 8 * s, 1);
      sm90::mbar_init(hempty0 + 8 * s, (kChannelPingpong ? 128 : CONSUMERS) / 32);  // the warps that read the window
    }
    sm90::fence_barrier_init();
  }
  const uint32_t rank = WG_MCAST ? sm90::cluster_ctarank() : 0;
  // Activation rows past the box (BN > the tile's P pixels) are never written by the copy engine:
  // zero them once, before the async proxy reads them.
  if (L::HALO) {  // window rows past the box (only positions that are never stored read them)
    const int per_slot = (L::HALO_SLOT - t.box_bytes) / 16;
    for (int i = tid; i < L::HALO_STAGES * per_slot; i += blockDim.x) {
      const int slot = i / per_slot, off = i - slot * per_slot;
      *reinterpret_cast<int4*>(smem + L::HALO_OFFSET + slot * L::HALO_SLOT + t.box_bytes + off * 16) = make_int4(0, 0, 0, 0);
    }
    sm90::fence_proxy_async_shared();
  }
  const int tail = L::B_STEP - t.box_bytes;
  if (!L::HALO && tail > 0) {
    const int per_step = tail / 16;
    for (int i = tid; i < STAGES * KS * per_step; i += blockDim.x) {
      const int step = i / per_step, off = i - step * per_step;
      int8_t* dst = smem + L::RING_OFFSET + (step / KS) * L::STAGE + L::A_IN_SLOT + (step % KS) * L::B_STEP + t.box_bytes + off * 16;
      *reinterpret_cast<int4*>(dst) = make_int4(0, 0, 0, 0);
    }
    sm90::fence_proxy_async_shared();
  }
  __syncthreads();
  if (WG_MCAST) sm90::cluster_sync();  // the partner's barriers exist before any multicast completes on them
  constexpr bool kWindowWarp = WG_WINDOW_WARP && L::HALO && !kChannelPingpong;
  static_assert(!WG_WINDOW_WARP || kWindowWarp, "a window thread: window tiles whose weights stream through the ring");
  const bool weight_thread = tid == CONSUMERS;  // issues the resident weight (and, but for WG_WINDOW_WARP, the rest)
  // (WG_PDL) every other thread waits for the previous grid here; the weight thread once it has issued the weight
  if (WG_PDL && !weight_thread) sm90::wait_for_prerequisites();

  if (wg == WG_CONSUMERS) {
    // ---------------- producer warpgroup: one thread drives the copy engine (WG_WINDOW_WARP: a second, the windows) ----------------
    sm90::regs_dealloc<kProducerRegs>();
    const bool window_thread = kWindowWarp && tid == CONSUMERS + 32;  // (WG_WINDOW_WARP) issues the windows only
    if ((weight_thread || window_thread) && !kDiagNoRing) {
      // What the copy engine moves: profiling builds 3, 8, 9 nothing, 4 only weights, 5 only activations;
      // resident weights once, below, instead of in every slot.
      constexpr bool kCopyWeights = !kDiagNoCopies && !kDiagNoWeightCopies && WG_DIAG != 5, kLoadActivations = !kDiagNoCopies && WG_DIAG != 4;
      constexpr bool kLoadWeights = kCopyWeights && !L::WRES;  // per ring slot
      sm90::prefetch_tensor_map(tmap_w);
      sm90::prefetch_tensor_map(tmap_x);
      if (L::WRES && (int)blockIdx.x < t.tiles && kCopyWeights) {  // (never the window thread: its tiles stream weights)
        // The CTA's channel tile (the same for all its tiles) as permuted 128-byte chunks: see the slot's box below.
        // (Channel-major: plain CH rows x 128 bytes per chunk, 128-byte swizzle, the A operand of all 4 steps.)
        const int chunks = (t.kt + 3) / 4, c0 = TileCoord(blockIdx.x, p, t, ohw, CH).c0;
        sm90::mbar_arrive_expect_tx(wres_full, chunks * L::WRES_CHUNK);
        for (int c = 0; c < chunks; ++c) {
          if (PIXM)
            sm90::tma_load_5d(base + c * L::WRES_CHUNK, tmap_w, wres_full, c * 128, 0, 0, 0, c0 / 32);
          else if (kChannelPingpong)  // (KGpad, 8, 2, Kpad/16, 1): box row 16u + 8h + g is channel 16u + 2g + h
            sm90::tma_load_5d(base + c * L::WRES_CHUNK, tmap_w, wres_full, c * 128, 0, 0, c0 / 16, 0);
          else
            sm90::tma_load_2d(base + c * L::WRES_CHUNK, tmap_w, wres_full, c * 128, c0);
        }
      } else if (L::WRES) {
        sm90::mbar_arrive(wres_full);
      }
      if (WG_PDL && weight_thread) sm90::wait_for_prerequisites();
      int it = 0;  // ring slot use counter, continuous across tiles
      for (int tile = blockIdx.x, local = 0; tile < t.tiles; tile += tile_step, ++local) {
        const TileCoord tc(tile, p, t, ohw, CH);
        const int h0 = tc.oh0 * p.stride_h - p.pad_top, w0 = -p.pad_left;
        // WG_HALO: channel block cb's window, the tile's (local * windows + cb)-th use of the window ring
        auto issue_window = [&](int cb) {
          const int use = local * windows + cb, hs = use % L::HALO_STAGES;
          const uint32_t hfull = hfull0 + 8 * hs;
          if (kTimeline) stamp_window(use, 3);
          sm90::mbar_wait(hempty0 + 8 * hs, ((use / L::HALO_STAGES) & 1) ^ 1);
          if (kTimeline) stamp_window(use, 0);
          if (!kLoadActivations) {
            sm90::mbar_arrive(hfull);
          } else {
            sm90::mbar_arrive_expect_tx(hfull, t.box_bytes);
            const uint32_t slot = base + L::HALO_OFFSET + hs * L::HALO_SLOT;
            if (WG_S2WIN && t.nb > 1) {  // stacked images, the view (64, W / 2, H, N, CB): tap row r's rows 2oh + r - 1
              for (int r = 0; r < 3; ++r)
                sm90::tma_load_5d(slot + r * (t.box_bytes / 3), tmap_x, hfull, 0, -1, r - 1, tc.n0, cb);
            } else if (WG_S2WIN) {  // the pair view (64, W / 2, H / 2, 2, N * CB): pairs from -1, rows of both phases from oh0 - 1
              sm90::tma_load_5d(slot, tmap_x, hfull, 0, -1, tc.oh0 - 1, 0, tc.n0 * windows + cb);
            } else  // the window view (32, W, N, H, CB) of the activation (plugins/wgmma.py): NB images side by side
              sm90::tma_load_5d(slot, tmap_x, hfull, 0, w0, tc.n0, h0, cb);
          }
        };
        if (kChannelPingpong || window_thread) {  // resident weights (or WG_WINDOW_WARP's window thread): windows only
          for (int cb = 0; cb < windows; ++cb) issue_window(cb);
          continue;
        }
        int cb = 0, r = 0, s = 0;  // tap of k32 step k = (cb * R + r) * S + s (the packed weight's GEMM-K order)
        for (int kb = 0; kb < kblocks; ++kb, ++it) {
          const int slot = it % STAGES;
          sm90::mbar_wait(empty0 + 8 * slot, ((it / STAGES) & 1) ^ 1);
          const int steps = t.kt - kb * KS < KS ? t.kt - kb * KS : KS;
          const uint32_t full = full0 + 8 * slot;
          // A 128-byte weight box always lands whole (k32 steps past the GEMM-K read as zeros). Profiling
          // builds without copies still arrive on every barrier, so the ring keeps its turns.
          const int a_bytes = !kLoadWeights ? 0 : (WG_A128 ? KS * L::A_STEP : steps * L::A_STEP);
          const int act_steps = WG_FLAT ? KS : steps;  // a flat box brings KS blocks, those past CB zero-filled
          sm90::mbar_arrive_expect_tx(full, a_bytes + (L::HALO || !kLoadActivations ? 0 : act_steps * t.box_bytes));
          const uint32_t sa = base + L::RING_OFFSET + slot * L::STAGE, sb = sa + L::A_IN_SLOT;
          if (kLoadWeights && PIXM) {
            // 5-D view (KGpad, 2, 4, 4, Kpad/32) of the packed weight: row e + 2q + 8jj + 32b of the box is
            // channel c0 + 32b + 8q + 2jj + e (plugins/wgmma.py), which is wgmma column 8(4b + jj) + 2q + e.
            sm90::tma_load_5d(sa, tmap_w, full, kb * KS * 32, 0, 0, 0, tc.c0 / 32);
          } else if (kLoadWeights && WG_A128 && kTmaOut) {  // (KGpad, 8, 2, Kpad/16, 1): box row 16u + 8h + g is channel 16u + 2g + h
            sm90::tma_load_5d(sa, tmap_w, full, kb * KS * 32, 0, 0, tc.c0 / 16, 0);
          } else if (kLoadWeights && WG_A128) {
            sm90::tma_load_2d(sa, tmap_w, full, kb * KS * 32, tc.c0);
          }
          for (int j = 0; j < steps; ++j) {
            const int k = kb * KS + j;
            if (kLoadWeights && !WG_A128) sm90::tma_load_2d(sa + j * L::A_STEP, tmap_w, full, k * 32, tc.c0);
            if (L::HALO) {
              if (!kWindowWarp && r == 0 && s == 0) issue_window(cb);  // after the weight slot it is first used with
            } else if (!kLoadActivations) {
            } else if (WG_FLAT) {
              // The slot's boxes, once (j == 0), each GB groups x the slot's KS channel blocks (1x1: k32 step k is
              // block k; blocks past CB zero-filled). Boxes past the batch (its last tile) load the batch's last box
              // again: their rows are never stored, and no box lies wholly outside the tensor.
              const int last_box = p.N * t.groups_per_image - t.box_groups;
              for (int g = 0; j == 0 && g < kFlatGroupsPerTile; g += t.box_groups) {
                const int q = min(tc.m0 / kFlatGroup + g, last_box), n = t.div_groups.div(q);
                sm90::tma_load_5d(sb + g * KS * 256, tmap_x, full, 0, 0, kb * KS, q - n * t.groups_per_image, n);
              }
            } else if (!WG_MCAST) {
              sm90::tma_load_5d(sb + j * L::B_STEP, tmap_x, full, 0, w0 + s, h0 + r, cb, tc.n0);
            } else if ((j & 1) == (int)rank) {
              sm90::tma_load_5d_multicast(sb + j * L::B_STEP, tmap_x, full, 0, w0 + s, h0 + r, cb, tc.n0, 0x3);
            }
            if (++s == p.S) {
              s = 0;
              if (++r == p.R) { r = 0; ++cb; }
            }
          }
        }
      }
    }
    if (WG_PDL == 3 && weight_thread) sm90::launch_dependents();  // every copy of the CTA's is issued
    __syncwarp();
    if (WG_MCAST) sm90::cluster_sync();  // matches the consumers' final one
    return;
  }

  if constexpr (PIXM) {
    consume_pixel_major<BN, STAGES, KS, CH, PERSISTENT>(p, t, smem, base);
    return;
  } else if constexpr (kChannelPingpong) {
    consume_channel_pingpong<BN, STAGES, KS, CH>(p, t, smem, base, tmap_y);
    return;
  }
  // ---------------- consumer warpgroups 0 and 1: 64 output channels each ----------------
  sm90::regs_alloc<kConsumerRegs>();
  const int lane = tid % 32, warp = (tid % 128) / 32;
  // A slot is free for the copy engines once every consumer warp that reads it is done: with multicast,
  // those of both CTAs (the partner's engine writes into this CTA's slot too).
  auto release_slot = [](uint32_t empty) {
    if (WG_MCAST) {
      sm90::mbar_arrive_cluster(empty, 0);
      sm90::mbar_arrive_cluster(empty, 1);
    } else {
      sm90::mbar_arrive(empty);
    }
  };
  const bool has_res = p.residual != nullptr;
  const int c_lo = wg * 64 + warp * 16 + lane / 4;  // tile channel of this thread's accumulator rows (and + 8)
  // kTmaOut: the weight rows are permuted, so accumulator rows 16w + g and 16w + g + 8 of the warpgroup's warp w are its
  // channels 16w + 2g and 16w + 2g + 1, adjacent bytes of staging block 2 wg + w / 2 (32-byte swizzle: the half flips in
  // rows 4-7); `pair_cell` is the thread's pixel 2(lane % 4) there.
  const int c_pair = wg * 64 + warp * 16 + 2 * (lane / 4);
  const int pair_cell = (2 * wg + warp / 2) * BN * 32 + 2 * (lane % 4) * 32 + ((16 * (warp % 2) + 2 * (lane / 4)) ^ (lane % 4 >= 2 ? 16 : 0));
  const EpilogueScalars es(p, has_res);
  const uint32_t a_rows = wg * 64 * (WG_A128 ? 128 : 32);  // this warpgroup's 64 weight rows inside the A tile
  using Tile = TileCoord;
  auto issue_residual = [&](const Tile& tc, int8_t* staging) {
    residual_to_staging<BN, CH, CONSUMERS, L::OUT_STRIDE>(p, tc, ohw, kpad, tid, t, staging);
  };
  auto store = [&](const Tile& tc, const int8_t* staging) {
    store_staging<BN, CH, CONSUMERS, L::OUT_STRIDE>(p, tc, ohw, kpad, tid, t, staging, !has_res);
  };
  // A tile's output leaves the staging tile during the NEXT tile's first wgmma batch (the tensor cores
  // work while the consumers store), so the epilogue's stores never idle the tensor cores.
  bool pending = false;
  Tile pending_tc(blockIdx.x, p, t, ohw, CH);
  const int8_t* pending_staging = s_out;
  int it = 0;  // ring slot use counter, continuous across tiles (same sequence as the producer's)
  int local = 0;  // tiles this CTA has done
  // Zeroed once: a tile's first wgmma overwrites them (accumulate = false).
  int acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
  for (int tile = blockIdx.x; tile < t.tiles; tile += tile_step, ++local) {
    const Tile tc(tile, p, t, ohw, CH);
    int8_t* staging = s_out + (WG_STAGING == 2 ? (local & 1) * L::OUT_BYTES : 0);
    const bool res_now = has_res && (WG_DIAG == 0 || WG_DIAG == 3 || WG_DIAG == 11);  // the builds that run the epilogue
    // Two staging tiles: this tile's residual can stream in now (the other tile holds the pending output).
    if (WG_STAGING == 2 && res_now) issue_residual(tc, staging);
    cp_async_commit();
    const ChannelPairFactors factors(p, tc.c0 + (kTmaOut ? c_pair : c_lo), kpad, kTmaOut ? 1 : 8);  // used in the epilogue

    WindowCursor<L> win(local * windows, t);  // WG_HALO
    // One ring slot's batch of k32 steps. `whole`: all KS of them, with no branch between the wgmmas (a branch makes
    // ptxas fence each wgmma, and a merge after a batch costs it a dummy wgmma); steps past the GEMM-K then read the
    // 128-byte weight box's zero fill (windows: against the next window slot) and add nothing. Windows always take
    // whole batches; the other tiles peel the GEMM-K's short last batch off the loop instead, since issuing its
    // zero-weight steps cost res2 conv3 +res (GEMM-K 64) 6 % (bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/
    // 35-unbranched-batches-res-*.json).
    auto batch = [&](int kb, bool whole) {
      const int slot = it % STAGES;
      if (!kDiagNoRing) sm90::mbar_wait(full0 + 8 * slot, (it / STAGES) & 1);
      const int steps = t.kt - kb * KS < KS ? t.kt - kb * KS : KS;
      if (L::HALO && !kDiagNoRing) win.wait_for_steps_before(kb * KS + steps, p, hfull0);
      __syncwarp();  // the .aligned wgmma instructions below need the warp converged after the spin
      const uint32_t sa = base + slot * L::STAGE + a_rows, sb = base + slot * L::STAGE + L::A_IN_SLOT;
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < KS; ++j) {
        if (!whole && j >= steps) continue;
        if (!kDiagNoWgmma)
          sm90::WgmmaS8<BN>::mma(acc, WG_A128 ? sm90::desc_kmajor_sw128(sa + j * 32) : sm90::desc_kmajor_sw32(sa + j * L::A_STEP),
                                 L::HALO ? win.desc(base) : sm90::desc_kmajor_sw32(sb + j * L::B_STEP), kb * KS + j > 0);
        if (L::HALO) win.advance(p, wh);
      }
      sm90::wgmma_commit();
      if (kb == 0) {
        // Under the first batch: the previous tile's stores, then (one staging tile) this tile's residual
        // into the staging tile they have just emptied.
        if (pending && !kDiagNoStores) store(pending_tc, pending_staging);
        pending = false;
        if (WG_STAGING == 1 && res_now) {
          if (kTmaOut && tid == 0) sm90::bulk_wait_group_read_all();  // the previous tile's TMA store has read it
          sm90::named_barrier(1, CONSUMERS);  // every consumer's stores have read the staging tile
          issue_residual(tc, staging);
        }
        cp_async_commit();
      }
      sm90::wgmma_wait<1>();  // the previous slot's batch is done: hand that slot back to the producer
      if (kb > 0 && lane == 0 && !kDiagNoRing) release_slot(empty0 + 8 * ((it - 1) % STAGES));
      if (L::HALO && !kDiagNoRing) win.release_before(kb * KS, windows, p, hempty0, lane);
      __syncwarp();
      ++it;
    };
    // (Only 128-byte weight boxes read as zeros past the GEMM-K: the 32-byte-box tactics take every batch with steps.)
    const int whole_batches = !WG_A128 ? 0 : L::HALO ? kblocks : t.kt / KS;
    for (int kb = 0; kb < whole_batches; ++kb) batch(kb, true);
    for (int kb = whole_batches; kb < kblocks; ++kb) batch(kb, false);
    sm90::wgmma_wait<0>();
    if (lane == 0 && !kDiagNoRing) release_slot(empty0 + 8 * ((it - 1) % STAGES));  // the tile's last slot
    if (L::HALO && !kDiagNoRing) win.release_before(t.kt, windows, p, hempty0, lane);
    __syncwarp();

    if (kDiagSkipsEpilogue) {
      keep_accumulators_live(acc, p, tid);
      continue;
    }
    // ---------- epilogue: requantize into the staging tile; the stores go out under the next tile (kTmaOut: by TMA) ----------
    cp_async_wait<0>();
    if (kTmaOut && tid == 0) sm90::bulk_wait_group_read_all();  // the previous tile's TMA store has read the staging tile
    sm90::named_barrier(1, CONSUMERS);  // every consumer's residual copies have landed (and the stores read their tile)
    if constexpr (kTmaOut) {
      factors.requantize_for_tma<BN>(acc, staging + pair_cell, es, has_res);
    } else {
      factors.requantize<BN, L::OUT_STRIDE>(acc, staging + 2 * (lane % 4) * L::OUT_STRIDE + c_lo, lane, es, has_res);
    }
    sm90::named_barrier(1, CONSUMERS);  // the whole staging tile is written before anyone stores from it
    if (kTmaOut && tid == 0 && !kDiagNoStores) store_staging_by_tma<BN, CH>(tmap_y, staging, tc, t, kpad);
    pending = !kTmaOut;
    pending_tc = tc;
    pending_staging = staging;
  }
  if (pending && !kDiagNoStores) store(pending_tc, pending_staging);
  if (kTmaOut && tid == 0) sm90::bulk_wait_group_all();  // the stores are done before the CTA's shared memory goes
  // No CTA of a pair leaves while its partner may still arrive on its barriers.
  if (WG_MCAST) sm90::cluster_sync();
}

// How many of a word's 4 accumulators convert on the XU pipe (s32_to_float_small) instead of the ALU pipe's I2FP,
// which the epilogue's other conversions, byte extractions and packing keep busy. Only where resident weights bound
// GEMM-K (|acc| <= 2^24), and only with 2 consumer warpgroups: 1 of 4 took res2 conv3 +res from 0.1241 to 0.1211 ms
// on w52 (res3 conv3 0.0674 -> 0.0672), 2 of 4 gained nothing, 3 of 4 lost 5 %, and with 4 consumer warpgroups
// (w56) 1 of 4 lost 1-2 % (bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/26-conversions-on-xu.json).
constexpr int kAccOnXu = WG_PIXM && WG_WRES_KT > 0 && WG_CONSUMERS == 2 ? 1 : 0;
static_assert(!kAccOnXu || WG_WRES_KT * 32 <= 1024, "resident weights bound GEMM-K so that |acc| <= 2^24 (s32_to_float_small)");

// One pixel of the pixel-major tile through docs/ops.md's epilogue: the 8 accumulators of channel block
// b (wgmma columns 8(4b + jj) + 2q + e, i.e. channels 32b + 8q + 2jj + e by the weight map's row order,
// held at acc[4(4b + jj) + 2h + e]) with their 8 folded factors and 8 residual bytes (channel order) ->
// 8 int8 in channel order, two words.
template <int NACC, bool RES>
__device__ __forceinline__ uint2 requantize_8_channels(const int (&acc)[NACC], int b, int h, const float4 (&sc)[2],
                                                       const float4 (&bi)[2], uint2 res, float rs, float relu_min) {
  const float a[8] = {sc[0].x, sc[0].y, sc[0].z, sc[0].w, sc[1].x, sc[1].y, sc[1].z, sc[1].w};
  const float o[8] = {bi[0].x, bi[0].y, bi[0].z, bi[0].w, bi[1].x, bi[1].y, bi[1].z, bi[1].w};
  int v[2][4];
  float fa[2][4], fo[2][4];
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // i = 2jj + e
    v[i / 4][i % 4] = acc[4 * (4 * b + i / 2) + 2 * h + i % 2];
    fa[i / 4][i % 4] = a[i];
    fo[i / 4][i % 4] = o[i];
  }
  return make_uint2(requantize_word<RES, kAccOnXu>(v[0], fa[0], fo[0], res.x, rs, relu_min),
                    requantize_word<RES, kAccOnXu>(v[1], fa[1], fo[1], res.y, rs, relu_min));
}

// Where a consumer warp's 16 pixels x CH channels of residual sit in a residual tile: its own slice
// [block][16 pixels][32], filled by the warp's own cp.asyncs, so only __syncwarp orders them.
template <int CH>
struct ResidualSlice {
  static constexpr int BYTES = 16 * CH;
  // Lane l copies 16-byte half l % 2 of slice pixel l / 2, for every block.
  __device__ __forceinline__ static void load(int8_t* slice, const ConvParams& p, const TileCoord& tc, int first_px,
                                              int ohw, int kpad, int lane) {
    const int px = first_px + lane / 2;
    const bool ok = px < tc.valid_px;
    const size_t row = (ok ? chw32_offset(p, tc.m0 + px, tc.c0, ohw, kpad) : 0) + 16 * (lane % 2);
    const int blocks = (kpad - tc.c0) / 32;
#pragma unroll
    for (int b = 0; b < CH / 32; ++b) {
      const bool copy = ok && b < blocks;
      cp_async_16(smem_u32(slice + (16 * b + lane / 2) * 32 + 16 * (lane % 2)),
                  copy ? p.residual + row + (size_t)b * ohw * 32 : p.residual, copy);
    }
  }
  // Lane (g, q) = (lane / 4, lane % 4) reads channels 8q .. 8q + 7 of slice pixel g + 8h, block b.
  __device__ __forceinline__ static uint2 read(const int8_t* slice, int b, int h, int lane) {
    return *reinterpret_cast<const uint2*>(slice + (16 * b + lane / 4 + 8 * h) * 32 + 8 * (lane % 4));
  }
};

// The pixel-major epilogue of one thread: straight-line code over every (block, pixel) of its
// accumulators (blocks past Kpad are computed and not stored), so the scheduler interleaves 16 x 8
// independent chains instead of branching between groups of 8.
template <int CH, bool RES>
__device__ __forceinline__ void pixel_major_epilogue(const int (&acc)[CH / 2], const ConvParams& p, const TileCoord& tc,
                                                     const float* s_scale, const float* s_bias, const int8_t* slice,
                                                     const int (&px)[2], int ohw, int kpad, int lane, float rs,
                                                     float relu_min) {
  bool ok[2];
  size_t out_off[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    ok[h] = px[h] < tc.valid_px;
    out_off[h] = !ok[h] ? 0 : chw32_offset(p, tc.m0 + px[h], tc.c0, ohw, kpad) + 8 * (lane % 4);
  }
  const int blocks = (kpad - tc.c0) / 32;  // < CH / 32 only on the last channel tile
  uint32_t folded = 0;  // kDiagNoStores only
#pragma unroll
  for (int b = 0; b < CH / 32; ++b) {
    const float4* f = reinterpret_cast<const float4*>(s_scale + 32 * b + 8 * (lane % 4));
    const float4* g = reinterpret_cast<const float4*>(s_bias + 32 * b + 8 * (lane % 4));
    const float4 sc[2] = {f[0], f[1]}, bi[2] = {g[0], g[1]};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint2 res = RES ? ResidualSlice<CH>::read(slice, b, h, lane) : make_uint2(0, 0);
      const uint2 out = requantize_8_channels<CH / 2, RES>(acc, b, h, sc, bi, res, rs, relu_min);
      if (kDiagNoStores)
        folded ^= out.x ^ out.y;
      else if (ok[h] && b < blocks)
        *reinterpret_cast<uint2*>(p.y + out_off[h] + (size_t)b * ohw * 32) = out;
    }
  }
  if (kDiagNoStores && folded == 0x7fffffffu) p.y[lane] = 1;
}

// ---------------- pixel-major consumers (WG_PIXM) ----------------
// A tile is BN pixels x CH channels, computed by a group of BN / 64 consumer warpgroups (warpgroup `part` of
// the group owning tile pixels 64 part .. 64 part + 63); the CTA's GROUPS groups take its tiles in turn
// (group g: the CTA's tiles g, g + GROUPS, ...), so while one group requantizes the others keep the tensor
// cores busy. Thread (warp, lane) holds pixels px_h = 64 part + 16 warp + lane / 4 + 8 h (h = 0, 1) and,
// per 32-channel block b, channels 32b + 8 (lane % 4) .. + 7 of each: one 8-byte residual read and one
// 8-byte CHW32 store per (pixel, block), the 8 lanes of a lane%4 class covering 8 consecutive pixels'
// 32-byte vectors. No CTA-wide barrier per tile: each warp prefetches its own residual slice of its group's
// NEXT tile right after this tile's main loop (two residual buffers), so it has this tile's epilogue and
// the next tile's main loop to land.
template <int BN, int STAGES, int KS, int CH, bool PERSISTENT>
__device__ __forceinline__ void consume_pixel_major(const ConvParams& p, const WgmmaTile& t, int8_t* smem, uint32_t base) {
  using L = WgmmaSmem<BN, STAGES, KS, CH, true>;
  constexpr int TILE_WGS = BN / 64, GROUPS = L::GROUPS;
  static_assert(BN % 64 == 0 && WG_CONSUMERS % TILE_WGS == 0, "whole consumer warpgroups x m64 pixels per tile");
  static_assert(L::OUT_BYTES == 4 * WG_CONSUMERS * ResidualSlice<CH>::BYTES, "a residual buffer is every consumer warp's slice");
  sm90::regs_alloc<kConsumerRegs>();
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, warp = (tid % 128) / 32;
  // Warp-uniform as the compiler sees it (a shuffle from lane 0): the tile loop below starts at a
  // group-dependent tile, and a trip count that might differ inside a warp would serialize the wgmmas.
  const int group = __shfl_sync(0xffffffffu, wg / TILE_WGS, 0), part = wg % TILE_WGS;
  const int ohw = p.OH * p.OW, kpad = (p.K + 31) / 32 * 32;
  const int kblocks = (t.kt + KS - 1) / KS;
  const int tile_step = PERSISTENT ? gridDim.x : t.tiles;
  const uint32_t full0 = base + L::BAR_OFFSET, empty0 = full0 + STAGES * 8, wres_full = empty0 + STAGES * 8;
  float* s_scale = reinterpret_cast<float*>(smem + L::FACTOR_OFFSET) + group * 2 * CH;
  float* s_bias = s_scale + CH;
  const bool has_res = p.residual != nullptr && (WG_DIAG == 0 || WG_DIAG == 3 || WG_DIAG >= 6);
  const bool load_res = has_res && !kDiagNoResidualLoads;
  const EpilogueScalars es(p, has_res);
  const int first_px = 64 * part + 16 * warp;  // this warp's 16 pixels of the tile
  const int px[2] = {first_px + lane / 4, first_px + lane / 4 + 8};
  int8_t* const slice0 = smem + L::OUT_OFFSET + (tid / 32) * ResidualSlice<CH>::BYTES;  // + L::OUT_BYTES: the other buffer
  // this warpgroup's 64 activation rows inside a k32 step (WG_FLAT: 8 groups of [KS][8][32] inside the slot)
  const uint32_t a_rows = part * 64 * (WG_FLAT ? KS * 32 : 32);
  auto tile_of = [&](int i) { return (int)blockIdx.x + i * tile_step; };  // the CTA's i-th tile
  // WG_PINGPONG: group g waits for its turn on barrier kTurn + g, which the other group's arrival completes.
  constexpr bool PINGPONG = WG_PINGPONG != 0;
  static_assert(!PINGPONG || GROUPS == 2, "ping-pong alternates two tile groups");
  constexpr int kTurn = 1 + 2 * GROUPS, kTurnThreads = 2 * 128 * TILE_WGS;
  if (load_res && tile_of(group) < t.tiles)
    ResidualSlice<CH>::load(slice0, p, TileCoord(tile_of(group), p, t, ohw, CH), first_px, ohw, kpad, lane);
  cp_async_commit();
  // Resident weights: the CTA stays on one channel tile (the host's grid is a multiple of the channel tiles,
  // or covers every tile once), so its folded factors are loaded once, here.
  if (L::WRES && (int)gridDim.x < t.tiles && gridDim.x % t.ch_tiles != 0) __trap();
  auto load_factors = [&](int c0) {
    for (int c = tid % (128 * TILE_WGS); c < CH; c += 128 * TILE_WGS) {
      const int cc = min(c0 + c, kpad - 1);  // channels past Kpad: computed, never stored
      s_scale[c] = es.fold(p.scale[cc]);
      s_bias[c] = es.fold(p.bias[cc]);
    }
    sm90::named_barrier(1 + group, 128 * TILE_WGS);
  };
  if (L::WRES) {
    load_factors(TileCoord(blockIdx.x, p, t, ohw, CH).c0);
    sm90::mbar_wait(wres_full, 0);
  }
  int factors_c0 = -1;  // without resident weights: the channel tile whose folded factors are in s_scale / s_bias
  // Zeroed once: a tile's first wgmma overwrites them (accumulate = false), so a tile costs no zeroing
  // instructions (half an instruction per element on the epilogue-bound layers).
  int acc[CH / 2];
#pragma unroll
  for (int k = 0; k < CH / 2; ++k) acc[k] = 0;
  for (int i = group, j = 0, tile = tile_of(group); tile < t.tiles; i += GROUPS, ++j, tile += GROUPS * tile_step) {
    const TileCoord tc(tile, p, t, ohw, CH);
    if (kDiagEpilogueAlone) {
#pragma unroll
      for (int k = 0; k < CH / 2; ++k) acc[k] = fresh_tid() * k;  // not foldable to constants
    }
    int it = i * kblocks;  // the ring slot use of this tile's first k-block (the producer walks the tiles in order)
    if (PINGPONG && i > 0) sm90::named_barrier(kTurn + group, kTurnThreads);  // the CTA's tile i - 1 is issued
    auto batch = [&](int kb, bool whole) {  // as the channel-major loop's: whole batches have no branch between wgmmas
      const int slot = it % STAGES;
      sm90::mbar_wait(full0 + 8 * slot, (it / STAGES) & 1);
      __syncwarp();
      const int steps = t.kt - kb * KS < KS ? t.kt - kb * KS : KS;
      const uint32_t sa = base + L::RING_OFFSET + slot * L::STAGE, sb = sa + L::A_IN_SLOT + a_rows;
      sm90::wgmma_fence();
#pragma unroll
      for (int s = 0; s < KS; ++s) {
        const int k = kb * KS + s;  // resident: chunk k / 4, k32 step k % 4 of it
        const uint32_t w = L::WRES ? base + (k / 4) * L::WRES_CHUNK + (k % 4) * 32 : sa + s * 32;
        if ((whole || s < steps) && !kDiagNoWgmma)
          sm90::WgmmaS8<CH>::mma(acc, WG_FLAT ? sm90::desc_kmajor(sb + s * 256, KS * 256, 3) : sm90::desc_kmajor_sw32(sb + s * L::B_STEP),
                                 sm90::desc_kmajor_sw128(w), k > 0);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();
      if (kb > 0 && lane == 0) sm90::mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
      __syncwarp();
      ++it;
    };
    const int whole_batches = t.kt / KS;
    for (int kb = 0; kb < whole_batches; ++kb) batch(kb, true);
    for (int kb = whole_batches; kb < kblocks; ++kb) batch(kb, false);
    // Every wgmma of this tile is issued: the other group's next tile may queue behind them.
    if (PINGPONG && tile_of(i + 1) < t.tiles) sm90::named_barrier_arrive(kTurn + 1 - group, kTurnThreads);
    sm90::wgmma_wait<0>();
    if (lane == 0) sm90::mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
    __syncwarp();
    // The group's next tile's residual into the other buffer (read by this warp a tile ago, __syncwarp'd).
    const int next = tile + GROUPS * tile_step;
    if (load_res && next < t.tiles)
      ResidualSlice<CH>::load(slice0 + ((j + 1) & 1) * L::OUT_BYTES, p, TileCoord(next, p, t, ohw, CH), first_px, ohw, kpad, lane);
    cp_async_commit();

    // Folded factors of the tile's channels: refreshed only when the channel tile changes (never after
    // the first tile when the grid is a multiple of the channel tiles, plugins/wgmma.py).
    if (!L::WRES && tc.c0 != factors_c0) {
      sm90::named_barrier(1 + group, 128 * TILE_WGS);  // nobody in the group still reads the previous tile's factors
      load_factors(tc.c0);
      factors_c0 = tc.c0;
    }
    if (kDiagSkipsEpilogue) {
      keep_accumulators_live(acc, p, tid);
      continue;
    }
    cp_async_wait<1>();  // this tile's slice (the group before the one just committed) has landed
    __syncwarp();
    const int8_t* slice = slice0 + (j & 1) * L::OUT_BYTES;
    if (has_res) {
      pixel_major_epilogue<CH, true>(acc, p, tc, s_scale, s_bias, slice, px, ohw, kpad, lane, es.rs, es.relu_min);
    } else {
      pixel_major_epilogue<CH, false>(acc, p, tc, s_scale, s_bias, slice, px, ohw, kpad, lane, es.rs, es.relu_min);
    }
    __syncwarp();  // every lane's reads of this slice come before its refill two tiles on
  }
  cp_async_wait<0>();
}

// ---------------- channel-major ping-pong consumers (WG_PINGPONG, channel-major) ----------------
// Warpgroup g takes the CTA's tiles g, g + 2, ...: each a whole tile of CH = 64 channels (its wgmma M) x BN window
// positions (its N), operand A the resident weight, B the window views. Before issuing tile i > 0 it waits on
// barrier kTurn + g for the other warpgroup to have issued tile i - 1 (the CTA's tile order, the producer's), and
// once its last batch is committed it hands the turn on, so the tensor cores take the tiles back to back while
// the warpgroup drains its last batch, requantizes into its own staging tile and hands it to the copy engine (a TMA
// store per channel block), all under the other's main loop. The turn barrier also orders the store's reads of the
// staging tile (its issuing thread waits for them first) before the next tile's residual copies and staging writes
// (every one of the warpgroup's threads takes part in it).
template <int BN, int STAGES, int KS, int CH>
__device__ __forceinline__ void consume_channel_pingpong(const ConvParams& p, const WgmmaTile& t, int8_t* smem, uint32_t base,
                                                         const sm90::TensorMap* tmap_y) {
  using L = WgmmaSmem<BN, STAGES, KS, CH, false>;
  sm90::regs_alloc<kConsumerRegs>();
  const int tid = threadIdx.x, lane = tid % 32, warp = (tid % 128) / 32, ct = tid % 128;
  // Warp-uniform as the compiler sees it: the tile loop starts at a warpgroup-dependent tile (see consume_pixel_major).
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int ohw = p.OH * p.OW, kpad = (p.K + 31) / 32 * 32;
  const int kblocks = (t.kt + KS - 1) / KS, windows = t.kt / (p.R * p.S), wh = t.nb * t.pitch;
  const uint32_t wres_full = base + L::BAR_OFFSET + 2 * STAGES * 8;
  const uint32_t hfull0 = base + L::HALO_BARS, hempty0 = hfull0 + L::HALO_STAGES * 8;
  int8_t* const staging = smem + L::OUT_OFFSET + wg * L::OUT_BYTES;
  const bool has_res = p.residual != nullptr && (WG_DIAG == 0 || WG_DIAG == 3 || WG_DIAG == 11);
  const EpilogueScalars es(p, has_res);
  // The weight rows are permuted (plugins/wgmma.py): accumulator rows 16w + g and 16w + g + 8 of warp w are channels
  // 16w + 2g and 16w + 2g + 1, adjacent bytes of staging block w / 2 (32-byte swizzle: the half flips in rows 4-7).
  const int c_pair = warp * 16 + 2 * (lane / 4);
  int8_t* const cells = staging + (warp / 2) * BN * 32 + 2 * (lane % 4) * 32 + ((16 * (warp % 2) + 2 * (lane / 4)) ^ (lane % 4 >= 2 ? 16 : 0));
  constexpr int kStagingBar = 1, kTurn = 3;  // named barriers: 1 + g (the warpgroup), 3 + g (its turn)
  constexpr int kInFlight = WG_PP_INFLIGHT;  // batches left in flight while the next is prepared
  constexpr bool kWindowBatches = WG_WIN_BATCH != 0;
  constexpr int kEarlyRelease = WG_EARLY_RELEASE;  // (stride-2 window batches) taps issued before the last window goes back
  constexpr int kTaps = 9;  // (WG_WIN_BATCH) 3x3 windows: the host takes no other filter for it
  if (kWindowBatches && p.R * p.S != kTaps) __trap();
  // The CTA stays on one channel tile (its resident weights): the host's grid is a multiple of the channel tiles.
  if ((int)gridDim.x < t.tiles && gridDim.x % t.ch_tiles != 0) __trap();
  auto tile_of = [&](int i) { return (int)blockIdx.x + i * (int)gridDim.x; };  // the CTA's i-th tile
  int acc[BN / 2];  // zeroed once: a tile's first wgmma overwrites them (accumulate = false)
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0;
  if (!kDiagNoCopies) sm90::mbar_wait(wres_full, 0);
  for (int i = wg, tile = tile_of(wg); tile < t.tiles; i += 2, tile += 2 * gridDim.x) {
    const TileCoord tc(tile, p, t, ohw, CH);
    const ChannelPairFactors factors(p, tc.c0 + c_pair, kpad, 1);  // loaded now, used in the epilogue
    if (kDiagEpilogueAlone) {
#pragma unroll
      for (int k = 0; k < BN / 2; ++k) acc[k] = fresh_tid() * k;  // not foldable to constants
    }
    // (WG_TIMELINE) point j of this tile: 0 ready, 1 turn, 2 first windows, 3 issued, 4 drained, 5 stored
    auto stamp = [&](int j) {
#if WG_TIMELINE
      if (ct == 0 && blockIdx.x < kTimelineCtas && i / 2 < kTimelineTiles)
        trtfuse_timeline[((blockIdx.x * 2 + wg) * kTimelineTiles + i / 2) * kTimelinePoints + j] = clock64();
#endif
    };
    if (ct == 0) sm90::bulk_wait_group_read_all();  // this warpgroup's previous TMA store has read the staging tile
    stamp(0);
    if (i > 0) sm90::named_barrier(kTurn + wg, 256);  // the CTA's tile i - 1 is issued; the staging tile is free
    stamp(1);
    if (has_res) residual_to_staging<BN, CH, 128, L::OUT_STRIDE>(p, tc, ohw, kpad, ct, t, staging);
    cp_async_commit();
    WindowCursor<L> win(i * windows, t);
    if constexpr (kWindowBatches) {
      // One batch per window (its R * S = 9 taps), so no batch reads two windows: a window goes back as soon as its own
      // batch is done. When the next window has not landed, the warpgroup first drains and releases the last one, so
      // its slot goes back to the copy engine while the warpgroup waits (with batches of 4 steps, the batch that
      // straddled two windows held the first until the second had landed).
      for (int w = 0; w < windows; ++w) {
        if (!kDiagNoRing) {
          if (w > 0 && !win.next_landed(hfull0)) {
            sm90::wgmma_wait<0>();
            win.release_before(w * kTaps, windows, p, hempty0, lane);
          }
          win.wait_for_steps_before((w + 1) * kTaps, p, hfull0);
        }
        if (w == 0) stamp(2);
        __syncwarp();  // the .aligned wgmma instructions below need the warp converged after the spin
        sm90::wgmma_fence();
        if constexpr (kEarlyRelease > 0) {
          // The batch's first taps, then window w - 1 goes back as soon as its batch is done, then the rest: a wgmma's
          // issue waits for room in the tensor cores' queue, so issuing the whole batch first held the last window
          // about a batch's time longer (the timeline's window held ~2,700 clocks, its batch ~1,230).
          issue_window_taps<0, kEarlyRelease, BN>(acc, base, win, w * kTaps);
          sm90::wgmma_commit();
          sm90::wgmma_wait<1>();  // window w - 1's batch is done
          if (!kDiagNoRing) win.release_before(w * kTaps, windows, p, hempty0, lane);
          issue_window_taps<kEarlyRelease, kTaps, BN>(acc, base, win, w * kTaps);
          win.next_window();
        } else {
          issue_resident_steps<kTaps, false, BN>(acc, base, win, w * kTaps, p, wh);
        }
        sm90::wgmma_commit();
        if (w == windows - 1 && tile_of(i + 1) < t.tiles) sm90::named_barrier_arrive(kTurn + 1 - wg, 256);
        if (w == windows - 1) stamp(3);
        if constexpr (kEarlyRelease == 0) {
          sm90::wgmma_wait<1>();  // window w - 1's batch is done
          if (!kDiagNoRing) win.release_before(w * kTaps, windows, p, hempty0, lane);
        }
        __syncwarp();
      }
    } else
    for (int kb = 0; kb < kblocks; ++kb) {
      const int steps = t.kt - kb * KS < KS ? t.kt - kb * KS : KS;
      if (!kDiagNoRing) win.wait_for_steps_before(kb * KS + steps, p, hfull0);
      if (kb == 0) stamp(2);
      __syncwarp();  // the .aligned wgmma instructions below need the warp converged after the spin
      sm90::wgmma_fence();
      issue_resident_steps<KS, true, BN>(acc, base, win, kb * KS, p, wh);  // steps past the GEMM-K have zero weights
      sm90::wgmma_commit();
      // Every wgmma of the tile is issued: the other warpgroup's next tile may queue behind them.
      if (kb == kblocks - 1 && tile_of(i + 1) < t.tiles) sm90::named_barrier_arrive(kTurn + 1 - wg, 256);
      if (kb == kblocks - 1) stamp(3);
      sm90::wgmma_wait<kInFlight>();  // batches up to kb - kInFlight are done: their windows may go back
      if (!kDiagNoRing) win.release_before((kb + 1 - kInFlight) * KS, windows, p, hempty0, lane);
      __syncwarp();
    }
    sm90::wgmma_wait<0>();
    stamp(4);
    if (!kDiagNoRing) win.release_before(t.kt, windows, p, hempty0, lane);
    __syncwarp();
    if (kDiagSkipsEpilogue) {
      keep_accumulators_live(acc, p, tid);
      stamp(5);
      continue;
    }
    cp_async_wait<0>();
    sm90::named_barrier(kStagingBar + wg, 128);  // the warpgroup's residual copies have landed
    factors.requantize_for_tma<BN>(acc, cells, es, has_res);
    sm90::named_barrier(kStagingBar + wg, 128);  // the whole staging tile is written before it is stored
    // The tile leaves by TMA store. Stored by the consumer threads, 16 bytes each, the stores made the epilogue outlast
    // the other warpgroup's main loop (res3 conv2 w70 0.0578 ms, 0.0480 without them:
    // bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/40-pingpong-epilogue.json).
    if (ct == 0 && !kDiagNoStores) store_staging_by_tma<BN, CH>(tmap_y, staging, tc, t, kpad);
    stamp(5);
  }
  cp_async_wait<0>();
  if (ct == 0) sm90::bulk_wait_group_all();  // the stores are done before the CTA's shared memory goes
}

}  // namespace trtfuse

// One CTA per (pixel tile, 128-channel tile), or WG_PERSISTENT: min(tiles, SMs) CTAs walking the tiles.
// 128 * (WG_CONSUMERS + 1) threads: consumer warpgroups 0 .. WG_CONSUMERS - 1, then the producer warpgroup.
#if WG_MCAST
#define WG_CLUSTER __cluster_dims__(2, 1, 1)
#else
#define WG_CLUSTER
#endif
extern "C" __global__ void WG_CLUSTER __launch_bounds__(128 * (WG_CONSUMERS + 1), 1)
    trtfuse_wgmma_conv(const __grid_constant__ trtfuse::sm90::TensorMap tmap_w,
                       const __grid_constant__ trtfuse::sm90::TensorMap tmap_x,
                       const __grid_constant__ trtfuse::sm90::TensorMap tmap_y, const trtfuse::ConvParams p,
                       const trtfuse::WgmmaTile t) {
  trtfuse::wgmma_conv_body<WG_BN, WG_STAGES, WG_KS, WG_PERSISTENT != 0, WG_CH, WG_PIXM != 0>(&tmap_w, &tmap_x, &tmap_y, p, t);
}
