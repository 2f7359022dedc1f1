"""The README's reference tables say what the code does: the sidecar's settings, their
defaults, flags and stated ranges, the worker's metrics, the sidecar's own metrics, the HTTP
routes and their query parameters, the keys kvscope reads from vLLM's
``kv_connector_extra_config``, and the alerts (their severities and durations).

Each table is read from README.md and compared with the definitions themselves
(``SidecarSettings``, ``offload.telemetry.metrics``, what ``/metrics`` serves, the app's
OpenAPI schema, ``KVSCOPE_KEYS``, the alerting rules), as are docs/PROTOCOL.md's tables of
each wire message's fields (the ``offload.wire`` structs); the values of the labels and
verdict kinds the code declares as ``Literal`` types must each be named. So a renamed
setting, a changed default or a new route fails here rather than leaving the README to drift.
``offload/vllm/settings.py`` is read as source, not imported: importing ``offload.vllm``
loads vLLM.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import get_args

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.api import create_app
from app.api.http_counts import Refusal
from app.cli import build_parser
from app.settings import SidecarSettings
from app.state.block_index import PAGE_SCAN
from app.state.insight_verdicts import VerdictKind
from app.state.locations import MediaRefusal
from app.state.publisher import ReplayOutcome
from app.state.sidecar import SidecarState
from offload.cpu.miss_attribution import Reason
from offload.cpu.policies.registry import BUILT_IN
from offload.telemetry import metrics
from offload.wire import kv_events, sample_frame, stats_frame

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
PROTOCOL = (ROOT / "docs" / "PROTOCOL.md").read_text()
UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "s": 1}


def table(header: str) -> list[list[str]]:
    """The rows (cells stripped) of every README table whose header row starts ``header``."""
    rows: list[list[str]] = []
    inside = False
    for line in README.splitlines():
        if line.startswith(header):
            inside = True
        elif inside and line.startswith("|"):
            if not re.fullmatch(r"[|\s:-]+", line):
                rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
        else:
            inside = False
    assert rows, f"README has no table headed {header!r}"
    return rows


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def readme_default(text: str) -> object:
    """A default as the settings tables write it: 1,000 / 64 MiB / 2 s / `lru,arc` / (empty),
    or (any) / (none) for no value (an empty list, or None)."""
    if text in ("(any)", "(none)"):
        return None
    if text == "(empty)":
        return ""
    if spans := code_spans(text):
        return spans[0]
    number, _, unit = text.partition(" ")
    value = float(number.replace(",", "")) * UNITS[unit] if unit else float(number.replace(",", ""))
    return value


def test_every_setting_the_tables_name_has_the_default_they_give() -> None:
    fields = SidecarSettings.model_fields
    rows = table("| setting | default |")
    for name_cell, default_cell, *_ in rows:
        (variable,) = code_spans(name_cell)
        name = variable.removeprefix("KVSCOPE_").lower()
        assert name in fields, f"README's {variable} is no setting"
        field = fields[name]
        default = field.default_factory() if field.default_factory else field.default
        if isinstance(default, list):
            default = ",".join(default) if default else None
        expected = readme_default(default_cell)
        assert default == expected, f"{variable}: README says {default_cell}, the code {default!r}"


BOUND = r"[\d.,]+(?: [KMGT]iB| s)?(?: less one byte)?"
RANGE = re.compile(rf"\((?:at least ({BOUND})|({BOUND}) to ({BOUND}))[);]")


def readme_bound(text: str) -> float:
    """A bound as the settings tables write it: 0.001 / 3,600 s / 1 TiB / 2 GiB less one byte."""
    value, less, _ = text.partition(" less one byte")
    return readme_default(value) - (1 if less else 0)


def test_the_ranges_the_settings_tables_give_are_the_settings_bounds() -> None:
    """A setting's range written "(LOW to HIGH)" or "(at least LOW)" is what the setting
    accepts: pydantic's ge and le on its field (and no upper bound for "at least")."""
    fields = SidecarSettings.model_fields
    checked = 0
    for name_cell, *_, bounds_cell in table("| setting | default |"):
        (variable,) = code_spans(name_cell)
        field = fields[variable.removeprefix("KVSCOPE_").lower()]
        given = {type(m).__name__: m for m in field.metadata}
        for found in RANGE.finditer(bounds_cell):
            at_least, low, high = found.groups()
            assert given["Ge"].ge == readme_bound(at_least or low), variable
            if at_least:
                assert "Le" not in given, f"{variable} has an upper bound the README leaves out"
            else:
                assert given["Le"].le == readme_bound(high), variable
            checked += 1
    assert checked >= 5, f"only {checked} ranges read: the tables' wording moved"


