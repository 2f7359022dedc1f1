"""The C forms of five hot-path structures, built where a C compiler is (pyproject.toml holds
everything else). Each is optional: without a compiler, pip still installs kvscope and the
Python forms beside them serve (offload/cpu/miss_attribution.py,
offload/cpu/policies/offer_history.py, offload/cpu/policies/miniature_model.py,
offload/insight/sampling.py, offload/wire/sample_recorder.py)."""

from setuptools import Extension, setup

# Each includes offload's shared headers, and is rebuilt when one changes.
SHARED_HEADERS = {
    "include_dirs": ["offload"],
    "depends": [
        "offload/small_int.h",
        "offload/sample_select.h",
        "offload/key_table.h",
        "offload/key_check.h",
    ],
}

setup(
    ext_modules=[
        Extension(
            "offload.cpu._miss_attribution",
            ["offload/cpu/_miss_attribution.c"],
            optional=True,
            **SHARED_HEADERS,
        ),
        Extension(
            "offload.cpu.policies._offer_history",
            ["offload/cpu/policies/_offer_history.c"],
            optional=True,
            **SHARED_HEADERS,
        ),
        Extension(
            "offload.cpu.policies._miniature",
            ["offload/cpu/policies/_miniature.c"],
            optional=True,
            # A model's hit count must round as the Python form's does: no fused multiply-add.
            extra_compile_args=["-ffp-contract=off"],
            **SHARED_HEADERS,
        ),
        Extension(
            "offload.insight._sample_test",
            ["offload/insight/_sample_test.c"],
            optional=True,
            **SHARED_HEADERS,
        ),
        Extension(
            "offload.wire._sample_recorder",
            ["offload/wire/_sample_recorder.c"],
            optional=True,
            **SHARED_HEADERS,
        ),
    ]
)
