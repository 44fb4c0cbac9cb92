"""scripts/verdicts.py: records from results.json, the comparison of two records, and the README's
findings block, on made-up runs; and the repository's README against docs/verdicts.json."""
import copy
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import verdicts  # noqa: E402


def results(isa, swiglu_verdict="better than ReLU", quick=False):
    """A default run's results.json, cut to what the records read."""
    def outcome(verdict, diff, seeds):
        return {"verdict": verdict, "paired_difference_to_relu_mean": diff,
                "paired_difference_to_relu_ci95": [diff - 0.01, diff + 0.01],
                "val_bits_per_byte": [3.0] * seeds}
    return {
        "quick": quick, "full": False, "seconds": 2700.4,
        "machine": {"cpu": "Some EPYC", "family": 25, "model": 17 if isa == "AVX-512" else 1,
                    "isa": isa, "bf16": False, "processors": 2},
        "build": {"march_native": True},
        "training": {
            "config": {"steps": 600, "equivalence_margin": 0.02,
                       "sequential": {"first_seeds": 3, "max_seeds": 6, "alpha": 0.05}},
            "variants": {"relu": outcome("reference", 0, 6),
                         "gelu": outcome("worse than ReLU", 0.07, 3),
                         "swiglu": outcome(swiglu_verdict, -0.04, 5)}},
        "moe_axes": {"rows": {
            "relu": {"against_relu": {}}, "moe": {"against_relu": {}},
            "moe_fine_shared": {"against_relu": {
                "verdict": "better than ReLU", "paired_difference_mean": -0.03,
                "paired_difference_ci95": [-0.05, -0.01], "val_bits_per_byte": [3.0] * 6}}}},
        "recommendations": {"best_at_equal_parameters": "swiglu", "best_per_flop": "swiglu",
                            "best_per_second": None, "moe_pays_off": False},
    }


