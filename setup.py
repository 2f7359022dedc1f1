"""The C forms of three hot-path structures, built where a C compiler is (pyproject.toml holds
everything else). Each is optional: without a compiler, pip still installs kvscope and the
Python forms beside them serve (offload/cpu/miss_attribution.py, offload/insight/sampling.py,
offload/wire/sample_recorder.py)."""

from setuptools import Extension, setup

# Each C form includes offload/small_int.h: rebuilt when it changes.
SHARED = {"include_dirs": ["offload"], "depends": ["offload/small_int.h"], "optional": True}

setup(
    ext_modules=[
        Extension("offload.cpu._miss_attribution", ["offload/cpu/_miss_attribution.c"], **SHARED),
        Extension("offload.insight._sample_test", ["offload/insight/_sample_test.c"], **SHARED),
        Extension("offload.wire._sample_recorder", ["offload/wire/_sample_recorder.c"], **SHARED),
    ]
)
