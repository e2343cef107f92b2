"""Attention kinds on Long Range Arena's ListOps (Tay et al. 2021, table 1, ListOps column).

An encoder classifier (pooled [CLS], 10 classes) per (attention kind, seed) on ListOps expressions
generated as LRA describes (tfjax/data/listops.py: MAX, MIN, MED, SM; depth <= 10, <= 10
arguments per operator), at a length this CPU can train instead of LRA's 2k: expressions of
N // 4 .. N tokens, rows of N + 1 with the [CLS] token. Scored by eval/accuracy on a fixed eval
set; eval/majority_floor is the accuracy of always answering that set's most frequent class.

Arms (model.attention_kind, with the kind's own keys where the defaults don't fit the length):
  softmax     full attention (the LRA paper's "Transformer")
  performer   FAVOR+ random features (LRA: Performer)
  linformer   length projections of K and V (LRA: Linformer)
  longformer  sliding window + global tokens (LRA: Longformer)
  bigbird     window + global + random blocks (LRA: BigBird)
  local       LRA's "Local Attention": no arm. model.window is a causal (decoder) window, and
              the encoder has no bidirectional window of its own (see SKIPPED).
An arm whose kind is not registered in this checkout (tfjax.nn.attention_kinds) is left out of
the sweep (SKIPPED says so) and its claim reads "untestable here: ... no finished run".

  smoke   N = 63, 2 layers x 64, 150 steps, 2 seeds
  medium  N = 127, 2 layers x 64, 200 steps, 3 seeds: ~2.5 min a point on the shared 2-core CPU.
          Pilots (softmax, seed 0, CPU-2 under load): N = 255 at lr 1e-3 sat at chance until
          step ~200 and reached 0.338 eval accuracy at 600 steps (12 min); N = 127 at lr 3e-3
          reached 0.359 at step 125 and 0.357 at 250 (2.5 min), the floor being ~0.17
  full    N = 1999 (LRA's maximum length), 4 layers x 128, 5000 steps, 3 seeds: one GPU

Published (Tay et al. 2021, "Long Range Arena: A Benchmark for Efficient Transformers", table 1,
ListOps accuracy %, sequences up to 2k tokens), the rows these arms stand for: Transformer 36.37,
Local Attention 15.82, Performer 18.01, Linformer 35.70, Longformer 35.63, BigBird 36.05
(tests/research/test_paper_numbers.py holds them). Chance (10 classes) is 10%; the paper does not
state its majority-class rate.
"""
import functools
import os

from tfjax.research import sweep

_lm = sweep.load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_char_lm.py"))

SEEDS = {"smoke": (0, 1), "medium": (0, 1, 2), "full": (0, 1, 2)}
MAX_TOKENS = {"smoke": 63, "medium": 127, "full": 1999}  # N: expressions of N // 4 .. N tokens
# Tay et al. 2021, table 1, ListOps column (accuracy %), the rows the arms here stand for.
PUBLISHED = {"softmax": 36.37, "local": 15.82, "performer": 18.01, "linformer": 35.70,
             "longformer": 35.63, "bigbird": 36.05}
LRA_NAMES = {"softmax": "Transformer", "local": "Local Attention", "performer": "Performer",
             "linformer": "Linformer", "longformer": "Longformer", "bigbird": "BigBird"}
# Per kind, the overrides of its own keys (beyond model.attention_kind) sized for N; applied
# only where the kind is registered. Empty: the kind's defaults.
KIND_SETTINGS = {"softmax": {}, "performer": {}, "linformer": {}, "longformer": {},
                 "bigbird": {}}
KINDS = tuple(KIND_SETTINGS)
SKIPPED_ALWAYS = {"local": "model.window is a causal sliding window (decoders only): the "
                           "encoder has no bidirectional local attention to run LRA's Local "
                           "Attention arm with"}
FLOOR_MARGIN = 0.02  # the control: softmax above the majority floor by more than verdicts'
                     # BOUND_TOL


def registered_kinds() -> tuple:
  """The arms' kinds that this checkout registers (importing the model registers them)."""
  import tfjax.nn.models  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  from tfjax.nn.attention_kinds import ATTENTION_KINDS  # pylint: disable=import-outside-toplevel
  return tuple(k for k in KINDS if k in ATTENTION_KINDS)


def skipped() -> dict:
  """{arm: why it is not in the sweep}."""
  out = dict(SKIPPED_ALWAYS)
  for kind in KINDS:
    if kind not in registered_kinds():
      out[kind] = f"model.attention_kind={kind!r} is not registered in this checkout"
  return out


def arm(kind: str) -> dict:
  return {"model.attention_kind": kind, **KIND_SETTINGS[kind]}


