"""Issue 57's scaling tables, compiled ahead of time from this CPU host (python -m tfjax.aot per
row): which attention implementation each device's program holds, memory per device, collective
bytes and the MFU estimates, for

  kernels   gpt2_owt (as shipped) on h100 and h100x8; llama2_7b (as shipped) on v5p-64
  context   llama2_7b at 4k / 32k / 128k tokens on v5p-64 and h100x8, without the context axis
            (FSDP over every device) and with it (context x FSDP over the rest); remat full, the
            fewest rows the mesh allows (one per batch shard)

  python experiments/bench_scaling_aot.py [--only=REGEX] [--out=aot_results] [--timeout=S]
      [--write_docs]

Run it with the python of an environment holding the tpu-aot and cuda-aot extras (a venv of its
own: `python3 -m venv /work/aotvenv && /work/aotvenv/bin/pip install -e ".[tpu-aot,cuda-aot]"`).
Each row runs `python -m tfjax.aot` in its own process under `timeout`; results accumulate in
OUT/scaling_aot.json (a rerun replaces only the rows it ran; a row that timed out says so), and
OUT/scaling_aot.md holds the tables with the command, device, JAX version and date.
--write_docs renders them into docs/scaling/context.md between the scaling-aot markers.
"""

import datetime
import json
import os
import re
import subprocess
import sys
import time

from absl import flags

from tfjax.training.entry import cli

_ONLY = flags.DEFINE_string("only", "", "Run only rows whose key matches this regex.")
_OUT = flags.DEFINE_string("out", "aot_results", "Output directory (scaling_aot.json, .md).")
_TIMEOUT = flags.DEFINE_integer("timeout", 1800, "Seconds per compile.")
_WRITE_DOCS = flags.DEFINE_bool("write_docs", False,
                                "Render the tables into docs/scaling/context.md.")
_RENDER = flags.DEFINE_bool("render_only", False, "Write the tables from the saved rows only.")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE = "deviceless compile on this 2-core CPU"
MARKERS = ("<!-- scaling-aot:start -->", "<!-- scaling-aot:end -->")
LENGTHS = (4096, 32768, 131072)
# Context-axis size per target: FSDP over the rest must still hold the 7B's fp32 weights and Adam
# moments, 75 GiB in all (v5p-64, 32 chips: context 8 x fsdp 4, 19 GiB a chip; 8xH100: 4 x 2,
# 38 GiB a GPU).
CONTEXT = {"v5p-64": 8, "h100x8": 4}
DEVICES = {"v5p-64": 32, "h100x8": 8}  # JAX devices: a v5p chip (2 TensorCores) is one
BEFORE = {"h100": "pallas, 7.8 GiB, MFU 41.8%", "h100x8": "xla (forced), 22.2 GiB, MFU 18.2%"}


def rows() -> list[dict]:
  out = [dict(table="kernels", config="gpt2_owt", target="h100", overrides=[]),
         dict(table="kernels", config="llama2_7b", target="v5p-64", overrides=[]),
         dict(table="kernels", config="gpt2_owt", target="h100x8", overrides=[])]
  for length in LENGTHS:
    for target, context in CONTEXT.items():
      for c in (1, context):
        shards = DEVICES[target] // c
        out.append(dict(table="context", config="llama2_7b", target=target, length=length,
                        context=c, overrides=[
                            "--config.mesh.data=1", "--config.mesh.fsdp=-1",
                            f"--config.mesh.context={c}", "--config.model.remat=full",
                            f"--config.train.batch_size={shards}",
                            f"--config.data.seq_len={length}",
                            f"--config.model.max_len={length}"]))
  for row in out:
    row["key"] = " ".join([row["config"], row["target"], *row["overrides"]])
  return out


def compile_row(row: dict) -> dict:
  command = [sys.executable, "-m", "tfjax.aot", f"--config=configs/{row['config']}.py",
             f"--target={row['target']}", *row["overrides"]]
  start = time.perf_counter()
  try:
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                            timeout=_TIMEOUT.value,
                            env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
  except subprocess.TimeoutExpired:
    return {"status": "timeout", "seconds": _TIMEOUT.value}
  seconds = time.perf_counter() - start
  lines = result.stdout.strip().splitlines()
  if result.returncode not in (0, 1) or not lines or not lines[-1].startswith("{"):
    error = (result.stderr.strip().splitlines() or ["?"])[-1]
    return {"status": "error", "error": error[:400], "seconds": seconds}
  out = {"status": "ok", "seconds": seconds, **json.loads(lines[-1])}
  header = re.search(r"compiled in (\d+) s", result.stdout)
  out["compile_s"] = int(header.group(1)) if header else None
  mesh = re.search(r"mesh ([^;]*);", result.stdout)
  out["mesh"] = mesh.group(1) if mesh else ""
  if result.returncode == 1:
    out["verdict"] = lines[-2] if len(lines) > 1 else ""
  return out


def _gib(n) -> str:
  return f"{n / 2 ** 30:.1f}" if n is not None else ""


def _pct(x) -> str:
  return f"{100 * x:.1f}%" if x is not None else "n/a"


