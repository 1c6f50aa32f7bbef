"""The training path: the loop (loop.py) and its actions at step boundaries
(actions.py), what one step computes (steps.py, calls.py; a model's own
train_step: model_step.py), the explicit gradient all-reduce (allreduce.py),
learning-rate rules (lr.py), checkpoints (checkpoints.py), SIGTERM and
Ctrl-C (preemption.py), the workdir's files (run_files.py) and what a run
reports (report.py)."""
