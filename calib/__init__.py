"""Post-training INT8 calibration and accuracy evaluation (docs/calibration.md).

  data         --data sources: a folder of JPEG/PNG (+ val_map.txt), .npy/.npz, the embedded default
  tensors      which activations need a scale (the rewrite's list, or a broad fallback)
  stats        one ONNX Runtime pass over the data, |x| histograms that grow their range exactly
  calibrators  max / percentile / entropy (TensorRT's KL) / mse thresholds; per-channel weight scales
  scales       the trtfuse-scales-v1 JSON and a TensorRT calibration cache
  calibrate    model + images -> scales document
  evaluate     fp32 vs INT8: logit cosine, top-1 agreement/accuracy, per fused layer SQNR
  compare      every method: scales -> rewrite -> evaluate, ranked
  sensitivity  Q/DQ emulation and noise-propagation probes, to tell scale problems from model sensitivity
"""
