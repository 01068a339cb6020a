"""Extraction options, torch-free: the workflow builds and checks them when it builds the DAG.

``ExtractConfig.from_config`` is the one place where the config's ``extract`` section becomes
library options; ``RUN_ONLY_KEYS`` are the keys that say how or where a job runs (speed, device),
never what it computes, so changing them re-runs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from blockcoupling.coupling.arguments import expect, expect_ints
from blockcoupling.coupling.formulas import VARIANTS, check_option

SVD_METHODS = ("auto", "dense", "gram", "topk")
AUTO_CHUNK_BYTES = 1 << 30  # activations of one vmapped batch of VJPs/JVPs when chunk_size is null
AUTO_CHUNK_FLOATS = 8  # floats per token and d one VJP/JVP sample holds (measured ~5.6, d=4096)
AUTO_CHUNK_CPU_BYTES = 4 << 20  # on CPU: one batch's gradient of a (token, d) tensor


def auto_chunk(n_tokens: int, d: int, cpu: bool = False) -> int:
    """VJPs/JVPs per vmapped batch when ``chunk_size`` is null: as many as keep one batch's
    activations (``AUTO_CHUNK_FLOATS`` x tokens x d float32 per sample) under
    ``AUTO_CHUNK_BYTES``, at most d (all at once). Measured: the single-token path's batch of all
    d VJPs at d=4096 holds the gradients of the whole key/value prefix (2 d n d floats); a batch
    of 512 at 64 tokens held ~3 GB (5.6 floats per token and d per sample) and cost no time
    (bench/runs/depth_speed_chunk512.md).

    On ``cpu`` the batch is smaller still: its gradient of one ``(token, d)`` tensor (the
    attention's keys, values) under ``AUTO_CHUNK_CPU_BYTES``, but never below ``max(64, d / 8)``
    samples, where the block's weight products stay efficient. Measured on one thread
    (SmolLM2, d=576, one block's ``J_tt``): 0.090 s against 0.132 s for all d at 26 tokens,
    0.136 s against 0.244 s at 64 tokens; at d=2048 batches of 64 or 128 cost 1.5x more than
    256 or all d.
    """
    tensor_bytes = max(n_tokens, 1) * d * 4  # one sample's (token, d) float32 tensor
    largest = max(1, min(d, AUTO_CHUNK_BYTES // (AUTO_CHUNK_FLOATS * tensor_bytes)))
    if not cpu:
        return largest
    floor = min(d, max(64, d // 8))
    return min(largest, max(floor, AUTO_CHUNK_CPU_BYTES // tensor_bytes))


def runs_on_gpu(device: str, gpu_mem_gb: float = 0) -> bool:
    """Whether a job runs on a GPU, the one rule the planner, the memory check and the Slurm
    requests follow: device ``cuda*``, or ``auto`` with GPU memory declared (``cpu``: never).
    """
    return device.startswith("cuda") or (device == "auto" and gpu_mem_gb > 0)


# Keys of the ``extract`` section that change neither Jacobians nor statistics (prompt shards
# are merged into the same files as one job's).
RUN_ONLY_KEYS = ("prompt_set", "threads", "device", "chunk_size", "prompts_per_shard")


def science_params(section: Mapping[str, Any]) -> dict[str, Any]:
    """The ``extract`` keys that change results (rule params re-run jobs when they change)."""
    return {key: value for key, value in section.items() if key not in RUN_ONLY_KEYS}


@dataclass(frozen=True)
class SVDOptions:
    """How top-K factors are computed (``extract.svd``; see ``spectral.top_k``).

    method: ``dense`` (``torch.linalg.svd``), ``gram`` (eigendecomposition of ``J^T J`` in
    float64, the top K only: ``gram.gram_top_k``), ``topk`` (randomized block Krylov) or
    ``auto`` (``gram`` when ``d <= dense_up_to``, else ``topk``; measured on one CPU thread,
    seconds per top-50 of one Jacobian: d = 576 dense 0.061, gram 0.040, topk 0.155; d = 1024
    dense 0.41, gram 0.25, topk 0.48; bench/runs/depth_speed_spectra.md); oversample: extra
    columns ``p`` of the sketch; iters: the most Krylov iterations (blocks after the first);
    tol: relative change of the top-K singular values below which iteration stops; seed: of
    the Gaussian sketch.
    """

    method: str = "auto"
    oversample: int = 20
    iters: int = 8
    tol: float = 1e-5
    dense_up_to: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        check_option("extract.svd.method", self.method, SVD_METHODS)
        if self.oversample < 0 or self.iters < 1 or self.tol <= 0 or self.dense_up_to < 0:
            raise ValueError(
                "extract.svd needs oversample >= 0, iters >= 1, tol > 0 and dense_up_to >= 0; "
                f"got {self}"
            )

    def resolve(self, d: int, k: int) -> str:
        """The method ``(d, d)`` matrices get: ``dense``, ``gram`` or ``topk`` (a sketch as wide
        as d saves nothing: ``topk`` then takes the dense SVD, ``auto`` the Gram path).
        """
        if self.method in ("dense", "gram"):
            return self.method
        if self.method == "auto":
            return "gram" if d <= self.dense_up_to or k + self.oversample >= d else "topk"
        return "dense" if k + self.oversample >= d else "topk"

    def uses_dense(self, d: int, k: int) -> bool:
        """Whether ``(d, d)`` matrices get an exact O(d^3) decomposition (dense SVD or Gram)."""
        return self.resolve(d, k) != "topk"


@dataclass(frozen=True)
class ExtractConfig:
    """What to extract: the options of ``extract`` (the config's ``extract`` section).

    Checked when built (a one-line ValueError naming the key).

    Parameters
    ----------
    k_max : int
        Singular triplets kept per Jacobian: the largest K of m_K later.
    variants : tuple of str
        Basis variants, ``ujv`` and/or ``vju``.
    depth_token : int
        Position of the depth-wise token (negative: from the end).
    token_layers : tuple of int
        Blocks (1-based, negative from the end) of the token families.
    token_prompts : int
        How many prompts (the first ones) get token families.
    max_tokens : int or None
        Truncate prompts to this many tokens (None: keep them whole).
    store_factors : bool
        Keep the top-K_max ``U``, ``V`` of the depth Jacobians.
    chunk_size : int or None
        VJPs per vmapped batch (None: sized by ``auto_chunk``; speed only).
    pca_components : int
        Components of the trajectory projections.
    svd : SVDOptions
        How the top-K factors are computed.
    spectra_prompts : int or None
        How many prompts (the first ones) get the full singular-value spectrum of every depth
        Jacobian (None: all).
    token_max_tokens : int or None
        The token families cover the first this many tokens of a prompt (None: all; their cost
        grows as n^3).
    tf32 : bool
        Allow TensorFloat-32 matmuls on CUDA (off: Jacobians and SVDs in full float32).
    jacobian_prompts : int or None
        How many prompts (the first ones) get block Jacobians; the others get only the
        forward-pass measures (trajectories), as the paper measured its Jacobian alignment on a
        subset of its prompts (None: all).
    allow_full_sequence : bool
        On an accelerator, let a block whose single-token ``J_tt`` was refused take the
        full-sequence path (~t times the cost) instead of stopping the job (the CPU always may).
    stored_ks : tuple of int or None
        The Ks whose m_K the stored statistics give: each pair stores the squared numerator of
        m_K per reading at these Ks instead of its diagonal and corner sums at every K up to
        k_max (None: every K, for sweeps).
    token_bases : bool
        Store the token families' basis corner sums (their overlap measures; the ViT sweep reads
        only their m_K and stores none).

    Examples
    --------
    >>> import blockcoupling as bc
    >>> config = bc.ExtractConfig(k_max=10, variants=("ujv",))
    >>> config.at(30).k_max
    30
    """

    k_max: int = 50
    variants: tuple[str, ...] = VARIANTS
    depth_token: int = -1
    token_layers: tuple[int, ...] = ()
    token_prompts: int = 0
    max_tokens: int | None = None
    store_factors: bool = False
    chunk_size: int | None = None
    pca_components: int = 2
    svd: SVDOptions = field(default_factory=SVDOptions)
    spectra_prompts: int | None = None
    token_max_tokens: int | None = None
    tf32: bool = False
    jacobian_prompts: int | None = None
    allow_full_sequence: bool = False
    stored_ks: tuple[int, ...] | None = None
    token_bases: bool = True

    def __post_init__(self) -> None:
        self._check_types()
        if self.stored_ks is not None and (
            not self.stored_ks
            or list(self.stored_ks) != sorted(set(self.stored_ks))
            or not 1 <= self.stored_ks[0] <= self.stored_ks[-1] <= self.k_max
        ):
            raise ValueError(
                f"extract.stored_ks must be increasing Ks in 1..k_max={self.k_max}, "
                f"got {list(self.stored_ks)}"
            )
        if self.jacobian_prompts is not None and self.jacobian_prompts < 0:
            raise ValueError(
                f"extract.jacobian_prompts must be >= 1 or null, got {self.jacobian_prompts}"
            )
        if self.token_max_tokens is not None and self.token_max_tokens < 2:
            raise ValueError(f"extract.token_max_tokens must be >= 2, got {self.token_max_tokens}")
        if self.spectra_prompts is not None and self.spectra_prompts < 0:
            raise ValueError(f"extract.spectra_prompts must be >= 0, got {self.spectra_prompts}")
        for variant in self.variants:
            check_option("variant", variant, VARIANTS)
        if not self.variants:
            raise ValueError("extract.variants is empty; give ujv, vju or both")
        if self.k_max < 1:
            raise ValueError(f"extract.k_max must be >= 1, got {self.k_max}")
        if self.max_tokens is not None and self.max_tokens < 2:
            raise ValueError(f"extract.max_tokens must be >= 2, got {self.max_tokens}")
        if 0 in self.token_layers:
            raise ValueError("extract.token_layers: blocks are 1-based (negative: from the end)")
        if self.token_prompts < 0:
            raise ValueError(f"extract.token_prompts must be >= 0, got {self.token_prompts}")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise ValueError(f"extract.chunk_size must be >= 1 or null, got {self.chunk_size}")

    def _check_types(self) -> None:
        """A one-line TypeError naming the field whose value has the wrong type."""
        for name in ("k_max", "depth_token", "token_prompts", "pca_components"):
            expect(getattr(self, name), int, f"ExtractConfig({name}=...)")
        optional = ("max_tokens", "chunk_size", "spectra_prompts", "token_max_tokens")
        for name in (*optional, "jacobian_prompts"):
            if getattr(self, name) is not None:
                expect(getattr(self, name), int, f"ExtractConfig({name}=...) (or None)")
        for name in ("store_factors", "tf32"):
            expect(getattr(self, name), bool, f"ExtractConfig({name}=...)")
        if isinstance(self.variants, str) or not isinstance(self.variants, (tuple, list)):
            raise TypeError(
                f"ExtractConfig(variants=...): expected a tuple such as ('ujv',), got "
                f"{self.variants!r}"
            )
        expect_ints(self.token_layers, "ExtractConfig(token_layers=...)")
        expect(self.svd, SVDOptions, "ExtractConfig(svd=...)")

    def at(self, k_max: int) -> ExtractConfig:
        """The same options keeping ``k_max`` singular triplets (checked).

        Parameters
        ----------
        k_max : int
            The new K_max.

        Returns
        -------
        ExtractConfig
            A copy with ``k_max`` replaced; this object is unchanged.
        """
        return replace(self, k_max=int(k_max))

    def for_shard(self, first: int) -> ExtractConfig:
        """The options for a shard whose first prompt is prompt ``first`` of the whole set: token
        families and full spectra stay on the first ``token_prompts`` / ``spectra_prompts``
        prompts of the whole set, so merged shards equal one job over every prompt.
        """
        spectra = None if self.spectra_prompts is None else max(0, self.spectra_prompts - first)
        jacobians = None if self.jacobian_prompts is None else max(0, self.jacobian_prompts - first)
        return replace(
            self,
            token_prompts=max(0, self.token_prompts - first),
            spectra_prompts=spectra,
            jacobian_prompts=jacobians,
        )

    def jacobian_count(self, n_prompts: int) -> int:
        """How many of ``n_prompts`` prompts (the first ones) get block Jacobians."""
        return n_prompts if self.jacobian_prompts is None else min(self.jacobian_prompts, n_prompts)

    @classmethod
    def from_config(cls, section: Mapping[str, Any]) -> ExtractConfig:
        """From the config's ``extract`` section; the run-only keys other than ``chunk_size``
        are ignored, an unknown key is an error naming it.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known - set(RUN_ONLY_KEYS))
        if unknown:
            raise ValueError(
                f"extract: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        values = {
            key: tuple(value) if isinstance(value, list) else value
            for key, value in section.items()
            if key in known
        }
        if values.get("stored_ks") in ("metrics", "all"):  # the checks resolve ``metrics``
            values["stored_ks"] = None  # to the metrics' Ks (``stored_ks``); alone: every K
        if isinstance(values.get("svd"), Mapping):
            svd_known = {f.name for f in fields(SVDOptions)}
            unknown = sorted(set(values["svd"]) - svd_known)
            if unknown:
                raise ValueError(
                    f"extract.svd: unknown key {unknown[0]!r} "
                    f"(known: {', '.join(sorted(svd_known))})"
                )
            values["svd"] = SVDOptions(**values["svd"])
        return cls(**values)


def stored_ks(
    section: Mapping[str, Any], metric_ks: Sequence[int], where: str = ""
) -> list[int] | None:
    """The Ks whose statistics extraction stores (``ExtractConfig.stored_ks``) from a config's
    ``extract`` section: ``metrics`` (the default) the Ks of the metrics (``metric_ks``), ``all``
    every K up to k_max (None: a sweep over K), or a list as given.
    """
    value = section.get("stored_ks", "metrics")
    if value == "metrics":
        return sorted({int(k) for k in metric_ks})
    if value == "all" or value is None:
        return None
    if isinstance(value, list | tuple):
        return [int(k) for k in value]
    raise ValueError(
        f"{where}extract.stored_ks must be metrics, all or a list of Ks, got {value!r}"
    )


def check_stored_ks(measure: ExtractConfig, metric_ks: Sequence[int], where: str = "") -> None:
    """One-line error when the metrics read a K whose statistics extraction does not store."""
    if measure.stored_ks is None:
        return
    missing = [k for k in metric_ks if k not in measure.stored_ks]
    if missing:
        metrics = "vit.ks" if where == "vit." else "metrics.ks"
        raise ValueError(
            f"{metrics} has K={missing[0]}, which {where}extract.stored_ks="
            f"{list(measure.stored_ks)} does not store; add it there or set it to metrics or all"
        )


@dataclass(frozen=True)
class PromptText:
    """A prompt (or image) as extract() sees it: an id, its source (task style), its text."""

    id: str
    source: str
    text: str


def __getattr__(name: str) -> Any:
    """``MeasureConfig``, the name before the rename, with a DeprecationWarning."""
    if name == "MeasureConfig":
        import warnings

        warnings.warn(
            "MeasureConfig is renamed ExtractConfig; the old name will be removed",
            DeprecationWarning,
            stacklevel=2,
        )
        return ExtractConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
