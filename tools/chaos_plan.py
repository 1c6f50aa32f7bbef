"""A chaos run's plan: which fault, into which worker, at which step.

Pure and seeded: the same seed, fault count, cluster and schedule give the
same plan, so a failing chaos run is rerun exactly from its printed seed.
Each fault falls in its own checkpoint interval, a step or a few after the
interval's checkpoint and before the next one, from the third interval on: a
restart then has a checkpoint to resume from and steps to train again, a
damaged checkpoint is the latest one when the worker is killed and has an
intact one before it, and a fault is injected only after the one before it
was recovered from.
"""
import dataclasses
import random

from common import BadInput

# What each kind does to the worker (the damage's file and cut are drawn).
KINDS = {
    "kill": "SIGKILL",
    "term": "SIGTERM (preemption: a checkpoint of the step, exit 143)",
    "hang": "SIGSTOP, held past the collective timeout, then SIGCONT",
    "damage": "{cut} the latest checkpoint's {file} file, then SIGKILL",
}
CUTS = ("truncate", "overwrite")  # Half its bytes cut off; its middle zeroed.
FILES = ("index", "data")


@dataclasses.dataclass(frozen=True)
class Fault:
  """One fault: at the first progress line of `step` or later, do `kind` to
  worker `worker`; a damage also names its `cut` and `file`."""
  step: int
  kind: str
  worker: int
  cut: str = ""
  file: str = ""

  def action(self) -> str:
    return KINDS[self.kind].format(cut=self.cut, file=self.file)


def make(seed: int, faults: int, workers: int, steps: int,
         checkpoint_every: int, kinds=tuple(KINDS)) -> list[Fault]:
  """`faults` faults in increasing steps, drawn from `seed`.

  Kinds are dealt in shuffled rounds of `kinds`, so every kind comes once
  before any comes twice (4 faults of the 4 kinds: one of each).

  Raises:
    BadInput: the schedule has too few checkpoint intervals for the faults.
  """
  rng = random.Random(seed)
  intervals = sorted(rng.sample(
      range(2, _intervals(faults, steps, checkpoint_every)), faults))
  dealt = []
  while len(dealt) < faults:
    dealt += rng.sample(list(kinds), len(kinds))
  plan = []
  for interval, kind in zip(intervals, dealt):
    step = interval * checkpoint_every + rng.randint(
        1, max(1, checkpoint_every // 2))
    worker = rng.randrange(workers)
    cut, file = ((rng.choice(CUTS), rng.choice(FILES)) if kind == "damage"
                 else ("", ""))
    plan.append(Fault(step, kind, worker, cut, file))
  return plan


def _intervals(faults: int, steps: int, checkpoint_every: int) -> int:
  """Interval m holds steps m*C+1..(m+1)*C (C: checkpoint_every). A fault
  may fall in intervals 2..N-1 (N = steps // C): after the second
  checkpoint, and at least C/2 steps before the end. Returns N."""
  count = steps // checkpoint_every
  if count - 2 < faults:
    raise BadInput(
        f"--steps={steps} with --checkpoint_every={checkpoint_every} leaves "
        f"{max(0, count - 2)} checkpoint interval(s) for --faults={faults} "
        "(one each, after the second checkpoint); raise --steps to at least "
        f"{(faults + 2) * checkpoint_every} or lower --checkpoint_every.")
  return count


def lines(plan: list[Fault]) -> list[str]:
  """The plan as one line per fault."""
  return [f"  {i}. step {f.step:>4}  {f.kind:<6}  worker {f.worker}  "
          f"{f.action()}" for i, f in enumerate(plan, 1)]
