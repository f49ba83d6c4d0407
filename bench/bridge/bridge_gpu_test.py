"""bridge_gpu.py's plumbing and verdicts without a GPU or Megatron Bridge (pytest): the cases run as
--fake processes (a test double for a run) through the real subprocess / JSON path; the count checks
and verdicts catch what they are for; the import doubles refuse use after seal()."""
import copy
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bridge_gpu  # noqa: E402


def fake_run(run, rank, tmp_path):
    path = tmp_path / f"{run['name']}.{rank}.json"
    os.environ["RANK"] = str(rank)
    bridge_gpu.fake_run(dict(run, case="t"), str(path))
    return json.loads(path.read_text())


def test_fake_cases_end_to_end(tmp_path):
    out = tmp_path / "bridge_gpu.json"
    proc = subprocess.run([sys.executable, os.path.join(HERE, "bridge_gpu.py"), "--fake", "--json", str(out),
                           "--workdir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["all_passed"] and set(report["cases"]) == set(bridge_gpu.CASES)
    assert all(len(ls) in (bridge_gpu.ITERS, bridge_gpu.SAVE_AT, bridge_gpu.ITERS - bridge_gpu.SAVE_AT)
               for c in report["cases"].values() for ls in c["losses"].values())


def test_counts_catch_wrong_consumed_and_a_loss_of_part_of_the_batch(tmp_path):
    run = {"name": "libgtp", "gtp": "libgtp", "world": 2}
    ranks = [fake_run(run, r, tmp_path) for r in range(2)]
    assert bridge_gpu.check_counts(ranks) == []
    wrong = copy.deepcopy(ranks)
    wrong[0]["end"]["consumed"] //= 2                       # consumed samples counted over DP only
    assert any("consumed samples" in f for f in bridge_gpu.check_counts(wrong))
    partial = copy.deepcopy(ranks)
    for micro in partial[1]["micro"]["train"]:              # rank 1 saw other samples; logged = rank 0's only
        micro[0] *= 1.5
    assert any("whole-batch mean" in f for f in bridge_gpu.check_counts(partial))
    evals = copy.deepcopy(ranks)
    evals[0]["evals"] = [evals[0]["evals"][0] * 2]          # evaluation run G times the microbatches
    assert any("evals microbatches" in f for f in bridge_gpu.check_counts(evals))


def test_a_changed_loss_fails_the_bit_identity_verdict(tmp_path):
    runs = {r["name"]: [fake_run(r, 0, tmp_path)] for r in bridge_gpu.CASES["dense_g1"]}
    v = bridge_gpu.verdicts("dense_g1", runs, {})
    assert bridge_gpu.case_ok(v, {})
    runs["libgtp_machinery"][0]["train"][5]["hex"] = (1.0).hex()
    v = bridge_gpu.verdicts("dense_g1", runs, {})
    assert v["libgtp_machinery_bit_identical_to_off"] is False and not bridge_gpu.case_ok(v, {})


def test_doubles_only_for_absent_packages_and_refused_after_seal():
    import import_doubles
    import_doubles.install(("gtp_absent_package_for_test", "json"))
    import json as real_json
    assert not hasattr(real_json, "_double_name") and real_json.dumps(1) == "1"  # a real package stays real
    import gtp_absent_package_for_test.sub as double
    assert double.Anything.__name__ == "Anything"            # touched at import: allowed, recorded
    import_doubles.seal()
    with pytest.raises(import_doubles.DoubleUsed, match="gtp_absent_package_for_test"):
        double.Anything()
