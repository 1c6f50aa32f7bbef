"""The Python examples of docs/own_models.md run as copied: its first block
(the model_fn / dataset_fn pair) and the block under "From Python" (the
`dist_keras.fit` call), pasted into one file as the page says, train in a
fresh process with 2 logical CPU replicas (runtime.strategy=auto's choice
here). Only the step counts are shrunk, by wrapping `dist_keras.fit`, so a
page whose blocks stop running (a fragment, a renamed argument) fails here.
The blocks are found as test_docs.py finds fenced code: a line opening with
``` (or ~~~) up to the same fence.
"""
import json
import os
import re

import helpers

PAGE = os.path.join(helpers.REPO, "docs", "own_models.md")
_FENCE = re.compile(r"^\s{0,3}(```|~~~)\s*(\S*)")
# What the test changes in the page's own fit call: the step counts only.
STEPS = 30
TINY = {"train.steps": STEPS, "eval.every": STEPS, "train.log_every": 10,
        "train.checkpoint_every": STEPS, "log.calibration_steps": 0}
SHRINK = (
    "import dist_keras\n"
    "_fit = dist_keras.fit\n"
    "def _tiny_fit(*args, config, **kwargs):\n"
    f"  return _fit(*args, config={{**config, **{TINY!r}}}, **kwargs)\n"
    "dist_keras.fit = _tiny_fit\n\n")
REPORT = ("\nimport json\n"
          "print('SUMMARY', json.dumps(result.summary))\n"
          "print('MODEL', type(result.model).__name__)\n")


def fenced_blocks(text: str, language: str) -> list[str]:
  """The code of each fenced block of `language` in `text`, in order."""
  blocks, fence, lines = [], None, []
  for line in text.splitlines():
    match = _FENCE.match(line)
    if fence is None and match:
      fence, lines = (match.group(1), match.group(2)), []
    elif fence is not None and match and match.group(1) == fence[0]:
      if fence[1] == language:
        blocks.append("\n".join(lines) + "\n")
      fence = None
    elif fence is not None:
      lines.append(line)
  return blocks


def page_example() -> str:
  """The page's first Python block, then the one under "## From Python"."""
  with open(PAGE, encoding="utf-8") as f:
    text = f.read()
  first = fenced_blocks(text, "python")[0]
  section = text.split("\n## From Python\n", 1)
  assert len(section) == 2, "docs/own_models.md has no '## From Python'"
  call = fenced_blocks(section[1], "python")[0]
  assert "dist_keras.fit(" in call, call
  return first + "\n" + call


def test_fenced_blocks_finds_each_language_block():
  text = ("x\n```python\na = 1\n```\n~~~bash\n```python\n~~~\n"
          "  ```python\nb = 2\n\nc = 3\n  ```\n```\nplain\n```\n")
  assert fenced_blocks(text, "python") == ["a = 1\n", "b = 2\n\nc = 3\n"]
  assert fenced_blocks(text, "bash") == ["```python\n"]


def test_own_models_first_example_runs_as_copied(tmp_path):
  script = tmp_path / "example.py"
  script.write_text(SHRINK + page_example() + REPORT)
  result = helpers.run_module([str(script)], timeout=600, cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  line = [l for l in result.stdout.splitlines() if l.startswith("SUMMARY ")]
  summary = json.loads(line[0].split(" ", 1)[1])
  assert summary["steps"] == STEPS and summary["replicas"] == 2
  assert summary["global_batch_size"] == 64
  assert summary["eval_examples"] == 1024  # Each eval example once.
  # It learns the sum: always predicting 0 scores E|y| = 2.26.
  assert summary["eval_mae"] < 1.0, summary["eval_mae"]
  assert "MODEL Sequential" in result.stdout
  assert (tmp_path / "runs" / "mine" / "model.keras").exists()
