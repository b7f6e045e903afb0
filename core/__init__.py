"""trtfuse: ONNX rewrites, INT8 CHW32 fused-convolution kernels and TensorRT plugins for residual CNNs.

Subpackages (each a top-level folder of the repository):
  trtfuse.models        ResNet ONNX models built here with onnx + numpy (no downloads)
  trtfuse.graph_passes  onnx-graphsurgeon rewrites: BN folding, residual-block fusion, split-K
  trtfuse.calib         post-training INT8 calibration, explicit Q/DQ, accuracy evaluation
  trtfuse.plugins       the fused op's schema, its golden reference, the CUDA kernels and their launchers
  trtfuse.runtime       executing rewritten models: CPU golden executor, GPU runner
  trtfuse.bench         benchmarks (`trtfuse bench ...`)
"""

__version__ = "0.1.0"
# The kernels' version: bumped whenever a kernel or tactic change moves a benchmark, with a row in docs/PERF.md's
# history table (the kernels' changelog). Benchmarks record it in each history line.
KERNELS_VERSION = "v45"
