#!/usr/bin/env bash
# One device call: Nsight Compute on bench/profile_one.py's launches (clocks left alone). Text reports in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
METRICS=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed.sum,dram__bytes.sum,lts__t_bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sector_hit_rate.pct,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
timeout 300 ncu --clock-control none -k regex:"trtfuse_(fused|wgmma)_conv" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
  --section Occupancy --section ComputeWorkloadAnalysis --section LaunchStats --metrics $METRICS \
  python3 -m trtfuse.bench.profile_one "$@" > "$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "trtfuse_|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Issued Warp|No Eligible|Registers Per|Theoretical Occ|Warp Cycles Per Issued|pipe_xu|bank_conflicts|inst_executed.sum|dram__bytes|Block Limit|L2 Hit|lts__|Mem Busy|Max Bandwidth|Mem Pipes" "$OUT/ncu.txt" | head -150
