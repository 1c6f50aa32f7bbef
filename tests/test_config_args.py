"""tools/config_args.py: every tool refuses a bad --config or override the
same way, in one line with exit 2, before any TensorFlow start-up."""
import pytest

import config_args
import helpers


# large_batch.py: tests/test_large_batch_tool.py, in-process.
@pytest.mark.parametrize("tool", ["bench.py", "features.py"])
@pytest.mark.parametrize("args,message", [
    (["--config=lstm"], "--config='lstm' is not a config in configs/"),
    (["--override=model.unitz=3"], "--override=model.unitz=3: names no "
     "config key (did you mean 'units'?)"),
    (["--override=units"], "--override=units is not SECTION.KEY=VALUE"),
])
def test_tools_refuse_bad_config_arguments(tool, args, message):
  result = helpers.run_module([f"tools/{tool}", *args], timeout=60)
  assert result.returncode == 2
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"{tool}: error: ") and message in last


def test_a_bad_variant_is_named():
  result = helpers.run_module(["tools/features.py",
                               "--variant=train.steps_per_loop=4,x.y=1"])
  assert result.returncode == 2
  assert "--variant x.y=1: names no config key" in result.stderr


@pytest.mark.parametrize("override,message", [
    ("train.momentum=fast", "train.momentum=fast: Could not override field "
     "'momentum'"),
    ("runtime=3", "is not SECTION.KEY=VALUE"),
])
def test_check_overrides_names_the_bad_one(override, message):
  with pytest.raises(config_args.BadConfigArg, match=message):
    config_args.check_overrides("cnn_shapes", ["train.steps=5", override],
                                "--config.")
