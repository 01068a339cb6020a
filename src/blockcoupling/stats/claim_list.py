"""The paper's empirical claims, each with the analysis id that tests it (a stable id: the
claims table's rows, the figures that quote them), the sign it predicts, its measure, the
design's limits and the scale the paper made it at (``docs/statistics.md`` lists them with
the paper's sections and figures).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    """A claim of the paper, the analysis id that tests it, the sign it predicts, and ``scale``:
    the scale the paper made it at against this design's (empty: the design tests it there).
    """

    text: str
    analysis: str
    measure: str
    sign: int
    limits: str
    scale: str = ""
    agree: str = ""  # another analysis whose estimate must share the sign for "reproduced"
    check: str = ""  # another analysis whose 95% interval must lie above 0 for "reproduced"
    design: str = "mean"  # its power simulation's design (decision_power.Design.kind)


LLMS = "the paper's: pretrained LLMs of 117M-70B parameters; here: small models trained here"
PYTHIA = (
    "the paper's: Pythia 6.9B and 12B over 143k steps; here: small models trained here (the "
    "default's: 4 blocks, width 64, 1,000 steps)"
)
VIT = (
    "the paper's: 64 ViTs of width 192 and depth 12 trained 500 epochs on CIFAR-10; here: config "
    "vit (the default's: width 64, depth 6, 12 epochs on 8 x 8 digits)"
)


CLAIMS = (
    Claim(
        "Training couples the blocks: trained models are more coupled than random-init twins",
        "fixed_size_trained_vs_random",
        "coupling_excess, trained - twin, on held-out prompts",
        +1,
        "the fixed-size runs; configurations as units",
        LLMS,
    ),
    Claim(
        "More coupled models generalize better (held-out bits per byte)",
        "fixed_size_excess_vs_bpb",
        "sd of -bits per byte per sd of coupling_excess at stats.k (held-out Shakespeare prompts)",
        +1,
        "one small architecture trained here; generalization varied by the data fraction at one "
        "size; each run its own seed (init and data): runs are the units; reproduced only if the "
        "subspace overlap's slope (fixed_size_overlap_u_vs_bpb) has the same sign",
        LLMS,
        agree="fixed_size_overlap_u_vs_bpb",
        design="slope",
    ),
    Claim(
        "The same beyond the spectrum's shape (secondary)",
        "fixed_size_excess_vs_bpb_rank_adjusted",
        "sd of -bits per byte per sd of coupling_excess, adjusted for the runs' log effective rank",
        +1,
        "the excess also tracks the spectrum's shape across runs (docs/science.md, 'Which K')",
        LLMS,
    ),
    Claim(
        "The same with the paper's raw coupling",
        "fixed_size_coupling_vs_bpb_rank_adjusted",
        "sd of -bits per byte per sd of raw coupling (minus mean m_K), held-out prompts, adjusted "
        "for log effective rank",
        +1,
        "raw m_K has a chance level that moves with the spectrum; the excess is the calibrated "
        "measure",
        LLMS,
    ),
    Claim(
        "More coupled models have a smaller generalization gap",
        "fixed_size_excess_vs_gap_rank_adjusted",
        "sd of val - train loss per sd of coupling_excess, held-out prompts, adjusted for log "
        "effective rank",
        -1,
        "gap at each run's last step; same runs as above",
        LLMS,
    ),
    Claim(
        "Coupling emerges with training: higher at the end than at initialization",
        "emergence_final_vs_init",
        "coupling_excess, last checkpoint - step 0, paired per run",
        +1,
        "small runs trained here; runs that share an initialization averaged first",
        PYTHIA,
    ),
    Claim(
        "Coupling increases persistently through training (no decline after its peak)",
        "emergence_relaxation",
        "coupling_excess, last checkpoint - the declared peak step (stats.peak_step)",
        +1,
        "the peak step is declared from a pilot run before this one",
        PYTHIA,
    ),
    Claim(
        "Within a run, coupling grows as the model gets better (validation loss)",
        "emergence_within_loss",
        "per run, Fisher z of Spearman rho of coupling_excess with minus validation loss over "
        "its checkpoints after step 0",
        +1,
        "small runs trained here, each its own seed (init and data); half at a small data "
        "fraction trained long, where validation loss turns up; its null is not the claim's: "
        "a measure that tracks training time alone gives the arms opposite signs, and the "
        "mean then depends on the mix of arms (emergence_within_arms tests the claim)",
        PYTHIA,
    ),
    Claim(
        "Coupling tracks generalization beyond training time: at matched steps, the arm that "
        "generalizes better gains more coupling",
        "emergence_within_arms",
        "coupling_excess change over the declared window (stats.within_window), full-text arm "
        "minus small-data arm, per suite",
        +1,
        "two arms of checkpoint suites (full text, a small data fraction) at the same steps; "
        "reproduced only if the arms' change of minus validation loss over the window differs "
        "on the designed side (emergence_within_arms_val_loss); a measure that tracks training "
        "time alone has no effect here",
        PYTHIA,
        check="emergence_within_arms_val_loss",
        design="arms",
    ),
    Claim(
        "Linearity of the token trajectories emerges with training (lower LSS)",
        "emergence_lss_final_vs_init",
        "line-shape score (mean over prompts and tokens), last checkpoint - step 0, per suite",
        -1,
        "small runs trained here (4 blocks: a trajectory of 4 steps); runs sharing an init "
        "averaged first",
        PYTHIA,
    ),
    Claim(
        "Exponential growth of the representations over depth emerges with training (lower "
        "expodistance)",
        "emergence_expodistance_final_vs_init",
        "expodistance (CV of the step-norm ratios, mean over prompts and tokens), last "
        "checkpoint - step 0, per suite",
        -1,
        "small runs trained here (4 blocks: 3 step-norm ratios per trajectory); runs sharing "
        "an init averaged first",
        PYTHIA,
    ),
    Claim(
        "Coupling becomes more pronounced between adjacent layers with training (locality)",
        "emergence_locality",
        "(adjacent - all-pairs coupling_excess), last checkpoint - step 0",
        +1,
        "4-block models: adjacent pairs are 3 of 6",
        PYTHIA,
    ),
    Claim(
        "Coupling across tokens emerges with training: self family (J_tt vs J_t't')",
        "tokens_self_trained_vs_random",
        "token-pair excess (t != t'), trained - twin",
        +1,
        (
            "extract.token_layers x token_prompts per model, averaged within it; the twin is "
            "the run's own (random_init.per_run) or one shared by the runs"
        ),
        LLMS,
    ),
    Claim(
        "Coupling across tokens emerges with training: context (fixed input, fixed output)",
        "tokens_context_trained_vs_random",
        "token-pair excess (t != t'), mean of fixed input and fixed output, trained - twin",
        +1,
        (
            "extract.token_layers x token_prompts per model, averaged within it; the twin is "
            "the run's own (random_init.per_run) or one shared by the runs"
        ),
        LLMS,
    ),
    Claim(
        "Stochastic depth increases coupling (ViT)",
        "vit_sd_effect",
        "coupling_excess per unit drop-path rate, seed as a block",
        +1,
        "small ViTs on a small image set; fixed weight decay",
        VIT,
    ),
    Claim(
        "At a fixed rate, more coupled ViTs are more accurate",
        "vit_accuracy_within_rate",
        "test accuracy per sd of coupling_excess, rate and seed fixed effects",
        +1,
        "small ViTs; a seed fixes init and data order at every rate, so it is a block: the "
        "slope rests on the seed-by-rate variation",
        VIT,
    ),
    Claim(
        "Coupling correlates with the leaderboard score across pretrained models",
        "crossmodel_coupling_vs_score",
        "Spearman rho of coupling and the score across models",
        +1,
        "models differ in data, size and training at once",
    ),
    Claim(
        "Coupling correlates more strongly with performance than parameter count, depth or width",
        "crossmodel_coupling_vs_size",
        "|Spearman rho| of coupling with the score minus the largest |rho| of log parameters, "
        "depth or width with it, across pretrained models",
        +1,
        "needs pretrained models that vary in size, depth and width; the models trained here "
        "share one size (the grids vary data and training, not the architecture)",
        LLMS,
    ),
)
