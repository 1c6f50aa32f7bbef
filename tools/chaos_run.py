"""Runs a job under tools/launch_local.py and injects a chaos plan into it.

The launcher's relayed output (its stderr merged into its stdout) is read
line by line: the chief's progress lines (`[w0] step  12/60 ...`) say which
step the job is at, the launcher's own lines say which worker failed with
which code and when it restarts the cluster, and the chief's resume line
(`[w0] resumed from ckpt-10 at step 10`, or `ckpt-20 is damaged (...):
resuming from ckpt-10 at step 10`) says where the restarted job went on
from. When the job reaches a fault's step, the fault is done to that
worker's process, found as the launcher's child whose TF_CONFIG names the
task. The next fault waits until the job has recovered from this one: it
trained past the furthest step printed before the restart.

Every line of the launcher goes to a log file; the tool prints only what it
did and saw.
"""
import dataclasses
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import common
import launch_local
from dist_keras.launch import cluster as local_cluster

LAUNCHER = os.path.abspath(launch_local.__file__)  # It runs with cwd=REPO.
SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM,
           "hang": signal.SIGSTOP, "damage": signal.SIGKILL}
# A damage of the "overwrite" cut inverts this many bytes mid-file.
OVERWRITE_BYTES = 64

_PROGRESS = re.compile(r"^\[w\d+\] step\s+(\d+)/\d+\s")
_RESUME = re.compile(r"^\[w\d+\] .*?(?:resumed|resuming) from ckpt-\d+ at "
                     r"step (\d+)")
_DAMAGED = re.compile(r"(ckpt-\d+) is damaged")
_FAILED = re.compile(r"^launch_local: worker (\d+) exited with code (\d+)")
_RESTART = re.compile(r"^launch_local: restart \d+/\d+ after")
_ERROR = re.compile(r"^\[w\d+\] dist_keras: error: ")


def progress_step(line: str) -> int | None:
  """The step of a relayed progress line, else None."""
  found = _PROGRESS.match(line)
  return int(found.group(1)) if found else None


def resume(line: str) -> tuple[int, list[str]] | None:
  """(step resumed from, checkpoints named damaged) of a resume line."""
  found = _RESUME.match(line)
  return (int(found.group(1)), _DAMAGED.findall(line)) if found else None


def failure(line: str) -> tuple[int, int] | None:
  """(worker, exit code) of the launcher's line on a failed worker."""
  found = _FAILED.match(line)
  return (int(found.group(1)), int(found.group(2))) if found else None


def is_restart(line: str) -> bool:
  return bool(_RESTART.match(line))


# ---- doing the faults --------------------------------------------------------


def worker_pids(parent: int) -> dict[int, int]:
  """{task index: pid} of `parent`'s live children that have a TF_CONFIG."""
  pids = {}
  for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
    try:
      state, ppid, _ = local_cluster.process_stat(pid)
      if ppid != parent or state == "Z":
        continue
      with open(f"/proc/{pid}/environ", "rb") as f:
        environ = dict(item.partition(b"=")[::2]
                       for item in f.read().split(b"\0"))
      if b"TF_CONFIG" in environ:
        pids[json.loads(environ[b"TF_CONFIG"])["task"]["index"]] = pid
    except (OSError, ValueError, KeyError):
      continue  # Ended while we looked, or not ours to read.
  return pids


