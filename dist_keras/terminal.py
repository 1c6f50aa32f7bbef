"""The run's lines on its terminal: one guarded way to write them.

A stdout or stderr that fails must never end a run that can still save its
work: a closed terminal fails every write (EIO), a `| head` that has gone
too (EPIPE), /dev/full with ENOSPC, and one closed when Python started
(`>&-`) is None. Every line dist_keras prints goes through `say` (the
output of the launcher's workers, through `relay`), from the lowest layer
up (no TensorFlow here: the command line says things before TensorFlow
starts).
"""
import errno
import os
import stat
import sys


def silence(fds) -> None:
  """Points file descriptors at /dev/null: the writes that follow succeed
  and go nowhere, instead of failing one by one."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  for fd in fds:
    os.dup2(devnull, fd)
  os.close(devnull)


def terminals(fds) -> set:
  """Those of `fds` that are terminals (character devices: isatty() itself
  fails on one that has hung up); files and pipes keep their output."""
  return {fd for fd in fds if stat.S_ISCHR(os.fstat(fd).st_mode)}


def say(line: str, err: bool = False, end: str = "\n") -> None:
  """Prints one of the run's lines on stdout (stderr: `err`): the one way
  the run writes to its terminal. One that fails (EIO: its terminal
  closed; EPIPE: `| head` has gone; ENOSPC: /dev/full) goes to /dev/null,
  and after EIO a terminal on the other stream too (the same closed one):
  the run goes on (a SIGHUP stops it). One closed when Python started
  (`>&-`) is None, one closed since raises ValueError: nothing to print."""
  stream = sys.stderr if err else sys.stdout
  if stream is None:
    return
  try:
    # One write of line and end: print writes them apart, and a TF thread's
    # log line (fd 2) landed between them, on the end of this one.
    print(line + end, file=stream, end="", flush=True)
  except ValueError:  # Closed (the stream object, not its descriptor).
    return
  except OSError as e:
    _failed(stream, e)


def error(message: str) -> None:
  """An error's one line on stderr, as the command line says its errors
  (and dist_keras.fit its preemption, which ends a script silently)."""
  say(f"dist_keras: error: {message}", err=True)


def flush() -> None:
  """Flushes stdout and stderr where they are there; a failure costs only
  what they held (the exit's code, or the run, stands)."""
  for stream in (sys.stdout, sys.stderr):
    if stream is None:
      continue
    try:
      stream.flush()
    except (OSError, ValueError):
      pass


def relay(data: bytes, err: bool = False) -> None:
  """Writes another process's output (the launcher's workers' lines), its
  bytes as they came, on stdout (stderr: `err`), guarded as `say` is."""
  stream = sys.stderr if err else sys.stdout
  if stream is None:
    return
  try:
    stream.buffer.write(data)
    stream.buffer.flush()
  except ValueError:  # Closed.
    return
  except OSError as e:
    _failed(stream, e)


def _failed(stream, failure: OSError) -> None:
  """Points `stream`, whose write failed, at /dev/null (after EIO, a
  terminal on the other stream too: the same closed one)."""
  try:
    fd = stream.fileno()
  except (OSError, ValueError):  # Not a file (a test's capture).
    return
  silence({fd, *(terminals((1, 2)) if failure.errno == errno.EIO else ())})
