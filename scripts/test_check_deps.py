#!/usr/bin/env python3
"""scripts/check-deps.py's rules, each shown failing: a copy of src/ with one violation put
in on purpose must fail the check with the rule's message, and the copy as it is must pass.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


class CheckDeps(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="check-deps-")
        shutil.copytree(ROOT / "src", pathlib.Path(self.tmp) / "src")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def check(self):
        env = dict(os.environ, CHECK_DEPS_ROOT=self.tmp)
        return subprocess.run([sys.executable, str(HERE / "check-deps.py")], env=env,
                              capture_output=True, text=True)

    def inject(self, rel, line):
        """Appends `line` to src/<rel> of the copy (before its tests, which the check skips)."""
        path = pathlib.Path(self.tmp) / "src" / rel
        text = path.read_text()
        head, sep, tail = text.partition("#[cfg(test)]")
        path.write_text(head + "\n" + line + "\n" + sep + tail)

    def assert_refused(self, words):
        r = self.check()
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(words, r.stdout)

    def test_the_tree_as_it_is_passes(self):
        r = self.check()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_http_naming_the_store_is_refused(self):
        self.inject("http/counts.rs", "use crate::store::stats::Bucket as Named;")
        self.assert_refused("http -> store points against the direction")

    def test_http_naming_the_engine_is_refused(self):
        self.inject("http/system.rs", "pub fn now() -> u64 { crate::engine::step_io::now_ms() }")
        self.assert_refused("http -> engine points against the direction")

    def test_a_broker_consumer_naming_the_store_is_refused(self):
        self.inject("broker/reply.rs", "use crate::store::dead_letters::Origin as Named;")
        self.assert_refused("broker -> store points against the direction")

    def test_a_broker_consumer_naming_the_engine_is_refused(self):
        self.inject("broker/amqp.rs", "use crate::engine::resume::parse as Named;")
        self.assert_refused("broker -> engine points against the direction")

    def test_the_outside_worlds_room_using_the_store_is_refused(self):
        self.inject("outbound/limits.rs", "use crate::store::StoreError as Up;")
        self.assert_refused("outbound -> store points against the direction")

    def test_a_layer_using_one_above_it_is_refused(self):
        self.inject("store/stats.rs", "use crate::ops::OpError as Up;")
        self.assert_refused("store -> ops points against the direction")

    def test_a_leaf_using_a_module_is_refused_but_the_route_table(self):
        self.inject("metrics.rs", "use crate::config::Config as Up;")
        self.assert_refused("metrics -> config points against the direction")

    def test_the_route_table_uses_nothing(self):
        self.inject("routes.rs", "use crate::metrics::Metrics as Up;")
        self.assert_refused("routes -> metrics points against the direction")

    def test_the_statuses_use_nothing(self):
        self.inject("status.rs", "use crate::ids::new_v7 as Up;")
        self.assert_refused("status -> ids points against the direction")

    def test_files_using_each_other_in_a_circle_are_refused(self):
        self.inject("store/stats.rs", "use super::slots::Waiting as Around;")
        self.inject("store/slots.rs", "use super::stats::Bucket as Back;")
        self.assert_refused("use each other in a circle")

    def test_a_status_spelled_outside_status_rs_is_refused(self):
        self.inject("store/slots.rs", "const SPELLED: &str = \"WHERE status = 'PAUSED'\";")
        self.assert_refused("spells the status 'PAUSED'")

    def test_an_answer_built_below_http_is_refused(self):
        self.inject("ops/lists.rs", "pub fn built() -> serde_json::Value { serde_json::json!({}) }")
        self.assert_refused("builds JSON")


if __name__ == "__main__":
    unittest.main()
