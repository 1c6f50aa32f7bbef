"""tools/k8s: the Kubernetes manifests and Dockerfile, checked offline.

No cluster is needed or used. The manifests are parsed, their trainer
command is parsed with the same flag machinery as dist_keras.train, the
TF_CONFIG each pod would get is rebuilt (the operator's rule for the TFJob;
the container's own script, actually run, for the Indexed Job) and its
addresses are checked against the ports and names in the manifests.
"""
import ast
import re
import glob
import json
import os
import subprocess
import sys

from absl import flags
import pytest
import yaml

from dist_keras import configs, errors, train, validate
from dist_keras.configs import base
from dist_keras.distribute import tfconfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K8S = os.path.join(REPO, "tools", "k8s")
YAML_FILES = sorted(glob.glob(os.path.join(K8S, "*.yaml")))
IMAGE = "dist-keras:latest"
TF_PORT = 2222
# kubeflow/training-operator pkg/apis/kubeflow.org/v1/tensorflow_types.go.
TFJOB_CONTAINER, TFJOB_PORT_NAME, TFJOB_DEFAULT_PORT = (
    "tensorflow", "tfjob-port", 2222)


def _docs():
  """{file name: [documents]} for every YAML file in tools/k8s."""
  out = {}
  for path in YAML_FILES:
    with open(path, encoding="utf-8") as f:
      out[os.path.basename(path)] = [d for d in yaml.safe_load_all(f) if d]
  return out


def _one(kind):
  """The only document of `kind` in tools/k8s."""
  found = [d for docs in _docs().values() for d in docs if d["kind"] == kind]
  assert len(found) == 1, f"expected one {kind}, found {len(found)}"
  return found[0]


def _container(pod_spec, name):
  matches = [c for c in pod_spec["containers"] if c["name"] == name]
  assert len(matches) == 1, f"no single container named {name!r}"
  return matches[0]


def _env(container):
  return {e["name"]: e["value"] for e in container.get("env", [])}


