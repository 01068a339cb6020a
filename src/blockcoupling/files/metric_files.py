"""The measures of one model at one step from its extraction files (m_K, the excess and the
overlaps for every K), for the metrics rule and the per-run rule metrics_<run> alike.
"""

from __future__ import annotations

from blockcoupling.coupling.finite import SUMMARIES, require_finite, require_rank
from blockcoupling.coupling.metrics import MetricConfig, coupling_dataset, token_coupling_dataset
from blockcoupling.files.io import read_netcdf, write_netcdf


def write_metrics(
    depth: str, tokens: str, config: MetricConfig, depth_out: str, tokens_out: str, where: str
) -> None:
    """m_K, the excess and the overlaps for every K of ``config`` from one model's extracted
    files; a rank below the largest K or a non-finite summary stops the job naming ``where``.
    """
    extracted = read_netcdf(depth)
    width = int(extracted.attrs.get("hidden_size", extracted.sizes["rank"]))
    require_rank(extracted["singular_values"], max(config.ks), width, where)
    try:  # coupling_dataset names a non-finite input statistic; the job names the model
        coupling = coupling_dataset(extracted, config)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    if coupling.sizes["layer"] > 1:  # each is a mean over layer pairs: defined from two layers
        require_finite(coupling, [name for name in SUMMARIES if name in coupling], where)
    write_netcdf(coupling, depth_out)
    write_netcdf(token_coupling_dataset(read_netcdf(tokens), config), tokens_out)
