"""Every command in the fenced bash blocks of README.md's "Quickstart", "Training any config" and
"Start from a Hugging Face checkpoint" sections is run here as written (size-reducing flags
appended where it would take minutes: fewer steps, fewer tokens), or named in COVERED with the
existing test that already runs it, or in SKIPPED with the reason it cannot run on a CPU-only
machine without network. test_every_readme_command_is_accounted_for fails on a command the README
gains without a place in one of the three, so a new documented command needs a test or a reason.

Commands run in a child process from a scratch directory (the README's relative paths, such as
runs/llama, land there), with the compilation cache under it.
"""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ("Quickstart", "Training any config", "Start from a Hugging Face checkpoint")


def readme_commands(path=os.path.join(REPO, "README.md")) -> list[str]:
  """The commands of SECTIONS' ```bash blocks: backslash continuations joined, `# ...` comments
  and comment-only lines dropped, whitespace collapsed."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  commands = []
  for section in re.split(r"^## ", text, flags=re.M)[1:]:
    title, _, body = section.partition("\n")
    if title.strip() not in SECTIONS:
      continue
    for block in re.findall(r"```bash\n(.*?)```", body, flags=re.S):
      for line in re.sub(r"\\\n", " ", block).splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line)  # a comment (no command here quotes a '#')
        line = " ".join(line.split())
        if line:
          commands.append(line)
  return commands


# Run by the tests of this file (the test named for each; the command strings are below).
RUN = {
    "QUICKSTART": "test_quickstart_train",
    "TRAIN_ANY": "test_train_any_config_then_generate",
    "GENERATE": "test_train_any_config_then_generate",
    "PARAMS_MESH": "test_params_memory_plan",
    "CPU_DEVICES": "test_train_one_cpu_device_per_core",
    "HF_IMPORT": "test_hugging_face_path",
    "HF_GENERATE": "test_hugging_face_path",
    "HF_FINETUNE": "test_hugging_face_path",
    "HF_PARAMS": "test_hugging_face_path",
    "HF_EXPORT": "test_hugging_face_path",
}

# Already run as written (sizes cut) by an existing test: not run a second time here.
COVERED = {
    "tfjax-train ...": "tests/training/test_main.py::"
                       "test_console_script_trains_the_default_config_into_a_fresh_run_directory",
    "python -m tfjax.params --config=configs/NAME.py":
        "tests/training/test_params.py::test_cli_prints_the_published_total_last",
    "python experiments/torch_nanogpt.py --config=configs/shakespeare_char.py:cpu "
    "--mode=lockstep": "tests/training/test_torch_parity.py::"
                       "test_train_step_matches_pytorch_step_for_step",
    "python experiments/bench_ab.py --config=... --b=model.attention_impl=chunked":
        "tests/experiments/test_bench_train.py::test_bench_ab_pairs_the_two_variants_call_by_call",
}

# Not runnable here, with the reason.
SKIPPED = {
    'pip install -e ".[test]" && python -m pytest -n 2':
        "installs packages (network) and runs the whole suite (~9 min), which this file is in",
    'pip install -e ".[hf]"': "installs packages (network); this environment is that install",
    "python experiments/sweep.py --config=configs/ablations/position.py --scale=smoke "
    "--workdir=DIR [--parallel=2]":
        "trains every point of the smoke grid (tens of minutes on CPU-2, docs/ablations.md); "
        "tests/research/test_sweep.py runs experiments/sweep.py on tiny sweeps",
    "python experiments/sweep.py ... --launcher=slurm --slurm.partition=gpu "
    "--slurm.gpus_per_node=8": "needs a SLURM cluster (tests/research/test_sweep_slurm.py fakes "
                               "sbatch/squeue)",
    "python experiments/train.py --config=... --config.mesh.fsdp=8":
        "needs 8 devices (meshes on forced CPU devices: tests/training/test_sharding.py)",
    "python experiments/train.py --config=... --config.mesh.context=4":
        "needs 4 devices (tests/training/test_context_parallel.py, forced CPU devices)",
    "python -m tfjax.aot --config=configs/gpt2_small.py --target=h200":
        "needs the cuda-aot extra (+5.2 GB, not installed in CI): python -m pytest -m aot_gpu",
}


def test_every_readme_command_is_accounted_for():
  commands = readme_commands()
  assert len(commands) == len(set(commands)), commands
  run = {globals()[name] for name in RUN}
  places = [run, set(COVERED), set(SKIPPED)]
  assert not (places[0] & places[1] or places[0] & places[2] or places[1] & places[2])
  assert set(commands) == set().union(*places), (
      f"new: {sorted(set(commands) - set().union(*places))}; "
      f"gone: {sorted(set().union(*places) - set(commands))}")
  here = open(os.path.abspath(__file__), encoding="utf-8").read()
  for name in RUN.values():
    assert f"def {name}(" in here, name
  for ref in COVERED.values():
    path, name = ref.split("::")
    with open(os.path.join(REPO, path), encoding="utf-8") as f:
      assert f"def {name}(" in f.read(), ref


def test_the_extraction_joins_continuations_and_drops_comments(tmp_path):
  readme = tmp_path / "README.md"
  readme.write_text("## Quickstart\n\n```bash\na --x=1 \\\n    --y=2   # why\n# only a comment\n"
                    "b\n```\n\n## Other\n\n```bash\nc\n```\n")
  assert readme_commands(str(readme)) == ["a --x=1 --y=2", "b"]


@pytest.fixture
def scratch(tmp_path):
  """A scratch directory that looks like the repository root for the README's relative paths
  (configs/, experiments/ link to the repository's), so its commands run there as written and
  what they write (runs/..., out) stays in it."""
  for name in ("configs", "experiments"):
    os.symlink(os.path.join(REPO, name), tmp_path / name)
  return tmp_path


def _run(command: str, cwd, *extra: str, timeout: int = 300, env=None):
  """`command` (a README line; `python` is this interpreter) with `extra` flags appended, run in
  cwd with the compilation cache under it; fails with its output unless it exits 0."""
  args = shlex.split(command)
  if args[0] == "python":
    args[0] = sys.executable
  full_env = dict(os.environ, PYTHONUNBUFFERED="1", TFJAX_CACHE_DIR=str(cwd / "cache"),
                  PYTHONPATH=REPO, **(env or {}))
  result = subprocess.run([*args, *extra], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=full_env)
  assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-3000:])
  return result


def _metrics(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


# The default run's size, cut: one layer, two steps, one eval batch at one length.
SMALL_DEFAULT = ("--config.model.num_layers=1", "--config.model.d_model=32",
                 "--config.model.d_ff=64", "--config.train.num_steps=2",
                 "--config.train.eval_every=2", "--config.train.checkpoint_every=2",
                 "--config.train.batch_size=8", "--config.train.eval_batch_size=8",
                 "--config.train.eval_batches=1", "--config.data.test_lengths=(8,)")


def test_quickstart_train(scratch):
  """`python experiments/train.py` (after the install, which is this environment): the default
  config into runs/default-<time> under the current directory, evaluated at steps 0 and 2."""
  result = _run(QUICKSTART.split(" && ")[1], scratch, *SMALL_DEFAULT)
  [name] = os.listdir(scratch / "runs")
  assert re.fullmatch(r"default-\d{8}-\d{6}", name), name
  assert f"done: {os.path.join('runs', name)} " in result.stdout
  records = _metrics(scratch / "runs" / name)
  assert [m["step"] for m in records if "eval/exact_match@8" in m] == [0, 2]
  assert os.listdir(scratch / "runs" / name / "checkpoints") == ["2"]


def test_train_any_config_then_generate(scratch):
  """`train.py --config=configs/NAME.py[:arg] --workdir=DIR` with NAME:arg = shakespeare_char:cpu
  (its corpus from $TFJAX_DATA_DIR: a local text stands in for the download; 2 steps), then
  `generate.py --workdir=DIR --prompt="ROMEO:"` on that run, as written and with the bracketed
  options filled in."""
  data = scratch / "data" / "tinyshakespeare"
  data.mkdir(parents=True)
  lines = ["ROMEO:", "But soft, what light through yonder window breaks?", "JULIET:",
           "O Romeo, Romeo, wherefore art thou Romeo?", ""]
  (data / "input.txt").write_text("\n".join(lines * 200))
  env = dict(TFJAX_DATA_DIR=str(scratch / "data"))
  train = TRAIN_ANY.replace("configs/NAME.py[:arg]", "configs/shakespeare_char.py:cpu")
  train = train.replace("DIR", "runs/shakespeare").replace(" [--config.key=value ...]", "")
  result = _run(train, scratch, "--config.train.num_steps=2", "--config.train.steps_per_call=1",
                "--config.train.eval_every=2", "--config.train.eval_batches=1",
                "--config.train.checkpoint_every=2", "--config.train.sample_tokens=4", env=env)
  assert "done: runs/shakespeare " in result.stdout
  evals = [m["step"] for m in _metrics(scratch / "runs" / "shakespeare") if "eval/loss" in m]
  assert evals[-1] == 2, evals
  generate = GENERATE.replace("DIR", "runs/shakespeare")
  out = _run(re.sub(r" \[.*", "", generate), scratch, "--max_new_tokens=8").stdout
  assert "ROMEO:" in out, out
  options = (generate.replace("[--strategy=greedy|sample|beam]", "--strategy=sample")
             .replace("[--num_samples=N]", "--num_samples=2").replace("[--seed=S]", "--seed=3"))
  out = _run(options, scratch, "--max_new_tokens=8").stdout
  assert out.count("ROMEO:") >= 2, out


def test_params_memory_plan(scratch):
  """`python -m tfjax.params --config=configs/llama2_7b.py --mesh=1,8,1`: LLaMA-2 7B's count
  (README's table) and a memory plan for fsdp 8."""
  out = _run(PARAMS_MESH, scratch).stdout
  assert "6738415616" in out.replace(",", ""), out
  assert "fsdp" in out, out


@pytest.mark.slow  # another run of the default config, on one XLA device per core (~40 s loaded)
def test_train_one_cpu_device_per_core(scratch):
  """`train.py --config=... --config.mesh.cpu_devices=-1`, `...` = configs/default.py."""
  command = CPU_DEVICES.replace("--config=...", "--config=configs/default.py")
  result = _run(command, scratch, "--workdir=runs/cpu", *SMALL_DEFAULT)
  assert "done: runs/cpu " in result.stdout
  assert [m["step"] for m in _metrics(scratch / "runs" / "cpu") if "train/loss" in m] == [2]


WORDS = "The capital of France is Paris and a the city river".split()


def _tiny_llama(hf_dir):
  """A random 2-layer LLaMA saved as Hugging Face saves one, with a word-level tokenizer.json."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  tokenizers = pytest.importorskip("tokenizers")
  torch.manual_seed(0)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=len(WORDS) + 1, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
  model.save_pretrained(hf_dir)
  vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tok.save(os.path.join(hf_dir, "tokenizer.json"))
  return model


@pytest.mark.slow  # five commands, each starting JAX (~60 s loaded)
def test_hugging_face_path(scratch):
  """The README's Hugging Face section in order: import a (tiny, random) LLaMA directory,
  generate from it, fine-tune it on a text file (2 steps), count it with configs/from_run.py,
  export the fine-tune; transformers loads the export as a LLaMA holding the fine-tuned weights."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  model = _tiny_llama(str(scratch / "hf"))
  transformers = pytest.importorskip("transformers")
  _run(HF_IMPORT.replace("DIR", "hf").replace(" [--dtype=bfloat16]", ""), scratch)
  out = _run(HF_GENERATE, scratch, "--max_new_tokens=4").stdout
  assert "The capital of France is" in out, out
  (scratch / "corpus.txt").write_text(" ".join(WORDS[i % len(WORDS)] for i in range(0, 900, 7)))
  _run(HF_FINETUNE, scratch, "--config.data.seq_len=8", "--config.train.num_steps=2",
       "--config.train.batch_size=2", "--config.train.eval_batch_size=2",
       "--config.train.eval_batches=1", "--config.train.eval_every=2",
       "--config.train.checkpoint_every=2", "--config.optimizer.warmup_steps=0")
  total = _run(HF_PARAMS, scratch).stdout.strip().splitlines()[-1]
  assert total == f"total: {sum(p.numel() for p in model.parameters())}", total
  _run(HF_EXPORT, scratch)
  exported = transformers.AutoModelForCausalLM.from_pretrained(str(scratch / "out"))
  assert type(exported) is type(model)
  before = model.state_dict()["model.layers.0.mlp.down_proj.weight"].numpy()
  after = exported.state_dict()["model.layers.0.mlp.down_proj.weight"].numpy()
  assert after.shape == before.shape and not np.array_equal(after, before)  # the fine-tune's


QUICKSTART = "pip install -e . && python experiments/train.py"
TRAIN_ANY = ("python experiments/train.py --config=configs/NAME.py[:arg] --workdir=DIR "
             "[--config.key=value ...]")
GENERATE = ('python experiments/generate.py --workdir=DIR --prompt="ROMEO:" '
            "[--strategy=greedy|sample|beam] [--num_samples=N] [--seed=S]")
PARAMS_MESH = "python -m tfjax.params --config=configs/llama2_7b.py --mesh=1,8,1"
CPU_DEVICES = "python experiments/train.py --config=... --config.mesh.cpu_devices=-1"
HF_IMPORT = "python -m tfjax.hf import --hf_dir=DIR --workdir=runs/llama [--dtype=bfloat16]"
HF_GENERATE = ('python experiments/generate.py --workdir=runs/llama '
               '--prompt="The capital of France is"')
HF_FINETUNE = ("python experiments/train.py --workdir=runs/ft --config.init_from=runs/llama "
               "--config.data.name=text --config.data.path=corpus.txt --config.data.tokenizer=hf")
HF_PARAMS = "python -m tfjax.params --config=configs/from_run.py:runs/llama"
HF_EXPORT = "python -m tfjax.hf export --workdir=runs/ft --hf_dir=out"
