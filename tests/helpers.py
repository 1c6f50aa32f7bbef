"""Shared test helpers: tiny configs, subprocess runs, event-file reading,
made-up profiler traces."""
import contextlib
import glob
import json
import os
import subprocess
import sys
import tempfile

from dist_keras import catalog, configs, tensorboard_events

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
# A user_task run of 12 steps with a checkpoint every 4 (3 kept), no eval:
# the checkpoint tests' damage and leftovers are made in its workdir.
CHECKPOINT_EVERY, CHECKPOINT_STEPS = 4, 12
CHECKPOINT_RUN = {
    "train.steps": CHECKPOINT_STEPS, "train.global_batch_size": 48,
    "train.log_every": CHECKPOINT_EVERY,
    "train.checkpoint_every": CHECKPOINT_EVERY, "train.max_checkpoints": 3,
    "eval.every": 0, "eval.steps": 1, "log.calibration_steps": 0,
    "log.sync_timing": False, "log.peak_tflops": 1.0}


# The model's and data's keys tiny_config shrinks, where they are read.
TINY = {"data.train_size": 512, "data.eval_size": 128, "data.seq_len": 12,
        "data.image_size": 16, "model.units": 16, "model.embed_dim": 8,
        "model.filters": (8,), "model.dense_units": 16}


def tiny_config(name: str = "lstm_longmem"):
  """A config `name` shrunk to run in seconds. Only keys its model and
  data read are set: dist_keras.fit refuses a ConfigDict's others."""
  c = configs.load(name)
  inputs = catalog.MODELS[c.model.name].inputs
  reads = {"model": catalog.model_reads(c.model.name),
           "data": catalog.data_reads(c.data.name, inputs)}
  for key, value in TINY.items():
    section, field = key.split(".")
    if field in reads[section]:
      c[section][field] = value
  c.train.global_batch_size = 32
  c.train.steps = 8
  c.train.log_every = 4
  c.train.checkpoint_every = 4
  c.eval.every = 4
  c.log.progress = False
  c.log.calibration_steps = 0  # tests/training/test_loop.py covers it on its own.
  # One step function to trace instead of two (the timed one is ~1/3 of a
  # tiny run's CPU). The sync breakdown's own tests turn it on, and the
  # tests' command-line runs keep the default (on).
  c.log.sync_timing = False
  return c


def builtin_dataset_fn(config, with_ids: bool = False):
  """The built-in dataset_fn of `config.data.name`, as registry.resolve
  makes it (the model's inputs for data.name=synthetic)."""
  from dist_keras import data  # pylint: disable=g-import-not-at-top
  source = data.source(config.data, catalog.MODELS[config.model.name].inputs)
  return data.dataset_fn(source, data.Batching.from_config(config), with_ids)


def train(config, workdir, strategy) -> dict:
  """Trains `config` (its model.name and data.name) through the public
  `dist_keras.fit`, as the command line does; returns summary.json."""
  return fit(config, workdir, strategy).summary


def fit(config, workdir, strategy):
  import dist_keras  # pylint: disable=g-import-not-at-top
  return dist_keras.fit(config.model.name, config.data.name,
                        workdir=str(workdir), config=config,
                        strategy=strategy)


def fit_fns(model_fn, dataset_fn, workdir, config: dict):
  """`dist_keras.fit` of a user's functions on one CPU device."""
  import dist_keras  # pylint: disable=g-import-not-at-top
  return dist_keras.fit(model_fn, dataset_fn, workdir=str(workdir),
                        config=config, strategy="one_device")


def trainer(config, workdir, strategy):
  """The loop.Trainer of `config`'s named model and data, built as a run
  builds it (close() it, or use it in a `with`)."""
  from dist_keras import api, validate  # pylint: disable=g-import-not-at-top
  validate.config(config)
  return api.build(api.Job(config, str(workdir), strategy))


