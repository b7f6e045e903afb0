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
// CTA: the producer warpgroup (the last) drives the copy engine (wgmma_producer.cuh); the consumer warpgroups issue
// the wgmmas and run the epilogue: channel-major (wgmma_consumer_channel.cuh), pixel-major
// (wgmma_consumer_pixel.cuh) or the channel-major ping-pong (wgmma_consumer_pingpong.cuh). setmaxnreg moves
// registers from the producer to the consumers. What the kernel is built for is one tactic (wgmma_config.cuh).
#include "wgmma_config.cuh"
#include "wgmma_consumer_channel.cuh"
#include "wgmma_consumer_pingpong.cuh"
#include "wgmma_consumer_pixel.cuh"
#include "wgmma_producer.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma_conv.cu needs the sm_90a target (wgmma, setmaxnreg)"
#endif

namespace trtfuse {

// The mbarriers: each ring slot's "full" (the producer's arrive + the copy engine's bytes) and "empty" (one arrive per
// consumer warp that reads the slot: of both CTAs with multicast, of one tile group pixel-major), the resident
// weights' one, and the window ring's.
template <class L, int BN, int STAGES, bool PIXM>
__device__ __forceinline__ void init_barriers(uint32_t full0, uint32_t empty0, uint32_t wres_full, uint32_t hfull0, uint32_t hempty0) {
  constexpr int CONSUMERS = 128 * Tactic::consumers;
#pragma unroll
  for (int s = 0; s < STAGES; ++s) {
    sm90::mbar_init(full0 + 8 * s, 1);
    sm90::mbar_init(empty0 + 8 * s, PIXM ? 4 * BN / 64 : (Tactic::multicast ? 2 : 1) * CONSUMERS / 32);
  }
  sm90::mbar_init(wres_full, 1);
#pragma unroll
  for (int s = 0; s < (L::HALO ? L::HALO_STAGES : 0); ++s) {
    sm90::mbar_init(hfull0 + 8 * s, 1);
    sm90::mbar_init(hempty0 + 8 * s, (kChannelPingpong ? 128 : CONSUMERS) / 32);  // the warps that read the window
  }
  sm90::fence_barrier_init();
}

template <int BN, int STAGES, int KS, bool PERSISTENT, int CH = 128, bool PIXM = false>
__device__ __forceinline__ void wgmma_conv_body(const sm90::TensorMap* tmap_w, const sm90::TensorMap* tmap_x, const sm90::TensorMap* tmap_y,
                                                const ConvParams& p, const WgmmaTile& t) {
  using L = WgmmaSmem<BN, STAGES, KS, CH, PIXM>;
  static_assert(!PIXM || (kWeightBox128 && PERSISTENT && !Tactic::multicast && KS == 4), "pixel-major: 128-byte weight boxes, persistent, no multicast");
  static_assert(!Tactic::window_warp || (L::HALO && !kChannelPingpong), "a window thread: window tiles whose weights stream through the ring");
  constexpr int CONSUMERS = 128 * Tactic::consumers;
  if (Profiling::empty_launch) return;
  if (Tactic::pdl == 1) sm90::launch_dependents();
  Profiling::stamp_entry();
  extern __shared__ __align__(1024) int8_t smem_raw[];
  // Align the operand ring to 1024 bytes of shared-memory address (the host asks for 1024 more).
  const uint32_t raw = sm90::smem_addr(smem_raw);
  int8_t* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const uint32_t base = sm90::smem_addr(smem);
  int8_t* s_out = smem + L::OUT_OFFSET;  // the channel-major tile's staging tiles
  const uint32_t full0 = base + L::BAR_OFFSET, empty0 = full0 + STAGES * 8, wres_full = empty0 + STAGES * 8;
  const uint32_t hfull0 = base + L::HALO_BARS, hempty0 = hfull0 + L::HALO_STAGES * 8;

  const int tid = threadIdx.x, wg = tid / 128;
  // One tile per CTA, or (PERSISTENT) tiles blockIdx.x, + gridDim.x, ...: the ring and its phases run on across tiles,
  // so the producer fills the next tile's slots while the consumers store this one. A window tile's windows: one per
  // 32-channel block, R * S k32 steps each.
  const CtaWork cta{tid, wg, p.OH * p.OW, (p.K + 31) / 32 * 32, (t.kt + KS - 1) / KS, L::HALO ? t.kt / (p.R * p.S) : 0,
                    t.nb * t.pitch, PERSISTENT ? (int)gridDim.x : t.tiles};
  if (tid == 0) init_barriers<L, BN, STAGES, PIXM>(full0, empty0, wres_full, hfull0, hempty0);
  const uint32_t rank = Tactic::multicast ? sm90::cluster_ctarank() : 0;
  // Activation rows past the box (BN > the tile's P pixels; window rows past the window) are never written by the
  // copy engine: zeroed once, before the async proxy reads them (only positions that are never stored read them).
  if (L::HALO) {
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
  if (Tactic::multicast) sm90::cluster_sync();  // the partner's barriers exist before any multicast completes on them
  const bool weight_thread = tid == CONSUMERS;  // issues the resident weight (and, but for a window thread, the rest)
  // (Tactic::pdl) every other thread waits for the previous grid here; the weight thread once it has issued the weight
  if (Tactic::pdl && !weight_thread) sm90::wait_for_prerequisites();

  if (wg == Tactic::consumers) {
    produce<BN, STAGES, KS, PERSISTENT, CH, PIXM>(tmap_w, tmap_x, p, t, base, cta, rank, weight_thread);
  } else if constexpr (PIXM) {
    consume_pixel_major<BN, STAGES, KS, CH, PERSISTENT>(p, t, smem, base);
  } else if constexpr (kChannelPingpong) {
    consume_channel_pingpong<BN, STAGES, KS, CH>(p, t, smem, base, tmap_y);
  } else {
    consume_channel_major<BN, STAGES, KS, CH>(tmap_y, p, t, s_out, base, cta);
  }
}

}  // namespace trtfuse

// One CTA per (pixel tile, channel tile), or persistent: min(tiles, SMs) CTAs walking the tiles. 128 * (consumers + 1)
// threads: consumer warpgroups 0 .. consumers - 1, then the producer warpgroup. TRTFUSE_WGMMA_CLUSTER (the generated
// header): clusters of 2 CTAs for multicast.
extern "C" __global__ void TRTFUSE_WGMMA_CLUSTER __launch_bounds__(128 * (trtfuse::Tactic::consumers + 1), 1)
    trtfuse_wgmma_conv(const __grid_constant__ trtfuse::sm90::TensorMap tmap_w,
                       const __grid_constant__ trtfuse::sm90::TensorMap tmap_x,
                       const __grid_constant__ trtfuse::sm90::TensorMap tmap_y, const trtfuse::ConvParams p,
                       const trtfuse::WgmmaTile t) {
  using trtfuse::Tactic;
  trtfuse::wgmma_conv_body<Tactic::bm, Tactic::stages, Tactic::ks, Tactic::persistent, Tactic::bn, Tactic::pixel_major>(
      &tmap_w, &tmap_x, &tmap_y, p, t);
}
