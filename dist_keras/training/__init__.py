"""The training path: the loop (loop.py), what one step computes (step.py),
the explicit gradient all-reduce (allreduce.py), learning-rate rules
(lr.py), checkpoints (checkpoints.py), SIGTERM (preemption.py), the workdir's
files (workdir.py) and what a run reports (report.py)."""
