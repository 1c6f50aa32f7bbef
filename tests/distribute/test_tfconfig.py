"""TF_CONFIG parsing: the checked cluster, and one-line errors for bad input."""
import json
import os
import subprocess
import sys

import pytest

from dist_keras.distribute import tfconfig
from dist_keras.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(cluster, task_type="worker", index=0):
  return json.dumps({"cluster": cluster,
                     "task": {"type": task_type, "index": index}})


_CHIEF_AND_WORKERS = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]}
_WORKERS = {"worker": ["w0:2222", "w1:2222"]}


@pytest.mark.parametrize("raw", [None, "", "   ", "\n\t"])
def test_unset_or_blank_means_no_cluster(raw):
  assert tfconfig.parse(raw) is None
  assert not tfconfig.is_multi_worker(tfconfig.parse(raw))


def test_a_blank_variable_is_removed_for_tensorflows_resolver():
  environ = {"TF_CONFIG": "  ", "HOME": "/root"}
  assert tfconfig.from_env(environ) is None
  assert environ == {"HOME": "/root"}


@pytest.mark.parametrize(
    "task_type, index, address, worker_id, is_chief",
    [("chief", 0, "c:2222", 0, True),
     ("worker", 0, "w0:2222", 1, False),
     ("worker", 1, "w1:2222", 2, False)])
def test_chief_and_workers(task_type, index, address, worker_id, is_chief):
  spec = tfconfig.parse(_config(_CHIEF_AND_WORKERS, task_type, index))
  assert spec == tfconfig.ClusterSpec(_CHIEF_AND_WORKERS, task_type, index)
  assert spec.num_workers == 3
  assert spec.address == address
  assert spec.worker_id == worker_id
  assert spec.is_chief is is_chief
  assert tfconfig.is_multi_worker(spec)


@pytest.mark.parametrize("index, is_chief", [(0, True), (1, False)])
def test_without_a_chief_worker_0_is_chief(index, is_chief):
  spec = tfconfig.parse(_config(_WORKERS, "worker", index))
  assert spec.num_workers == 2
  assert spec.worker_id == index
  assert spec.address == _WORKERS["worker"][index]
  assert spec.is_chief is is_chief


def test_ipv6_addresses_are_accepted():
  cluster = {"worker": ["[::1]:2222", "[fe80::1%eth0]:2223"]}
  spec = tfconfig.parse(_config(cluster, "worker", 1))
  assert spec.address == "[fe80::1%eth0]:2223"


def test_a_one_worker_cluster_is_not_multi_worker():
  spec = tfconfig.parse(_config({"worker": ["localhost:12345"]}))
  assert spec.num_workers == 1
  assert spec.is_chief
  assert not tfconfig.is_multi_worker(spec)


def test_extra_keys_from_launchers_are_ignored():
  # Vertex AI adds "environment" and "job"; they are not ours to check.
  raw = json.dumps({"cluster": _WORKERS, "environment": "cloud",
                    "task": {"type": "worker", "index": 1, "trial": "7"}})
  assert tfconfig.parse(raw).task_index == 1


def test_pretty_printed_json_is_accepted():
  raw = json.dumps({"cluster": _WORKERS,
                    "task": {"type": "worker", "index": 0}}, indent=2)
  assert tfconfig.parse(raw).cluster == _WORKERS


def test_from_env_reads_tf_config():
  assert tfconfig.from_env({}) is None
  spec = tfconfig.from_env({"TF_CONFIG": _config(_WORKERS, "worker", 1)})
  assert (spec.task_type, spec.task_index) == ("worker", 1)


def test_the_spec_does_not_share_the_callers_lists():
  cluster = {"worker": ["w0:2222", "w1:2222"]}
  spec = tfconfig.parse(_config(cluster))
  cluster["worker"].append("w2:2222")
  assert spec.num_workers == 2