def _arm_keys() -> tuple:
  """The keys the present arms vary (none while softmax is the only registered kind)."""
  kinds = registered_kinds()
  keys = {k for kind in kinds for k in arm(kind)} if len(kinds) > 1 else set()
  return tuple(sorted(keys))


ARM_KEYS = _arm_keys()


REPORT = dict(metrics=["eval/accuracy", "eval/majority_floor", "eval/loss", "diverged"])


@functools.lru_cache(maxsize=None)
def majority_floor(scale: str) -> float:
  """The accuracy of always answering the eval set's most frequent class (the eval set is fixed
  by data.eval_seed, the same for every point)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from tfjax.data import datasets  # pylint: disable=import-outside-toplevel
  config = get_config(scale)
  data = datasets.make_dataset(config.data, config.task)
  labels = np.concatenate([b["labels"] for _, b in data.eval_batches(
      config.train.eval_batch_size, config.train.eval_batches)])
  return float(np.bincount(labels, minlength=10).max() / len(labels))


def CLAIMS(scale=None):  # pylint: disable=invalid-name  (a sweep's claims, per scale)
  """LRA's table 1 ListOps column as claims against the Transformer (softmax) arm on
  eval/accuracy. Each needs the arm trained (requires) and softmax above the majority floor
  (control); the metric's floor is that majority rate (bounds)."""
  scale = _lm.check_scale(scale, "lra_listops.py")
  floor = majority_floor(scale)
  control = dict(where={"model.attention_kind": "softmax"}, metric="eval/accuracy",
                 min=floor + FLOOR_MARGIN,
                 what=f"softmax learns ListOps above the majority-class floor {floor:.3f}")
  claims = []
  for kind in ("local", "performer", "linformer", "longformer", "bigbird"):
    a, b = PUBLISHED[kind], PUBLISHED["softmax"]
    gap = "well below" if b - a > 5 else "slightly below"
    claims.append(dict(
        id=f"{kind}_vs_softmax",
        claim=f"{LRA_NAMES[kind]} ({kind}) is {gap} full attention on ListOps",
        paper=f"accuracy {a} vs {b} % (table 1, ListOps, {LRA_NAMES[kind]} vs Transformer)",
        a={"model.attention_kind": kind, "metric": "eval/accuracy"},
        b={"model.attention_kind": "softmax", "metric": "eval/accuracy"}, expect="less",
        bounds=(floor, 1.0),
        requires=[dict(where={"model.attention_kind": kind}, metric="eval/accuracy", min=0.0,
                       what=f"the {kind} arm runs ({skipped().get(kind, 'registered')})")],
        controls=[control]))
  return claims


def get_config(scale=None):
  """A ListOps encoder classifier with full (softmax) attention; get_sweep varies the kind.

    python experiments/sweep.py --config=configs/ablations/lra_listops.py --scale=medium \\
        --workdir=runs/ablations/lra_listops_medium --parallel=1

  Points: 3 per registered kind at medium (2 smoke). Expected runtime: the committed results
  record each point's (docs/ablations/results/lra_listops_<scale>.jsonl); full: one GPU, not
  measured. Results and verdicts: docs/ablations.md.
  """
  from tfjax.training.defaults import base_config  # pylint: disable=import-outside-toplevel
  scale = _lm.check_scale(scale, "lra_listops.py")
  n, small = MAX_TOKENS[scale], scale != "full"
  config = base_config()
  config.task = "classification"
  config.data.update(name="listops", train_lengths=(n, n), test_lengths=(n,))
  config.model.update(
      family="encoder", vocab_size=0, d_model=64 if small else 128,
      num_layers=2 if small else 4, num_heads=4, d_ff=128 if small else 512, ffn="gelu",
      norm="layernorm", norm_placement="pre", position="learned", max_len=n + 1,
      pooler=True, num_classes=10, mlm_head=False, type_vocab_size=0, dropout=0.0)
  steps = {"smoke": 150, "medium": 200, "full": 5000}[scale]
  config.optimizer.update(name="adamw", lr=3e-3 if small else 1e-3, b2=0.98, weight_decay=0.01,
                          schedule="cosine",
                          warmup_steps=steps // 10, min_lr=1e-4, clip_norm=1.0)
  config.train.update(num_steps=steps, batch_size=32, eval_batch_size=64,
                      eval_batches=4 if scale == "smoke" else 8, eval_every=steps // 2,
                      log_every=50, checkpoint_every=steps, keep_checkpoints=1)
  return config


def get_sweep(scale=None):
  scale = _lm.check_scale(scale, "lra_listops.py")
  return [{**arm(kind), "seed": seed} for kind in registered_kinds() for seed in SEEDS[scale]]


def evaluate_point(config, workdir):
  del workdir
  scale = next(s for s, n in MAX_TOKENS.items() if n == config.data.train_lengths[1])
  return {"eval/majority_floor": majority_floor(scale)}
