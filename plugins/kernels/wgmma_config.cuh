// What the kernel is built for: the tactic, one constexpr struct generated from plugins/wgmma_tactics.py
// (WgmmaTactic.config_header, passed to NVRTC as wgmma_tactic.cuh; each field is documented there), and what
// follows from it for every component: the tile's kind, how the output leaves, the register split.
#pragma once
#include "wgmma_tactic.cuh"

namespace trtfuse {

using Tactic = WgmmaTactic;
// The profiling hooks: none (wgmma_no_profiling.cuh) but in bench/wgmma_diag.py's and wgmma_timeline.py's builds
using Profiling = WgmmaProfiling;

constexpr bool kWeightBox128 = Tactic::a_box == 128;  // a slot's 4 k32 steps of weights in one 128-byte-wide box
constexpr bool kWindows = Tactic::halo_rows > 0;      // input windows, each tap a shifted view (wgmma_windows.cuh)
constexpr bool kQuadWindows = Tactic::quad_windows;   // stride-2 windows of 128-byte column quads
constexpr bool kChannelPingpong = Tactic::pingpong && !Tactic::pixel_major;
// Channel-major tiles whose weight rows are permuted in pairs and whose output leaves by TMA store
constexpr bool kTmaOut = kChannelPingpong || (Tactic::tma_store && !Tactic::pixel_major);
static_assert(!Tactic::early_release || (Tactic::stride2_windows && Tactic::window_batches && Tactic::early_release < 9),
              "early release: taps of a stride-2 window batch");

// setmaxnreg split of the 64K registers: 128 producer threads + 128 * consumers consumer threads.
// The pool is what the CTA got at launch: 65536 / threads per thread, in units of 8.
constexpr int kLaunchRegs = 65536 / (128 * (Tactic::consumers + 1)) / 8 * 8;
constexpr int kProducerRegs = Tactic::consumers == 2 ? 40 : 32;
constexpr int kConsumerRegs = Tactic::consumers == 2 ? 232 : 112;
static_assert(Tactic::consumers == 2 || Tactic::consumers == 4, "2 or 4 consumer warpgroups");
static_assert(kProducerRegs + Tactic::consumers * kConsumerRegs <= (Tactic::consumers + 1) * kLaunchRegs, "register pool");
static_assert(Tactic::consumers == 2 || Tactic::pixel_major, "the channel-major tile has two consumer warpgroups");

constexpr int kFlatGroup = 8;  // pixels per group of a flat tile: one 8-row core-matrix group of the operand
constexpr int kFlatGroupsPerTile = Tactic::flat ? Tactic::bm / kFlatGroup : 0;

// How many of a word's 4 accumulators convert on the XU pipe (s32_to_float_small) instead of the ALU pipe's I2FP,
// which the epilogue's other conversions, byte extractions and packing keep busy. Only where resident weights bound
// GEMM-K (|acc| <= 2^24), and only with 2 consumer warpgroups: 1 of 4 took res2 conv3 +res from 0.1241 to 0.1211 ms
// on w52 (res3 conv3 0.0674 -> 0.0672), 2 of 4 gained nothing, 3 of 4 lost 5 %, and with 4 consumer warpgroups
// (w56) 1 of 4 lost 1-2 % (bench/results/wgmma-diag-NVIDIA_H200-2026-11-22/26-conversions-on-xu.json).
constexpr int kAccOnXu = Tactic::pixel_major && Tactic::resident_kt > 0 && Tactic::consumers == 2 ? 1 : 0;
static_assert(!kAccOnXu || Tactic::resident_kt * 32 <= 1024, "resident weights bound GEMM-K so that |acc| <= 2^24 (s32_to_float_small)");

}  // namespace trtfuse
