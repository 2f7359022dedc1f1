"""Why the tier hits what it hits: hit-ratio curves and the distance to the optimum.

Pure Python (no torch, no vLLM, no sidecar), so the worker can sample its
block references and the sidecar can turn the sample into a curve.

- ``sampling``: the spatial sample of block references (a hash test, as in SHARDS)
- ``stack_distance``: the LRU curve at many capacities in one pass
- ``shadow``: the other registered policies, as shadow tiers at scaled capacities
- ``estimator``: a sampled stream -> a curve, corrected for the sample's size
- ``curve``: the curve itself: capacities, hit ratio per policy, the current one
- ``sweep``: the exact offline sweep, policy by capacity, ``opt`` included
- ``window_optimum``: the optimum and the tier's policy over the latest sampled references
- ``plot``: a curve as an HTML page (inline SVG) or a PNG
"""

from offload.insight.curve import DEFAULT_MULTIPLES, HitRatioCurve, scaled_capacities
from offload.insight.estimator import CurveEstimator
from offload.insight.sampling import DEFAULT_RATE, SpatialSampler
from offload.insight.stack_distance import LRUStackCurve

__all__ = [
    "DEFAULT_MULTIPLES",
    "DEFAULT_RATE",
    "CurveEstimator",
    "HitRatioCurve",
    "LRUStackCurve",
    "SpatialSampler",
    "scaled_capacities",
]