def distribute(strategy, dataset_fn, split, config):
  """distribute/pipelines.py's distribution of `dataset_fn`'s `split` with
  `config`'s batch, eval steps and pipelines: (dataset, batch spec)."""
  from dist_keras.distribute import pipelines  # pylint: disable=g-import-not-at-top
  return pipelines.distribute(
      strategy, dataset_fn, split, pipelines.Feed(
          config.train.global_batch_size, config.data.pipeline_per_replica),
      eval_steps=config.eval.steps if split == "eval" else 0)


@contextlib.contextmanager
def built(config, strategy):
  """A Trainer of `config` in a throwaway workdir: its model, optimizer and
  distributed datasets, built exactly as a run builds them."""
  with tempfile.TemporaryDirectory() as workdir, trainer(
      config, workdir, strategy) as built_trainer:
    yield built_trainer


def run_module(args, timeout=300, env=None, cwd=REPO):
  """Runs `python ARGS` (e.g. `-m dist_keras.train ...`) from `cwd`.

  The checkout stays importable from any `cwd`, as for an installed user.
  """
  full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO,
              **(env or {})}
  return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env,
                        capture_output=True, text=True, timeout=timeout,
                        check=False)


def stop(procs) -> None:
  """SIGTERM to each process (a launcher stops its workers), SIGKILL to
  one that has not ended within 60 s."""
  for proc in procs:
    proc.terminate()
    try:
      proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


@contextlib.contextmanager
def logged(name: str = "tensorflow"):
  """The messages logger `name` logs in the block, as a list."""
  import logging  # pylint: disable=g-import-not-at-top
  messages = []
  handler = logging.Handler()
  handler.emit = lambda record: messages.append(record.getMessage())
  logger = logging.getLogger(name)
  logger.addHandler(handler)
  try:
    yield messages
  finally:
    logger.removeHandler(handler)


def scalar_tags(logdir: str) -> dict:
  """{tag: [(step, value), ...]} of every scalar under `logdir`."""
  return tensorboard_events.read_scalars(logdir)


def served_scalars(logdir: str) -> dict:
  """{tag: [(step, value), ...]} of every scalar under `logdir` as
  TensorBoard's default loader serves them: the Rust data server
  (tensorboard-data-server, `--load_fast=true`), asked over its gRPC
  interface as TensorBoard asks it. Skips the test where it is missing."""
  from tensorboard.data.proto import data_provider_pb2 as pb  # pylint: disable=g-import-not-at-top

  def read(stub):
    request = pb.ReadScalarsRequest(
        plugin_filter=pb.PluginFilter(plugin_name="scalars"),
        downsample=pb.Downsample(num_points=10**6))
    return {tag.tag_name: list(zip(tag.data.step, tag.data.value))
            for run in stub.ReadScalars(request, timeout=10).runs
            for tag in run.tags}
  return _served(logdir, read)


def served_texts(logdir: str) -> dict:
  """{tag: [(step, text), ...]} of every text summary under `logdir` (the
  Text tab's) as the Rust data server serves them (see served_scalars)."""
  from tensorboard.data.proto import data_provider_pb2 as pb  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top

  def read(stub):
    request = pb.ReadTensorsRequest(
        plugin_filter=pb.PluginFilter(plugin_name="text"),
        downsample=pb.Downsample(num_points=10**6))
    return {tag.tag_name: [
        (step, tensor_util.make_ndarray(value).item().decode())
        for step, value in zip(tag.data.step, tag.data.value)]
            for run in stub.ReadTensors(request, timeout=10).runs
            for tag in run.tags}
  return _served(logdir, read)


