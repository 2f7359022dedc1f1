"""Number settings from the environment or the command line: plain ASCII digits only.

pydantic's lax mode took ``KVSCOPE_MAX_BLOCKS=1_0`` for 10, ``+3`` or `` 3 ``
for 3, and argparse's ``int`` took ``--port ٣`` for port 3. Every integer
setting is now read by the API's rule for numbers (app/decimal_text.py), so
each other spelling is refused with an error naming the variable. Timeouts
and shares are read by its fractional rule: ``1_0``, ``+3`` and Arabic-Indic digits were
taken for numbers there too.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.settings import SidecarSettings
from offload.decimal_text import MAX_DIGITS
from tests.app.test_cli import kvscope

LISTEN = ["tcp://127.0.0.1:*"]
INTEGERS = [name for name, field in SidecarSettings.model_fields.items() if field.annotation is int]
FRACTIONAL = [
    name for name, field in SidecarSettings.model_fields.items() if field.annotation is float
]

LAX_FORMS = ["1_0", "+3", " 3", "3 ", "03", "3.0", "0x10", "\uff13", "\u0663", "", "1" * 21]


def test_every_integer_setting_is_found() -> None:
    assert {"port", "max_blocks", "page_limit", "max_connections"} <= set(INTEGERS)
    assert len(INTEGERS) == 28


LAX_FRACTIONS = [
    *("1_0", "+3", " 3", "03", "1.2.3", "inf", "nan", "0x10", "\u0663", ""),
    *("-0", "-0.0", "1e-400"),  # each reads as 0, which only "0" (or "0.0", "0e3") writes
]

RULES = [(name, LAX_FORMS, "int_parsing", f"at most {MAX_DIGITS}") for name in INTEGERS] + [
    (name, LAX_FRACTIONS, "float_parsing", "such as 2, 0.5 or 1e-05") for name in FRACTIONAL
]
"""Each number setting, the text its rule refuses, the error's type and its words."""


def test_every_fractional_setting_is_found() -> None:
    assert {"peer_timeout_s", "send_timeout_s", "insight_cpu_share"} <= set(FRACTIONAL)


@pytest.mark.parametrize(
    ("name", "forms", "error_type", "words"), RULES, ids=[rule[0] for rule in RULES]
)
def test_a_number_setting_in_any_other_form_is_refused_by_name(
    name: str, forms: list[str], error_type: str, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    variable = f"KVSCOPE_{name.upper()}"
    for text in forms:
        monkeypatch.setenv(variable, text)
        with pytest.raises(ValidationError) as refused:
            SidecarSettings(listen=LISTEN)
        (error,) = refused.value.errors()
        assert (error["loc"], error["type"]) == ((name,), error_type), text
        assert words in error["msg"], text
    default = SidecarSettings.model_fields[name].default
    monkeypatch.setenv(variable, str(default))
    assert getattr(SidecarSettings(listen=LISTEN), name) == default


def test_bounds_still_hold_and_ints_given_in_code_are_read_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVSCOPE_PORT", "65536")
    with pytest.raises(ValidationError, match="less than or equal to 65535"):
        SidecarSettings(listen=LISTEN)
    monkeypatch.setenv("KVSCOPE_MAX_BLOCKS", "0")
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        SidecarSettings(listen=LISTEN, port=0)
    assert SidecarSettings(listen=LISTEN, port=0, max_blocks=7).max_blocks == 7


@pytest.mark.parametrize(
    ("args", "env", "problem"),
    [
        (["--port", "\u0663"], {}, "--port / KVSCOPE_PORT: Input should be plain decimal "
         "digits 0-9 (at most 20; no sign, space, underscore or leading zero): it has a digit "
         "that is not ASCII 0-9"),
        ([], {"KVSCOPE_PORT": "80_80"}, "--port / KVSCOPE_PORT: Input should be plain decimal "
         "digits 0-9 (at most 20; no sign, space, underscore or leading zero): it has an "
         "underscore"),
        ([], {"KVSCOPE_MAX_BLOCKS": "+5"}, "KVSCOPE_MAX_BLOCKS: Input should be plain decimal "
         "digits 0-9 (at most 20; no sign, space, underscore or leading zero): it has a sign"),
    ],
    ids=["flag", "variable-with-flag", "variable"],
)  # fmt: skip
def test_the_command_names_the_setting_whose_number_is_malformed(
    args: list[str], env: dict[str, str], problem: str
) -> None:
    result = kvscope("serve", "--connect", "tcp://127.0.0.1:1", *args, env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == f"kvscope: error: {problem}"
