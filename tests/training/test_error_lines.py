"""Every console script of pyproject.toml and `python -m tfjax.hf`, on a bad flag, a bad value and
a missing file: its whole output (stdout and stderr) is one `error: ...` line, exit status 2, and
nothing is written (tfjax/training/entry/cli.py; README "Training any config").

tests/training/test_cli.py checks what the error lines say; this file checks that nothing else is
printed (a log line, a warning, a usage block, a native library's chatter) for every entry point.
Each case is the real command in a child process started from a scratch directory whose file
tree is compared before and after.
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import tomllib

import pytest

from test_cli import snapshot  # pylint: disable=import-error  (tests/training is on sys.path)
from tfjax.training.entry import cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT = f"--config={REPO}/configs/default.py"

with open(os.path.join(REPO, "pyproject.toml"), "rb") as _f:
  SCRIPTS = tomllib.load(_f)["project"]["scripts"]  # name -> "module:function"

# An --import module that is nowhere (issue 58): every entry point but tfjax-prepare takes --import.
MISSING = "no_such_module_xyz"
# entry point -> [(case, arguments)]: a bad flag, a bad value, a missing file, a missing --import
# module ({w}: scratch dir)
CASES = {
    "tfjax-train": [
        ("bad-flag", ["--num_steps=10", "--workdir={w}/run"]),
        ("bad-value", ["--config.model.attention_kind=perfomer", "--workdir={w}/run"]),
        ("missing-file", ["--config={w}/nope.py", "--workdir={w}/run"]),
        ("missing-import", [f"--import={MISSING}", "--workdir={w}/run"]),
    ],
    "tfjax-generate": [
        ("bad-flag", ["--workdir={w}/vit", "--bogus=1"]),
        ("bad-value", ["--workdir={w}/vit"]),  # a modality run: not one generate reads
        ("missing-file", ["--workdir={w}/nowhere"]),
        ("missing-import", [f"--import={MISSING}", "--workdir={w}/vit"]),
    ],
    "tfjax-sweep": [
        ("bad-flag", ["--bogus=1"]),
        ("bad-value", [f"--config={REPO}/configs/ablations/ffn.py", "--workdir={w}/sweep",
                       "--parallel=abc"]),
        ("missing-file", ["--config={w}/nope.py", "--workdir={w}/sweep"]),
        ("missing-import", [f"--import={MISSING}", f"--config={REPO}/configs/ablations/ffn.py",
                            "--workdir={w}/sweep"]),
    ],
    "tfjax-params": [
        ("bad-flag", [DEFAULT, "--bogus=1"]),
        ("bad-value", [DEFAULT, "--mesh=1,3,1"]),  # a batch of 64 rows over 3 shards
        ("missing-file", ["--config={w}/nope.py"]),
        ("missing-import", [DEFAULT, f"--import={MISSING}"]),
    ],
    "tfjax-prepare": [
        ("bad-flag", ["--bogus=1"]),
        ("bad-value", ["--input={w}/vit/config.json", "--tokenizer=wordpiece",
                       "--output={w}/prepared"]),
        ("missing-file", ["--input={w}/nope.txt", "--tokenizer=byte", "--output={w}/prepared"]),
    ],
    "tfjax-aot": [
        ("bad-flag", [DEFAULT, "--target=v5e-1", "--bogus=1"]),
        ("bad-value", [DEFAULT, "--target=v9-1"]),
        ("bad-config-value", [DEFAULT, "--target=v5e-1", "--config.model.position=foo"]),
        ("missing-file", ["--config={w}/nope.py", "--target=v5e-1"]),
        ("missing-import", [DEFAULT, "--target=v5e-1", f"--import={MISSING}"]),
    ],
    "python -m tfjax.hf": [
        ("bad-flag", ["import", "--hf_dir={w}/vit", "--workdir={w}/run", "--bogus=1"]),
        ("bad-value", ["import", "--hf_dir={w}/vit", "--workdir={w}/run", "--dtype=float16"]),
        ("missing-file", ["import", "--hf_dir={w}/missing", "--workdir={w}/run"]),
        ("missing-import", ["import", "--hf_dir={w}/vit", "--workdir={w}/run",
                            f"--import={MISSING}"]),
    ],
}


def _command(entry_point: str) -> list[str]:
  """The Python arguments that run `entry_point` as its console script does."""
  if entry_point == "python -m tfjax.hf":
    return ["-m", "tfjax.hf"]
  module, function = SCRIPTS[entry_point].split(":")
  return ["-c", f"import sys; sys.argv[0] = {entry_point!r}; from {module} import {function}; "
                f"sys.exit({function}())"]


def test_every_console_script_has_cases():
  assert set(SCRIPTS) | {"python -m tfjax.hf"} == set(CASES)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  """{(entry point, case): (CompletedProcess, snapshot before, snapshot after)}, the children
  run two at a time (most of each one's time is its imports)."""
  root = tmp_path_factory.mktemp("errors")
  (root / "vit").mkdir()  # a ViT run of the removed modality loop, as generate sees it
  (root / "vit" / "config.json").write_text(json.dumps(
      {"task": "vit", "data": {"classes": 4}, "model": {"d_model": 8},
       "train": {"learning_rate": 3e-3}}))
  # the compilation cache outside the compared tree (a user's cache, not the run's output)
  env = {**os.environ, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu",
         "TFJAX_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
  env.pop("TFJAX_TRACEBACK", None)
  cases = [(entry, name, [a.format(w=root) for a in args])
           for entry, entry_cases in CASES.items() for name, args in entry_cases]
  before = snapshot(root)

  def run(case):
    entry, _, args = case
    return subprocess.run([sys.executable, *_command(entry), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    done = list(pool.map(run, cases))
  after = snapshot(root)
  return {(entry, name): result for (entry, name, _), result in zip(cases, done)}, before, after


@pytest.mark.parametrize("entry,case", [(e, n) for e, cases in CASES.items() for n, _ in cases],
                         ids=[f"{e.split()[-1]}-{n}" for e, cases in CASES.items()
                              for n, _ in cases])
def test_a_mistake_prints_one_error_line_and_exits_2(results, entry, case):
  result = results[0][(entry, case)]
  lines = (result.stdout + result.stderr).splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stdout + result.stderr
  assert result.returncode == cli.USAGE_ERROR, result.stderr
  if case == "missing-import":  # names the module and the fix
    assert f"--import={MISSING}: no module named '{MISSING}'" in lines[0], lines[0]
    assert "PYTHONPATH" in lines[0] and "pip install" in lines[0], lines[0]


def test_no_mistake_writes_anything(results):
  _, before, after = results
  assert after == before, sorted(set(after.items()) ^ set(before.items()))

