"""Attention kinds on Long Range Arena's ListOps (Tay et al. 2021, table 1, ListOps column).

An encoder classifier (pooled [CLS], 10 classes) per (attention kind, seed) on ListOps expressions
generated as LRA describes (tfjax/data/listops.py: MAX, MIN, MED, SM; depth <= 10, <= 10
arguments per operator), at a length this CPU can train instead of LRA's 2k: expressions of
N // 4 .. N tokens, rows of N + 1 with the [CLS] token. Scored by eval/accuracy on a fixed eval
set; eval/majority_floor is the accuracy of always answering that set's most frequent class.

Arms (ARMS: model.attention_kind with its own keys sized to the row length R = N + 1):
  softmax     full attention (the LRA paper's "Transformer")
  local       Longformer's sliding window without global tokens (LRA: Local Attention)
  performer   FAVOR+ random features (LRA: Performer)
  linformer   length projections of K and V (LRA: Linformer)
  longformer  sliding window + the [CLS] token global (LRA: Longformer)
  bigbird     window + global + random blocks (LRA: BigBird)
An arm whose kind is not registered in the checkout (tfjax.nn.attention_kinds) is left out of
the sweep (`skipped()`) and its claim reads "untestable here: ... no finished run".

  smoke   N = 63, 2 layers x 64, 100 steps, 2 seeds
  medium  N = 127, 2 layers x 64, 600 steps (batch 32, lr 3e-3), 5 seeds. Pilots (softmax, seed
          0, CPU-2 under load): N = 255 at lr 1e-3 sat at the floor until step ~200 and reached
          0.338 eval accuracy at 600 steps (12 min); N = 127 at lr 3e-3 reached 0.359 at step 125
          and 0.357 at 250 (2.5 min). A 130-step sweep (commits f21e01a, febba72) left 2 of 3
          softmax seeds at the majority floor (0.191), and a 250-step one (feab638) 1 of 3
          (0.217: the every-seed control failed), so medium trains 600 steps with 5 seeds
  full    N = 2047 (LRA's 2k), 4 layers x 128, 5000 steps, 3 seeds: one GPU

Published (Tay et al. 2021, "Long Range Arena: A Benchmark for Efficient Transformers", table 1,
ListOps accuracy %, sequences up to 2k tokens), the rows these arms stand for: Transformer 36.37,
Local Attention 15.82, Performer 18.01, Linformer 35.70, Longformer 35.63, BigBird 36.05
(tests/research/test_paper_numbers.py holds them). Chance (10 classes) is 10%; the paper does not
state its majority-class rate.
"""
import os

from tfjax.research import memo, sweep, verdicts