def _run_container_script(container, index, tmp_path):
  """Runs the Indexed Job's container command for pod `index`.

  `python -c` (the TF_CONFIG one-liner) runs for real; `python -m ...` (the
  trainer) is replaced by a stub that reports its argv and TF_CONFIG.
  """
  bin_dir = tmp_path / f"bin{index}"
  bin_dir.mkdir()
  stub = bin_dir / "python"
  stub.write_text(
      f"#!{sys.executable}\n"
      "import json, os, sys\n"
      "if sys.argv[1:2] == ['-c']:\n"
      f"  os.execv({sys.executable!r}, [{sys.executable!r}] + sys.argv[1:])\n"
      "print(json.dumps({'argv': sys.argv[1:], "
      "'tf_config': os.environ.get('TF_CONFIG')}))\n")
  stub.chmod(0o755)
  env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
         "JOB_COMPLETION_INDEX": str(index), **_env(container)}
  argv = list(container["command"]) + list(container.get("args", []))
  result = subprocess.run(argv, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
  assert result.returncode == 0, result.stderr
  return json.loads(result.stdout.strip().splitlines()[-1])


def _tfjob_tf_config(tfjob, rtype, index, namespace="default"):
  """TF_CONFIG as the training operator builds it for one TFJob pod.

  Follows genClusterSpec / genTFConfigJSONStr in kubeflow/training-operator
  pkg/controller.v1/tensorflow/tensorflow.go and GetPortFromTFJob in util.go:
  one "<job>-<type>-<i>.<namespace>.svc:<port>" per replica, the port taken
  from the port named tfjob-port of the container named tensorflow (else
  2222).
  """
  cluster = {}
  for rt, spec in tfjob["spec"]["tfReplicaSpecs"].items():
    port = TFJOB_DEFAULT_PORT
    for c in spec["template"]["spec"]["containers"]:
      if c["name"] == TFJOB_CONTAINER:
        for p in c.get("ports", []):
          if p.get("name") == TFJOB_PORT_NAME:
            port = p["containerPort"]
    name = tfjob["metadata"]["name"]
    cluster[rt.lower()] = [
        f"{name}-{rt.lower()}-{i}.{namespace}.svc:{port}"
        for i in range(spec.get("replicas", 1))]
  return {"cluster": cluster, "task": {"type": rtype.lower(), "index": index},
          "environment": "cloud"}


def _trainer_argvs(tmp_path):
  """{workload: the argv after `python`} of each trainer container."""
  tfjob = _one("TFJob")
  c = _container(tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"],
                 TFJOB_CONTAINER)
  argvs = {"TFJob": list(c["command"]) + list(c.get("args", []))}
  assert argvs["TFJob"][0] == "python", argvs["TFJob"]
  argvs["TFJob"] = argvs["TFJob"][1:]
  job = _one("Job")
  job_c = _container(job["spec"]["template"]["spec"], "trainer")
  argvs["Job"] = _run_container_script(job_c, 0, tmp_path)["argv"]
  return argvs


def _parse_train_flags(argv, monkeypatch):
  """The config and workdir dist_keras.train would build from `argv` (after
  -m NAME), by its own parsing: an unknown flag or config key, or a wrongly
  typed value, raises here as it would in the pod."""
  monkeypatch.chdir(REPO)  # The image's WORKDIR holds configs/ likewise.
  rest, overrides = train.split_overrides(["dist_keras.train", *argv])
  fv = flags.FlagValues()
  flags.DEFINE_string("config", configs.DEFAULT, "", flag_values=fv)
  flags.DEFINE_string("workdir", None, "", flag_values=fv)
  flags.DEFINE_bool("verbose", False, "", flag_values=fv)
  fv(rest)
  return (configs.from_command_line(fv["config"].value, overrides),
          fv["workdir"].value)


def test_every_manifest_parses_with_kind_and_name():
  docs = _docs()
  assert set(docs) == {"tfjob.yaml", "indexed-job.yaml", "pvc.yaml",
                       "networkpolicy.yaml"}
  for name, file_docs in docs.items():
    assert file_docs, name
    for d in file_docs:
      assert d["apiVersion"] and d["kind"] and d["metadata"]["name"], name
  kinds = {(d["apiVersion"], d["kind"]) for ds in docs.values() for d in ds}
  assert kinds == {("kubeflow.org/v1", "TFJob"), ("batch/v1", "Job"),
                   ("v1", "Service"), ("v1", "PersistentVolumeClaim"),
                   ("networking.k8s.io/v1", "NetworkPolicy")}


def test_trainer_commands_run_dist_keras_train(tmp_path, monkeypatch):
  base_cfg = base.get_config()
  for workload, argv in _trainer_argvs(tmp_path).items():
    assert argv[:2] == ["-m", "dist_keras.train"], (workload, argv)
    flags_ = argv[2:]
    configs_ = [a for a in flags_ if a.startswith("--config=")]
    assert len(configs_) == 1, (workload, flags_)
    # A built-in's name: an image that only pip installs dist_keras has no
    # configs/ folder to give a path in.
    config_name = configs_[0].split("=", 1)[1]
    assert config_name in configs.names(), config_name
    for arg in flags_:
      if arg.startswith("--config."):
        key = arg[len("--config."):].split("=", 1)[0]
        section, field = key.split(".")
        assert section in base_cfg and field in base_cfg[section], (
            f"{workload}: --config.{key} is not a key of configs/base.py")
    cfg, workdir = _parse_train_flags(flags_, monkeypatch)
    assert cfg.runtime.strategy == "multi_worker_mirrored", workload
    validate.config(cfg)
    assert workdir and workdir.startswith("/workdir/"), (workload, workdir)


@pytest.mark.parametrize("override,error", [
    ("--config.runtime.stratgy=multi_worker_mirrored", "names no config key"),
    ("--config.train.steps=many", "--config.train.steps=many is not an int"),
])
def test_a_bad_override_would_be_caught(override, error, monkeypatch):
  # The check above is real: the same parser refuses an unknown key or a
  # wrongly typed value, as dist_keras.train would in the pod.
  with pytest.raises(errors.UserError, match=re.escape(error)):
    _parse_train_flags(["--config=lstm_longmem", override],
                       monkeypatch)


def test_tfjob_structure():
  tfjob = _one("TFJob")
  specs = tfjob["spec"]["tfReplicaSpecs"]
  assert set(specs) == {"Worker"}  # No Chief: worker 0 is the chief.
  worker = specs["Worker"]
  assert worker["replicas"] >= 2
  assert worker["restartPolicy"] == "ExitCode"
  pod = worker["template"]["spec"]
  assert "restartPolicy" not in pod  # The operator sets it from the above.
  c = _container(pod, TFJOB_CONTAINER)
  assert c["image"] == IMAGE
  assert c["resources"]["requests"]["cpu"]
  ports = {p["name"]: p["containerPort"] for p in c["ports"]}
  assert ports == {TFJOB_PORT_NAME: TF_PORT}
  assert tfjob["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"


def test_pods_have_time_to_answer_a_sigterm():
  """Kubernetes' default 30 s from SIGTERM to SIGKILL can end before the
  workers' next agreement step, an eval and a checkpoint save."""
  pods = [_one("TFJob")["spec"]["tfReplicaSpecs"]["Worker"]["template"],
          _one("Job")["spec"]["template"]]
  for pod in pods:
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 60


def test_tfjob_tf_config_addresses_use_port_2222():
  tfjob = _one("TFJob")
  n = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["replicas"]
  for i in range(n):
    tf_config = _tfjob_tf_config(tfjob, "Worker", i)
    workers = tf_config["cluster"]["worker"]
    assert len(workers) == n
    assert all(a.endswith(f".svc:{TF_PORT}") for a in workers), workers
    assert workers[i].startswith(f"dist-keras-worker-{i}.")


# The shell's own permanent failures: a command found but not executable
# (126) or not found (127), e.g. a broken image.
SHELL_PERMANENT = (126, 127)


def test_exit_codes_match_restart_policy_exit_code():
  # ExitCode: 1-127 permanent (job fails), 128-255 retryable (pod recreated),
  # per kubeflow/training-operator pkg/util/train/train_util.go.
  for code in errors.PERMANENT:
    assert 1 <= code <= 127, code
  for code in errors.RETRYABLE:
    assert 128 <= code <= 255, code
  job = _one("Job")
  rules = job["spec"]["podFailurePolicy"]["rules"]
  fail = [r for r in rules if r["action"] == "FailJob"]
  assert len(fail) == 1
  on_exit = fail[0]["onExitCodes"]
  assert on_exit["operator"] == "In"
  assert on_exit["containerName"] == "trainer"
  # Exactly dist_keras' permanent codes: a missing one is retried
  # backoffLimit times, failing alike each time.
  assert on_exit["values"] == sorted(errors.PERMANENT + SHELL_PERMANENT)
  assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_indexed_job_names_and_ports_agree():
  job, svc = _one("Job"), _one("Service")
  spec = job["spec"]
  assert spec["completionMode"] == "Indexed"
  assert spec["completions"] >= 2 and spec["parallelism"] == spec["completions"]
  pod = spec["template"]["spec"]
  c = _container(pod, "trainer")
  env = _env(c)
  assert c["image"] == IMAGE
  assert c["resources"]["requests"]["cpu"]
  assert env["JOB_NAME"] == job["metadata"]["name"]
  assert int(env["NUM_WORKERS"]) == spec["completions"]
  assert env["SERVICE_NAME"] == pod["subdomain"] == svc["metadata"]["name"]
  assert svc["spec"]["clusterIP"] == "None"
  assert svc["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
  assert int(env["TF_PORT"]) == TF_PORT
  assert [p["containerPort"] for p in c["ports"]] == [TF_PORT]
  assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
      (TF_PORT, TF_PORT)]


def test_indexed_job_builds_tf_config_from_its_index(tmp_path):
  job = _one("Job")
  c = _container(job["spec"]["template"]["spec"], "trainer")
  name, svc = job["metadata"]["name"], _env(c)["SERVICE_NAME"]
  n = job["spec"]["completions"]
  expected = [f"{name}-{i}.{svc}:{TF_PORT}" for i in range(n)]
  for i in range(n):
    tf_config = json.loads(_run_container_script(c, i, tmp_path)["tf_config"])
    assert tf_config == {"cluster": {"worker": expected},
                         "task": {"type": "worker", "index": i}}


def test_dist_keras_accepts_both_tf_configs(tmp_path):
  tfjob = _one("TFJob")
  n = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["replicas"]
  job = _one("Job")
  c = _container(job["spec"]["template"]["spec"], "trainer")
  for i in range(n):
    for raw in (json.dumps(_tfjob_tf_config(tfjob, "Worker", i)),
                _run_container_script(c, i, tmp_path)["tf_config"]):
      spec = tfconfig.parse(raw)
      assert spec.num_workers == n
      assert spec.is_chief == (i == 0)


def test_shared_workdir_volume():
  pvc = _one("PersistentVolumeClaim")
  assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
  tfjob_pod = _one("TFJob")["spec"]["tfReplicaSpecs"]["Worker"]["template"][
      "spec"]
  job_pod = _one("Job")["spec"]["template"]["spec"]
  for pod, name in ((tfjob_pod, TFJOB_CONTAINER), (job_pod, "trainer")):
    (volume,) = pod["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"][
        "name"]
    (mount,) = _container(pod, name)["volumeMounts"]
    assert mount["name"] == volume["name"]
    assert mount["mountPath"] == "/workdir"


def _setup_extras():
  with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.keyword) and node.arg == "extras_require":
      return {k.value for k in node.value.keys}
  raise AssertionError("setup.py has no extras_require")


def test_dockerfile_installs_the_package():
  with open(os.path.join(K8S, "Dockerfile"), encoding="utf-8") as f:
    lines = [l.strip() for l in f
             if l.strip() and not l.lstrip().startswith("#")]
  # Join backslash continuations, then split each instruction off its words.
  joined = " ".join(l[:-1] + " " if l.endswith("\\") else l + "\n"
                    for l in lines).splitlines()
  by = {}
  for line in joined:
    op, rest = line.split(None, 1)
    by.setdefault(op.upper(), []).append(" ".join(rest.split()))
  assert by["FROM"] == ["python:3.11-slim"]
  assert by["WORKDIR"] == ["/app"]
  copied = set()
  for rest in by["COPY"]:
    *sources, _ = rest.split()
    for s in sources:
      assert os.path.exists(os.path.join(REPO, s)), f"COPY {s}: not in repo"
      copied.add(s)
  assert "configs ./configs" in by["COPY"]  # setup.py packages it.
  # What setup.py reads or packages (configs/ too: it ships as
  # dist_keras.configs) is in place before the install.
  ops = [line.split(None, 1) for line in joined]
  install_at = next(i for i, (op, rest) in enumerate(ops)
                    if op.upper() == "RUN" and "pip install" in rest)
  before = {s for op, rest in ops[:install_at] if op.upper() == "COPY"
            for s in rest.split()[:-1]}
  assert {"setup.py", "pyproject.toml", "README.md", "dist_keras",
          "configs"} <= before
  installs = [r for r in by["RUN"] if "pip install" in r]
  assert installs == ['pip install ".[cpu]"']
  assert "cpu" in _setup_extras()
  assert json.loads(by["ENTRYPOINT"][0]) == ["python", "-m", "dist_keras.train"]
  assert by["EXPOSE"] == [str(TF_PORT)]


def test_network_policy_covers_the_workers_and_their_port():
  policy = _one("NetworkPolicy")["spec"]
  selector = policy["podSelector"]["matchLabels"]
  (rule,) = policy["ingress"]
  (source,) = rule["from"]
  assert source["podSelector"]["matchLabels"] == selector
  assert rule["ports"] == [{"protocol": "TCP", "port": TF_PORT}]
  pods = [_one("TFJob")["spec"]["tfReplicaSpecs"]["Worker"]["template"],
          _one("Job")["spec"]["template"]]
  for pod in pods:
    labels = pod["metadata"]["labels"]
    assert selector.items() <= labels.items(), labels


def _exit_table(path):
  """{code: retry column} of the exit-code table in a markdown file."""
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    rows = re.findall(r"^\| (\d+) \|.*\|([^|]*)\|$", f.read(), re.MULTILINE)
  return {int(code): retry.strip() for code, retry in rows}


@pytest.mark.parametrize("path", ["README.md", "docs/errors.md"])
def test_exit_code_tables_list_every_code_and_its_retry(path):
  table = _exit_table(path)
  assert set(table) == {0, *errors.PERMANENT, *errors.RETRYABLE}, table
  for code in errors.PERMANENT:
    assert table[code].startswith("no"), (code, table[code])
  for code in errors.RETRYABLE:
    assert table[code].startswith("yes"), (code, table[code])


def test_kubernetes_doc_says_what_each_exit_code_does_to_a_pod():
  table = _exit_table("docs/kubernetes.md")
  assert {0, *errors.PERMANENT, *errors.RETRYABLE} <= set(table), table
  for code in errors.PERMANENT:
    assert table[code] == "FailJob", (code, table[code])
  for code in errors.RETRYABLE:
    assert table[code].startswith("pod replaced"), (code, table[code])


def _doc_manifests(page="docs/kubernetes.md"):
  """The manifests a page applies inline (`kubectl apply -f - <<'EOF'`)."""
  with open(os.path.join(REPO, page), encoding="utf-8") as f:
    text = f.read()
  blocks = re.findall(r"<<'EOF'\n(.*?)\nEOF\n", text, re.S)
  return [d for block in blocks for d in yaml.safe_load_all(block) if d]


def _containers(document):
  """Every container of a Pod, a Job or a TFJob's replicas."""
  specs = {"Pod": lambda d: [d["spec"]],
           "Job": lambda d: [d["spec"]["template"]["spec"]],
           "TFJob": lambda d: [r["template"]["spec"] for r in
                               d["spec"]["tfReplicaSpecs"].values()]}
  get = specs.get(document["kind"], lambda d: [])
  return [c for spec in get(document) for c in spec["containers"]]


def test_a_loaded_image_is_not_pulled_again():
  # `:latest` defaults to imagePullPolicy Always: on kind or minikube,
  # where the image is loaded into the nodes (no registry), the pod would
  # sit in ErrImagePull.
  documents = [d for ds in _docs().values() for d in ds] + _doc_manifests()
  containers = [c for d in documents for c in _containers(d)]
  assert len([d for d in _doc_manifests() if d["kind"] == "Pod"]) == 1
  assert len(containers) == 3  # TFJob's worker, the Job's, TensorBoard's.
  for container in containers:
    assert container["image"] == IMAGE, container["name"]
    assert container.get("imagePullPolicy") == "IfNotPresent", (
        container["name"])
