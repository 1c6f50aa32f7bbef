"""A chaos run's report: a row per fault, then the totals.

Columns: the fault and the worker it was done to; the step the job had
printed when it was done; the exit code the launcher reported and the
seconds from the fault to that report; the cluster restarts until the job
was back; the step the restarted job resumed from (and the checkpoints it
passed over as damaged); the steps trained again (the furthest step printed
before the restart minus the step resumed from); the wall seconds from the
fault until the job was back at that furthest step. docs/tools.md shows a
report.
"""

HEADER = ("fault", "worker", "at step", "exit", "exit after s", "restarts",
          "resumed from", "retrained", "time lost s")


def _cell(value, form="{}") -> str:
  return "-" if value is None else form.format(value)


def row(outcome) -> tuple:
  """One fault's cells (chaos_run.Outcome)."""
  resumed = _cell(outcome.resumed)
  if outcome.damaged:
    resumed += f" ({', '.join(outcome.damaged)} damaged)"
  return (outcome.fault.kind, str(outcome.fault.worker), str(outcome.at_step),
          _cell(outcome.exit), _cell(outcome.exit_after, "{:.1f}"),
          str(outcome.restarts), resumed,
          _cell(outcome.retrained), _cell(outcome.time_lost, "{:.1f}"))


def table(outcomes) -> list[str]:
  """The rows under a header, columns aligned (text left, numbers right);
  then a line for each fault that could not be done, saying why."""
  rows = [HEADER, *(row(o) for o in outcomes)]
  widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
  left = (0, 6)  # fault, resumed from
  return ["  ".join(cell.ljust(w) if i in left else cell.rjust(w)
                    for i, (cell, w) in enumerate(zip(r, widths))).rstrip()
          for r in rows] + [f"fault {i}: {o.done}"
                            for i, o in enumerate(outcomes, 1)
                            if not o.injected]


def totals(result, reference_seconds: float, planned: int,
           weights: str) -> list[str]:
  """The summary lines under the table.

  Args:
    result: chaos_run.Result of the chaos run.
    reference_seconds: the uninterrupted run's wall seconds.
    planned: the faults the plan held.
    weights: the final weights' comparison, as one line.
  """
  outcomes = result.chaos.outcomes
  injected = sum(o.injected for o in outcomes)
  survived = sum(o.survived for o in outcomes)
  planned_restarts = sum(o.restarts for o in outcomes)
  extra = result.chaos.restarts - planned_restarts
  retrained = sum(o.retrained or 0 for o in outcomes)
  lost = result.seconds - reference_seconds
  return [
      f"faults planned {planned}, injected {injected}, survived {survived}; "
      f"restarts {result.chaos.restarts}"
      + (f" ({extra} after no fault of ours)" if extra else "")
      + f"; steps retrained {retrained}",
      f"wall time {result.seconds:.1f} s vs {reference_seconds:.1f} s "
      f"uninterrupted: {lost:+.1f} s"
      + (f" ({lost / injected:.1f} s a fault)" if injected else ""),
      f"final weights: {weights}",
  ]
