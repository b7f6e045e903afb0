"""The top-1 readout shared by runtime/gpu_runner.CudaRunner and runtime/trt_runner.TrtRunner: each ends
its forward with plugins/network_ops.argmax_rows over its logits into an int32 [batch] device buffer
(`self.top1`, None where the output is not per-image logits), and the Offline harness copies those
batch * 4 bytes instead of the logits."""

from __future__ import annotations

import numpy as np

from ..errors import TrtfuseError


class Top1Readout:
    """Needs `batch`, `stream` (cuda_driver.Stream), `output_name` and `top1` (DeviceBuffer or None)."""

    top1 = None

    @property
    def top1_ptr(self) -> int | None:
        """int32 [batch]: the top-1 class of each image of the last forward, on the device; None when the
        output is not per-image logits."""
        return self.top1.ptr if self.top1 is not None else None

    def copy_top1(self, dst: np.ndarray) -> None:
        """Enqueue the copy of the last forward's top-1 into `dst` (int32 [batch]) on this runner's stream;
        asynchronous when `dst` is pinned (cuda_driver.PinnedArray), ready once the stream has passed it."""
        from ..plugins import cuda_driver as cd

        if self.top1 is None:
            raise TrtfuseError(f"output {self.output_name!r} is not per-image logits: no top-1 on the device")
        if dst.dtype != np.int32 or dst.shape != (self.batch,):
            raise ValueError(f"the top-1 goes into an int32 [{self.batch}] array, got {dst.dtype} {list(dst.shape)}")
        cd.download_async(dst, self.top1.ptr, self.stream.handle)

    def top1_host(self) -> np.ndarray:
        """A pinned int32 [batch] array the runner owns, for copy_top1 queued behind a forward (no wait of its own)."""
        if getattr(self, "_top1_pinned", None) is None:
            from ..plugins import cuda_driver as cd

            self._top1_pinned = cd.PinnedArray(self.batch, np.int32)
        return self._top1_pinned.array

    def fetch_top1(self) -> np.ndarray:
        """The last forward's top-1 as a new int32 [batch] array (waits for this runner's stream)."""
        out = np.empty(self.batch, np.int32)
        self.copy_top1(out)
        self.stream.synchronize()
        return out
