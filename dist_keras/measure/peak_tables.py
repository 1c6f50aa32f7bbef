"""Vendors' peak FLOP/s of accelerators, by device name and precision
(measure/mfu.py falls back to a timed matmul where these know nothing)."""
import re

# Dense (no 2:4 sparsity) peak TFLOP/s per GPU, from NVIDIA's datasheets:
# A100 (nvidia.com/en-us/data-center/a100, 2021), H100 SXM and PCIe
# (nvidia.com/en-us/data-center/h100; its table states sparse figures:
# halved here), V100 (SXM2 / PCIe), T4, L4 (datasheets; L4's tensor
# figures are sparse: halved). "tf32" is what TensorFlow runs float32
# matmuls and convs in on Ampere and later while TensorFloat-32 is on (its
# default: tf.config.experimental.enable_tensor_float_32_execution).
# Matched in order: the first pattern found in the lower-cased device name
# (e.g. 'NVIDIA A100-SXM4-40GB', 'Tesla V100-PCIE-16GB') wins. An H100 NVL
# matches 'H100 SXM', which may overstate it: set log.peak_tflops there.
GPU_PEAKS = (
    ("H100 PCIe", r"\bh100\b.*\bpcie\b",
     {"bfloat16": 756.0, "float16": 756.0, "tf32": 378.0, "float32": 51.2}),
    ("H100 SXM", r"\bh100\b",
     {"bfloat16": 989.0, "float16": 989.0, "tf32": 494.7, "float32": 66.9}),
    ("A100", r"\ba100\b",
     {"bfloat16": 312.0, "float16": 312.0, "tf32": 156.0, "float32": 19.5}),
    ("L4", r"\bl4\b",
     {"bfloat16": 121.0, "float16": 121.0, "tf32": 60.0, "float32": 30.3}),
    # Volta and Turing have no bfloat16 tensor cores: no bfloat16 entry.
    ("V100 PCIe", r"\bv100\b.*\bpcie\b", {"float16": 112.0, "float32": 14.0}),
    ("V100 SXM2", r"\bv100\b", {"float16": 125.0, "float32": 15.7}),
    ("T4", r"\bt4\b", {"float16": 65.0, "float32": 8.1}),
)
# Peak bf16 TFLOP/s per TPU CHIP, from Google Cloud's TPU pages
# (cloud.google.com/tpu/docs/v2, v3, v4, v5e, v5p, v6e), and the TensorFlow
# devices (replicas) per chip: v2 and v3 chips have two TensorCores, each
# its own device; v4 and v5p join theirs into one megacore device; v5e and
# v6e have one. TPUs run float32 matmuls as bfloat16 multiplies with float32
# accumulation by default, so float32 uses the bf16 peak too.
TPU_PEAKS = {"v2": (45.0, 2), "v3": (123.0, 2), "v4": (275.0, 1),
             "v5e": (197.0, 1), "v5p": (459.0, 1), "v6e": (918.0, 1)}
_TPU_NAME = re.compile(r"v(\d)\s*(litepod|lite|e|p)?")


def gpu_peak(device_name: str, precision: str,
             tf32: bool = True) -> tuple[str, float] | None:
  """(table name, dense peak TFLOP/s) of a GPU at `precision`, or None."""
  name = device_name.lower()
  for table_name, pattern, peaks in GPU_PEAKS:
    if re.search(pattern, name):
      key = "tf32" if precision == "float32" and tf32 and "tf32" in peaks \
          else precision
      return (table_name, peaks[key]) if key in peaks else None
  return None


def tpu_peak(accelerator_type: str,
             precision: str) -> tuple[str, float] | None:
  """(table name, peak TFLOP/s per TensorFlow device) of a TPU, or None.

  `accelerator_type` as Cloud names it ('v4-8', 'v5litepod-16', 'v6e-8',
  'TPU v3'); bf16 and float32 share the peak (see TPU_PEAKS).
  """
  if precision not in ("bfloat16", "float32"):
    return None
  match = _TPU_NAME.search(accelerator_type.lower().replace("tpu", ""))
  if not match:
    return None
  version, variant = match.group(1), (match.group(2) or "").strip()
  key = f"v{version}" + ("e" if variant in ("lite", "litepod", "e") else
                         "p" if variant == "p" else "")
  if key not in TPU_PEAKS:
    return None
  per_chip, devices_per_chip = TPU_PEAKS[key]
  return f"TPU {key}", per_chip / devices_per_chip