def _served(logdir: str, read) -> dict:
  """What `read(stub)` reads from a Rust data server over `logdir`, once
  two reads agree."""
  import time  # pylint: disable=g-import-not-at-top
  import grpc  # pylint: disable=g-import-not-at-top
  import pytest  # pylint: disable=g-import-not-at-top
  from tensorboard.data import server_ingester  # pylint: disable=g-import-not-at-top
  from tensorboard.data.proto import data_provider_pb2_grpc  # pylint: disable=g-import-not-at-top
  try:
    binary = server_ingester.get_server_binary().path
  except server_ingester.NoDataServerError as e:
    pytest.skip(f"no TensorBoard data server here ({e})")
  with tempfile.TemporaryDirectory() as tmp:
    port_file = os.path.join(tmp, "port")
    server = subprocess.Popen(  # pylint: disable=consider-using-with
        [binary, f"--logdir={logdir}", "--reload=once", "--port=0",
         f"--port-file={port_file}", "--die-after-stdin"],
        stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
      deadline = time.monotonic() + 30
      while not (os.path.exists(port_file)
                 and open(port_file, encoding="utf-8").read().endswith("\n")):
        assert time.monotonic() < deadline, "the data server did not start"
        time.sleep(0.05)
      port = int(open(port_file, encoding="utf-8").read())
      with grpc.insecure_channel(f"localhost:{port}") as channel:
        stub = data_provider_pb2_grpc.TensorBoardDataProviderStub(channel)
        # It serves while it loads (--reload=once loads in the background):
        # read until two reads agree.
        before, now = None, {}
        while now != before or not now:
          assert time.monotonic() < deadline, "the data server read nothing"
          time.sleep(0.2)
          before, now = now, read(stub)
        return now
    finally:
      server.kill()
      server.wait()


def config_texts(logdir: str) -> list:
  """[(step, text), ...] of the `config` text summaries under `logdir` as
  TensorBoard's Python loader (`--load_fast=false`) keeps them."""
  from tensorboard.backend.event_processing import plugin_event_accumulator as pea  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  acc = pea.EventAccumulator(logdir, size_guidance={pea.TENSORS: 0})
  acc.Reload()
  return [(e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode())
          for e in acc.Tensors("config")]


def as_if_killed_after(workdir, kept: int, last: int) -> None:
  """`workdir`, a finished run's, as if killed after its ckpt-`kept` (its
  events logged to the end): ckpt-`last`, the model file and summary.json
  gone, TensorFlow's list naming ckpt-`kept`."""
  for path in glob.glob(os.path.join(workdir, "checkpoints",
                                     f"ckpt-{last}.*")):
    os.remove(path)
  with open(os.path.join(workdir, "checkpoints", "checkpoint"), "w") as f:
    f.write(f'model_checkpoint_path: "ckpt-{kept}"\n')
  for name in ("model.keras", "summary.json"):
    os.remove(os.path.join(workdir, name))


def event_files(root: str) -> list[str]:
  return glob.glob(os.path.join(root, "**", "events.out.tfevents.*"),
                   recursive=True)


def eval_three_examples(strategy, layer):
  """A [Input(2), `layer`, Dense(1)] model (mse, mae), compiled in scope,
  evaluated by dist_keras' eval pass on 3 examples in per-replica batches
  of 1: over 2 replicas the second step leaves one replica empty. Returns
  (x, y, model, the eval's results)."""
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from dist_keras.training import evaluation, metrics  # pylint: disable=g-import-not-at-top
  with strategy.scope():
    model = keras.Sequential([keras.Input((2,)), layer, keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
  x = np.arange(6, dtype="float32").reshape(3, 2)
  y = x[:, :1]
  ds = strategy.distribute_datasets_from_function(
      lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(1))
  with strategy.scope():  # The metrics' state, as a run builds it.
    model.compute_metrics(x, y, model(x), None)
    model.compute_loss(x, y, model(x))
  if hasattr(layer, "calls"):
    layer.calls.assign(0.0)  # The builds' calls above do not count.
  result = evaluation.evaluate(evaluation.make_eval_pass(strategy, model),
                               metrics.MetricState(model), ds)
  return x, y, model, result


def free_ports(n: int) -> list[int]:
  """`n` distinct ports free on every interface (TensorFlow's server binds
  them all: strategies.check_port_free) for workers a test starts by hand:
  the launcher's pick (launch/cluster.py), below the ports the system hands
  out by itself, whose sockets stay bound until all `n` are chosen. Not
  held after: a process choosing that very port may still take it before
  its worker binds it (the launcher picks again then; such a test fails
  with dist_keras' "port N is in use" line)."""
  from dist_keras.launch import cluster  # pylint: disable=g-import-not-at-top
  return cluster.free_ports(n, host="")


def leave_as_fit_does() -> None:
  """For a script a test runs as a cluster's worker, once its work is done:
  its workers leave together as their interpreters exit, as
  dist_keras.fit's do (distribute/leaving.py). One that left right after
  its last collective could close its channel while a peer still received
  that collective's last ring step, or be reported crashed by the chief's
  coordination service."""
  from dist_keras.distribute import leaving, tfconfig  # pylint: disable=g-import-not-at-top
  cluster = tfconfig.from_env()
  if tfconfig.is_multi_worker(cluster):
    leaving.at_exit(cluster)


def one_worker_cluster() -> str:
  """TF_CONFIG of a one-worker cluster on a free loopback port (a cluster
  worker's paths, on one process)."""
  (port,) = free_ports(1)
  return json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}"]},
                     "task": {"type": "worker", "index": 0}})


