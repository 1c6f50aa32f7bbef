"""Parses and checks `TF_CONFIG` for MultiWorkerMirroredStrategy.

Kubeflow TFJob, Vertex AI, Ray Train and local launchers describe the cluster
in the `TF_CONFIG` environment variable:

  {"cluster": {"chief": ["host:port"], "worker": ["host:port", ...]},
   "task": {"type": "worker", "index": 0}}

TensorFlow reads it lazily and reports a typo as a hang or a gRPC error
minutes later, so this module checks it first. It must not import
TensorFlow: it runs before TensorFlow starts, so that a bad value fails
at once with one line saying what to fix.
"""
import dataclasses
import json
import os
import re

from dist_keras.distribute import tpu_env
from dist_keras.errors import UserError

_CHIEF = "chief"
_WORKER = "worker"
# Chief first: its global rank is 0, as in TensorFlow's own task order.
_TASK_TYPES = (_CHIEF, _WORKER)
_UNSUPPORTED = {
    "ps": "parameter-server training is not supported; use chief/worker "
          "tasks only",
    "evaluator": "dist_keras does not run a side-car evaluator; remove the "
                 "evaluator task and evaluate in the training job or a "
                 "separate one",
    "master": "\"master\" is the TensorFlow 1 name; rename it to \"chief\"",
}
_EXAMPLE = ('{"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
            '"task": {"type": "worker", "index": 0}}')