def _impl(r: dict) -> str:
  if r.get("attention_impl") is None:
    return ""
  calls = r.get("attention_kernel_calls") or {}
  kernels = ", ".join(f"{k} x{n}" for k, n in calls.items())
  square = r.get("square_buffer")
  return (f"{r['attention_impl']}" + (f" ({kernels})" if kernels else "")
          + (f"; L x L buffer {square}" if square else "; no L x L buffer"))


def _missing(r: dict) -> str:
  if r is None:
    return "not measured (not run)"
  if r["status"] == "timeout":
    return f"not measured (compile did not finish in {r['seconds']} s on this VM)"
  if r["status"] == "error":
    return f"not measured (error: {r['error'][:160]})"
  return ""


def _collective_gb(r: dict) -> str:
  if r.get("collectives") is None:
    return ""
  return f"{sum(c['bytes'] for c in r['collectives']) / 1e9:.1f}"


def render(results: dict) -> str:
  meta = results.get("_meta", {})
  lines = [f"Command: `{meta.get('command', 'python experiments/bench_scaling_aot.py')}` "
           f"(each row `python -m tfjax.aot --config=configs/CONFIG.py --target=TARGET "
           f"OVERRIDES`); device: {DEVICE}; jax {meta.get('jax', '?')}; "
           f"{meta.get('date', '?')}.", "",
           "| config | target | mesh | attention per device | GiB per device / HBM | fits "
           "| collective GB per step | MFU (kernel sum) | MFU bound (roofline) | compile s "
           "| before (issue 57) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  by_key = {row["key"]: row for row in rows()}
  for key, row in by_key.items():
    if row["table"] != "kernels":
      continue
    r = results.get(key)
    before = BEFORE.get(row["target"], "") if row["config"] == "gpt2_owt" else ""
    if _missing(r):
      lines.append(f"| {row['config']} | `{row['target']}` | | {_missing(r)} | | | | | | "
                   f"| {before} |")
      continue
    lines.append(
        f"| {row['config']} | `{row['target']}` | {r.get('mesh', '')} | {_impl(r)} "
        f"| {_gib(r['bytes_per_device'])} / {_gib(r['hbm_bytes'])} "
        f"| {'yes' if r['fits'] else '**no**'} | {_collective_gb(r)} "
        f"| {_pct(r.get('mfu_kernel_sum'))} | {_pct(r.get('mfu_bound'))} "
        f"| {r.get('compile_s') or round(r['seconds'])} | {before} |")
  lines += ["", "llama2_7b by context length (remat full; one row per batch shard; overrides: "
            "`--config.mesh.data=1 --config.mesh.fsdp=-1 --config.mesh.context=C "
            "--config.train.batch_size=ROWS --config.data.seq_len=L --config.model.max_len=L`):",
            "",
            "| target | L | context x fsdp | rows | attention per device | GiB per device / HBM "
            "| fits | collective GB per step | MFU (kernel sum) | MFU bound (roofline) "
            "| compile s |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for target in CONTEXT:
    for key, row in by_key.items():
      if row["table"] != "context" or row["target"] != target:
        continue
      r = results.get(key)
      c = row["context"]
      shards = DEVICES[target] // c
      head = f"| `{target}` | {row['length'] // 1024}k | {c} x {shards} | {shards} "
      if _missing(r):
        lines.append(head + f"| {_missing(r)} | | | | | | |")
        continue
      lines.append(head + f"| {_impl(r)} | {_gib(r['bytes_per_device'])} / "
                   f"{_gib(r['hbm_bytes'])} | {'yes' if r['fits'] else '**no**'} "
                   f"| {_collective_gb(r)} | {_pct(r.get('mfu_kernel_sum'))} "
                   f"| {_pct(r.get('mfu_bound'))} | {r.get('compile_s') or round(r['seconds'])} |")
  return "\n".join(lines) + "\n"


def main(argv) -> None:
  if len(argv) > 1:
    cli.fail(f"unexpected arguments {argv[1:]}")
  import jax  # pylint: disable=import-outside-toplevel
  os.makedirs(_OUT.value, exist_ok=True)
  path = os.path.join(_OUT.value, "scaling_aot.json")
  results = json.load(open(path)) if os.path.exists(path) else {}
  if not _RENDER.value:
    pattern = re.compile(_ONLY.value) if _ONLY.value else None
    for row in rows():
      if pattern and not pattern.search(row["key"]):
        continue
      print(f"compiling {row['key']} ...", flush=True)
      results[row["key"]] = compile_row(row)
      results["_meta"] = {"jax": jax.__version__, "date": datetime.date.today().isoformat(),
                          "command": "python experiments/bench_scaling_aot.py"}
      with open(path, "w") as f:
        json.dump(results, f, indent=1)
      print(json.dumps(results[row["key"]])[:600], flush=True)
  text = render(results)
  with open(os.path.join(_OUT.value, "scaling_aot.md"), "w") as f:
    f.write(text)
  print(text)
  if _WRITE_DOCS.value:
    from tfjax.aot import report  # pylint: disable=import-outside-toplevel
    report.replace_marked_block(os.path.join(REPO, "docs", "scaling", "context.md"), MARKERS,
                                text)


if __name__ == "__main__":
  cli.run_absl(main, argv=sys.argv)
