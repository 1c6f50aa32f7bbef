"""tools/: every script answers --help; tools/common.py's shared pieces.

Every tool refuses a bad --config or override the same way, before any run
and any TensorFlow start-up: one line `PROG: error: ...` and exit 2. Each
tool's own behaviour, and a brief real run of it, is in its own test file
(test_*_tool.py, test_launch_local.py, test_chaos.py, test_costmodel.py
for scaling_model.py, test_trace.py for profile_collectives.py,
test_tfds.py for prepare_data.py).
"""
import glob
import json
import os

import pytest

import bench  # tools/, on sys.path (conftest.py)
import bench_startup
import common
import features
import grid
import helpers
import large_batch

SCRIPTS = sorted(
    os.path.basename(path)
    for path in glob.glob(os.path.join(helpers.REPO, "tools", "*.py"))
    if 'if __name__ == "__main__":' in open(path).read())


def test_every_script_is_listed():
  assert SCRIPTS == [
      "bench.py", "bench_startup.py", "chaos.py", "features.py", "grid.py",
      "large_batch.py", "launch_local.py", "pin_cores.py", "prepare_data.py",
      "profile_collectives.py", "scaling.py", "scaling_model.py"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script):
  result = helpers.run_module([os.path.join("tools", script), "--help"],
                              timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("usage: ") and not result.stderr


# ---- --config and overrides, the same in every tool --------------------------


@pytest.mark.parametrize("tool", [bench, bench_startup, features,
                                  large_batch, grid])
@pytest.mark.parametrize("args,message", [
    (["--config=lstm"], "--config=lstm could not be loaded"),
    (["--override=model.unitz=3"], "--override=model.unitz names no config "
     "key (did you mean 'units'?)"),
    (["--override=units"], "--override=units is not SECTION.KEY=VALUE"),
    (["--override=train.steps=0"], "train.steps=0 must be >= 1."),
])
def test_tools_refuse_bad_config_arguments(tool, args, message, capsys):
  assert tool.main(args) == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert line.startswith(f"{tool.PROG}: error: ") and message in line


def test_a_bad_config_argument_fails_before_tensorflow_starts():
  result = helpers.run_module(
      ["-c", "import sys; sys.argv[1:] = ['--override=units']; "
       "sys.path.insert(0, 'tools'); import bench; code = bench.main(); "
       "assert 'tensorflow' not in sys.modules; sys.exit(code)"], timeout=60)
  assert result.returncode == 2, result.stderr
  assert result.stderr == ("bench: error: --override=units is not "
                           "SECTION.KEY=VALUE (e.g. "
                           "--override=train.steps=500).\n")


@pytest.mark.parametrize("override,message", [
    ("train.momentum=fast", "--config.train.momentum=fast is not a float: "
     "write e.g. `--config.train.momentum=0.0`."),
    ("runtime=3", "--config.runtime=3 is not SECTION.KEY=VALUE"),
    ("train.momentum=0.9", "train.momentum=0.9 does nothing with "
     "train.optimizer='adam'"),  # Each value checked, as the trainer does.
])
def test_load_config_names_the_bad_one(override, message):
  with pytest.raises(common.BadInput, match=message):
    common.load_config("cnn_shapes", ["train.steps=5", override], "--config.")


def test_load_config_takes_a_built_in_or_a_file():
  shapes = os.path.join(helpers.REPO, "configs", "cnn_shapes.py")
  assert common.load_config(shapes, ["train.steps=5"]).train.steps == 5
  assert common.load_config("cnn_shapes").model.name == (
      common.load_config(shapes).model.name)


def test_a_config_file_reaches_a_run_in_another_folder(tmp_path,
                                                       monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "mine.py").write_text("")
  assert common.child_spec("mine.py:4") == f"{tmp_path}/mine.py:4"
  assert common.child_spec("lstm_longmem") == "lstm_longmem"


# ---- the rest of common.py ---------------------------------------------------


def test_parser_errors_are_one_line(capsys):
  p = common.Parser(prog="x.py")
  p.add_argument("--n", type=int)
  with pytest.raises(common.BadInput, match="^argument --n: invalid int "
                     "value: 'x'; see --help.$"):
    p.parse_args(["--n=x"])
  assert common.fail("x", common.BadInput("bad")) == 2
  assert capsys.readouterr().err == "x: error: bad\n"


def test_require_empty_refuses_a_folder_with_runs(tmp_path):
  common.require_empty("--root", str(tmp_path / "new"))
  common.require_empty("--root", str(tmp_path))
  (tmp_path / "run0").mkdir()
  with pytest.raises(common.BadInput, match="--root=.* is not empty; its "
                     "runs would resume"):
    common.require_empty("--root", str(tmp_path))


def test_a_failed_run_carries_its_stderr(tmp_path):
  with pytest.raises(common.RunFailed, match=r"failed \(exit 1\); its last "
                     "lines:\nboom$") as info:
    common.train("lstm_longmem", str(tmp_path), [], entry=(
        "-c", "import sys; sys.exit('boom')"))
  assert isinstance(info.value, SystemExit)  # Uncaught, it ends the tool.


def test_json_is_written_whole(tmp_path):
  path = tmp_path / "out.json"
  common.write_json(str(path), [{"a": 1}])
  assert json.loads(path.read_text()) == [{"a": 1}]
  assert os.listdir(tmp_path) == ["out.json"]

