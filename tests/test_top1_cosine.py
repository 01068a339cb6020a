"""The top-1 cosine of the left singular vectors (registry measure ``top1_cos_u``): the metrics'
value is |u_{i,1} . u_{j,1}| of the stored singular vectors, its chance level E|cos| of random
unit vectors."""

import math

import numpy as np
from tiny_models import ARCHITECTURES, CharTokenizer

from blockcoupling.coupling import metrics
from blockcoupling.jacobians.extract import MeasureConfig, measure


def test_top1_cos_u_is_the_cosine_of_the_stored_top_left_singular_vectors() -> None:
    config = MeasureConfig(k_max=4, store_factors=True)
    model, tokenizer = ARCHITECTURES["llama"](), CharTokenizer()
    depth = measure(model, tokenizer, ["hello"], config, progress=False)["depth"]
    ds = metrics.coupling_dataset(depth, metrics.MetricConfig(ks=(1, 2), null_draws=16))
    u = depth["u"].isel(prompt=0).transpose("layer", "dim", "rank").values
    direct = np.abs(np.einsum("id,jd->ij", u[:, :, 0], u[:, :, 0]))
    got = ds["depth_top1_cos_u"].isel(prompt=0).transpose("layer", "layer_ref").values
    np.testing.assert_allclose(got, direct, rtol=1e-5, atol=1e-6)
    d = int(depth.attrs["hidden_size"])
    chance = math.gamma(d / 2) / (math.sqrt(math.pi) * math.gamma((d + 1) / 2))
    assert math.isclose(float(ds["top1_cos_u_null"]), chance, rel_tol=1e-12)