def test_every_flag_the_settings_table_names_sets_its_setting() -> None:
    flagged = 0
    for name_cell, _, flag_cell, _ in table("| setting | default | flag |"):
        (variable,) = code_spans(name_cell)
        for flag in code_spans(flag_cell):
            given = vars(build_parser().parse_args(["serve", flag, "1"]))
            assert given.get(variable.removeprefix("KVSCOPE_").lower()) in ("1", ["1"]), flag
            flagged += 1
    assert flagged, "the settings table names no flag"


def test_every_setting_is_in_the_readme() -> None:
    named = set(re.findall(r"KVSCOPE_([A-Z0-9_]+)", README))
    missing = {name.upper() for name in SidecarSettings.model_fields} - named
    assert not missing, f"settings the README never names: {sorted(missing)}"


def test_the_metric_table_is_the_metric_definitions() -> None:
    specs = {
        spec.name: spec for spec in vars(metrics).values() if isinstance(spec, metrics.MetricSpec)
    }
    seen: set[str] = set()
    for names, kind, labels, _ in table("| metric | type | labels |"):
        expected = () if labels == "(none)" else tuple(label.strip() for label in labels.split(","))
        for name in code_spans(names):
            assert name in specs, f"README's {name} is no metric"
            assert (specs[name].kind, specs[name].labels) == (kind, expected), name
            seen.add(name)
    assert seen == set(specs), f"metrics the table leaves out: {sorted(set(specs) - seen)}"


def sidecar_families() -> dict[str, tuple[str, tuple[str, ...] | None]]:
    """Each ``kvscope_sidecar_*`` family a sidecar in connect and listen mode serves on
    /metrics before any frame: its name as scraped (a counter's with ``_total``), its type,
    and its labels, or None for a family with no sample yet (a lag before a first frame)."""
    settings = SidecarSettings(connect=["tcp://127.0.0.1:1"], listen=["tcp://127.0.0.1:*"])
    app = create_app(settings, SidecarState.from_settings(settings))
    with TestClient(app, base_url="http://localhost") as http:
        text = http.get("/metrics").text
    families: dict[str, tuple[str, tuple[str, ...] | None]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("kvscope_sidecar_"):
            name = family.name + ("_total" if family.type == "counter" else "")
            labels = {label for sample in family.samples for label in sample.labels} - {"le"}
            families[name] = (family.type, tuple(sorted(labels)) if family.samples else None)
    return families


def test_the_sidecar_metric_table_is_what_metrics_serves() -> None:
    served = sidecar_families()
    listed: set[str] = set()
    for names, kind, labels, _ in table("| sidecar metric | type | labels |"):
        expected = () if labels == "(none)" else tuple(sorted(map(str.strip, labels.split(","))))
        for name in code_spans(names):
            assert name in served, f"README's {name} is not on /metrics"
            served_kind, served_labels = served[name]
            assert served_kind == kind, f"{name}: README {kind}, served {served_kind}"
            assert served_labels in (None, expected), f"{name}: README {expected}, {served_labels}"
            listed.add(name)
    assert listed == set(served), f"sidecar metrics the table leaves out: {set(served) - listed}"


def test_every_kvscope_name_the_docs_write_is_a_metric_or_a_vllm_key() -> None:
    """Prose names metrics too (an alert's runbook, a count's meaning), in README.md and
    docs/: a renamed metric must not live on there."""
    worker = {spec.name for spec in vars(metrics).values() if isinstance(spec, metrics.MetricSpec)}
    known = worker | set(sidecar_families()) | vllm_keys()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        written = set(re.findall(r"\bkvscope_[a-z0-9_]*[a-z0-9]\b", page.read_text()))
        assert written <= known, (
            f"{page.name} names what kvscope does not export: {written - known}"
        )


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(Reason, id="miss reasons"),
        pytest.param(ReplayOutcome, id="replay outcomes"),
        pytest.param(Refusal, id="HTTP refusals"),
        pytest.param(MediaRefusal, id="media refusals"),
        pytest.param(VerdictKind, id="verdict kinds"),
    ],
)
def test_every_label_value_and_verdict_kind_is_in_the_readme(values: object) -> None:
    """The values a label (a miss's reason, a replay's outcome, an HTTP refusal's reason, a
    refused medium's reason) or a verdict's ``kind`` takes, each as code in the README: a new
    one is said there as it is exported."""
    missing = [value for value in get_args(values) if f"`{value}`" not in README]
    assert get_args(values) and not missing, f"the README never names {missing}"


