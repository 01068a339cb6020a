"""A cost model of the workflow's GPU (or CPU) jobs: seconds, peak memory and output size.

Torch-free: the workflow calls ``check_fits`` when it builds the DAG (a job that cannot fit its
declared ``gpu_mem_gb`` stops the run before any job), and ``blockcoupling plan`` prints
``pipeline.plan_table.plan_table``. Counts follow the extraction as written
(``jacobians.extract``):

- depth-wise, per prompt and block: d VJPs through the block on one token with the prefix KV
  cache (``jacobians.engine.JacobianEngine.diagonal``), each ~3 forward passes of one token
  (``2 P`` FLOPs for a block of P parameters, plus ``4 n d`` for attention over n tokens); one
  top-K (or dense) SVD of the layer stack; the coupling statistics of every layer pair
  (``L^2 d^2 K`` per variant);
- token families, per token prompt and token block: d VJPs per output token on its prefix
  (``token_vjp_flops``, ``3 d P n(n+1)``), shared by both context families (again for the
  groups that do not fit ``hold_budget``; bench/runs/token_families.md), n(n+1) SVDs, and
  the statistics of every pair within a group (``~(4/3) n^3 d^2 K`` per layer pair and variant);
- forward passes: one per prompt (``record_calls``: the trajectories and the recorded block
  inputs), ``2 P`` FLOPs per token for a model of P parameters;
- memory: the weights in their storage dtype, a float32 copy of one block, the Jacobians held at
  once (``L d^2`` floats for depth, ``layers n d^2`` per token group) with their SVD workspace,
  and the activations of one vmapped chunk of VJPs/JVPs.

Rates: ``CPU`` was calibrated on this project's 2-core machine by ``bench/depth_speed.py``
(one thread per job; ``matmul`` is the effective rate under the FLOP counts above, not a
hardware peak); ``GPU`` is read from ``gpu_rates.json``, which ``bench/gpu_acceptance.py``
writes from one run on a GPU in IEEE float32 (no TF32), its machine and date recorded there.
``blockcoupling plan --gpu-rates FILE`` reads another such file; ``--gpu-tflops`` scales the
matmul rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blockcoupling.coupling.formulas import READINGS
from blockcoupling.jacobians.options import (
    AUTO_CHUNK_FLOATS,
    ExtractConfig,
    auto_chunk,
    runs_on_gpu,
)

GB = 1e9
BYTES_PER_PARAM = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "4bit": 0.55,
    "8bit": 1.05,
}
DEFAULT_TOKENS = 128  # assumed prompt length where extract.max_tokens is null
ACTIVATION_FLOATS = AUTO_CHUNK_FLOATS  # floats per token and d that one VJP/JVP sample holds


@dataclass(frozen=True)
class Rates:
    """Achieved throughputs of one kind of device.

    matmul: FLOP/s of the batched VJP/JVP products and statistics; dense_svd: seconds per d^3 of
    a dense SVD (U, S, V); svdvals: likewise for singular values only; topk: seconds per
    ``d^2 (K + oversample)`` of a top-K SVD (block Krylov, a few iterations); overhead: seconds
    per job (start, model load).
    """

    name: str
    matmul: float
    dense_svd: float
    svdvals: float
    topk: float
    overhead: float


CPU = Rates(  # bench/runs/depth_speed_quiet.md: one thread, Llama block d=4096, quiet machine
    "CPU, 1 thread per job (calibrated by bench/depth_speed.py)",
    matmul=3.1e11,  # d one-token VJPs of a 203M-parameter block in 16.0 s, counted as above
    dense_svd=13.5 / 4096**3,
    svdvals=13.5 / 3 / 4096**3,  # assumed a third of the dense SVD (not measured here)
    topk=2.5 / (4096**2 * 70),
    overhead=20.0,
)
RATES_FIELDS = tuple(f.name for f in fields(Rates) if f.name != "name")
# What a rates file may hold, generously around any device (a rate outside gives hours that
# overflow or round to nothing): each field's unit and its (lowest, highest) value.
RATE_UNITS = {
    "matmul": "FLOP/s",
    "dense_svd": "seconds per d^3",
    "svdvals": "seconds per d^3",
    "topk": "seconds per d^2 (K + oversample)",
    "overhead": "seconds per job",
}
RATE_RANGE = {
    "matmul": (1e6, 1e18),
    "dense_svd": (1e-18, 1e-3),
    "svdvals": (1e-18, 1e-3),
    "topk": (1e-18, 1e-3),
    "overhead": (1e-3, 86400.0),
}
GPU_RATES = Path(__file__).with_name("gpu_rates.json")  # written by bench/gpu_acceptance.py


def load_rates(path: Path) -> Rates:
    """``Rates`` from a JSON file as ``write_rates`` writes it (``name``, the five rates, and a
    ``measured`` record of where and how); a missing or non-positive rate is a one-line error
    naming the file.
    """
    import json

    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        values = {key: record[key] for key in RATES_FIELDS}
        name = str(record["name"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path}: not a rates file ({type(error).__name__}: {error}); it needs name and "
            f"{', '.join(RATES_FIELDS)}, as bench/gpu_acceptance.py writes it"
        ) from None
    for key, value in values.items():
        low, high = RATE_RANGE[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: {key} = {value!r} is not a number; give {RATE_UNITS[key]}")
        if not value > 0:
            raise ValueError(f"{path}: {key} = {float(value)!r}; every rate must be above 0")
        if not low <= value <= high:
            raise ValueError(
                f"{path}: {key} = {value!r} is outside {low:g}..{high:g} "
                f"({RATE_UNITS[key]}); give the rate bench/gpu_acceptance.py measured"
            )
    return Rates(name, **{key: float(value) for key, value in values.items()})


if TYPE_CHECKING:  # the plan imports no cost: the checks pass it in
    from blockcoupling.pipeline.plan import Plan


def write_rates(rates: Rates, path: Path, measured: dict[str, Any]) -> None:
    """Write ``rates`` as ``load_rates`` reads them, with ``measured`` (machine, date, script)."""
    import json

    from blockcoupling.files.io import write_text

    record = {"name": rates.name, **{key: getattr(rates, key) for key in RATES_FIELDS}}
    record["measured"] = measured
    write_text(path, json.dumps(record, indent=1) + "\n")


GPU = load_rates(GPU_RATES)  # the GPU's rates: see gpu_rates.json's "measured" record


@dataclass(frozen=True)
class Shape:
    """What the cost depends on: layers, width, parameters, storage bytes per parameter."""

    n_layers: int
    d_model: int
    params: float
    bytes_per_param: float

    @property
    def block_params(self) -> float:
        """Parameters of one block (at least the 12 d^2 of a standard block)."""
        return max(12.0 * self.d_model**2, self.params / self.n_layers)


@dataclass
class JobCost:
    """One rule's jobs for one model (all its steps and shards): total seconds, the longest
    job's seconds, peak device memory, output bytes, and what the model declares.
    """

    model: str
    rule: str
    jobs: int
    seconds: float
    job_seconds: float
    peak_bytes: float
    output_bytes: float
    declared_gb: float
    runtime_min: float
    on_gpu: bool
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        """Whether the peak fits the declared device memory (none declared: assumed to fit)."""
        return self.declared_gb <= 0 or self.peak_bytes <= self.declared_gb * GB

    @property
    def in_time(self) -> bool:
        """Whether the longest job fits the declared runtime (none declared: assumed to)."""
        return self.runtime_min <= 0 or self.job_seconds <= self.runtime_min * 60


def shape_of(meta: dict[str, Any], load: dict[str, Any]) -> Shape | None:
    """The Shape of a model from its metadata and load options (None without n_layers/d_model).
    Parameters default to 13 d^2 L (blocks plus a little) where the table has none.
    """
    layers, d = meta.get("n_layers"), meta.get("d_model")
    if not layers or not d:
        return None
    params = meta.get("params") or 13.0 * d * d * layers
    storage = load.get("quantization") or load.get("dtype") or "float32"
    return Shape(int(layers), int(d), float(params), BYTES_PER_PARAM[storage])


def _svd_seconds(d: int, count: float, options: ExtractConfig, rates: Rates) -> float:
    if options.svd.uses_dense(d, options.k_max):
        return count * rates.dense_svd * d**3
    return count * rates.topk * d**2 * (options.k_max + options.svd.oversample)


def pair_floats(options: ExtractConfig) -> tuple[int, int]:
    """Floats stored per Jacobian pair (``jacobians.datasets``): its statistics over every
    variant (``2 k_max`` each, or 2 readings per stored K) and its basis corners (2 per K).
    """
    ks = options.k_max if options.stored_ks is None else len(options.stored_ks)
    per_variant = 2 * options.k_max if options.stored_ks is None else len(READINGS) * ks
    return len(options.variants) * per_variant, 2 * ks


TOKEN_HOLD_BYTES = 2 << 30  # as jacobians.extract.TOKEN_HOLD_BYTES (a CPU job)
TOKEN_HOLD_FRACTION = 0.8  # as jacobians.extract.TOKEN_HOLD_FRACTION (of a GPU's free memory)


def token_held_bytes(layers: int, n_family: int, d: int) -> float:
    """Bytes of every float32 ``J^l_{t1 t2}`` (t1 <= t2 < n) of the token layers."""
    return layers * n_family * (n_family + 1) / 2 * d * d * 4


def token_vjp_flops(n_family: int, d: int, block_params: float) -> float:
    """FLOPs of one pass of the token families' VJPs at one layer: d VJPs of each output token
    t2 < n on its prefix of t2 + 1 tokens, each ~3 one-token forward passes (``2 P``): the
    floor of every ``J_{t1 t2}``, t1 <= t2 (one VJP gives a row for every input token at once).
    """
    return 3.0 * 2.0 * block_params * d * n_family * (n_family + 1) / 2


def extract_cost(
    shape: Shape,
    options: ExtractConfig,
    n_prompts: int,
    rates: Rates,
    hold_bytes: float = TOKEN_HOLD_BYTES,
) -> dict:
    """Seconds (by part), peak bytes and output bytes of extracting ``n_prompts`` prompts with
    the checked ``options`` (the first ``options.jacobian_prompts`` get Jacobians, every prompt
    a forward pass); the token families' Jacobians are held between their two uses where they
    fit ``hold_bytes`` (``hold_budget``).
    """
    n = options.max_tokens or DEFAULT_TOKENS
    n_family = min(n, options.token_max_tokens or n)
    k = options.k_max
    variants = len(options.variants)
    layers_l, d, p = shape.n_layers, shape.d_model, shape.block_params
    jacobian_prompts = options.jacobian_count(n_prompts)
    token_layers = len(set(options.token_layers))
    token_prompts = min(options.token_prompts, jacobian_prompts) if token_layers else 0
    spectra = options.spectra_prompts
    spectra_prompts = jacobian_prompts if spectra is None else min(spectra, jacobian_prompts)
    dense = options.svd.uses_dense(d, k)
    chunk = options.chunk_size or auto_chunk(n, d)
    vjp = 3.0 * (2.0 * p + 4.0 * n * d)  # one VJP of one token through a block
    seconds = {
        "depth jacobians": jacobian_prompts * layers_l * (d * vjp + 2.0 * p * n) / rates.matmul,
        "depth svd": _svd_seconds(d, jacobian_prompts, options, rates) * layers_l
        + spectra_prompts * layers_l * rates.svdvals * d**3,
        "depth statistics": jacobian_prompts
        * variants
        * 2.0
        * layers_l**2
        * d**2
        * k
        / rates.matmul,
        "forward passes": n_prompts * 2.0 * shape.params * n / rates.matmul,  # one each
    }
    if token_prompts:
        nf = n_family  # d VJPs of each output token on its prefix (twice unless held), self
        held_all = token_held_bytes(token_layers, nf, d)  # the groups not held: VJPs again
        passes = 1.0 + max(0.0, 1.0 - hold_bytes / held_all)
        per_layer = passes * token_vjp_flops(nf, d, p) + 6.0 * nf * d * p
        seconds["token jacobians"] = token_prompts * token_layers * per_layer / rates.matmul
        seconds["token svd"] = token_prompts * _svd_seconds(
            d, token_layers * nf * (nf + 1), options, rates
        )
        stats = (4.0 / 3.0) * nf**3 * d**2 * k * token_layers**2 * variants
        seconds["token statistics"] = token_prompts * stats / rates.matmul
    weights = shape.params * shape.bytes_per_param
    block_copy = p * 4 if shape.bytes_per_param < 4 else 0  # the float32 copy of one block
    held = 3.0 if dense else 1.3  # Jacobians held, with a dense SVD's U and V
    depth_held = held * layers_l * d * d * 4  # the stack (filled in place) and SVD workspace
    depth_act = chunk * ACTIVATION_FLOATS * n * d * 4  # gradients of the key/value prefix too
    token_held = held * token_layers * n_family * d * d * 4 if token_prompts else 0
    if token_prompts:
        token_held += min(hold_bytes, token_held_bytes(token_layers, n_family, d))
    token_act = chunk * n * ACTIVATION_FLOATS * d * 4 if token_prompts else 0
    peak = weights + block_copy + max(depth_held + depth_act, token_held + token_act)
    f64 = 8
    pair, basis = pair_floats(options)
    output = (
        jacobian_prompts
        * (
            layers_l**2 * (pair + basis) * f64  # depth pair statistics and basis corners
            + layers_l * (k + 2) * f64  # top-K singular values, full-spectrum sums
        )
        + n_prompts * (3 * (layers_l + 1) + 3) * n * f64  # trajectories: step norm, 2 PCs
        # per state and token; LSS, expodistance, spacing CV per token
        + spectra_prompts * layers_l * d * f64
    )
    if token_prompts:
        output += token_prompts * (
            token_layers**2
            * (n_family**2 + 2 * n_family**3)
            * (pair + (basis if options.token_bases else 0))
            * f64
            + token_layers * n_family**2 * (k + 2) * f64
        )
    return {"seconds": seconds, "peak": peak, "output": output}


def hold_budget(shape: Shape, options: ExtractConfig, declared_gb: float, on_gpu: bool) -> float:
    """Bytes a job may hold the token families' Jacobians in, as the extraction decides
    (``jacobians.extract.token_hold_bytes``): on a GPU ``TOKEN_HOLD_FRACTION`` of what its
    declared memory leaves free beside the rest of the job's peak, else ``TOKEN_HOLD_BYTES``.
    """
    if not on_gpu or declared_gb <= 0 or not options.token_prompts:
        return TOKEN_HOLD_BYTES
    rest = extract_cost(shape, replace(options, token_prompts=1), 1, CPU, hold_bytes=0)["peak"]
    return TOKEN_HOLD_FRACTION * max(0.0, declared_gb * GB - rest)


def evaluate_cost(shape: Shape, tokens: float, rates: Rates) -> dict:
    """Forward passes over ``tokens`` tokens (held-out text and answer choices)."""
    peak = shape.params * shape.bytes_per_param + 4 * 2048 * shape.d_model * 64
    return {"seconds": {"forward": 2.0 * shape.params * tokens / rates.matmul}, "peak": peak}


def plan_costs(plan: Plan, gpu: Rates = GPU, cpu: Rates = CPU) -> list[JobCost]:
    """The cost of every extract and evaluate job of a ``workflow.Plan`` (models without
    ``n_layers``/``d_model`` in their metadata are left out).
    """
    rows = []
    for name, entry in plan.models.items():
        shape = shape_of(entry.meta, entry.load)
        if shape is None:
            continue
        declared = float(entry.resources.get("gpu_mem_gb", 0))
        on_gpu = plan.on_gpu(name)
        rates = gpu if on_gpu else cpu
        shards = plan.shards(name)
        options = plan.extraction_for(name)
        token_jobs = len(plan.token_jobs(name))
        depth_only = replace(options, token_prompts=0) if token_jobs else options
        hold = hold_budget(shape, options, declared, on_gpu)
        job = max(
            (
                extract_cost(shape, depth_only.for_shard(first), count, rates, hold)
                for first, count in shards
            ),
            key=lambda cost: sum(cost["seconds"].values()),
        )
        if token_jobs:  # one token prompt's own job
            tokens = extract_cost(shape, replace(options, token_prompts=1), 1, rates, hold)
            job = max(job, tokens, key=lambda cost: sum(cost["seconds"].values()))
        total = extract_cost(shape, options, plan.n_prompts, rates, hold)
        steps = len(entry.measured_steps)
        runtime = float(entry.resources.get("runtime", 0))
        rows.append(
            JobCost(
                name,
                "extract",
                steps * (len(shards) + token_jobs),
                (sum(total["seconds"].values()) + rates.overhead * (len(shards) + token_jobs))
                * steps,
                sum(job["seconds"].values()) + rates.overhead,
                job["peak"],
                total["output"] * steps,
                declared,
                runtime,
                on_gpu,
                {part: value * steps for part, value in total["seconds"].items()},
            )
        )
        if name in plan.evaluated(plan.models):
            tokens = plan.heldout_chars / 3.5 + plan.n_prompts * 200
            cost = evaluate_cost(shape, tokens, rates)
            seconds = sum(cost["seconds"].values()) + rates.overhead
            scored = len(entry.scored_steps)
            rows.append(
                JobCost(
                    name,
                    "evaluate",
                    scored,
                    seconds * scored,
                    seconds,
                    cost["peak"],
                    0.0,
                    declared,
                    runtime,
                    on_gpu,
                )
            )
    return rows + vit_costs(plan, gpu, cpu)


DATASET_IMAGES = {"cifar10": 60000, "digits": 1797}  # images before the train/test split


def vit_costs(plan: Plan, gpu: Rates = GPU, cpu: Rates = CPU) -> list[JobCost]:
    """The cost of the ViT sweep's training and extraction jobs (none when it is off): training
    ``6 P`` FLOPs per token and image and epoch; extraction as ``extract_cost`` of the ViT.
    """
    if plan.vit is None:
        return []
    run = plan.vit.base  # base: model and recipe, defaults filled
    on_gpu = runs_on_gpu(plan.vit.device)
    rates = gpu if on_gpu else cpu
    d, depth = run["embed_dim"], run["depth"]
    tokens = (run["img_size"] // run["patch_size"]) ** 2 + 1
    shape = Shape(depth, d, 12.0 * d * d * depth, 4)
    images = DATASET_IMAGES.get(run["dataset"], 60000) * (1 - run["test_fraction"])
    train = 6.0 * shape.params * tokens * images * run["epochs"] / rates.matmul + rates.overhead
    options = replace(plan.vit.extraction, max_tokens=tokens)
    extract = extract_cost(shape, options, plan.vit.images, rates)
    seconds = sum(extract["seconds"].values()) + rates.overhead
    n = len(plan.vit.points)
    return [
        JobCost("vit", "vit_train", n, n * train, train, shape.params * 16, 0.0, 0, 0, on_gpu),
        JobCost(
            "vit",
            "vit_extract",
            n,
            n * seconds,
            seconds,
            extract["peak"],
            n * extract["output"],
            0,
            0,
            on_gpu,
            {p: n * v for p, v in extract["seconds"].items()},
        ),
    ]


def check_fits(plan: Plan) -> None:
    """Raise ``ValueError`` naming the first model whose GPU job cannot fit its ``gpu_mem_gb``."""
    for row in plan_costs(plan):
        if row.on_gpu and not row.fits:
            raise ValueError(
                f"models.{row.model}: one {row.rule} job needs ~{row.peak_bytes / GB:.0f} GB of "
                f"GPU memory, more than its gpu_mem_gb={row.declared_gb:.0f}; raise gpu_mem_gb, "
                "quantize the model, or lower extract.chunk_size, max_tokens or token_layers "
                "(blockcoupling plan shows the parts)"
            )
