"""The example plugin's own tests, written as a third party would: only pycollector's public API."""

import csv

from pycollector.pdata import ProfilesBuilder
from pycollector.testing import assert_conformance, make_settings, TestHost

from pycollector_example_exporter import SampleCountsConfig, factory


def test_keeps_the_component_contract(tmp_path):
    assert_conformance(factory, "exporters", {"path": str(tmp_path / "out.csv")})


def test_writes_one_row_per_process_with_its_samples(tmp_path):
    builder = ProfilesBuilder()
    stack = builder.stack([builder.location(lines=[(builder.function("spin"), 0, 0)])])
    for name, counts in (("api", [3, 4]), ("worker", [5])):
        profile = builder.profile(builder.scope_profiles(builder.resource_profiles({"process.executable.name": name})))
        for count in counts:
            builder.sample(profile, stack, [count])
    path = tmp_path / "counts.csv"
    exporter = factory.create(make_settings(), SampleCountsConfig(path=str(path)), None)
    exporter.start(TestHost())
    exporter.consume(builder.data)
    exporter.shutdown()
    rows = [row[1:] for row in csv.reader(path.open())]
    assert rows == [["api", "7"], ["worker", "5"]]