_lm = sweep.load_module(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_char_lm.py"))

SEEDS = {"smoke": (0, 1), "medium": (0, 1, 2, 3, 4), "full": (0, 1, 2)}
# Earlier readings of every claim under superseded medium configs, each a look (the rule: looks
# on an earlier test bed count), both 3 vs 3 by Welch's t on the accuracy (no floor; the failure
# rule came later, f0d3742): 130 steps (97ec32a) and 250 steps (757113a).
LOOKS = {"smoke": (), "medium": ((3, 3, "mean"), (3, 3, "mean")), "full": ()}
MAX_TOKENS = {"smoke": 63, "medium": 127, "full": 2047}  # N: expressions of N // 4 .. N tokens
# Tay et al. 2021, table 1, ListOps column (accuracy %), the rows the arms here stand for.
PUBLISHED = {"softmax": 36.37, "local": 15.82, "performer": 18.01, "linformer": 35.70,
             "longformer": 35.63, "bigbird": 36.05}
LRA_NAMES = {"softmax": "Transformer", "local": "Local Attention", "performer": "Performer",
             "linformer": "Linformer", "longformer": "Longformer", "bigbird": "BigBird"}
# Arms: name -> (model.attention_kind, its own keys as a function of the row length R = N + 1).
# Each efficient kind sees about a quarter of the row per query where it has a knob for it
# (LRA ran its kinds at their own papers' settings for 2k tokens; at R = 128 those would cover
# the whole row): Longformer's two-sided window R / 4 with the [CLS] token global; LRA's Local
# Attention is that window with no global token (bidirectional local attention; model.window is
# a causal, decoder-only window); Linformer's projections to R / 4 (at most 256); BigBird blocks
# of R / 16 (global 2 + window 3 + random 3 blocks: half of the 16 blocks); Performer R / 2
# random features (at most 256, the kind's default; 64 at R = 128, above the Performer paper's
# d log d = 44 for d = 16, and fewer than the 128 keys it stands in for).
ARMS = {
    "softmax": ("softmax", lambda r: {}),
    "local": ("longformer", lambda r: {"model.longformer_window": r // 4,
                                       "model.longformer_global_tokens": 0}),
    "performer": ("performer", lambda r: {"model.performer_features": min(256, r // 2)}),
    "linformer": ("linformer", lambda r: {"model.linformer_k": min(256, r // 4)}),
    "longformer": ("longformer", lambda r: {"model.longformer_window": r // 4,
                                            "model.longformer_global_tokens": 1}),
    "bigbird": ("bigbird", lambda r: {"model.bigbird_block_size": r // 16}),
}
# A seed has learned ListOps when its accuracy is at least this far above the majority-class
# floor. Seeds that learn reach ~0.36 here (and in LRA's table 1), seeds that do not stay within
# ~0.03 of the floor: 0.05 sits between, far below the ~0.17 gap.
LEARNED_MARGIN = 0.05


def registered_kinds() -> tuple:
  """The attention kinds this checkout registers (importing the model registers them)."""
  import tfjax.nn.models  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  from tfjax.nn.attention_kinds import ATTENTION_KINDS  # pylint: disable=import-outside-toplevel
  return tuple(sorted(ATTENTION_KINDS))


def present_arms() -> tuple:
  """The arms whose kind is registered, in ARMS order."""
  return tuple(a for a, (kind, _) in ARMS.items() if kind in registered_kinds())


def skipped() -> dict:
  """{arm: why it is not in the sweep}."""
  return {a: f"model.attention_kind={kind!r} is not registered in this checkout"
          for a, (kind, _) in ARMS.items() if a not in present_arms()}


def arm(name: str, scale: str) -> dict:
  """The overrides of arm `name` at `scale`."""
  kind, settings = ARMS[name]
  return {"model.attention_kind": kind, **settings(MAX_TOKENS[scale] + 1)}


def _arm_keys() -> tuple:
  """The keys the present arms vary (none while softmax is the only one)."""
  arms = present_arms()
  keys = {k for a in arms for s in SEEDS for k in arm(a, s)} if len(arms) > 1 else set()
  return tuple(sorted(keys))


ARM_KEYS = _arm_keys()
REPORT = dict(metrics=["eval/accuracy", "eval/majority_floor", "eval/loss", "diverged"])


def _rows(scale: str, split: str):
  """(root operators, labels) of the eval set (fixed by data.eval_seed, the same for every point)
  or of the first SHALLOW_FIT_ROWS training rows: a row's root operator is its token after
  [CLS]. Generated once per process (tfjax/research/memo.py: the page rebuild loads this file
  several times)."""
  return memo.cached(("lra_listops._rows", scale, split, SHALLOW_FIT_ROWS),
                     lambda: _generate_rows(scale, split))


def _generate_rows(scale: str, split: str):
  import numpy as np  # pylint: disable=import-outside-toplevel
  from tfjax.data import datasets  # pylint: disable=import-outside-toplevel
  config = get_config(scale)
  data = datasets.make_dataset(config.data, config.task)
  if split == "eval":
    batches = [b for _, b in data.eval_batches(config.train.eval_batch_size,
                                               config.train.eval_batches)]
  else:
    batches = [data.train_batch(i, 512) for i in range(SHALLOW_FIT_ROWS // 512)]
  return (np.concatenate([b["inputs"][:, 1] for b in batches]),
          np.concatenate([b["labels"] for b in batches]))


def majority_floor(scale: str) -> float:
  """The accuracy of always answering the eval set's most frequent class."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  _, labels = _rows(scale, "eval")
  return float(np.bincount(labels, minlength=10).max() / len(labels))


SHALLOW_FIT_ROWS = 4096  # training rows the root-operator rule is fitted on


def root_operator_rule(scale: str) -> float:
  """The eval-set accuracy of a rule that reads one token, the root operator, and answers the
  label most frequent with that operator in SHALLOW_FIT_ROWS training rows. A model at this level
  has shown no use of the expression beyond that token."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  roots, labels = _rows(scale, "train")
  answer = {int(r): int(np.bincount(labels[roots == r], minlength=10).argmax())
            for r in np.unique(roots)}
  majority = int(np.bincount(labels, minlength=10).argmax())  # an operator never seen in fitting
  eval_roots, eval_labels = _rows(scale, "eval")
  guesses = np.array([answer.get(int(r), majority) for r in eval_roots])
  return float((guesses == eval_labels).mean())


def CLAIMS(scale=None):  # pylint: disable=invalid-name  (a sweep's claims, per scale)
  """LRA's table 1 ListOps column as claims against the Transformer (softmax) arm on eval/accuracy.
  Each needs the arm trained (requires) and softmax to leave the majority-class floor and rise
  above the root-operator rule in every seed (controls); a seed that stays near that floor failed
  (failure: the claim is then judged by failure counts). The floor a comparison needs to rise
  above (bounds) is the root-operator rule's accuracy: two arms whose every seed sits at it have
  both learned only what one token tells, and their comparison says nothing about attention over
  the row."""
  scale = _lm.check_scale(scale, "lra_listops.py")
  floor = majority_floor(scale)
  learned = floor + LEARNED_MARGIN
  shallow = root_operator_rule(scale)
  # The reference must learn in every seed: a seed at the floor would pass on the mean.
  control = dict(where=arm("softmax", scale), metric="eval/accuracy", min=learned,
                 every_seed=True, what=f"softmax leaves the floor in every seed (accuracy >= "
                                       f"{learned:.3f}, the majority-class floor {floor:.3f} "
                                       f"+ {LEARNED_MARGIN})")
  # And it must use the row: a Transformer that only matches the one-token rule shows no
  # attention over the sequence, so no claim about attention kinds is testable against it.
  beyond = dict(where=arm("softmax", scale), metric="eval/accuracy",
                min=shallow + verdicts.BOUND_TOL, every_seed=True,
                what=f"softmax rises above the root-operator rule in every seed (accuracy >= "
                     f"{shallow + verdicts.BOUND_TOL:.3f}, the rule's {shallow:.3f} + "
                     f"{verdicts.BOUND_TOL})")
  claims = []
  for name in ("local", "performer", "linformer", "longformer", "bigbird"):
    a, b = PUBLISHED[name], PUBLISHED["softmax"]
    gap = "well below" if b - a > 5 else "slightly below"
    side = arm(name, scale)
    why = skipped().get(name, "registered")
    claims.append(dict(
        id=f"{name}_vs_softmax",
        claim=f"{LRA_NAMES[name]} ({name}) is {gap} full attention on ListOps",
        paper=f"accuracy {a} vs {b} % (table 1, ListOps, {LRA_NAMES[name]} vs Transformer)",
        a={**side, "metric": "eval/accuracy"},
        b={**arm("softmax", scale), "metric": "eval/accuracy"}, expect="less",
        bounds=(shallow, 1.0), failure={"metric": "eval/accuracy", "below": learned},
        bounds_what=f"here {shallow:.3f}: what a rule reading only the root operator scores; "
                    f"both arms score what that one token gives",
        requires=[dict(where=side, metric="eval/accuracy", min=0.0,
                       what=f"the {name} arm runs (its kind: {why})")],
        controls=[control, beyond], earlier_looks=LOOKS[scale]))
  return claims


def get_config(scale=None):
  """A ListOps encoder classifier with full (softmax) attention; get_sweep varies the kind.

    python experiments/sweep.py --config=configs/ablations/lra_listops.py --scale=medium \\
        --workdir=runs/ablations/lra_listops_medium --parallel=2 --pack_seeds=5

  Points: 5 per arm whose kind is registered at medium, 3 at full, 2 at smoke: 30 at medium with
  every kind. Expected runtime: the committed results
  record each point's (docs/ablations/results/lra_listops_<scale>.jsonl); full: one GPU, not
  measured. Results and verdicts: docs/ablations.md.
  """
  from tfjax.training.config.defaults import base_config  # pylint: disable=import-outside-toplevel
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
  steps = {"smoke": 100, "medium": 600, "full": 5000}[scale]
  config.optimizer.update(name="adamw", lr=3e-3 if small else 1e-3, b2=0.98, weight_decay=0.01,
                          schedule="cosine",
                          warmup_steps=steps // 10, min_lr=1e-4, clip_norm=1.0)
  config.train.update(num_steps=steps, batch_size=32, eval_batch_size=64,
                      eval_batches=4 if scale == "smoke" else 8, eval_every=steps,
                      log_every=25, checkpoint_every=steps, keep_checkpoints=1)
  return config


def get_sweep(scale=None):
  scale = _lm.check_scale(scale, "lra_listops.py")
  return [{**arm(name, scale), "seed": seed} for name in present_arms() for seed in SEEDS[scale]]


def evaluate_point(config, workdir):
  del workdir
  scale = next(s for s, n in MAX_TOKENS.items() if n == config.data.train_lengths[1])
  return {"eval/majority_floor": majority_floor(scale)}