def damage_latest(folder: str, cut: str, file: str) -> str:
  """Truncates to half, or inverts bytes mid-file of, the `file` ("index"
  or "data") of the newest checkpoint in `folder`; says what it did."""
  steps = [int(m.group(1)) for name in os.listdir(folder)
           if (m := re.fullmatch(r"ckpt-(\d+)\.index", name))]
  if not steps:
    raise OSError(f"no checkpoint in {folder} to damage")
  name = f"ckpt-{max(steps)}"
  path = os.path.join(folder, name + ".index")
  if file == "data":
    (path,) = (os.path.join(folder, n) for n in os.listdir(folder)
               if n.startswith(name + ".data-"))
  size = os.path.getsize(path)
  with open(path, "r+b") as f:
    if cut == "truncate":
      f.truncate(size // 2)
      return f"{os.path.basename(path)} cut from {size} to {size // 2} bytes"
    start = max(0, size // 2 - OVERWRITE_BYTES // 2)
    f.seek(start)
    middle = f.read(OVERWRITE_BYTES)
    f.seek(start)
    f.write(bytes(b ^ 0xFF for b in middle))
  return (f"{os.path.basename(path)}: {len(middle)} bytes at {start} of "
          f"{size} inverted")


class Injector:
  """Does faults to the workers of one launcher, by their task index."""

  def __init__(self, launcher_pid: int, workdir: str):
    self.launcher_pid, self.workdir = launcher_pid, workdir
    self.stopped = None  # The pid a hang stopped, until released.

  def inject(self, fault) -> str:
    """Does `fault`; says what was done. Raises OSError if it could not."""
    pid = worker_pids(self.launcher_pid).get(fault.worker)
    if pid is None:
      raise OSError(f"worker {fault.worker} is not running")
    said = ""
    if fault.kind == "damage":
      said = damage_latest(os.path.join(self.workdir, "checkpoints"),
                           fault.cut, fault.file) + "; "
    os.kill(pid, SIGNALS[fault.kind])
    if fault.kind == "hang":
      self.stopped = pid
    return said + f"{SIGNALS[fault.kind].name} to pid {pid}"

  def release(self) -> None:
    """SIGCONTs the worker a hang stopped, if any."""
    if self.stopped:
      try:
        os.kill(self.stopped, signal.SIGCONT)
      except ProcessLookupError:
        pass  # The launcher has killed it already.
      self.stopped = None


# ---- following the job -------------------------------------------------------


def _say(line: str) -> None:
  print(line, flush=True)  # Between the runs' minutes of silence.


@dataclasses.dataclass
class Outcome:
  """What became of one fault. Times are time.monotonic() seconds."""
  fault: object
  at_step: int  # The step the job had printed when the fault was done.
  injected_at: float
  done: str = ""  # What was done, or why it could not be.
  injected: bool = True
  reached: int = 0  # The furthest step printed before the restart.
  exit: int | None = None  # The code the launcher reported.
  exit_after: float | None = None  # Seconds from the fault to that report.
  error: str = ""  # The first worker's error line after the fault.
  restarts: int = 0
  released: bool = False  # A hang's SIGCONT was sent.
  resumed: int | None = None  # The step the restarted job resumed from.
  damaged: tuple = ()  # Checkpoints the resume line named damaged.
  recovered_at: float | None = None

  @property
  def settled(self) -> bool:
    return not self.injected or self.recovered_at is not None

  @property
  def survived(self) -> bool:
    """Recovered; a damage only if the resume passed over the damage."""
    return self.recovered_at is not None and (
        self.fault.kind != "damage" or bool(self.damaged))

  @property
  def retrained(self) -> int | None:
    if self.resumed is None:
      return None
    return max(0, self.reached - self.resumed)

  @property
  def time_lost(self) -> float | None:
    if self.recovered_at is None:
      return None
    return self.recovered_at - self.injected_at


class Chaos:
  """Follows the launcher's lines and injects the plan's faults in turn.

  `hang`: (least, most) seconds a hang holds its worker stopped. It is held
  at least `least` (the collective timeout: the hang outlasts it) and then
  released as soon as the launcher has reported a failed worker, so it
  takes the launcher's SIGTERM like the rest of the cluster; if no worker
  failed, it is released after `most`.
  """

  def __init__(self, plan, injector, hang: tuple[float, float], say=None):
    self.pending = list(plan)
    self.injector, self.hang, self.say = injector, hang, say or _say
    self.outcomes = []
    self.restarts = 0

  @property
  def current(self) -> Outcome | None:
    """The fault not yet recovered from, if any."""
    last = self.outcomes[-1] if self.outcomes else None
    return last if last and not last.settled else None

  def feed(self, line: str, now: float) -> None:
    """Takes one line of the launcher's output, read at `now`."""
    step, failed, resumed = progress_step(line), failure(line), resume(line)
    current = self.current
    if step is not None:
      self._progress(step, now)
    elif current and not current.error and _ERROR.match(line):
      current.error = line.strip()
      self.say(f"  {current.error}")
    elif failed and current and current.exit is None:
      current.exit, current.exit_after = failed[1], now - current.injected_at
      self.say(f"  worker {failed[0]} exited with code {failed[1]} "
               f"{current.exit_after:.1f} s after the fault")
    elif failed and not current:
      self.say(f"worker {failed[0]} exited with code {failed[1]}, after no "
               "fault of ours")
    elif is_restart(line):
      self.restarts += 1
      if current:
        current.restarts += 1
    elif resumed and current and current.restarts:
      current.resumed, current.damaged = resumed[0], tuple(resumed[1])
      self.say(f"  restarted; {line.split('] ', 1)[1].strip()}")

  def tick(self, now: float) -> None:
    """Releases a hang when its time has come (see `hang`)."""
    current = self.current
    if not current or current.fault.kind != "hang" or current.released:
      return
    held = now - current.injected_at
    if (held >= self.hang[0] and current.exit is not None
        or held >= self.hang[1]):
      self.injector.release()
      current.released = True
      self.say(f"  SIGCONT after {now - current.injected_at:.1f} s stopped")

  def _progress(self, step: int, now: float) -> None:
    current = self.current
    if current and not current.restarts:
      if current.released and step > current.reached:  # Never detected.
        self._recovered(current, now, "without a restart")
      current.reached = max(current.reached, step)
    elif current and step >= current.reached:
      self._recovered(current, now, f"step {current.reached} reached again")
    if not self.current and self.pending and step >= self.pending[0].step:
      self._inject(self.pending.pop(0), step, now)

  def _recovered(self, outcome: Outcome, now: float, how: str) -> None:
    outcome.recovered_at = now
    self.say(f"  recovered: {how} {now - outcome.injected_at:.1f} s after "
             "the fault")

  def _inject(self, fault, step: int, now: float) -> None:
    outcome = Outcome(fault, step, now, reached=step)
    try:
      outcome.done = self.injector.inject(fault)
    except OSError as e:
      outcome.done, outcome.injected = f"not injected: {e}", False
    self.outcomes.append(outcome)
    self.say(f"fault {len(self.outcomes)} at step {step}: {fault.kind} "
             f"worker {fault.worker}: {outcome.done}")


@dataclasses.dataclass
class Result:
  """A finished run: the launcher's exit status, wall seconds, the chaos."""
  code: int
  seconds: float
  chaos: Chaos
  timed_out: bool = False


def run(command: list[str], num_workers: int, plan, log_path: str,
        hang: tuple[float, float] = (15.0, 45.0),
        timeout: float = 1800.0) -> Result:
  """Runs `command` on `num_workers` local workers, injecting `plan`.

  The launcher may restart the cluster once per fault and twice more (an
  unplanned failure then shows in the report, not as a failed job).

  Args:
    command: the worker command; its --workdir=... is where damage goes.
    num_workers: the cluster's size.
    plan: chaos_plan.Fault list; empty: an uninterrupted run.
    log_path: every line of the launcher goes here.
    hang: see Chaos.
    timeout: after this many seconds the launcher is stopped (SIGTERM).
  """
  workdir = next(a.split("=", 1)[1] for a in command
                 if a.startswith("--workdir="))
  proc = subprocess.Popen(
      [sys.executable, LAUNCHER, f"--num_workers={num_workers}",
       f"--max_restarts={len(plan) + 2 if plan else 0}", "--", *command],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      cwd=common.REPO)
  chaos = Chaos(plan, Injector(proc.pid, workdir), hang)
  start = time.monotonic()
  try:
    timed_out = _follow(proc, chaos, log_path, start + timeout)
  finally:
    chaos.injector.release()
    if proc.poll() is None:
      proc.terminate()  # The launcher stops its workers in order.
    code = proc.wait()
  return Result(code, time.monotonic() - start, chaos, timed_out)


def _follow(proc, chaos: Chaos, log_path: str, deadline: float) -> bool:
  """Feeds the launcher's lines to `chaos` until it ends; True if the
  deadline came first."""
  lines = queue.Queue()
  threading.Thread(target=_read, args=(proc.stdout, lines),
                   daemon=True).start()
  with open(log_path, "w") as log:
    while time.monotonic() < deadline:
      try:
        line = lines.get(timeout=0.2)
      except queue.Empty:
        line = ""
      if line is None:
        return False
      log.write(line)
      if line:
        chaos.feed(line, time.monotonic())
      chaos.tick(time.monotonic())
  return True


def _read(pipe, lines: queue.Queue) -> None:
  with pipe:
    for line in pipe:
      lines.put(line)
  lines.put(None)