def write_xspace(path, lines):
  """Writes an XSpace of one host plane to `path`.

  `lines`: {line id: [(event name, start_us, duration_us, {stat: int})]}.
  """
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  space = xplane_pb2.XSpace()
  plane = space.planes.add(name="/host:CPU")
  ids = {}

  def metadata_id(table, name):
    if name not in ids:
      ids[name] = len(ids) + 1
    table[ids[name]].id, table[ids[name]].name = ids[name], name
    return ids[name]

  for line_id, events in lines.items():
    line = plane.lines.add(id=line_id, timestamp_ns=1000)
    for name, start_us, dur_us, stats in events:
      event = line.events.add(
          metadata_id=metadata_id(plane.event_metadata, name),
          offset_ps=int(start_us * 1e6), duration_ps=int(dur_us * 1e6))
      for key, value in stats.items():
        event.stats.add(metadata_id=metadata_id(plane.stat_metadata, key),
                        int64_value=value)
  with open(path, "wb") as f:
    f.write(space.SerializeToString())
  return str(path)


# A worker command for the launcher, no TensorFlow: each worker prints its
# index and TF_CONFIG; worker 1 waits until worker 0 has printed, then exits
# 3, so both lines are out before the launcher stops the cluster.
TWO_WORKERS = """\
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
ready = os.path.join(os.getcwd(), "worker0_done")
while task == 1 and not os.path.exists(ready):
  time.sleep(0.01)
print(task, os.environ["TF_CONFIG"], flush=True)
if task == 0:
  open(ready, "w").close()
sys.exit(3 * task)
"""


def check_two_workers(result) -> None:
  """TWO_WORKERS' launch: both workers ran with their own TF_CONFIG of one
  2-worker cluster; the launcher, named dist-keras-launch, ended with
  worker 1's code."""
  assert result.returncode == 3, result.stderr
  lines = sorted(result.stdout.splitlines())
  assert [line.split(" ", 2)[:2] for line in lines] == [["[w0]", "0"],
                                                        ["[w1]", "1"]]
  tf_configs = [json.loads(line.split(" ", 2)[2]) for line in lines]
  assert [c["task"] for c in tf_configs] == [{"type": "worker", "index": 0},
                                             {"type": "worker", "index": 1}]
  assert tf_configs[0]["cluster"] == tf_configs[1]["cluster"]
  assert len(set(tf_configs[0]["cluster"]["worker"])) == 2
  assert result.stderr == ("dist-keras-launch: worker 1 exited with code 3; "
                           "stopping the others\n")
