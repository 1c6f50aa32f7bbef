"""The measurement layer: in-graph step stamps (stamps.py) and the sync
breakdown (breakdown.py), wall-clock throughput (timing.py), profiler traces
(profiler.py, trace.py), the alpha-beta all-reduce model (costmodel.py,
calibration.py), and model FLOPs and MFU (flops.py, flop_rules.py,
flop_graph.py, mfu.py).
Nothing here imports the training path."""