def test_every_recorded_name_the_docs_write_is_a_recording_rule() -> None:
    """``kvscope:...`` names in README.md and docs/ are the recording rules' (the page's
    ``kvscope:first-render`` mark aside): a renamed rule must not live on there."""
    rules = yaml.safe_load((ROOT / "docker/prometheus/rules/kvscope-recording.yml").read_text())
    recorded = {rule["record"] for group in rules["groups"] for rule in group["rules"]}
    written: set[str] = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        written |= set(re.findall(r"\bkvscope:[a-z0-9_:]*[a-z0-9]\b(?!-)", page.read_text()))
    assert written, "the docs name no recorded series: the pattern no longer matches"
    assert written <= recorded, f"the docs name what no rule records: {written - recorded}"


def test_the_shadow_memory_table_is_what_each_policy_states() -> None:
    """The built-in policies' (tests may register more); the capped part stops at 511 slots,
    as the header says, for every policy with one."""
    stated = {
        code_spans(policy)[0]: tuple(map(readme_default, parts))
        for policy, *parts, _ in table("| Policy | Fixed | Per slot |")
    }
    bounds = {cls.name: cls.metadata_bound for cls in BUILT_IN}
    assert stated == {name: tuple(bound[:3]) for name, bound in bounds.items()}
    assert {bound.capped_slots for bound in bounds.values() if bound.capped_per_slot} == {511}


def test_the_route_table_is_the_routes_the_app_serves() -> None:
    settings = SidecarSettings(connect=["tcp://127.0.0.1:1"])
    app = create_app(settings, SidecarState.from_settings(settings))
    schema = app.openapi()
    served = {
        (method.upper(), re.sub(r"\{[^}]+\}", "{}", path)): sorted(
            p["name"] for p in operation.get("parameters", ()) if p["in"] == "query"
        )
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
    }
    listed: dict[tuple[str, str], list[str]] = {}
    for route_cell, _ in table("| route |"):
        for span in code_spans(route_cell):
            method, _, target = span.partition(" ")
            if method not in ("GET", "POST"):
                continue
            path, _, query = target.partition("?")
            params = sorted(part.removesuffix("=") for part in query.split("&") if part)
            listed[(method, re.sub(r"\{[^}]+\}", "{}", path))] = params
    unlisted = set(served) - set(listed)
    assert not unlisted, f"routes the README's table leaves out: {sorted(unlisted)}"
    for route, params in listed.items():
        if route in served:
            assert params == served[route], f"{route}: README {params}, served {served[route]}"
        else:  # outside the schema: the page and the schema itself
            with TestClient(app, base_url="http://localhost") as http:
                assert http.request(*route).status_code == 200, route


