# Probe (device, cupy): does bar.sync(4, 256) wait for another warpgroup's bar.arrive when a third warpgroup has exited
# (exit_mode 1), or three of its warps have (2)? Measured on the H200: yes in all three modes (it waits ~200,000 clocks for it).
import cupy as cp
src = r'''
extern "C" __global__ void probe(long long* out, int exit_mode) {
  int wg = threadIdx.x / 128, ct = threadIdx.x % 128;
  long long t0 = clock64();
  if (wg == 2) {
    if (exit_mode == 1) return;                       // the whole warpgroup exits
    if (exit_mode == 2 && threadIdx.x % 128 >= 32) return;  // 3 warps exit, one stays
    if (exit_mode == 2 && ct % 32 != 0) { __syncwarp(); return; }
    long long t = clock64(); while (clock64() - t < 400000) {}
    __syncwarp();
    return;
  }
  if (wg == 0) {
    long long t = clock64(); while (clock64() - t < 200000) {}
    asm volatile("bar.arrive 4, 256;" ::: "memory");
    if (ct == 0) out[blockIdx.x * 4 + 0] = clock64() - t0;
  } else {
    asm volatile("bar.sync 4, 256;" ::: "memory");
    if (ct == 0) out[blockIdx.x * 4 + 1] = clock64() - t0;
  }
}
'''
k = cp.RawKernel(src, "probe")
for mode in (0, 1, 2):
    out = cp.zeros(4 * 4, dtype=cp.int64)
    k((4,), (384,), (out, cp.int32(mode)))
    cp.cuda.Device().synchronize()
    o = out.get().reshape(4, 4)
    print(f"exit_mode {mode}: wg0 arrived at {o[:,0].tolist()}, wg1 passed bar.sync at {o[:,1].tolist()}")
