"""The sim against the GPU: scripts/probe_graphs.py's transcript of graph and capture calls,
run on the sim and compared step by step with the one recorded on an H100
(tests/driver/graphs_transcript.json)."""

from __future__ import annotations

import importlib
import json
import warnings
from pathlib import Path

import pytest

TRANSCRIPT = Path(__file__).with_name("graphs_transcript.json")
RECORD = (
    "record it on a GPU: CUCTX_BACKEND=cuda PYTHONPATH=src python "
    "scripts/probe_graphs.py tests/driver/graphs_transcript.json"
)


@pytest.fixture
def probe():
    """scripts/probe_graphs.py (importable through pytest's `pythonpath`), whose
    `transcript` both the GPU recording and these tests run."""
    return importlib.import_module("probe_graphs")


def test_the_probe_runs_on_the_sim_without_errors_of_its_own(sim, probe):
    steps = probe.transcript(sim)
    assert len(steps) > 300
    assert len({label for label, _ in steps}) == len(steps)  # labels name steps
    assert not [s for s in steps if isinstance(s[1], str) and s[1].startswith("raised")]


def test_the_sim_answers_the_graph_transcript_as_the_gpu_did(sim, probe):
    """Every step the GPU recorded, answered alike and in the same order. Steps the probe
    has that the recording lacks (added since it was made) are named in a warning."""
    if not TRANSCRIPT.exists():
        pytest.skip(f"no GPU transcript of graph calls yet ({RECORD})")
    recorded = json.loads(TRANSCRIPT.read_text())["steps"]
    seen = probe.transcript(sim)
    answers = dict((label, answer) for label, answer in seen)
    differences = [
        f"{label}: GPU {want!r}, sim {answers[label]!r}"
        for label, want in recorded
        if label in answers and answers[label] != want
    ]
    gone = [label for label, _ in recorded if label not in answers]
    if gone:
        differences.append(f"the probe no longer has the steps {gone}: {RECORD}")
    known = {label for label, _ in recorded}
    if [label for label, _ in seen if label in known] != [label for label, _ in recorded]:
        differences.append(f"the steps run in another order than recorded: {RECORD}")
    assert not differences, "the sim differs from the GPU:\n" + "\n".join(differences)
    new = [label for label, _ in seen if label not in known]
    if new:
        warnings.warn(
            f"{len(new)} steps of the probe are not in the GPU transcript yet "
            f"({RECORD}), the first: {new[:3]}",
            stacklevel=1,
        )