def test_the_blocks_route_states_the_page_scan_bound() -> None:
    """The route table gives the records one page examines as a number: it is PAGE_SCAN."""
    (cell,) = [row[1] for row in table("| route |") if "GET /api/v1/blocks?" in row[0]]
    found = re.search(r"examines at most ([\d,]+) entries", cell)
    assert found, "the /api/v1/blocks row no longer states how many entries a page examines"
    assert int(found.group(1).replace(",", "")) == PAGE_SCAN


def vllm_keys() -> set[str]:
    """``KVSCOPE_KEYS`` as offload/vllm/settings.py writes it (read, not imported)."""
    source = ast.parse((ROOT / "offload" / "vllm" / "settings.py").read_text())
    for node in source.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "KVSCOPE_KEYS":
            return set(ast.literal_eval(node.value.args[0]))
    pytest.fail("offload/vllm/settings.py defines no KVSCOPE_KEYS")


def test_the_vllm_key_table_is_the_keys_kvscope_reads() -> None:
    listed = {span for key_cell, _ in table("| key | meaning |") for span in code_spans(key_cell)}
    named = {key for key in vllm_keys() if f"`{key}`" in README}
    assert listed <= vllm_keys(), f"README keys kvscope refuses: {sorted(listed - vllm_keys())}"
    assert named == vllm_keys(), f"keys the README never names: {sorted(vllm_keys() - named)}"


def test_the_alert_table_is_the_alerting_rules() -> None:
    """Each alert the rules define, once, marked "(critical)" exactly where its severity is."""
    rules = yaml.safe_load((ROOT / "docker/prometheus/rules/kvscope-alerts.yml").read_text())
    defined = {
        rule["alert"]: rule["labels"]["severity"]
        for group in rules["groups"]
        for rule in group["rules"]
    }
    listed: dict[str, str] = {}
    for name_cell, *_ in table("| alert | fires when |"):
        name, _, severity = name_cell.partition(" ")
        listed[name] = "critical" if severity == "(critical)" else "warning"
    assert listed == defined


def test_the_alert_table_gives_each_rule_its_for() -> None:
    """ "for N min" in a row is the rule's ``for:``; a row without one is a rule without."""
    rules = yaml.safe_load((ROOT / "docker/prometheus/rules/kvscope-alerts.yml").read_text())
    held = {rule["alert"]: rule.get("for") for group in rules["groups"] for rule in group["rules"]}
    for name_cell, fires_when, _ in table("| alert | fires when |"):
        name = name_cell.partition(" ")[0]
        minutes = re.search(r"\bfor (\d+) min\b", fires_when)
        assert held[name] == (f"{minutes.group(1)}m" if minutes else None), name
    assert any(held.values()), "no rule holds a for: the check reads nothing"


def first_table_after(text: str, marker: str) -> list[list[str]]:
    """The rows (cells stripped, header and rule left out) of the first table after the
    line that starts with ``marker``."""
    found = re.search(rf"^{re.escape(marker)}", text, re.MULTILINE)
    assert found, f"no line starts {marker!r}"
    lines = text[found.end() :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


@pytest.mark.parametrize(
    ("marker", "struct"),
    [
        pytest.param(marker, struct, id=struct.__name__)
        for marker, struct in [
            ("`BlockStored`:", kv_events.BlockStored),
            ("`BlockRemoved`:", kv_events.BlockRemoved),
            ("`StatsFrame`:", stats_frame.StatsFrame),
            ("`WorkerConfig`:", stats_frame.WorkerConfig),
            ("`Sample` (", stats_frame.Sample),
            ("`HistogramSnapshot` (", stats_frame.HistogramSnapshot),
            ("## Sample frames", sample_frame.SampleFrame),
        ]
    ],
)
def test_the_protocol_schema_tables_are_the_wire_structs(marker: str, struct: type) -> None:
    """docs/PROTOCOL.md's table of each message names its struct's fields, every one
    (an event's ``type`` is its tag, no field)."""
    listed = {
        name
        for row in first_table_after(PROTOCOL, marker)
        for name in code_spans(row[0])
        if name != "type"
    }
    assert listed == set(struct.__struct_fields__), struct.__name__