_BAD = [
    # (raw TF_CONFIG, parts the message must quote)
    ('{"cluster": {"worker": ["a:1"]} "task": {}}',
     ["not valid JSON", "Expecting ',' delimiter at char 32",
      '{"cluster": {"worker": ["a:1"]} "task"']),
    ("{'cluster': {}}", ["not valid JSON", "{'cluster': {}}"]),
    ('["a:1", "b:2"]', ['must be a JSON object, not ["a:1", "b:2"]']),
    (json.dumps({"task": {"type": "worker", "index": 0}}),
     ['no "cluster" key']),
    (json.dumps({"cluster": _WORKERS}), ['no "task" key']),
    (_config(["a:1"]), ['cluster=["a:1"] must be an object']),
    (_config({}), ["cluster={} is empty"]),
    (_config({"worker": "a:1"}), ['cluster.worker="a:1" must be a list']),
    (_config({"worker": []}), ["cluster.worker=[] is empty"]),
    (_config({"worker": ["a:1", 2222]}), ["cluster.worker[1]=2222",
                                          '"host:port"']),
    (_config({"worker": ["localhost"]}), ['cluster.worker[0]="localhost"']),
    (_config({"worker": ["a:0"]}), ['cluster.worker[0]="a:0"', "1..65535"]),
    (_config({"worker": ["a:65536"]}), ['cluster.worker[0]="a:65536"']),
    (_config({"worker": ["a:22x"]}), ['cluster.worker[0]="a:22x"']),
    (_config({"worker": ["a b:1"]}), ['cluster.worker[0]="a b:1"']),
    (_config({"worker": ["::1:2222"]}), ['cluster.worker[0]="::1:2222"',
                                         "[::1]:2222"]),
    (_config({"worker": ["a:1\nb:2"]}), [r'cluster.worker[0]="a:1\nb:2"']),
    (_config({"chief": ["a:1"], "worker": ["b:1", "a:1"]}),
     ['address "a:1" is both cluster.chief[0] and cluster.worker[1]']),
    (_config({"worker": ["a:1", "a:1"]}),
     ['"a:1" is both cluster.worker[0] and cluster.worker[1]']),
    (_config({"chief": ["a:1", "b:1"], "worker": ["c:1"]}),
     ['cluster.chief=["a:1", "b:1"] has 2 addresses', "at most one chief"]),
    (_config({"ps": ["p:1"], "worker": ["a:1"]}),
     ['cluster has task type "ps"', "parameter-server training is not "
      "supported; use chief/worker"]),
    (_config({"evaluator": ["e:1"], "worker": ["a:1"]}),
     ['cluster has task type "evaluator"', "side-car evaluator"]),
    (_config({"master": ["m:1"], "worker": ["a:1"]}),
     ['"master"', 'rename it to "chief"']),
    (_config({"trainer": ["t:1"]}), ['cluster has task type "trainer"']),
    (json.dumps({"cluster": _WORKERS, "task": "worker"}),
     ['task="worker" must be an object']),
    (json.dumps({"cluster": _WORKERS, "task": {"index": 0}}),
     ['task={"index": 0} has no "type"']),
    (_config(_WORKERS, 0), ["task.type=0 must be a string"]),
    (_config(_WORKERS, "evaluator"),
     ['task.type is "evaluator"', "side-car evaluator"]),
    (_config(_WORKERS, "ps"), ['task.type is "ps"', "parameter-server"]),
    (_config(_WORKERS, "chief"),
     ['task.type="chief" is not in cluster (worker)']),
    (json.dumps({"cluster": _WORKERS, "task": {"type": "worker"}}),
     ['task={"type": "worker"} has no "index"', "0..1"]),
    (_config(_WORKERS, "worker", "0"), ['task.index="0" must be an integer']),
    (_config(_WORKERS, "worker", 1.0), ["task.index=1.0 must be an integer"]),
    (_config(_WORKERS, "worker", True), ["task.index=true must be an integer"]),
    (_config(_WORKERS, "worker", -1),
     ["task index -1 but cluster.worker has 2 address(es) (0..1)"]),
    (_config(_WORKERS, "worker", 3),
     ["task index 3 but cluster.worker has 2 address(es) (0..1)"]),
]


@pytest.mark.parametrize("raw, quoted", _BAD)
def test_bad_tf_config_is_one_line_naming_the_bad_part(raw, quoted):
  with pytest.raises(UserError) as e:
    tfconfig.parse(raw)
  message = str(e.value)
  assert message.startswith("TF_CONFIG ")
  assert "\n" not in message
  for part in quoted:
    assert part in message


def test_bad_tf_config_exits_with_the_config_error_code():
  with pytest.raises(UserError) as e:
    tfconfig.from_env({"TF_CONFIG": "{"})
  assert e.value.exit_code == 2


def test_a_long_bad_value_is_clipped_around_the_error():
  workers = [f"worker-{i}.example.com:2222" for i in range(20)]
  raw = _config({"worker": workers}).replace('"task"', '"task" oops')
  with pytest.raises(UserError) as e:
    tfconfig.parse(raw)
  message = str(e.value)
  assert "oops" in message
  assert "worker-0.example" not in message
  assert len(message) < 300


def test_a_pretty_printed_bad_value_is_quoted_on_one_line():
  raw = '{\n  "cluster": {\n    "worker": ["a:1"]\n  }\n  "task": {}\n}'
  with pytest.raises(UserError) as e:
    tfconfig.parse(raw)
  message = str(e.value)
  assert "\n" not in message
  assert '"worker": ["a:1"] }' in message


def test_importing_tfconfig_does_not_import_tensorflow():
  # conftest.py imports TensorFlow here, so ask a fresh interpreter.
  result = subprocess.run(
      [sys.executable, "-c",
       "import dist_keras.distribute.tfconfig, sys; print('tensorflow' in sys.modules)"],
      env={**os.environ, "PYTHONPATH": REPO},
      capture_output=True, text=True, check=True, timeout=120)
  assert result.stdout.strip() == "False"
