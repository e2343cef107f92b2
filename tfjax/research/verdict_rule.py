"""The verdict rule's constants and its text, as docs/ablations.md prints it (sweep_doc's `rule`
block); tfjax/research/verdicts.py applies it."""

ALPHA = 0.05
MIN_SEEDS = 5       # seeds per arm below which a verdict near its threshold needs more
MIN_POWER = 0.8    # below it (for the paper's effect) a non-significant arm under MIN_SEEDS
PARITY_MARGIN = 0.01  # nats of a loss: two arms within it are on par (1% perplexity)
BOUND_TOL = 0.02    # within this of a floor or ceiling, a value sits at it
BOUNDS = {"eval/exact_match": (0.0, 1.0)}  # metric (or @N family): floor, ceiling
FAILURE_METRICS = ("failed", "diverged")   # 1 = the seed failed; the first present is used
SEED_KEYS = ("seed", "data.seed")  # as tfjax.research.sweep.SEED_KEYS
WORDS = ("reproduced", "direction only", "tie", "inconclusive", "needs more seeds",
         "contradicted", "opposite only", "untestable here")
RULE_TEXT = (
    "**Verdict rule** (`tfjax/research/verdicts.py`, applied to the committed per-seed results). "
    "Each claim compares two arms on one metric. Losses and other per-seed numbers: Δ = mean(a) - "
    "mean(b) over seeds, se = sqrt(s_a²/n_a + s_b²/n_b), p from Welch's two-sided t-test "
    "(one arm's runs measured at two lengths: the paired t-test on the per-seed differences; "
    "one arm against a fixed number, such as a ratio against 1: Student's one-sample t). "
    "Failure counts: Δ = difference of the failure fractions (a failure: a seed whose `failed`, "
    "else `diverged`, is 1), se its binomial standard error, p from Fisher's exact test. Mean "
    "reciprocal ranks (length generalization): per-seed MRR, Δ and se as for losses, p from the "
    "exact permutation test (ranks take few values and can agree in every seed). A "
    "loss-like claim whose arms include a failed or diverged seed is bimodal and is judged by "
    "its failure counts instead of by Welch's t on the losses; so is a claim on another metric "
    "that declares what a failed seed is (ListOps: accuracy less than 0.05 above the "
    "majority-class floor) when one fails. A control may hold in every seed rather than on the "
    "seed mean (ListOps: the Transformer learns in every seed). **Multiple comparisons:** the p "
    "of a section's testable claims are Holm-adjusted (step-down, the family is the section); "
    "the words use the adjusted p. **Earlier readings:** where this page read a claim before "
    "on other data (fewer seeds, another run of the same points, arms it no longer reads, "
    "whose rows stay in the tables) or on an earlier test bed (a superseded config of its "
    "sweep, another scale, or another sweep the claim moved from; the hand-written verdict "
    "tables before this rule included), its p is first multiplied by the number of readings "
    "(Bonferroni; its config lists them, with the commits that showed them), counting only "
    f"earlier ones whose design could reach p < {ALPHA} with the test that read them then "
    "(a hand-written reading, which ran no test: the claim's own test at its seed counts); one "
    "that could not spends no alpha. "
    f"Then, in this order: *untestable here*, with the reason, "
    f"when a precondition or a declared positive control fails (the paper's reference "
    f"behaviour at this setting, e.g. post-LN with warmup trains, or at least one arm "
    f"generalizes past the training length), the config declares a confound that "
    f"decides the comparison and that the paper's setting does not have (stated with the "
    f"claim), an arm has fewer than 2 seeds, the design cannot "
    f"reach p < {ALPHA} (the smallest p its test can give with these seed counts over every "
    f"outcome: Fisher's test or the permutation test with 3 vs 3 seeds cannot go below 0.1; "
    f"Welch's t has no such floor), or every seed of both arms lies within {BOUND_TOL} of the "
    f"metric's floor or ceiling (exact match: 0 or 1; for a rank claim, the ranked metric at "
    f"every ranked task and length; for failure counts, no seed of either arm failed, while "
    f"every seed of both failing is a result: the remedy did not help); *tie* when |Δ| < 1 "
    f"se; *needs more seeds* when |Δ|/se is within 1 of the value at which p crosses the "
    f"claim's Holm level and an arm has fewer than {MIN_SEEDS} seeds, or, for a claim that "
    f"states the paper's effect size in its metric's units, when it is not significant (a "
    f"tie included), an arm has fewer than {MIN_SEEDS} seeds and the test's power to detect "
    f"that effect at its Holm level divided by its looks is below {MIN_POWER} (the "
    f"noncentral t at Welch's df and our se); *reproduced* when Δ "
    f"has the claimed sign and adjusted p < "
    f"{ALPHA}; *direction only* when it has the claimed sign and adjusted p >= {ALPHA}; "
    f"*contradicted* when Δ has the opposite sign and adjusted p < {ALPHA}; *opposite only* "
    f"when it has the opposite sign and adjusted p >= {ALPHA}. **Parity claims** (the paper "
    f"finds two arms on par) declare a margin, stated with each ({PARITY_MARGIN} nats, 1% "
    f"perplexity, for the losses here) and are judged by it instead: *reproduced* when two "
    f"one-sided tests put "
    f"Δ inside ±margin (adjusted p < {ALPHA}: the 90% CI lies inside it), *contradicted* when "
    f"the one-sided test that |Δ| exceeds the margin does (the CI lies beyond it), "
    f"*inconclusive* otherwise (*needs more seeds* when an arm has fewer than {MIN_SEEDS}); "
    f"the smaller of the two p enters Holm's family; the printed 90% CI is not widened for "
    f"the looks or Holm, so a CI inside or beyond the margin can still read *inconclusive*.")
