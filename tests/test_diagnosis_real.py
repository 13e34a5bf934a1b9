"""Every real trace in ../shared/data/traces gets a diagnosis verdict or a clear NotApplicable, never a crash.

Each file is loaded once; only the diagnosis and the analyses it reads run.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from conftest import SHARED_TRACES, shared_chrome_traces, shared_model, shared_results

from traceanalyzer.analyses.diagnosis import VERDICTS

TRACES = SHARED_TRACES
# Chrome traces only: a memory-timeline export has no diagnosis, a refused file is test_shared_traces'.
FILES = list(shared_chrome_traces())

pytestmark = [pytest.mark.shared, pytest.mark.slow,
              pytest.mark.skipif(not FILES, reason="../shared/data/traces not present")]

#: Verdicts that must hold on well-understood real traces (see docs/diagnosis.md).
EXPECTED = {
    "hta/df_index_resolver/df_index_resolver.json.gz": "cpu_bound",
    "tracelens/mi300/resnet_act_checkpoint.json.gz": "comm_bound",
    "hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": "cpu_compute",
    "zoology/trace.json": "cpu_compute",  # launches recorded, kernels not captured
}


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(TRACES)) for p in FILES])
def test_real_trace_gets_a_verdict(path: Path) -> None:
    model = shared_model(path)
    res = shared_results(path)
    assert "diagnosis" not in res.failed, res.failed
    assert not {"baseline", "phases"} & set(res.failed), res.failed
    if "diagnosis" not in res.values:
        assert res.skipped["diagnosis"].strip()  # a reason users can read
        return
    d = res["diagnosis"]
    assert d.verdict in VERDICTS and 0.0 <= d.share_pct <= 100.0
    assert d.resource == ("gpu" if model.has_gpu else "cpu")
    assert d.narrative() and d.summary() and d.per_step.height >= 1
    orjson.dumps(d.to_json())
    rel = str(path.relative_to(TRACES))
    if rel in EXPECTED:
        assert d.verdict == EXPECTED[rel], d.narrative()