_QUOTE_CHARS = 80
# Host names, IPv4, or a bracketed IPv6 address (with an optional zone);
# unbracketed IPv6 is refused because its last ':' is ambiguous.
_ADDRESS = re.compile(
    r"(?:\[[0-9A-Fa-f:.]+(?:%[\w.-]+)?\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
  """A checked `TF_CONFIG`: the cluster and this process's place in it.

  Build it with `parse` or `from_env`, which check the values.

  Attributes:
    cluster: task type ("chief", "worker") -> its "host:port" addresses.
    task_type: this process's task type, a key of `cluster`.
    task_index: this process's index into `cluster[task_type]`.
  """
  cluster: dict[str, list[str]]
  task_type: str
  task_index: int

  @property
  def num_workers(self) -> int:
    """All training tasks: the chief (if any) plus the workers."""
    return sum(len(addresses) for addresses in self.cluster.values())

  @property
  def is_chief(self) -> bool:
    """TensorFlow's rule: the chief, or worker 0 when there is no chief."""
    if self.task_type == _CHIEF:
      return True
    return _CHIEF not in self.cluster and self.task_index == 0

  @property
  def address(self) -> str:
    """This task's "host:port"."""
    return self.cluster[self.task_type][self.task_index]

  @property
  def worker_id(self) -> int:
    """A 0-based global rank (chief first, then workers), for log prefixes."""
    if self.task_type == _CHIEF:
      return self.task_index
    return len(self.cluster.get(_CHIEF, ())) + self.task_index


def from_env(environ=os.environ) -> ClusterSpec | None:
  """`parse` of the `TF_CONFIG` variable in `environ` (None when unset).

  A blank one (a Kubernetes template's empty value) is removed from
  `environ`: it means no cluster here, but TensorFlow's own resolver,
  which every strategy consults, fails on it as JSON.
  """
  raw = environ.get("TF_CONFIG")
  if raw is not None and not raw.strip():
    del environ["TF_CONFIG"]
    return None
  return parse(raw)


def is_multi_worker(spec: ClusterSpec | None) -> bool:
  """Whether `spec` describes more than one training task."""
  return spec is not None and spec.num_workers > 1


def parse(raw: str | None) -> ClusterSpec | None:
  """Checks a `TF_CONFIG` value and returns it as a `ClusterSpec`.

  Args:
    raw: the JSON text of `TF_CONFIG`; None or blank means no cluster.

  Returns:
    The checked cluster, or None when `raw` is None or blank.

  Raises:
    UserError: one line naming the bad part and how to fix it.
  """
  if raw is None or not raw.strip():
    return None
  config = _load_json(raw)
  for key in ("cluster", "task"):
    if key not in config:
      raise UserError(f"TF_CONFIG has no {json.dumps(key)} key: "
                      f"{_clip(raw)}; set it like {_EXAMPLE}.")
  cluster = _check_cluster(config["cluster"])
  task_type, task_index = _check_task(config["task"], cluster)
  return ClusterSpec(cluster, task_type, task_index)


def _load_json(raw: str) -> dict:
  """The decoded `raw`, which must be a JSON object."""
  try:
    config = json.loads(raw)
  except json.JSONDecodeError as e:
    raise UserError(f"TF_CONFIG is not valid JSON ({e.msg} at char {e.pos}): "
                    f"{_clip(raw, e.pos)}; fix it to read like "
                    f"{_EXAMPLE}.") from None
  if not isinstance(config, dict):
    raise UserError(f"TF_CONFIG must be a JSON object, not {_clip(raw)}; set "
                    f"it like {_EXAMPLE}.")
  return config


def _check_cluster(cluster) -> dict[str, list[str]]:
  """A copy of `cluster` after checking its task types and addresses."""
  if not isinstance(cluster, dict):
    raise UserError(f"TF_CONFIG cluster={_quote(cluster)} must be an object "
                    "of task type -> list of \"host:port\"; set it like "
                    f"{_EXAMPLE}.")
  if not cluster:
    raise UserError("TF_CONFIG cluster={} is empty; list the tasks, like "
                    f"{_EXAMPLE}.")
  for task_type in cluster:
    _check_task_type_supported(task_type, "cluster has task type")
  checked = {t: _check_addresses(t, cluster[t])
             for t in _TASK_TYPES if t in cluster}
  if len(checked.get(_CHIEF, ())) > 1:
    raise UserError(f"TF_CONFIG cluster.chief={_quote(checked[_CHIEF])} has "
                    f"{len(checked[_CHIEF])} addresses; there is at most one "
                    "chief, so move the others to cluster.worker.")
  _check_unique(checked)
  return checked


def _check_task_type_supported(task_type, where: str) -> None:
  """Refuses the task types MultiWorkerMirroredStrategy does not run."""
  if task_type in _UNSUPPORTED:
    raise UserError(f"TF_CONFIG {where} {_quote(task_type)}: "
                    f"{_UNSUPPORTED[task_type]}.")
  if task_type not in _TASK_TYPES:
    raise UserError(f"TF_CONFIG {where} {_quote(task_type)}; dist_keras runs "
                    "only \"chief\" and \"worker\" tasks, so use one of "
                    "those.")


def _check_addresses(task_type: str, addresses) -> list[str]:
  """`addresses` as a new list, if it is a non-empty list of host:port."""
  where = f"cluster.{task_type}"
  if not isinstance(addresses, list):
    raise UserError(f"TF_CONFIG {where}={_quote(addresses)} must be a list "
                    "of \"host:port\" strings, like [\"host1:2222\"].")
  if not addresses:
    raise UserError(f"TF_CONFIG {where}=[] is empty; give it at least one "
                    "\"host:port\" or remove the key.")
  for i, address in enumerate(addresses):
    _check_address(f"{where}[{i}]", address)
  return list(addresses)


def _check_address(where: str, address) -> None:
  """Refuses anything but "host:port" with a port in 1..65535."""
  match = (_ADDRESS.fullmatch(address) if isinstance(address, str)
           else None)
  if match is None or not 1 <= int(match.group(1)) <= 65535:
    raise UserError(f"TF_CONFIG {where}={_quote(address)} is not "
                    "\"host:port\" with a port in 1..65535; write it like "
                    "\"worker-1:2222\" (IPv6: \"[::1]:2222\").")


def _check_unique(cluster: dict[str, list[str]]) -> None:
  """Refuses an address given to two tasks: they could not both bind it."""
  seen = {}
  for task_type, addresses in cluster.items():
    for i, address in enumerate(addresses):
      where = f"cluster.{task_type}[{i}]"
      if address in seen:
        raise UserError(f"TF_CONFIG address {_quote(address)} is both "
                        f"{seen[address]} and {where}; give every task its "
                        "own host:port.")
      seen[address] = where


def _check_task(task, cluster: dict[str, list[str]]) -> tuple[str, int]:
  """This process's (task type, index), checked against `cluster`."""
  if not isinstance(task, dict):
    raise UserError(f"TF_CONFIG task={_quote(task)} must be an object like "
                    "{\"type\": \"worker\", \"index\": 0}.")
  if "type" not in task:
    raise UserError(f"TF_CONFIG task={_quote(task)} has no \"type\"; add "
                    "\"type\": \"chief\" or \"worker\".")
  task_type = task["type"]
  if not isinstance(task_type, str):
    raise UserError(f"TF_CONFIG task.type={_quote(task_type)} must be a "
                    "string, \"chief\" or \"worker\".")
  _check_task_type_supported(task_type, "task.type is")
  if task_type not in cluster:
    raise UserError(f"TF_CONFIG task.type={_quote(task_type)} is not in "
                    f"cluster ({', '.join(cluster)}); set it to one of "
                    "those.")
  return task_type, _check_index(task, task_type, len(cluster[task_type]))


def _check_index(task: dict, task_type: str, count: int) -> int:
  """`task["index"]`, an int in 0..count-1."""
  if "index" not in task:
    raise UserError(f"TF_CONFIG task={_quote(task)} has no \"index\"; add "
                    f"\"index\": N with N in 0..{count - 1}.")
  index = task["index"]
  # bool is an int subclass, but `true` is surely a mistake, not index 1.
  if isinstance(index, bool) or not isinstance(index, int):
    raise UserError(f"TF_CONFIG task.index={_quote(index)} must be an "
                    "integer, like \"index\": 0 (no quotes).")
  if not 0 <= index < count:
    raise UserError(f"TF_CONFIG task index {index} but cluster.{task_type} "
                    f"has {count} address(es) (0..{count - 1}); set "
                    "task.index in that range.")
  return index


def _quote(value) -> str:
  """`value` as (clipped, one-line) JSON: the user wrote JSON, not Python."""
  return _clip(json.dumps(value))


def _clip(text: str, around: int = 0) -> str:
  """`text` on one line, cut to about 80 characters near index `around`."""
  if len(text) > _QUOTE_CHARS:
    start = max(0, min(around - _QUOTE_CHARS // 2, len(text) - _QUOTE_CHARS))
    end = start + _QUOTE_CHARS
    text = (("..." if start else "") + text[start:end] +
            ("..." if end < len(text) else ""))
  # A pretty-printed TF_CONFIG spans lines; the message must not.
  return " ".join(text.split())


def choose(name: str, cluster, tpu_possible: bool = False) -> str:
  """The strategy to build for `runtime.strategy=name` and TF_CONFIG
  (no TensorFlow needed: the command line checks it before TF starts).

  Args:
    name: `runtime.strategy`.
    cluster: the checked TF_CONFIG (a ClusterSpec) or None.
    tpu_possible: whether a TPU may be here (tpu_env.detect): `auto` then tries
      it first.

  Raises:
    UserError: a name that contradicts TF_CONFIG (a cluster run as a single
      host would train N unsynchronised copies).
  """
  multi = is_multi_worker(cluster)
  if name == "auto":
    if multi:
      return "multi_worker_mirrored"
    return "tpu" if tpu_possible else "mirrored"
  if name == "multi_worker_mirrored" and cluster is None:
    raise UserError("runtime.strategy='multi_worker_mirrored' needs TF_CONFIG "
                    "naming the cluster; set it (python -m dist_keras.launch "
                    "does for local workers) or use runtime.strategy=mirrored.")
  if multi and name != "multi_worker_mirrored":
    raise UserError(f"TF_CONFIG names {cluster.num_workers} tasks but "
                    f"runtime.strategy={name!r} trains on one host; use "
                    "runtime.strategy=multi_worker_mirrored (or auto), or "
                    "unset TF_CONFIG.")
  return name


def chosen(name: str, cluster, environ=None,
           path_exists=os.path.exists) -> str:
  """`choose` for this process, a TPU it shows counted (tpu_env.detect on
  `environ`, default os.environ): each door calls it once, before
  TensorFlow starts, and hands the name down (strategies.make)."""
  environ = os.environ if environ is None else environ
  return choose(name, cluster,
                tpu_env.detect(environ, path_exists) is not None)
