"""The official OTLP profiles message classes of each profiles.proto layout (this module holds no
tests), for reading what pycollector writes and writing what older senders send.

- v1.10: the installed opentelemetry-proto.
- v1.9: opentelemetry-proto 1.42.0, generated from profiles.proto v1.9.0; v1.7: 1.39.0, from
  v1.7.0. ``scripts/setup.sh`` keeps their wheels in ``.venv/proto-layouts``; the serialized file
  descriptor each ``profiles_pb2.py`` carries is loaded into a pool of its own, since the default
  pool already holds the current file under the same name.
- v1.8: no release of opentelemetry-proto (nor any package the registries here serve) was
  generated from v1.8.0: the Python packages went from v1.7.0 (1.39) to v1.9.0 (1.40). Its
  classes are v1.9.0's descriptor with the two changes the v1.9.0 release made undone (it dropped
  ``Profile.comment_strindices`` = 7, moving the fields after it down by one, and
  ``ValueType.aggregation_temporality`` = 3; it renamed ``sample`` and ``line`` to plural names).
"""

from __future__ import annotations

import ast
import functools
import os
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

WHEELS = Path(os.environ.get("PYCOLLECTOR_PROTO_LAYOUTS", Path(sys.prefix) / "proto-layouts"))
_PACKAGE_OF = {"1.9": "1.42.0", "1.7": "1.39.0"}
_PROFILES_PB2 = "opentelemetry/proto/profiles/v1development/profiles_pb2.py"
_FIELD = descriptor_pb2.FieldDescriptorProto


class Classes:
    """The message classes of one layout, by message name: ``classes.ProfilesData``."""

    def __init__(self, version: str, pool: descriptor_pool.DescriptorPool, package: str):
        self.version = version
        self._pool, self._package = pool, package

    def __getattr__(self, name: str) -> Any:
        return message_factory.GetMessageClass(self._pool.FindMessageTypeByName(f"{self._package}.{name}"))


def missing() -> str | None:
    """Why the older layouts cannot be loaded, or None."""
    absent = [version for version in _PACKAGE_OF.values() if not list(WHEELS.glob(f"opentelemetry_proto-{version}-*.whl"))]
    return f"opentelemetry-proto {', '.join(absent)} wheels not in {WHEELS} (scripts/setup.sh fetches them)" if absent else None


@functools.cache
def layout(version: str) -> Classes:
    if version == "1.10":
        return _classes(version, descriptor_pb2.FileDescriptorProto.FromString(profiles_pb2.DESCRIPTOR.serialized_pb))
    if version == "1.8":
        return _classes(version, _v1_8_from_v1_9(_file_of(_PACKAGE_OF["1.9"])))
    return _classes(version, _file_of(_PACKAGE_OF[version]))


def _file_of(package_version: str) -> descriptor_pb2.FileDescriptorProto:
    wheel = next(WHEELS.glob(f"opentelemetry_proto-{package_version}-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        source = archive.read(_PROFILES_PB2).decode()
    with warnings.catch_warnings():  # the generated source has escapes newer Pythons warn about
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            return descriptor_pb2.FileDescriptorProto.FromString(node.args[0].value)
    raise LookupError(f"no serialized descriptor in {wheel}:{_PROFILES_PB2}")


def _classes(version: str, file: descriptor_pb2.FileDescriptorProto) -> Classes:
    pool = descriptor_pool.DescriptorPool()
    for dependency in (common_pb2, resource_pb2):
        pool.AddSerializedFile(dependency.DESCRIPTOR.serialized_pb)
    pool.Add(file)
    return Classes(version, pool, file.package)


def _v1_8_from_v1_9(file: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    messages = {message.name: message for message in file.message_type}
    profile = messages["Profile"]
    for field in profile.field:
        if field.number >= 7:
            field.number += 1
        if field.name == "samples":
            field.name, field.json_name = "sample", "sample"
    profile.field.add(name="comment_strindices", json_name="commentStrindices", number=7, label=_FIELD.LABEL_REPEATED, type=_FIELD.TYPE_INT32)
    messages["ValueType"].field.add(name="aggregation_temporality", json_name="aggregationTemporality", number=3, label=_FIELD.LABEL_OPTIONAL, type=_FIELD.TYPE_INT32)
    for field in messages["Location"].field:
        if field.name == "lines":
            field.name, field.json_name = "line", "line"
    return file