class Verdicts(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.records = os.path.join(self.dir.name, "verdicts.json")
        verdicts.RECORDS = self.records

    def tearDown(self):
        self.dir.cleanup()

    def run_script(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            status = verdicts.main(list(argv))
        return status, out.getvalue(), err.getvalue()

    def read(self, path):
        with open(path, encoding="utf-8") as f:
            return f.read()

    def write_results(self, name, r):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            json.dump(r, f)
        return path

    def test_a_record_holds_every_comparison_and_pick(self):
        path = self.write_results("avx2.json", results("AVX2"))
        status, out, _ = self.run_script("record", path, "--commit", "abc1234")
        self.assertEqual(status, 0)
        data = json.loads(self.read(self.records))
        (r,) = data["records"]
        self.assertEqual(r["name"], "avx2-native")
        self.assertEqual(r["build"], "native")  # from results.json
        self.assertEqual(set(r["comparisons"]), {"gelu", "swiglu", "moe_fine_shared"})
        self.assertEqual(r["comparisons"]["swiglu"]["seeds"], 5)
        self.assertEqual(r["picks"]["moe_pays_off"], False)
        # Recording again under the same name replaces it.
        self.run_script("record", path, "--commit", "def5678")
        self.assertEqual(len(json.loads(self.read(self.records))["records"]), 1)

    def test_refuses_a_quick_run_and_bad_files(self):
        status, _, err = self.run_script("record", self.write_results(
            "q.json", results("AVX2", quick=True)))
        self.assertEqual(status, 2)
        self.assertIn("--quick run says nothing", err)
        full = results("AVX2")
        full["full"] = True
        status, _, err = self.run_script("record", self.write_results("f.json", full))
        self.assertEqual(status, 2)
        self.assertIn("--full run", err)
        status, _, err = self.run_script("record", os.path.join(self.dir.name, "none.json"))
        self.assertEqual(status, 2)
        self.assertIn("none.json", err)
        status, _, err = self.run_script("compare", "a", "b")
        self.assertEqual(status, 2)
        self.assertIn("no record named 'a'", err)

    def test_compare_lists_every_verdict_that_differs(self):
        self.run_script("record", self.write_results("a.json", results("AVX2")), "--commit", "a")
        self.run_script("record", self.write_results(
            "b.json", results("AVX-512", swiglu_verdict="inconclusive")), "--commit", "b")
        status, out, _ = self.run_script("compare", "avx2-native", "avx512-native")
        self.assertEqual(status, 1)
        self.assertIn("swiglu: better than ReLU (-0.040 [-0.050, -0.030], 5 seeds) on "
                      "avx2-native; inconclusive", out)
        self.assertIn("avx512-native: Some EPYC, family 25 model 17 (AVX-512, no bf16)", out)
        self.assertNotIn("gelu:", out)
        status, out, _ = self.run_script("compare", "avx2-native", "avx2-native")
        self.assertEqual(status, 0)
        self.assertIn("agrees", out)

    def test_findings_need_both_isas_and_agreement(self):
        self.run_script("record", self.write_results("a.json", results("AVX2")), "--commit", "a")
        block = verdicts.readme_block(verdicts.load_records())
        gelu = next(l for l in block.splitlines() if l.startswith("| GELU |"))
        self.assertTrue(gelu.endswith("| worse | not yet: AVX2 only |"), gelu)
        self.run_script("record", self.write_results(
            "b.json", results("AVX-512", swiglu_verdict="inconclusive")), "--commit", "b")
        block = verdicts.readme_block(verdicts.load_records())
        gelu = next(l for l in block.splitlines() if l.startswith("| GELU |"))
        swiglu = next(l for l in block.splitlines() if l.startswith("| SwiGLU |"))
        self.assertTrue(gelu.endswith("| worse | yes |"), gelu)
        self.assertIn("| inconclusive | no: better on avx2-native; inconclusive on "
                      "avx512-native |", swiglu)
        # The numbers are the newest record's, and the block says whose.
        self.assertIn("the newest record, avx512-native: Some EPYC, family 25 model 17 (AVX-512, "
                      "no bf16), native build, commit b, `ffnlab evolve --out report`.", block)

    def test_a_bound_near_zero_keeps_its_sign_and_a_digit(self):
        r = results("AVX2")
        r["training"]["variants"]["swiglu"]["paired_difference_to_relu_ci95"] = [-0.07, -0.00009]
        self.run_script("record", self.write_results("a.json", r), "--commit", "a")
        block = verdicts.readme_block(verdicts.load_records())
        self.assertIn("| SwiGLU | -0.040 [-0.070, -0.0001] |", block)
        # What a verdict's 5 % covers: its comparison alone, of those the record holds.
        n = len(verdicts.load_records()["records"][-1]["comparisons"])
        self.assertIn(f"with the 5 % shared over the run's {n} comparisons", block)

    def test_the_block_is_short(self):
        self.run_script("record", self.write_results("a.json", results("AVX2")), "--commit", "a")
        lines = verdicts.readme_block(verdicts.load_records()).splitlines()
        self.assertLessEqual(len(lines) - 4, 8, lines)  # less the markers and their blank lines

    def test_the_readme_block_is_written_and_checked(self):
        readme = os.path.join(self.dir.name, "README.md")
        with open(readme, "w") as f:
            f.write(f"intro\n{verdicts.BEGIN}\nold\n{verdicts.END}\nrest\n")
        self.assertEqual(self.run_script("readme", "--check", readme)[0], 1)
        self.assertEqual(self.run_script("readme", "--write", readme)[0], 0)
        self.assertEqual(self.run_script("readme", "--check", readme)[0], 0)
        text = self.read(readme)
        self.assertTrue(text.startswith("intro\n") and text.endswith("rest\n"))


class Repository(unittest.TestCase):
    def test_the_readme_holds_the_findings_of_docs_verdicts_json(self):
        verdicts.RECORDS = os.path.join(ROOT, "docs", "verdicts.json")
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            status = verdicts.main(["readme", "--check", os.path.join(ROOT, "README.md")])
        self.assertEqual(status, 0, err.getvalue())


if __name__ == "__main__":
    unittest.main()
